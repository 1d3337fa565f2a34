"""The drift rule: when does a promoted speculative server go back to the base? (pure)

After a promotion the operator scrapes the speculative server's ``/metrics`` every ``monitor.interval``
seconds and feeds each scrape to :func:`observe`. The rule, with its hysteresis:

* A scrape whose ``sglang:spec_accept_length`` is **below** ``monitor.acceptLengthFloor`` adds one to a
  counter of consecutive low scrapes; a scrape **at or above** the floor resets the counter to 0.
* A scrape that carries no evidence leaves the counter unchanged: the scrape failed, the gauge is missing,
  the value is below 1.0 (impossible for a server that decoded anything: the bonus token alone makes 1.0),
  or no verify step ran since the previous scrape, so the gauge is a stale value: the server was idle, or it
  is a load-aware (adaptive) server serving a batch size it does not draft at (without the verify-call
  counter, generated tokens tell idle from working).
* The server is rolled back (AcceptanceDrift) exactly when the counter reaches ``monitor.window``: ``window``
  consecutive low scrapes, with no good scrape between them.
* No flapping: the rollback is recorded as the decision for the speculative revision (status.probe), and a
  decided revision is never promoted again automatically. Only a change to the fields that define the
  speculative server (drafter, steps, target, image, ...) gives a new revision that is validated and probed
  again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .api import MonitorStatus

ACCEPT_LENGTH_METRIC = "sglang:spec_accept_length"
THROUGHPUT_METRIC = "sglang:gen_throughput"
VERIFY_CALLS_METRIC = "sglang:spec_verify_calls_total"
GENERATED_TOKENS_METRIC = "sglang:generation_tokens_total"


@dataclass(frozen=True)
class Sample:
    """One scrape of the speculative server, reduced to what the rule needs."""

    time: str
    accept_length: float | None = None
    throughput: float | None = None
    # Counters, to tell an idle server (stale gauge) from a working one.
    verify_calls: float | None = None
    generated_tokens: float | None = None
    error: str | None = None


def sample_from_metrics(metrics: dict[str, Any], time: str) -> Sample:
    """Build a Sample from a scrape: a mapping of metric name -> value (labels already aggregated)."""

    def number(key: str) -> float | None:
        value = metrics.get(key)
        if value is None and key.endswith("_total"):
            value = metrics.get(key[: -len("_total")])
        try:
            return None if value is None else float(value)
        except (TypeError, ValueError):
            return None

    return Sample(
        time=time,
        accept_length=number(ACCEPT_LENGTH_METRIC),
        throughput=number(THROUGHPUT_METRIC),
        verify_calls=number(VERIFY_CALLS_METRIC),
        generated_tokens=number(GENERATED_TOKENS_METRIC),
    )


@dataclass(frozen=True)
class Verdict:
    """What a scrape means: the new monitor status and whether to roll back now."""

    status: MonitorStatus  # the new status.monitor
    evidence: bool  # whether the scrape counted (below or at/above the floor)
    drifted: bool  # the counter has reached the window: roll back


def _no_new_verify_steps(previous: Sample | None, sample: Sample) -> bool:
    """Nothing since the previous scrape says anything about the drafter: no verify step ran.

    Either the server was idle, or it served without drafting: SGLang's adaptive speculation runs steps 0 (no
    draft, no verify) at the batch sizes where it does not pay, and the accept-length gauge then keeps its
    value from the last drafted batch. Without a verify-call counter, generated tokens tell idle from working.
    """
    if previous is None or previous.error:
        return False
    if previous.verify_calls is not None and sample.verify_calls is not None:
        return sample.verify_calls <= previous.verify_calls
    if previous.generated_tokens is not None and sample.generated_tokens is not None:
        return sample.generated_tokens <= previous.generated_tokens
    return False


def observe(monitor: MonitorStatus | None, sample: Sample, *, floor: float, window: int, previous: Sample | None = None) -> Verdict:
    """Apply one scrape to the monitor status (see the module docstring for the rule)."""
    count = monitor.below_floor_count if monitor is not None else 0
    last_accept = monitor.accept_length if monitor is not None else None
    value = sample.accept_length
    if sample.error or value is None or value < 1.0 or _no_new_verify_steps(previous, sample):
        return Verdict(MonitorStatus(last_scrape_time=sample.time, below_floor_count=count, accept_length=last_accept), evidence=False, drifted=False)
    count = count + 1 if value < floor else 0
    status = MonitorStatus(last_scrape_time=sample.time, below_floor_count=count, accept_length=round(value, 4))
    return Verdict(status=status, evidence=True, drifted=count >= window)
