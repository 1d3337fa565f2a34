"""What the simulated server says about itself: SGLang's /server_info and /model_info, OpenAI's /v1/models."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import SGLANG_VERSION
from ..choices import DRAFT_MODEL_ALGORITHMS

if TYPE_CHECKING:
    from .server import Simulator


def server_args(sim: Simulator) -> dict[str, Any]:
    """The subset of SGLang's resolved ServerArgs that /server_info reports, as the profile implies them."""
    p, spec = sim.profile, sim.profile.speculative
    args: dict[str, Any] = {
        "model_path": p.model_path,
        "tokenizer_path": p.model_path,
        "served_model_name": sim.served_model_name,
        "host": sim.host,
        "port": sim.port,
        "tp_size": p.tp_size,
        "max_running_requests": p.max_running_requests,
        "context_length": p.context_length,
        "stream_interval": p.stream_interval,
        "incremental_streaming_output": False,
        "enable_metrics": True,
        "speculative_algorithm": spec.algorithm if spec else None,
        # A separate draft model only (NEXTN drafts with the target's layers, NGRAM and SUFFIX from the context).
        "speculative_draft_model_path": f"{p.model_path}-draft" if spec and spec.algorithm in DRAFT_MODEL_ALGORITHMS else None,
        "speculative_num_steps": spec.num_steps if spec else None,
        "speculative_eagle_topk": spec.eagle_topk if spec else None,
        "speculative_num_draft_tokens": p.resolved_num_draft_tokens,
        # SGLang reports the resolved flag: False when it switched the mode off (see Profile.adaptive_unsupported_reason).
        "speculative_adaptive": p.adaptive_active,
        "speculative_adaptive_config": p.adaptive.path if p.adaptive else None,
    }
    argv = ["sglang", "serve", "--model-path", p.model_path, "--tp-size", str(p.tp_size)]
    if spec:
        argv += [
            "--speculative-algorithm",
            spec.algorithm,
            "--speculative-num-steps",
            str(spec.num_steps),
            "--speculative-eagle-topk",
            str(spec.eagle_topk),
            "--speculative-num-draft-tokens",
            str(spec.num_draft_tokens),
        ]
    if p.adaptive is not None:
        argv.append("--speculative-adaptive")
        if p.adaptive.path is not None:
            argv += ["--speculative-adaptive-config", p.adaptive.path]
    args["launch_command"] = " ".join(argv)
    return args


def server_info(sim: Simulator) -> dict[str, Any]:
    engine = sim.engine
    state: dict[str, Any] = {"last_gen_throughput": engine.last_gen_throughput, "memory_usage": {}}
    if sim.profile.speculative is not None:
        state["avg_spec_accept_length"] = engine.avg_spec_accept_length
    return {
        **server_args(sim),
        "max_total_num_tokens": sim.profile.max_running_requests * sim.profile.context_length,
        "startup_time": sim.startup_time,
        "internal_states": [state],
        "version": SGLANG_VERSION,
        "frontend": "python",
        # Not in SGLang: says plainly that this is a simulator, and which model it runs.
        "simulator": {"profile": sim.profile.name, "time_scale": sim.time_scale, **adaptive_state(sim)},
    }


def adaptive_state(sim: Simulator) -> dict[str, Any]:
    """Not in SGLang: the adaptive config's source, each bucket's current steps, or why SGLang would not run it."""
    config = sim.profile.adaptive
    if config is None:
        return {}
    state: dict[str, Any] = {"source": config.source, "disabled_reason": sim.profile.adaptive_unsupported_reason}
    adaptive = sim.engine.adaptive
    state["steps_by_batch_size"] = adaptive.steps_by_bucket() if adaptive is not None else None
    return {"adaptive": state}


def model_info(sim: Simulator) -> dict[str, Any]:
    return {
        "model_path": sim.profile.model_path,
        "served_model_name": sim.served_model_name,
        "tokenizer_path": sim.profile.model_path,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": None,
        "architectures": None,
    }


def models(sim: Simulator) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {
                "id": sim.served_model_name,
                "object": "model",
                "created": int(sim.startup_time),
                "owned_by": "sglang",
                "root": sim.served_model_name,
                "max_model_len": sim.profile.context_length,
            }
        ],
    }
