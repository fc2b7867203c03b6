# fabriclab: `make run` brings up the default fabric, checks it and tears it down;
# `make test` runs the unit and integration tests. Both do the set-up themselves.
VENV ?= .venv
EXPERIMENT ?= experiments/quickstart.yaml

.PHONY: setup run test unit integration bench clean

setup:
	./scripts/setup.sh

run: setup
	$(VENV)/bin/fabriclab up --check -v $(EXPERIMENT)

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
