# specdec-operator developer entrypoints. `make test` is what CI runs (.ci/run).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Kubernetes, etcd, kwok and helm binaries are built once into this cache (outside the checkout).
SPECDEC_TOOLS_DIR ?= $(HOME)/.cache/specdec-operator/bin
export SPECDEC_TOOLS_DIR
SGLANG_VERSION ?= 0.5.23

.PHONY: help venv tools cluster-up cluster-down test test-unit crd demo manifests clean

help:
	@echo "make demo         bring up a local control plane, run the operator on the examples, show the decisions"
	@echo "make test         install everything into $(VENV), build the control-plane tools, run the whole suite"
	@echo "make tools        build kube-apiserver/controller-manager/scheduler, etcd, kwok, helm into $(SPECDEC_TOOLS_DIR)"
	@echo "make cluster-up   start the local control plane with simulated GPU nodes (cluster-down stops it)"
	@echo "make crd          regenerate crds/, the chart's copy and docs/api.md from the pydantic API"
	@echo "make manifests    render dist/install.yaml for users without Helm"

# The virtualenv is rebuilt when pyproject.toml changes. SGLang is installed without its dependencies:
# the tests only need its argument parser and its benchmark client, not its GPU runtime.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[training,dev]'
	$(PY) -m pip install --quiet --no-deps sglang==$(SGLANG_VERSION)
	touch $@

venv: $(VENV)/.installed

tools:
	hack/tools.sh

cluster-up: tools venv
	$(PY) hack/devcluster.py up

cluster-down:
	$(PY) hack/devcluster.py down

crd: venv
	$(VENV)/bin/specdec crd > crds/specdec.io_speculativeservers.yaml
	$(VENV)/bin/specdec crd --reference > docs/api.md
	@if [ -d charts/specdec-operator/crds ]; then cp crds/specdec.io_speculativeservers.yaml charts/specdec-operator/crds/; fi

test: venv tools
	$(VENV)/bin/pytest

test-unit: venv
	$(VENV)/bin/pytest -m "not cluster"

demo: venv tools
	$(PY) hack/demo.py

manifests: venv tools
	hack/manifests.sh

clean:
	rm -rf $(VENV) dist build
