# fabriclab: `make run` checks the default fabric's reachability, then runs its workload
# (results in runs/<experiment>/results.json);
# `make test` runs the unit and integration tests. Both do the set-up themselves.
VENV ?= .venv
EXPERIMENT ?= experiments/quickstart.yaml

.PHONY: setup run test unit integration bench clean

setup:
	./scripts/setup.sh

run: setup
	$(VENV)/bin/fabriclab up --check $(EXPERIMENT)
	$(VENV)/bin/fabriclab run $(EXPERIMENT) --out runs/$(notdir $(basename $(EXPERIMENT)))

test: setup
	$(VENV)/bin/python -m pytest -v tests

unit: setup
	$(VENV)/bin/python -m pytest -v tests/unit

integration: setup
	$(VENV)/bin/python -m pytest -v tests/integration

bench: setup
	$(VENV)/bin/python bench/bringup.py

clean:
	$(VENV)/bin/fabriclab clean
