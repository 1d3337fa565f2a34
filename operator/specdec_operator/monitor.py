"""The drift rule: when does a promoted speculative server go back to the base? (pure)

After a promotion the operator scrapes the speculative server's ``/metrics`` every ``monitor.interval``
seconds and feeds each scrape to :func:`observe`. The rule, with its hysteresis:

* A scrape whose acceptance length is **below** ``monitor.acceptLengthFloor`` adds one to a counter of
  consecutive low scrapes; a scrape **at or above** the floor resets the counter to 0. The acceptance length is
  the engine's (engines/): SGLang's gauge ``sglang:spec_accept_length``; for vLLM, which exports counters only,
  ``1 + delta(accepted tokens) / delta(drafts)`` between the pod's previous scrape and this one
  (:func:`window_acceptance`, with the acceptance rate of each draft position the same way). A vLLM pod's first
  scrape is its baseline and no evidence: a lifetime ratio would hide a drift behind the hours before it.
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

A fleet (several speculative pods) is judged as one server (:func:`observe_fleet`): every Ready speculative pod
is scraped, each pod with evidence counts with its verify calls since its previous scrape (its first scrape:
its verify calls since it started), and the rule above is applied to the fleet's acceptance length, the mean of
the pods' values weighted by those verify calls (the accepted tokens per verify step of the whole fleet). A pod
without evidence weighs nothing; a scrape with no pod of evidence is no evidence. One sick pod is reported, not
rolled back on its own (:func:`sick_pods`): a pod whose accepted draft tokens per verify step (acceptance length
minus the bonus token) are below ``SICK_RATIO`` of the weighted median of its peers', judged only when it and at
least ``MIN_PEERS`` peers each ran at least ``MIN_VERIFY_CALLS`` verify steps in the window.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .api import MonitorStatus, SickPod
from .engines import Engine, Window, counter_window, default_engine
from .engines.sglang import ACCEPT_LENGTH_METRIC as ACCEPT_LENGTH_METRIC
from .engines.sglang import GENERATED_TOKENS_METRIC as GENERATED_TOKENS_METRIC
from .engines.sglang import THROUGHPUT_METRIC as THROUGHPUT_METRIC
from .engines.sglang import VERIFY_CALLS_METRIC as VERIFY_CALLS_METRIC

# The sick-pod rule (sick_pods): below half its peers' accepted draft tokens per verify step, with enough verify
# steps behind both numbers for them to mean something.
SICK_RATIO = 0.5
MIN_VERIFY_CALLS = 20
MIN_PEERS = 2


@dataclass(frozen=True)
class Sample:
    """One scrape of the speculative server, reduced to what the rule needs."""

    time: str
    accept_length: float | None = None
    throughput: float | None = None
    # Counters, to tell an idle server (stale gauge) from a working one (vLLM: verify_calls are its drafts).
    verify_calls: float | None = None
    generated_tokens: float | None = None
    error: str | None = None
    # vLLM's counters, from which acceptance is computed between two scrapes (window_acceptance).
    accepted_tokens: float | None = None
    accepted_per_position: tuple[float, ...] | None = None

    @property
    def counts_acceptance(self) -> bool:
        """Acceptance comes from counters (vLLM) rather than a gauge (SGLang)."""
        return self.accept_length is None and self.accepted_tokens is not None and self.verify_calls is not None


def sample_from_metrics(metrics: Mapping[str, Any], time: str, engine: Engine | None = None) -> Sample:
    """Build a Sample from a scrape: a mapping of metric name -> value, parsed for ``engine`` (default: default_engine())."""
    found = (engine or default_engine()).read_metrics(metrics)
    return Sample(
        time=time,
        accept_length=found.accept_length,
        throughput=found.throughput,
        verify_calls=found.verify_calls,
        generated_tokens=found.generated_tokens,
        accepted_tokens=found.accepted_tokens,
        accepted_per_position=found.accepted_per_position,
    )


def window_acceptance(previous: Sample | None, sample: Sample) -> Window | None:
    """Acceptance from counter deltas since ``previous`` (vLLM; engines.counter_window); None without a window: no
    earlier successful scrape with the counters, no draft since (idle, or serving without drafting), or a counter
    that went back (the container restarted: this scrape is the new baseline)."""
    if previous is None or previous.error or sample.error:
        return None
    return counter_window(previous, sample)


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


def _is_evidence(sample: Sample, previous: Sample | None) -> bool:
    if sample.counts_acceptance:
        return not sample.error and window_acceptance(previous, sample) is not None
    value = sample.accept_length
    return not sample.error and value is not None and value >= 1.0 and not _no_new_verify_steps(previous, sample)


def accept_length(sample: Sample, previous: Sample | None) -> float | None:
    """The scrape's acceptance length (the gauge, or over the window since ``previous``), None when it is no evidence."""
    if not _is_evidence(sample, previous):
        return None
    if sample.counts_acceptance:
        found = window_acceptance(previous, sample)
        return found.accept_length if found is not None else None
    return sample.accept_length


def observe(monitor: MonitorStatus | None, sample: Sample, *, floor: float, window: int, previous: Sample | None = None) -> Verdict:
    """Apply one scrape to the monitor status (see the module docstring for the rule)."""
    value = accept_length(sample, previous)
    verdict = _count(monitor, value, sample.time, floor=floor, window=window)
    found = window_acceptance(previous, sample) if value is not None else None
    if found is not None and found.position_rates is not None:
        verdict.status.accept_rate_by_position = list(found.position_rates)
    return verdict


def _count(monitor: MonitorStatus | None, value: float | None, time: str, *, floor: float, window: int) -> Verdict:
    """The counter of consecutive low scrapes after one scrape whose acceptance length is ``value`` (None: no evidence)."""
    count = monitor.below_floor_count if monitor is not None else 0
    if value is None:
        last_accept = monitor.accept_length if monitor is not None else None
        return Verdict(MonitorStatus(last_scrape_time=time, below_floor_count=count, accept_length=last_accept), evidence=False, drifted=False)
    count = count + 1 if value < floor else 0
    status = MonitorStatus(last_scrape_time=time, below_floor_count=count, accept_length=round(value, 4))
    return Verdict(status=status, evidence=True, drifted=count >= window)


# ---------------------------------------------------------------------------------------------------------
# The fleet: every Ready speculative pod


@dataclass(frozen=True)
class PodEvidence:
    """What one pod's scrape says about the drafter: its acceptance length and the verify calls behind it."""

    name: str
    accept_length: float
    # Verify calls since the pod's previous scrape (its first scrape: since it started). None: the server has no
    # verify-call counter, so the pod counts once and is never judged sick.
    verify_calls: float | None
    position_rates: tuple[float, ...] | None = None  # vLLM: acceptance per draft position in the window

    @property
    def weight(self) -> float:
        return 1.0 if self.verify_calls is None else self.verify_calls


def pod_evidence(name: str, sample: Sample, previous: Sample | None) -> PodEvidence | None:
    """The pod's evidence in this scrape, or None (failed, no gauge, gauge below 1.0, no new verify step)."""
    if not _is_evidence(sample, previous):
        return None
    found = window_acceptance(previous, sample) if sample.counts_acceptance else None
    if found is not None:
        return PodEvidence(name, found.accept_length, found.drafts, found.position_rates)
    assert sample.accept_length is not None
    calls = sample.verify_calls
    if calls is not None and previous is not None and not previous.error and previous.verify_calls is not None:
        calls = calls - previous.verify_calls
    if calls is not None and calls <= 0:  # a first scrape with the counter at 0: nothing to weigh it by
        calls = None
    return PodEvidence(name, sample.accept_length, calls)


def fleet_accept_length(evidence: list[PodEvidence]) -> float | None:
    """The fleet's acceptance length: the pods' values weighted by their verify calls (None: no evidence)."""
    total = sum(e.weight for e in evidence)
    if not evidence or total <= 0:
        return None
    if len(evidence) == 1:  # exactly the pod's value (a one-server fleet is judged as one server)
        return evidence[0].accept_length
    return sum(e.accept_length * e.weight for e in evidence) / total


def fleet_position_rates(evidence: list[PodEvidence]) -> list[float] | None:
    """The fleet's acceptance rate per draft position: the pods' rates weighted by their drafts (vLLM only)."""
    counted = [e for e in evidence if e.position_rates is not None]
    total = sum(e.weight for e in counted)
    if not counted or total <= 0:
        return None
    width = max(len(e.position_rates or ()) for e in counted)
    return [round(sum((e.position_rates or ())[i] * e.weight for e in counted if i < len(e.position_rates or ())) / total, 4) for i in range(width)]


def weighted_median(values: list[tuple[float, float]]) -> float:
    """The value at half the total weight of (value, weight) pairs (the lower one on an exact tie)."""
    ordered = sorted(values)
    half = sum(w for _, w in ordered) / 2
    seen = 0.0
    for value, weight in ordered:
        seen += weight
        if seen >= half:
            return value
    return ordered[-1][0]


def sick_pods(
    evidence: list[PodEvidence], *, ratio: float = SICK_RATIO, min_verify_calls: float = MIN_VERIFY_CALLS, min_peers: int = MIN_PEERS
) -> dict[str, SickPod | None]:
    """Each judged pod: a SickPod when its accepted draft tokens per verify step are below ``ratio`` times the
    weighted median of its peers', else None. Pods with fewer than ``min_verify_calls`` verify calls (or without
    the counter) are neither judged nor peers; a pod is judged only against at least ``min_peers`` peers."""
    counted = [e for e in evidence if e.verify_calls is not None and e.verify_calls >= min_verify_calls]
    verdicts: dict[str, SickPod | None] = {}
    for pod in counted:
        peers = [(e.accept_length - 1.0, e.weight) for e in counted if e.name != pod.name]
        if len(peers) < min_peers:
            continue
        peers_accepted = weighted_median(peers)
        sick = pod.accept_length - 1.0 < ratio * peers_accepted
        verdicts[pod.name] = (
            SickPod(name=pod.name, accept_length=round(pod.accept_length, 4), peers_accept_length=round(peers_accepted + 1.0, 4)) if sick else None
        )
    return verdicts


@dataclass(frozen=True)
class FleetVerdict:
    status: MonitorStatus
    evidence: bool
    drifted: bool


def observe_fleet(
    monitor: MonitorStatus | None,
    samples: Mapping[str, Sample],
    previous: Mapping[str, Sample] | None = None,
    *,
    floor: float,
    window: int,
) -> FleetVerdict:
    """Apply one scrape of every Ready speculative pod (pod name -> Sample) to the monitor status.

    The drift rule runs on the fleet's weighted acceptance length (fleet_accept_length); status.monitor.sickPods
    lists the pods sick_pods judged sick, a pod keeping its mark while its scrapes are no evidence and losing it
    when it is judged healthy or is no longer scraped (not Ready, gone).
    """
    previous = previous or {}
    evidence = [e for name, sample in sorted(samples.items()) if (e := pod_evidence(name, sample, previous.get(name))) is not None]
    time = max((s.time for s in samples.values()), default=monitor.last_scrape_time if monitor is not None else None) or ""
    verdict = _count(monitor, fleet_accept_length(evidence), time, floor=floor, window=window)
    judged = sick_pods(evidence)
    stored = {p.name: p for p in (monitor.sick_pods if monitor is not None else [])}
    sick = []
    for name in sorted(samples):
        if name in judged:
            found = judged[name]
            if found is not None:
                sick.append(found.model_copy(update={"since": stored[name].since if name in stored else time}))
        elif name in stored:
            sick.append(stored[name])
    status = verdict.status.model_copy(
        update={
            "pods": len(samples),
            "verify_calls": round(sum(e.verify_calls or 0 for e in evidence)),
            "sick_pods": sick,
            "accept_rate_by_position": fleet_position_rates(evidence),
        }
    )
    return FleetVerdict(status=status, evidence=verdict.evidence, drifted=verdict.drifted)


def remember(previous: Mapping[str, Sample] | None, samples: Mapping[str, Sample]) -> dict[str, Sample]:
    """What the next scrape is compared with: each scraped pod's last successful scrape (a failed scrape does not
    reset the window its verify calls are counted over); pods no longer scraped are forgotten."""
    previous = previous or {}
    return {name: previous[name] if sample.error and name in previous else sample for name, sample in samples.items()}
