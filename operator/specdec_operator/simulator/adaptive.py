"""SGLang 0.5.23's adaptive speculative decoding (``--speculative-adaptive``), reimplemented for the simulator.

Written from SGLang's own code, not imported from it (the package does not depend on sglang):
``srt/speculative/adaptive_spec_params.py`` (the rule and its config file), ``srt/arg_groups/speculative_hook.py``
(when the mode is switched off, what is checked at startup), ``srt/speculative/eagle_worker_v2.py`` and
``srt/managers/scheduler_components/batch_result_processor.py`` (how each decode batch uses it).

The rule, as SGLang runs it:

* The config has one slot per batch-size bucket (its integer-string keys). A decode batch of ``b`` requests is
  padded up to the next CUDA-graph batch size and served by the slot of the largest bucket at or below that
  (the smallest bucket when there is none).
* Each slot holds its current ``num_steps``, one of its ``candidate_steps``: the initial ``--speculative-num-steps``
  when it is a candidate, else the middle candidate. Steps 0 means no drafting: a one-token "verify" that is a
  plain target step (the drafter's one-token extend still runs, so its KV stays warm for when steps come back).
* After every decode batch, the slot that served it gets the per-request accepted draft counts. While its steps
  are above 0 it folds their mean into an EMA (``ema_alpha``, starting at ``steps - 1``); at steps 0 the EMA is
  left alone (nothing was drafted) but the batch still counts.
* The first ``warmup_batches`` batches change nothing; after them, every ``update_interval``-th batch recomputes
  the steps: from steps 0 it probes the next candidate up; otherwise it steps down past each lower candidate whose
  threshold (``c - 0.5``, or ``0.5`` for candidate 0, plus ``down_hysteresis``) the EMA is at or below, and if it
  did not step down, up past each candidate whose ``c - 0.5 + up_hysteresis`` the EMA exceeds; ``ceiling_coeff``
  > 0 caps a target that is not a step up at ``max(1, ceil(ema * ceiling_coeff))``.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputError

# SGLang's DEFAULT_ADAPTIVE_CONFIG: what --speculative-adaptive without a config file uses.
DEFAULT_ADAPTIVE_CONFIG: dict[str, Any] = {
    "1": {"candidate_steps": [1, 3, 5, 7], "up_hysteresis": 0.0, "down_hysteresis": -0.25, "ceiling_coeff": 0},
    "8": {"candidate_steps": [0, 1, 3], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
    "32": {"candidate_steps": [0, 1], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
    "64": {"candidate_steps": [0], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
}

# The knobs a slot reads (from its own entry, else from the top level of the config) and SGLang's defaults.
KNOB_DEFAULTS: dict[str, float] = {
    "ema_alpha": 0.2,
    "update_interval": 5,
    "warmup_batches": 10,
    "down_hysteresis": -0.25,
    "up_hysteresis": 0.0,
    "ceiling_coeff": 0,
}
_INTEGER_KNOBS = ("update_interval", "warmup_batches")


@dataclass(frozen=True)
class SlotConfig:
    """One batch-size bucket's candidate steps and knobs."""

    candidate_steps: tuple[int, ...]  # sorted, no repeats
    ema_alpha: float = 0.2
    update_interval: int = 5
    warmup_batches: int = 10
    down_hysteresis: float = -0.25
    up_hysteresis: float = 0.0
    ceiling_coeff: float = 0


@dataclass(frozen=True)
class AdaptiveConfig:
    """A validated adaptive config: its buckets, and where it came from (for /server_info and error messages)."""

    buckets: tuple[tuple[int, SlotConfig], ...]  # sorted by batch size
    source: str
    path: str | None = None  # the --speculative-adaptive-config file, when it came from one

    @property
    def candidate_steps(self) -> list[int]:
        """Every bucket's candidates together: SGLang requires --speculative-num-steps to be one of them."""
        return sorted({s for _, slot in self.buckets for s in slot.candidate_steps})


def adaptive_config_from_dict(data: Any, source: str, path: str | None = None) -> AdaptiveConfig:
    """Validate a config in SGLang's format; InputError names the source and the key.

    Accepted exactly as SGLang accepts it: keys that are not integer strings are knobs or ignored; every integer
    key needs a non-empty ``candidate_steps`` list of ints >= 0 (SGLang's message); at least one integer key.
    Stricter than SGLang where SGLang would fail later, mid-serving or with a traceback: the config and each
    entry must be JSON objects, knobs must be numbers, ``update_interval`` and ``warmup_batches`` integers,
    ``update_interval`` >= 1.
    """
    if not isinstance(data, dict):
        raise InputError(f"{source}: an adaptive config must be a JSON object, got {type(data).__name__}")
    top = _knobs(data, f"{source}")
    buckets: list[tuple[int, SlotConfig]] = []
    for key, entry in data.items():
        if not key.isdigit():
            continue
        if not isinstance(entry, dict):
            raise InputError(f"{source}: BS {key}: must be an object with candidate_steps, got {entry!r}")
        steps = entry.get("candidate_steps")
        if not isinstance(steps, list) or not steps or not all(isinstance(s, int) and s >= 0 for s in steps):
            # SGLang's own message (adaptive_spec_params._load_adaptive_config).
            raise InputError(f"{source}: BS {key}: candidate_steps must be a list of non-negative ints, got {steps!r}")
        knobs = {**top, **_knobs(entry, f"{source}: BS {key}")}
        buckets.append((int(key), SlotConfig(candidate_steps=tuple(sorted(set(steps))), **knobs)))
    if not buckets:
        raise InputError(
            f"{source}: speculative_adaptive_config must contain at least one integer-string BS key, "
            f'e.g. {{"1": {{"candidate_steps": [1,3,7]}}}}. Got keys: {list(data.keys())}'
        )
    buckets.sort(key=lambda bucket: bucket[0])
    return AdaptiveConfig(buckets=tuple(buckets), source=source, path=path)


def _knobs(data: dict, where: str) -> dict[str, Any]:
    knobs: dict[str, Any] = {}
    for key in KNOB_DEFAULTS:
        if key not in data:
            continue
        value = data[key]
        if key in _INTEGER_KNOBS:
            ok = isinstance(value, int) and not isinstance(value, bool) and (key != "update_interval" or value >= 1)
            if not ok:
                least = ">= 1" if key == "update_interval" else "(batches)"
                raise InputError(f"{where}: {key} must be an integer {least}, got {value!r}")
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InputError(f"{where}: {key} must be a number, got {value!r}")
        knobs[key] = value
    return knobs


def load_adaptive_config(path: str) -> AdaptiveConfig:
    """Read ``--speculative-adaptive-config PATH`` (JSON in SGLang's format)."""
    file = Path(path)
    try:
        text = file.read_text()
    except OSError as exc:
        raise InputError(f"--speculative-adaptive-config {path}: cannot read it ({exc.strerror or exc})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    return adaptive_config_from_dict(data, path, path=path)


def default_adaptive_config() -> AdaptiveConfig:
    return adaptive_config_from_dict(DEFAULT_ADAPTIVE_CONFIG, "SGLang's default adaptive config")


def adaptive_unsupported_reason(algorithm: str | None, eagle_topk: int | None) -> str | None:
    """Why SGLang switches --speculative-adaptive off for this server, in SGLang's words; None when it runs.

    SGLang (speculative_hook._maybe_disable_adaptive) does not refuse to start: it logs
    ``speculative_adaptive disabled: REASON. Falling back to static speculative params.`` and serves statically.
    Of its reasons only these two can apply to a simulated server (no attention DP, no platform worker, no
    multi-layer EAGLE, no two-batch overlap, no PD multiplexing).
    """
    if algorithm not in ("EAGLE", "EAGLE3"):
        return f"speculative_algorithm={algorithm} (only EAGLE/EAGLE3 are supported)"
    if eagle_topk is not None and eagle_topk != 1:
        return f"speculative_eagle_topk={eagle_topk} (only topk=1 is supported)"
    return None


def disabled_warning(reason: str) -> str:
    """SGLang's warning line when the mode is switched off."""
    return f"speculative_adaptive disabled: {reason}. Falling back to static speculative params."


def speculative_cuda_graph_batch_sizes(max_bs: int) -> list[int]:
    """The decode CUDA-graph batch sizes SGLang captures for a speculative server (cuda_graph_hook.py).

    A batch is padded up to one of these before its adaptive slot is looked up, so e.g. a batch of 31 is served
    by bucket 32's slot.
    """
    sizes = [*range(1, 9), *range(10, 33, 2), *range(40, 65, 4), *range(72, 257, 8), *range(272, max_bs + 1, 16)]
    sizes = [s for s in sizes if s <= max_bs]
    if max_bs not in sizes:
        sizes.append(max_bs)
    return sizes


class StepSlot:
    """One bucket's adaptive state: its current steps and the EMA of accepted drafts per request."""

    def __init__(self, config: SlotConfig, initial_steps: int) -> None:
        self.config = config
        candidates = config.candidate_steps
        self.steps = initial_steps if initial_steps in candidates else candidates[len(candidates) // 2]
        # Neutral start: as if every draft but the last were accepted. -1 for a slot that starts at steps 0.
        self.ema = float(self.steps - 1)
        self.batches = 0  # decode batches this slot has served

    def observe(self, correct_drafts: Sequence[int]) -> bool:
        """Fold one verify's per-request accepted draft counts in; True when the slot's steps changed."""
        if not correct_drafts:
            return False
        cfg = self.config
        if self.steps > 0:  # at steps 0 nothing was drafted: no evidence about the drafter
            batch_mean = sum(correct_drafts) / len(correct_drafts)
            self.ema = (1 - cfg.ema_alpha) * self.ema + cfg.ema_alpha * batch_mean
        self.batches += 1
        after_warmup = self.batches - cfg.warmup_batches
        if after_warmup <= 0 or after_warmup % cfg.update_interval != 0:
            return False
        return self._retarget()

    def _retarget(self) -> bool:
        cfg, candidates = self.config, self.config.candidate_steps
        start = candidates.index(self.steps)
        if self.steps == 0:
            # Steps 0 gives the EMA nothing to go on, so every interval probes the next candidate up.
            target = candidates[min(start + 1, len(candidates) - 1)]
            if target > 0 and self.ema < 0:
                self.ema = float(target - 1)  # a slot that began at 0 starts its probe from the neutral EMA
            return self._move_to(target)
        i = start
        while i > 0:
            lower = candidates[i - 1]
            # Reaching candidate 0 takes an EMA of at most 0.5 (about no draft accepted), not -0.5.
            threshold = (0.5 if lower == 0 else lower - 0.5) + cfg.down_hysteresis
            if self.ema > threshold:
                break
            i -= 1
        if i == start:
            while i < len(candidates) - 1 and self.ema > candidates[i] - 0.5 + cfg.up_hysteresis:
                i += 1
        if cfg.ceiling_coeff > 0:
            ceiling = max(1, math.ceil(self.ema * cfg.ceiling_coeff))
            # The ceiling only holds a target down, never a step up.
            if ceiling < candidates[i] <= self.steps:
                while i > 0 and candidates[i] > ceiling:
                    i -= 1
        return self._move_to(candidates[i])

    def _move_to(self, target: int) -> bool:
        changed = target != self.steps
        self.steps = target
        return changed


class AdaptiveSteps:
    """All buckets' slots, and the routing of a decode batch to its slot."""

    def __init__(self, config: AdaptiveConfig, initial_steps: int, cuda_graph_batch_sizes: Sequence[int] | None = None) -> None:
        self.config = config
        self.bucket_sizes = [size for size, _ in config.buckets]
        self.slots = {size: StepSlot(slot, initial_steps) for size, slot in config.buckets}
        self.cuda_graph_batch_sizes = sorted(cuda_graph_batch_sizes) if cuda_graph_batch_sizes else None

    def bucket_for(self, batch_size: int) -> int:
        padded = batch_size
        graphs = self.cuda_graph_batch_sizes
        if graphs is not None:
            i = bisect.bisect_left(graphs, batch_size)
            padded = graphs[i] if i < len(graphs) else batch_size  # past the largest graph: not padded
        i = bisect.bisect_right(self.bucket_sizes, padded) - 1
        return self.bucket_sizes[max(i, 0)]

    def steps_for_batch(self, batch_size: int) -> int:
        return self.slots[self.bucket_for(batch_size)].steps

    def on_verify_complete(self, correct_drafts: Sequence[int], batch_size: int) -> bool:
        return self.slots[self.bucket_for(batch_size)].observe(correct_drafts)

    def steps_by_bucket(self) -> dict[str, int]:
        return {str(size): slot.steps for size, slot in self.slots.items()}
