"""SGLang behind the Engine interface: command lines per release (../sglang.py), the sglang: gauges, /server_info
and /generate, and `--speculative-adaptive-config` for load-aware speculation."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .. import enginefacts
from .. import sglang as argv
from ..api import SpeculativeServerSpec, Variant
from ..choices import DRAFT_MODEL_ALGORITHMS
from ..enginefacts import SGLANG_ACCEPT_LENGTH_METRIC as ACCEPT_LENGTH_METRIC
from ..enginefacts import SGLANG_GENERATED_TOKENS_METRIC as GENERATED_TOKENS_METRIC
from ..enginefacts import SGLANG_THROUGHPUT_METRIC as THROUGHPUT_METRIC
from ..enginefacts import SGLANG_VERIFY_CALLS_METRIC as VERIFY_CALLS_METRIC
from . import HealthPaths, HttpRequest, ServerInfo, SpecMetrics

GENERATE_PATH, CHAT_PATH = "/generate", "/v1/chat/completions"

# SGLang 0.5.23 gives the draft model the target's context length and refuses to start when the drafter's own
# max_position_embeddings is shorter (public EAGLE-3 drafters often say 2048) unless this variable is set. The
# validator reports the gap as ContextLengthExceedsDrafter and the probe measures what it costs; a server that
# cannot start would only crash-loop on 8 GPUs.
ALLOW_LONGER_DRAFT_CONTEXT_ENV = "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"

# Flags of sglang.extraArgs under which SGLang 0.5.23's adaptive_unsupported_reason says no
# (sglang/srt/speculative/adaptive_spec_params.py in the installed wheel).
_ADAPTIVE_UNSUPPORTED_FLAGS = {
    "--enable-dp-attention": "attention DP is not supported (adaptive tier decisions are not synchronized across DP ranks)",
    "--enable-multi-layer-eagle": "enable_multi_layer_eagle=True is not supported (MultiLayerEagleWorkerV2 does not implement adaptive)",
    "--enable-two-batch-overlap": "enable_two_batch_overlap=True is not supported (adaptive state swap would discard the TboAttnBackend wrapper)",
    "--enable-pdmux": "enable_pdmux=True is not supported (adaptive state swap does not update decode_attn_backend_group)",
}


def _number(metrics: Mapping[str, float], key: str) -> float | None:
    value = metrics.get(key)
    if value is None and key.endswith("_total"):
        value = metrics.get(key[: -len("_total")])
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


class SGLangEngine:
    facts = enginefacts.SGLANG
    name: str = facts.name
    cli_name: str = facts.cli_name
    container_name = "sglang"
    validator_args: tuple[str, ...] = ()  # the validator's default engine (and the pod templates of before spec.engine)
    # readiness: a real one-token generation (/health_generate answers within 20 s when the server is healthy).
    health = HealthPaths(startup="/health", readiness="/health_generate", liveness="/health")
    info_path = "/server_info"
    metric_prefix = facts.metric_prefix
    metric_names = facts.metric_names
    metric_labels: tuple[str, ...] = ()
    acceptance_from_counters = False
    adaptive_config_file = True  # --speculative-adaptive-config PATH
    idle_spin_s = 0.0  # not measured here (SGLang needs GPUs); its simulators do not spin
    metric_reduce = "mean"  # every TP rank's scheduler reports the same gauges under its own tp_rank label

    def render_argv(
        self,
        spec: SpeculativeServerSpec,
        variant: Variant | str,
        *,
        adaptive_config_path: str | None = None,
        adaptive_config: str | None = None,
        worker: bool = False,
    ) -> list[str]:
        del adaptive_config  # SGLang reads the table from the mounted file
        return argv.render_argv(spec, variant, adaptive_config_path=adaptive_config_path, worker=worker)

    def container_env(self, spec: SpeculativeServerSpec, variant: Variant | str) -> list[dict[str, Any]]:
        # Only a separate draft model has a context length of its own (NEXTN's are the target's layers, NGRAM has none).
        if Variant(variant) is Variant.SPECULATIVE and spec.drafter.algorithm in DRAFT_MODEL_ALGORITHMS:
            return [{"name": ALLOW_LONGER_DRAFT_CONTEXT_ENV, "value": "1"}]
        return []

    def user_env(self, spec: SpeculativeServerSpec) -> list[dict[str, Any]]:
        return list(spec.sglang.env)

    def read_metrics(self, metrics: Mapping[str, float]) -> SpecMetrics:
        return SpecMetrics(
            accept_length=_number(metrics, ACCEPT_LENGTH_METRIC),
            throughput=_number(metrics, THROUGHPUT_METRIC),
            verify_calls=_number(metrics, VERIFY_CALLS_METRIC),
            generated_tokens=_number(metrics, GENERATED_TOKENS_METRIC),
        )

    def request_model_name(self, spec: SpeculativeServerSpec) -> str:
        return "default"  # SGLang's OpenAI server answers to any model name

    def server_info(self, data: Mapping[str, Any]) -> ServerInfo:
        cap = data.get("max_running_requests")
        algorithm = data.get("speculative_algorithm")
        return ServerInfo(
            max_running_requests=cap if isinstance(cap, int) and not isinstance(cap, bool) else None,
            speculating=algorithm not in (None, "", "None"),
            model="default",  # SGLang's OpenAI server answers to any model name
        )

    def random_ids_request(self, ids: Sequence[int], max_tokens: int, *, model: str) -> HttpRequest:
        body = {
            "input_ids": list(ids),
            "sampling_params": {"max_new_tokens": max_tokens, "ignore_eos": True, "temperature": 0.0},
            "stream": True,
        }
        return HttpRequest(GENERATE_PATH, body)

    def text_request(self, text: str, messages: list[dict[str, Any]], *, chat: bool, max_tokens: int, fixed: bool, model: str) -> HttpRequest:
        if chat:
            body: dict[str, Any] = {
                "model": model,
                "messages": messages,
                "max_completion_tokens": max_tokens,
                "temperature": 0.0,
                "stream": True,
                # SGLang's OpenAI server: a usage object in every chunk, so tokens are counted as SGLang counts them.
                "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            }
            if fixed:
                body["ignore_eos"] = True
            return HttpRequest(CHAT_PATH, body)
        params: dict[str, Any] = {"max_new_tokens": max_tokens, "temperature": 0.0}
        if fixed:
            params["ignore_eos"] = True
        return HttpRequest(GENERATE_PATH, {"text": text, "sampling_params": params, "stream": True})

    def output_request(self, *, text: str | None, ids: Sequence[int] | None, max_tokens: int, model: str) -> HttpRequest:
        params = {"max_new_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}
        prompt: dict[str, Any] = {"input_ids": list(ids)} if ids is not None else {"text": text}
        return HttpRequest(GENERATE_PATH, {**prompt, "sampling_params": params})

    def output_ids(self, data: Mapping[str, Any]) -> list[int]:
        ids = data["output_ids"]
        if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
            raise TypeError("output_ids")
        return ids

    def adaptive_document(self, no_draft_from: int, num_steps: int, spec: SpeculativeServerSpec | None = None) -> Any:
        # Each bucket has a single candidate, so SGLang's EMA never moves it (loadaware.py says why).
        return {"1": {"candidate_steps": [num_steps]}, str(no_draft_from): {"candidate_steps": [0]}}

    def adaptive_unsupported_reason(self, spec: SpeculativeServerSpec) -> str | None:
        drafter = spec.drafter
        if drafter.algorithm not in ("EAGLE", "EAGLE3"):
            return f"speculative_algorithm={drafter.algorithm} (only EAGLE/EAGLE3 are supported)"
        if drafter.eagle_topk != 1:
            return f"speculative_eagle_topk={drafter.eagle_topk} (only topk=1 is supported)"
        for arg in spec.sglang.extra_args:
            reason = _ADAPTIVE_UNSUPPORTED_FLAGS.get(arg.split("=", 1)[0])
            if reason is not None:
                return reason
        return None


SGLANG = SGLangEngine()
