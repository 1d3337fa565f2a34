"""Where every engine's server listens and finds its models: the same for SGLang and vLLM, so that pods, Services and
probes need not ask which engine runs (vLLM's renderer takes these from here, not from SGLang's module)."""

from __future__ import annotations

import posixpath

from ..api import SpeculativeServerSpec
from ..choices import DRAFT_MODEL_ALGORITHMS

# SGLang's own default port (kept for vLLM too); the pods, Services and probes all use it.
SERVER_PORT = 30000
# A pod must listen on every interface; SGLang's default is 127.0.0.1.
LISTEN_HOST = "0.0.0.0"


def server_port(spec: SpeculativeServerSpec) -> int:
    """The port both servers listen on (HTTP API, /health, /metrics)."""
    del spec  # The same for every spec today; a parameter so that callers need not change if it becomes one.
    return SERVER_PORT


def _under_mount(spec: SpeculativeServerSpec, path: str) -> str:
    """A path relative to model.mountPath made absolute; absolute paths (under the mount) are kept."""
    return posixpath.normpath(posixpath.join(spec.model.mount_path, path))


def target_model_path(spec: SpeculativeServerSpec) -> str:
    """Where the target's weights are inside the server container."""
    return _under_mount(spec, spec.target.path)


def draft_model_path(spec: SpeculativeServerSpec) -> str | None:
    """Where the draft's weights are inside the container; None for NEXTN (the target's own MTP layers), NGRAM and
    SUFFIX (no drafter)."""
    if spec.drafter.algorithm not in DRAFT_MODEL_ALGORITHMS or spec.drafter.path is None:
        return None
    return _under_mount(spec, spec.drafter.path)
