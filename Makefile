# Two user-facing targets: `make demo` (the main job) and `make test`. Both create the
# virtualenv and install what they need when it is missing, so a fresh clone needs nothing else.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo demo-gpu test e2e-deployed kind-e2e matrix lint format typecheck unit protos clean venv

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(PY) -m e2e.demo

# The same on a machine with an NVIDIA GPU: one real node on NVML, CUDA in pods checks what it got.
demo-gpu: $(STAMP)
	$(PY) -m e2e.gpu.demo

# CI=true: an unexpected skip fails the run; only tests that need an NVIDIA GPU may skip
# (tests/ci_skips.py).
test: $(STAMP)
	$(MAKE) lint typecheck
	$(MAKE) e2e-deployed
	$(MAKE) kind-e2e
	CI=true $(PY) -m pytest

# The driver deployed as users deploy it: image from the Dockerfile (docker build), chart
# installed with helm on real kubelet + containerd nodes, the scenario suite, an upgrade, an
# uninstall. Installs Docker (Debian's docker.io) when missing. Ends with `N passed, N failed`.
e2e-deployed: $(STAMP)
	$(PY) -m e2e.deployed

# The real-node scenario suite on every supported Kubernetes version (not in `make test`: each
# version's cold build takes 20+ minutes). K8S_VERSIONS="v1.34.4 v1.37.2" picks versions. Prints
# a version x scenario table ending with `N passed, N failed`, kept in docs/development/versions.md only when
# no cell failed or ran nothing (a skip is accepted only for a known gate: e2e/suite/needs.py).
matrix: $(STAMP)
	$(PY) -m e2e.matrix --docs docs/development/versions.md $(MATRIX_ARGS)

# The kind kit (e2e/kind/run.sh) run here: kind, its base and node images built locally, the
# cluster up, the chart installed, the suite, the cluster deleted. Part of `make test`: the design
# names kind as how users test the driver, and a kit nothing runs rots.
kind-e2e: $(STAMP)
	$(PY) -m e2e.kind

# lint-imports: the layers and forbidden imports declared in pyproject.toml (import-linter).
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# mypy --strict over dra_gpu/, e2e/, bench/ and tests/ (pyproject.toml); tests/node in a run of
# its own: its conftest.py would be a second module named `conftest` in the first.
typecheck: $(STAMP)
	$(VENV)/bin/mypy
	MYPYPATH=tests/node $(VENV)/bin/mypy tests/node/*.py

unit: $(STAMP)
	$(PY) -m pytest -m "not cluster and not node"

protos: $(STAMP)
	$(PY) api/generate.py

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .import_linter_cache
