# fabriclab: `make run` checks the default fabric's reachability, then runs its workload
# (results in runs/<experiment>/results.json);
# `make test` runs every test: unit (once as an unprivileged user too), integration and the lab
# VM's. Both do the set-up themselves
# (as root): `make run` what a fabric on this host needs, the tests everything they use
# (scripts/test-deps.sh). `make unit` runs the unit tests only, as any user (it needs
# python3-venv, nothing else); `make integration` and `make lab` one kind each.
VENV ?= .venv
EXPERIMENT ?= experiments/quickstart.yaml

.PHONY: setup test-deps venv run test unit unit-as-user integration cluster-test lab bench clean

setup:
	./scripts/setup.sh

test-deps:
	./scripts/test-deps.sh

venv:
	./scripts/venv.sh

run: setup
	$(VENV)/bin/fabriclab up --check $(EXPERIMENT)
	$(VENV)/bin/fabriclab run $(EXPERIMENT) --out runs/$(notdir $(basename $(EXPERIMENT))) --force

# every test but the lab VM's (`make lab`: tens of minutes under CPU emulation, run on changes to
# what it covers; docs/testing.md)
test: setup test-deps
	VENV=$(VENV) ./scripts/unit-as-user.sh
	$(VENV)/bin/python -m pytest -v --durations=15 -m "not lab" tests

unit:
	FABRICLAB_VENV=$(abspath $(VENV)) FABRICLAB_EXTRAS=test,cluster,grafana,frames FABRICLAB_GROUPS=dev \
	  ./scripts/venv.sh
	$(VENV)/bin/python -m pytest -v -m "not integration" tests/unit

# the unit suite as an unprivileged user (nobody), from root; part of `make test`
unit-as-user: setup test-deps
	VENV=$(VENV) ./scripts/unit-as-user.sh

integration: setup test-deps
	$(VENV)/bin/python -m pytest -v -m integration tests/integration

# machines as network namespaces with Ray nodes: cut links as VXLAN, actors pinned per machine
# (also part of `make test` and `make integration`)
cluster-test: setup test-deps
	$(VENV)/bin/python -m pytest -v tests/integration/test_cluster.py tests/integration/test_cluster_runs.py

# the lab VM: installs vagrant and libvirt, builds the local box once, vagrant up, destroy
lab: setup test-deps
	$(VENV)/bin/python -m pytest -v -s -m lab tests/lab

bench: setup
	$(VENV)/bin/python bench/bringup.py

clean:
	$(VENV)/bin/fabriclab clean
