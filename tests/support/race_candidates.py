"""The real-engine race's candidates as the operator renders them, and their vLLM servers (issue 35, item 5).

One SpeculativeServer spec names the copy target (tests/support/copy_models.py) and three candidates: spec.drafter
its EAGLE-3 drafter (named ``eagle3``), ``ngram`` (prompt lookup, 2-4 token matches) and ``draft-model`` (STANDALONE:
the smaller draft model of the target's tokenizer, vLLM's ``draft_model``), 3 draft tokens each. A candidate's
--speculative-config is what the operator serves it with: resource.parse_spec with admission's rules,
api.spec_for_candidate and the vLLM engine's render_argv; only the draft model's path moves from the pod's /models
mount to the local build.

From a test (one pair at a time on a 2-core machine; each server ~3 GiB resident):

    models = copy_models()
    base = base_server(models, tmp / "base.log")                         # core 0
    spec = candidate_server(models, "draft-model", tmp / "dm.log")      # core 1; or "eagle3", "ngram"
    start_servers([base, spec]); ...; base.stop(); spec.stop()
"""

from __future__ import annotations

import json
import posixpath
from pathlib import Path
from typing import Any

from specdec_operator.api import spec_for_candidate
from specdec_operator.engines import engine_for
from specdec_operator.resource import parse_spec
from tests.support.copy_models import CopyModels
from tests.support.vllm_servers import VllmServer

MOUNT = "/models"
NUM_STEPS = 3
CANDIDATES = ["eagle3", "ngram", "draft-model"]


def race_spec(eagle3: str = "drafter-copy-vllm") -> dict[str, Any]:
    """The SpeculativeServer spec of the race: the copy target and its three candidates (paths under /models; `eagle3`
    the EAGLE-3 drafter's)."""
    return {
        "engine": "vLLM",
        "image": "vllm/vllm-openai:v0.32.0",
        "model": {"mountPath": MOUNT, "volume": {"persistentVolumeClaim": {"claimName": "weights"}}},
        "target": {"path": "target-copy"},
        "drafter": {"path": eagle3, "numSteps": NUM_STEPS},
        "candidates": [
            {"name": "ngram", "algorithm": "NGRAM", "numSteps": NUM_STEPS, "ngram": {"minMatch": 2, "maxMatch": 4}},
            {"name": "draft-model", "algorithm": "STANDALONE", "path": "draft-copy", "numSteps": NUM_STEPS},
        ],
    }


def rendered_config(name: str, models: CopyModels) -> dict[str, Any]:
    """Candidate `name`'s --speculative-config as the operator renders it, its draft model moved from /models to the build."""
    root = models.root
    spec = spec_for_candidate(parse_spec(race_spec(str(models.eagle3.relative_to(root))), check_rules=True), name)
    argv = engine_for(spec).render_argv(spec, "speculative")
    config: dict[str, Any] = json.loads(argv[argv.index("--speculative-config") + 1])
    if "model" in config:
        config["model"] = str(root / posixpath.relpath(config["model"], MOUNT))
    return config


def base_server(models: CopyModels, log: Path, core: str = "0") -> VllmServer:
    """The copy target without speculation (the tier's local flags: float32, 64 MiB KV cache, one core)."""
    return VllmServer("base", models.target, log, core=core)


def candidate_server(models: CopyModels, name: str, log: Path, core: str = "1") -> VllmServer:
    """The copy target served with candidate `name` (one of CANDIDATES)."""
    return VllmServer(name, models.target, log, core=core, speculative=rendered_config(name, models))
