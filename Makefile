# specdec-operator developer entrypoints. `make test` is what CI runs (.ci/run).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Kubernetes, etcd, kwok and helm binaries are built once into this cache (outside the checkout).
SPECDEC_TOOLS_DIR ?= $(HOME)/.cache/specdec-operator/bin
export SPECDEC_TOOLS_DIR
SGLANG_VERSION ?= 0.5.23
# Image names, tags and pinned bases (one place, shared with the chart): OPERATOR_IMAGE, OPERATOR_TAG, ...
include images/images.env

.PHONY: help venv tools cluster-up cluster-down lint test test-unit crd demo manifests images clean

help:
	@echo "make demo         bring up a local control plane, run the operator on the examples, show the decisions"
	@echo "make test         install everything into $(VENV), build the control-plane tools, lint, run the whole suite"
	@echo "make lint         ruff (lint and format check) and mypy over the tree (configured in pyproject.toml)"
	@echo "make tools        build kube-apiserver/controller-manager/scheduler, etcd, kwok, helm into $(SPECDEC_TOOLS_DIR)"
	@echo "make cluster-up   start the local control plane with simulated GPU nodes (cluster-down stops it)"
	@echo "make crd          regenerate crds/, the chart's copy and docs/api.md from the pydantic API"
	@echo "make manifests    render dist/install.yaml for users without Helm"
	@echo "make images       build the operator and drafter-training images (names and tags: images/images.env)"

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
	cp crds/specdec.io_speculativeservers.yaml charts/specdec-operator/crds/

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

test: venv lint tools
	$(VENV)/bin/pytest

test-unit: venv
	$(VENV)/bin/pytest -m "not cluster"

demo: venv tools
	$(PY) hack/demo.py

manifests: venv tools
	hack/manifests.sh

# Needs a Docker/BuildKit engine (not available on the CI machine; the Dockerfiles are linted by tests/test_images.py).
images:
	docker build -f images/operator/Dockerfile --build-arg BASE_IMAGE=$(OPERATOR_BASE_IMAGE) \
	  --build-arg VERSION=$(OPERATOR_TAG) -t $(OPERATOR_IMAGE):$(OPERATOR_TAG) .
	docker build -f images/drafter-training/Dockerfile --build-arg BASE_IMAGE=$(TRAINING_BASE_IMAGE) \
	  --build-arg VERSION=$(TRAINING_TAG) --build-arg TORCH_VERSION=$(TRAINING_TORCH_VERSION) \
	  -t $(TRAINING_IMAGE):$(TRAINING_TAG) .

clean:
	rm -rf $(VENV) dist build
