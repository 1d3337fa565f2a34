"""Load-aware speculation: the engine's per-batch-size drafting configured from the measured speedup curve (pure).

SGLang 0.5.23 can choose the number of draft steps per batch size (``--speculative-adaptive`` with
``--speculative-adaptive-config``: candidate steps per batch-size bucket, 0 = no drafting); vLLM 0.32 the number of
speculative tokens (``num_speculative_tokens_per_batch_size`` in ``--speculative-config``: inclusive batch-size
ranges, 0 = no drafting). Neither ships a table for it, because the right one depends on the hardware, the
drafter and the traffic. Here it is derived from a probe's own measurements, and the engine (engines/) writes it
in its own format (``Engine.adaptive_document``):

* ``adaptive_config(break_even, num_steps)``: the spec's numSteps below the first batch size where speculation may
  stop paying, 0 from there up. Each bucket has a single candidate, so SGLang's EMA never moves it: a bucket that
  also listed 1 would go back to drafting for one update interval out of two, probing, even when nothing is
  accepted (simulator/adaptive.py reproduces SGLang's rule; tests/unit/test_simulator_adaptive.py checks it against
  SGLang's own). The start of the no-draft range is the low end of the break-even interval when it is bounded:
  speculation is switched off wherever the measurements cannot rule out a loss.
* ``adaptive_unsupported_reason(spec)``: why the engine would not run adaptive for this spec, in its words. Neither
  refuses such a server: each logs a warning and serves with static steps, which is exactly the silent fallback
  the operator must see before it spends a probe.

What the operator decides with them (whether to try a load-aware probe, and the verdict on it, with their Reasons)
is reconcile/loadaware.py's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .api import SpeculativeServerSpec
from .engines import engine_for
from .probe.curve import BreakEven


def adaptive_unsupported_reason(spec: SpeculativeServerSpec) -> str | None:
    """The engine's reason for not running adaptive speculation with this spec's server, or None when it can."""
    return engine_for(spec).adaptive_unsupported_reason(spec)


@dataclass(frozen=True)
class AdaptivePlan:
    no_draft_from: int  # the smallest batch size served without drafting
    config: Any  # the engine's document: SGLang's --speculative-adaptive-config, vLLM's num_speculative_tokens_per_batch_size
    num_steps: int = 0  # the drafting steps below no_draft_from (spec.drafter.numSteps)


def adaptive_config(break_even: BreakEven, num_steps: int, spec: SpeculativeServerSpec | None = None) -> AdaptivePlan | None:
    """The adaptive table for a curve that wins at low load and loses at high; None when there is no such range.

    The table needs a drafting bucket at batch size 1 (SGLang refuses to start unless numSteps is a candidate of
    some bucket; vLLM's ranges must start at 1), so a break-even below 2 leaves nothing to speculate on. The
    document is the engine's of ``spec`` (SGLang's without one).
    """
    start = break_even.low if break_even.low is not None else break_even.concurrency
    if start is None or num_steps < 1:
        return None
    no_draft_from = math.ceil(start)
    if no_draft_from < 2:
        return None
    config = engine_for(spec).adaptive_document(no_draft_from, num_steps, spec)
    return AdaptivePlan(no_draft_from, config, num_steps)
