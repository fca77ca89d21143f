# Two user-facing targets: `make demo` (the main job) and `make test`. Both create the
# virtualenv and install what they need when it is missing, so a fresh clone needs nothing else.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo demo-gpu test e2e-deployed matrix lint format typecheck unit protos clean venv

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

test: $(STAMP)
	$(MAKE) lint typecheck
	$(MAKE) e2e-deployed
	$(PY) -m pytest

# The driver deployed as users deploy it: image from the Dockerfile (docker build), chart
# installed with helm on real kubelet + containerd nodes, the scenario suite, an upgrade, an
# uninstall. Installs Docker (Debian's docker.io) when missing. Ends with `N passed, N failed`.
e2e-deployed: $(STAMP)
	$(PY) -m e2e.deployed

# The real-node scenario suite on every supported Kubernetes version (not in `make test`: each
# version's cold build takes 20+ minutes). K8S_VERSIONS="v1.34.4 v1.37.2" picks versions. Prints
# a version x scenario table ending with `N passed, N failed`, kept in docs/versions.md.
matrix: $(STAMP)
	$(PY) -m e2e.matrix --docs docs/versions.md

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

unit: $(STAMP)
	$(PY) -m pytest -m "not cluster and not node"

protos: $(STAMP)
	$(PY) api/generate.py

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
