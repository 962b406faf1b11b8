# Squall: two commands on a fresh Debian/Ubuntu machine (as root):
#   make demo    the main job: a small cluster and the default experiment
#   make test    the tests (unit + integration on real containers)
# Each bootstraps what it needs (virtualenv, Docker engine, worker image) and rebuilds nothing
# that did not change.

SHELL := /bin/bash
VENV  := .venv
PY    := $(VENV)/bin/python
SQUALL := $(VENV)/bin/squall
PYTEST_ARGS ?=

.PHONY: demo test unit integration matrix venv docker image lint typecheck bench bench-allreduce fuzz gc clean help test-netem

help:
	@echo "make demo | test | unit | integration | matrix | lint | typecheck | bench | bench-allreduce | fuzz | gc | clean"

venv:
	@scripts/ensure-venv.sh

docker:
	@scripts/ensure-docker.sh

image: venv docker
	@$(SQUALL) image build
	@$(SQUALL) image prune >/dev/null || true  # an image still in use is kept

demo: image
	@$(SQUALL) demo

# The unit tests need no Docker and share nothing: they run on both cores (pytest-xdist). The
# containers' tests run one at a time, as their timing judges the host they share.
UNIT_WORKERS ?= 2

test: image
	@$(VENV)/bin/ruff check .
	@$(VENV)/bin/mypy
	@$(VENV)/bin/pytest tests/unit -n $(UNIT_WORKERS) --durations=15 $(PYTEST_ARGS)
	@$(VENV)/bin/pytest tests/integration tests/matrix --durations=25 --module-times=results/test-times.json $(PYTEST_ARGS)

unit: venv
	@$(VENV)/bin/pytest tests/unit -n $(UNIT_WORKERS) $(PYTEST_ARGS)

integration: image
	@$(VENV)/bin/pytest tests/integration tests/matrix $(PYTEST_ARGS)

# The netem backend on a netem kernel: a Debian kernel under QEMU TCG runs its suites (scripts/netem-vm/);
# each guest test is a test of tests/integration/test_netem_vm.py (6-9 min). make test runs it too
# (SQUALL_NETEM_VM=0 switches it off there, refused under CI=true); this target runs it alone.
test-netem: venv
	@SQUALL_NETEM_VM=1 $(VENV)/bin/pytest -rA tests/integration/test_netem_vm.py $(PYTEST_ARGS)

# The swarm engine (docs/swarm.md): a one-node swarm here, then two Docker-in-Docker nodes joined as workers
# (both also run in make test).
.PHONY: test-swarm
test-swarm: image
	@$(VENV)/bin/pytest tests/integration/test_cluster_swarm_engine.py tests/integration/test_cluster_swarm_two_nodes.py tests/unit/test_cluster_swarm_wire.py tests/unit/test_cluster_swarm_dind.py tests/unit/test_cluster_backend.py $(PYTEST_ARGS)

matrix: image
	@$(SQUALL) matrix matrices/full.yaml --report results/matrix

lint: venv
	@$(VENV)/bin/ruff check .

typecheck: venv
	@$(VENV)/bin/mypy

bench: image
	@$(PY) benchmarks/cluster.py --workers 4,8,16 --json results/bench-cluster.json

bench-allreduce: image
	@$(PY) benchmarks/allreduce.py --workers 4,8 --sizes 4KB,1MB,16MB,64MB --profiles lan,wan-5ms,thin-100mbit \
		--json results/bench-allreduce.json

bench-compression: image
	@$(PY) benchmarks/compression.py --workers 4 --sizes 1MB,4MB --profiles thin-20mbit,thin-100mbit \
		--json results/bench-compression.json

# Coverage-guided fuzzing of every decoder (fuzz/README.md): FUZZ_RUNS inputs per target, or
# FUZZ_SECONDS per target when set (0: no time limit); table on stdout, results/fuzz.json.
FUZZ_RUNS ?= 1000000
FUZZ_SECONDS ?= 0
fuzz: venv
	@$(PY) -m fuzz.run all --runs $(FUZZ_RUNS) --seconds $(FUZZ_SECONDS) --json results/fuzz.json

gc: venv docker
	@$(SQUALL) gc

clean: venv
	-@$(SQUALL) gc --all
	rm -rf $(VENV) containers/.wheelhouse

# The installable package: dist/squall-<version>-py3-none-any.whl, carrying the profiles, the image
# recipe, claims.yaml and matrices/ as package data (setup.py); pip install it anywhere.
.PHONY: wheel
wheel: venv
	@rm -rf build  # setuptools would reuse stale modules from an earlier build
	@$(PY) -m pip wheel --quiet --no-deps --no-build-isolation -w dist .
	@ls -l dist/squall-*.whl
