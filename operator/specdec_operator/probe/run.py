"""The probe: paired rounds of base and speculative server, intervals after every round, a decision with a reason."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import math
import random
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import aiohttp
from pydantic import ValidationError

from ..api import BreakEvenStatus, OutputCheck, ProbeStatus, Variant, Workload, WorkloadResult
from ..engines import Engine, SpecMetrics, counter_window, engine_for
from ..errors import InputError
from ..textutil import rfc3339
from .client import Measurement, ProbeRequestError, get_json, measure
from .curve import BreakEven, CurvePoint, break_even
from .datasets import Prompt
from .decide import (
    PROMOTE_MIN_ROUNDS,
    Decision,
    Outcome,
    Reason,
    Verdict,
    drafter_not_accepting,
    judge_paired,
    normalize_policy,
)
from .evidence import ArmState, Continue, Decide, Decided, Evidence, Measured, PairedMeasurement, RaceRules
from .metrics import scrape_metrics
from .outputs import compare_outputs, judge_outputs
from .scripted import ScriptedProbe
from .stats import (
    LogRate,
    block_rates,
    blocks_for,
    log_rate,
    pooled_blocks_for,
)
from .traffic import WorkloadTraffic, build_traffic

BASE, SPECULATIVE = Variant.BASE.value, Variant.SPECULATIVE.value

# Family-wise over every look a probe could take, however many rounds its budget allows (probe/sequential.py: each
# look spends its own share of 1 - confidence). Equal servers must practically never be promoted: docs/probe.md has
# the measured rates (benchmarks/probe_decisions.py, benchmarks/probe_study.py).
DEFAULT_CONFIDENCE = 0.998


def _rfc3339(ts: datetime | None) -> str | None:
    return None if ts is None else rfc3339(ts)


def _num(value: float | None, digits: int = 4) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return round(value, digits)


@dataclass
class WorkloadOutcome:
    """Per-workload outcome: mean tok/s of each server over the rounds, the speedup and its interval."""

    name: str
    concurrency: int
    weight: float = 1.0
    base_tok_s: float | None = None
    speculative_tok_s: float | None = None
    speedup: float | None = None
    speedup_low: float | None = None
    speedup_high: float | None = None
    rounds: int = 0
    verdict: str = Verdict.UNDECIDED.value
    ratios: list[float] = field(default_factory=list)
    base_latency: dict[str, float | None] = field(default_factory=dict)
    speculative_latency: dict[str, float | None] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "concurrency": self.concurrency,
            "weight": self.weight,
            "base_tok_s": _num(self.base_tok_s, 2),
            # The `specdec probe --json` document keeps the names it was published with (docs/probe.md):
            # "candidate" there is the speculative server.
            "candidate_tok_s": _num(self.speculative_tok_s, 2),
            "speedup": _num(self.speedup),
            "speedup_low": _num(self.speedup_low),
            "speedup_high": _num(self.speedup_high),
            "rounds": self.rounds,
            "verdict": self.verdict,
            "ratios": [_num(r) for r in self.ratios],
            "base_latency": self.base_latency,
            "candidate_latency": self.speculative_latency,
        }

    def to_status(self) -> WorkloadResult:
        return WorkloadResult(
            name=self.name,
            concurrency=self.concurrency,
            base_tokens_per_second=_num(self.base_tok_s, 2),
            speculative_tokens_per_second=_num(self.speculative_tok_s, 2),
            speedup=_num(self.speedup),
            speedup_low=_num(self.speedup_low),
            speedup_high=_num(self.speedup_high),
        )


@dataclass
class ProbeResult:
    """What the probe decided and why (``to_status()`` is the CR's ``status.probe``)."""

    decision: Decision = Decision.ROLLBACK
    reason: Reason = Reason.PROBE_FAILED
    message: str = ""
    rounds: int = 0
    policy: str = "all"
    min_speedup: float = 1.0
    confidence: float = DEFAULT_CONFIDENCE
    accept_length: float | None = None  # client side: completion_tokens / spec_verify_ct over the speculative server's rounds
    server_accept_length: float | None = None  # the server's own, from /metrics after the last round (ServerAcceptance)
    accept_rate_by_position: list[float] | None = None  # vLLM: accepted tokens per draft at each draft position
    speedup: float | None = None  # smallest workload speedup (all) or the weighted one (weighted)
    speedup_low: float | None = None
    speedup_high: float | None = None
    workloads: list[WorkloadOutcome] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    started_at: datetime | None = None
    finished_at: datetime | None = None
    base_reachable: bool = True
    base_max_running_requests: int | None = None
    speculative_max_running_requests: int | None = None
    traffic: dict[str, str] = field(default_factory=dict)  # workload -> what it sent (traffic.py)
    synthetic: list[str] = field(default_factory=list)  # workloads that sent random token ids
    output_match_rate: float | None = None  # outputs.py: the greedy completions' match with the base's
    outputs_compared: int | None = None
    # ProbeFailed on a failure that a later attempt can clear (a connection reset, a 5xx, a timeout, a server that
    # went away): the probe scheduler tries again, with backoff, before it reports ProbeFailed.
    transient: bool = False

    @property
    def wall_seconds(self) -> float | None:
        if self.started_at is None or self.finished_at is None:
            return None
        return (self.finished_at - self.started_at).total_seconds()

    def to_dict(self) -> dict[str, Any]:
        """The ``specdec probe --json`` document (snake_case)."""
        return {
            "decision": self.decision,
            "reason": self.reason,
            "message": self.message,
            "rounds": self.rounds,
            "policy": self.policy,
            "min_speedup": self.min_speedup,
            "confidence": self.confidence,
            "accept_length": _num(self.accept_length),
            "server_accept_length": _num(self.server_accept_length),
            "accept_rate_by_position": self.accept_rate_by_position,
            "speedup": _num(self.speedup),
            "speedup_low": _num(self.speedup_low),
            "speedup_high": _num(self.speedup_high),
            "workloads": [w.to_dict() for w in self.workloads],
            "warnings": list(self.warnings),
            "base_max_running_requests": self.base_max_running_requests,
            "candidate_max_running_requests": self.speculative_max_running_requests,
            "started_at": _rfc3339(self.started_at),
            "finished_at": _rfc3339(self.finished_at),
            "wall_seconds": _num(self.wall_seconds, 3),
            "break_even": dataclasses.asdict(found) if (found := self.break_even()) is not None else None,
            "traffic": dict(self.traffic),
            "synthetic_traffic": bool(self.synthetic),
            "output_match_rate": _num(self.output_match_rate),
            "outputs_compared": self.outputs_compared,
        }

    def traffic_summary(self) -> str | None:
        return "; ".join(f"{name}: {what}" for name, what in self.traffic.items()) or None

    def to_status(self, revision: str | None = None, gpu_seconds: float | None = None) -> ProbeStatus:
        """The CR's ``status.probe`` for the speculative ``revision`` that was measured; ``gpu_seconds``: what it cost
        (the scheduler's, from the spec: probecost.py)."""
        return ProbeStatus(
            decision=self.decision,
            reason=self.reason,
            rounds=self.rounds,
            started_at=_rfc3339(self.started_at),
            finished_at=_rfc3339(self.finished_at),
            gpu_seconds=gpu_seconds,
            # Chat streams carry no spec_verify_ct: then the server's own sglang:spec_accept_length.
            accept_length=_num(self.accept_length if self.accept_length is not None else self.server_accept_length),
            accept_rate_by_position=self.accept_rate_by_position,
            speedup=_num(self.speedup),
            message=self.message,
            revision=revision,
            output_match_rate=_num(self.output_match_rate),
            outputs_compared=self.outputs_compared,
            traffic=self.traffic_summary(),
            synthetic_traffic=True if self.synthetic else None,
            workloads=[w.to_status() for w in self.workloads],
            break_even=self.break_even_status(),
        )

    def break_even(self) -> BreakEven | None:
        """Where the speedup curve over the workloads' concurrencies crosses 1.0 (probe/curve.py)."""
        points = [CurvePoint(w.concurrency, w.speedup, w.speedup_low, w.speedup_high) for w in self.workloads if w.speedup is not None]
        return break_even(points)

    def break_even_status(self) -> BreakEvenStatus | None:
        found = self.break_even()
        if found is None:
            return None
        return BreakEvenStatus(concurrency=_num(found.concurrency, 2), low=_num(found.low, 2), high=_num(found.high, 2), summary=found.summary)


OnRound = Callable[[ProbeResult], "Awaitable[None] | None"]
OnEvidence = Callable[[Evidence], "Awaitable[None] | None"]


def _check_arguments(
    base_url: str,
    speculative_url: str,
    workloads: Sequence[Workload],
    min_speedup: float,
    max_rounds: int,
    accept_length_floor: float | None,
    confidence: float,
) -> None:
    for flag, url in (("--base", base_url), ("--speculative", speculative_url)):
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise InputError(f"{flag} {url!r}: must be an http:// or https:// URL of an SGLang or vLLM server")
    if not workloads:
        raise InputError("workloads: at least one workload is needed")
    names = [w.name for w in workloads]
    if len(set(names)) != len(names):
        raise InputError(f"workloads: names must be unique, got {names}")
    if not (isinstance(min_speedup, (int, float)) and min_speedup > 0):
        raise InputError(f"--min-speedup {min_speedup!r}: must be > 0 (1.0 = at least as fast as base)")
    if isinstance(max_rounds, bool) or not isinstance(max_rounds, int) or max_rounds < 1:
        raise InputError(f"--max-rounds {max_rounds!r}: must be an integer >= 1 ({PROMOTE_MIN_ROUNDS}+ to promote)")
    if accept_length_floor is not None and not (isinstance(accept_length_floor, (int, float)) and accept_length_floor >= 1.0):
        raise InputError(f"--accept-length-floor {accept_length_floor!r}: must be >= 1.0 (1.0 = nothing accepted)")
    if not 0.5 <= confidence < 1.0:
        raise InputError(f"confidence {confidence!r}: must be within [0.5, 1)")


async def run_probe(
    base_url: str,
    speculative_url: str,
    workloads: Iterable[Workload | dict[str, Any]],
    *,
    min_speedup: float = 1.0,
    max_rounds: int = 6,
    accept_length_floor: float | None = 1.1,
    policy: str = "all",
    confidence: float = DEFAULT_CONFIDENCE,
    timeout: float = 3600.0,
    request_timeout: float = 600.0,
    read_timeout: float = 120.0,
    seed: int | None = None,
    on_round: OnRound | None = None,
    session: aiohttp.ClientSession | None = None,
    datasets: Mapping[str, list[Prompt]] | None = None,
    output_check: OutputCheck | None = None,
    engine: Engine | None = None,
    decide: Decide,
    evidence: Evidence | None = None,
    on_evidence: OnEvidence | None = None,
    script: ScriptedProbe | None = None,
) -> ProbeResult:
    """Measure ``speculative_url`` against ``base_url``, one round at a time, until ``decide`` decides.

    ``decide`` is the decision (reconcile/race.py ``decide``: the operator, ``specdec probe`` and the benchmarks pass
    that one; this layer measures and never judges). ``evidence``: what an earlier run of this probe measured (a
    restarted operator resumes it; evidence.from_compact has checked it is of this revision); ``on_evidence`` (sync or
    async) gets the evidence after every round, to keep it. ``script``: the rounds come from it instead of from the
    servers (probe/scripted.py: tests of what the operator does with a decision); the decision is the same.

    Rounds alternate the order of the two servers (speculative first in odd rounds, base first in even
    ones) so drift on the machine hits both. After each round every workload gets an interval on its log
    speedup from the time blocks inside each measurement and the spread between rounds (see
    :mod:`.stats`); the probe stops as soon as the policy's verdict is decided and every reported interval is
    within [0.5x, 2x] of its estimate, or early (Inconclusive) when the estimate is too close to ``min_speedup``
    for the remaining rounds to decide (:func:`.decide.futile`).
    ``timeout`` bounds the whole probe (Inconclusive when spent), ``request_timeout``/``read_timeout``
    each request (ProbeFailed). ``on_round`` (sync or async) gets the partial result after each round.
    ``datasets`` maps a workload name to its prompts (a ConfigMap's or a File's, read by the operator, or ``--dataset``);
    other workloads use their source (traffic.py). ``output_check`` compares the greedy completions afterwards
    (outputs.py; None: not compared). ``engine``: the servers' engine, whose HTTP protocol and metrics the probe
    speaks (engines/; default SGLang). Bad arguments raise InputError; everything else ends in a ProbeResult.
    """
    engine = engine or engine_for(None)
    try:
        wls = [w if isinstance(w, Workload) else Workload.model_validate(w) for w in workloads]
    except ValidationError as exc:
        err = exc.errors()[0]
        raise InputError(f"workloads: {'.'.join(str(p) for p in err['loc'])}: {err['msg']}") from None
    try:
        policy_key = normalize_policy(policy)
    except ValueError as exc:
        raise InputError(f"--policy: {exc}") from None
    _check_arguments(base_url, speculative_url, wls, min_speedup, max_rounds, accept_length_floor, confidence)
    traffic = build_traffic(wls, datasets, seed, engine)
    result = ProbeResult(policy=policy_key, min_speedup=float(min_speedup), confidence=confidence, started_at=datetime.now(UTC))
    result.workloads = [WorkloadOutcome(w.name, w.concurrency, w.weight) for w in wls]
    result.traffic = {name: t.description for name, t in traffic.items()}
    result.synthetic = [name for name, t in traffic.items() if t.synthetic]
    own_session = session is None
    connector_limit = max(w.concurrency for w in wls) + 8
    if own_session:
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=connector_limit))
    assert session is not None
    try:
        outcome = await _probe(
            session,
            base_url.rstrip("/"),
            speculative_url.rstrip("/"),
            wls,
            result,
            rules=_rules(wls, min_speedup, confidence, max_rounds, policy_key, accept_length_floor),
            decide=decide,
            evidence=evidence if evidence is not None else Evidence(),
            on_evidence=on_evidence,
            script=script,
            timeout=timeout,
            request_timeout=request_timeout,
            read_timeout=read_timeout,
            seed=seed,
            on_round=on_round,
            traffic=traffic,
            engine=engine,
        )
        if output_check is not None and output_check.enabled and outcome.reason is not Reason.PROBE_FAILED and script is None:
            urls = (base_url.rstrip("/"), speculative_url.rstrip("/"))
            outcome = await _check_outputs(session, urls, traffic, output_check, outcome, result, request_timeout, seed, engine)
    except ProbeRequestError as exc:
        outcome = Outcome(Decision.ROLLBACK, Reason.PROBE_FAILED, f"probe failed: {exc}", transient=exc.transient)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # a bug or an unforeseen server answer must still end in a reason
        outcome = Outcome(Decision.ROLLBACK, Reason.PROBE_FAILED, f"probe failed: {type(exc).__name__}: {exc}")
    finally:
        if own_session:
            await session.close()
    return _finish(result, outcome, script)


def _rules(wls: list[Workload], min_speedup: float, confidence: float, max_rounds: int, policy: str, floor: float | None) -> RaceRules:
    """What the decision (reconcile/race.py) needs of the probe's arguments."""
    return RaceRules(
        min_speedup=float(min_speedup),
        confidence=confidence,
        max_rounds=max_rounds,
        policy=policy,
        weights={w.name: w.weight for w in wls},
        accept_length_floor=float(floor) if floor is not None else None,
        labels={w.name: f"{w.name} (c={w.concurrency})" for w in wls},
    )


def _finish(result: ProbeResult, outcome: Outcome, script: ScriptedProbe | None) -> ProbeResult:
    """The outcome into the result, with the notes on what was measured (scripted rounds, random token ids)."""
    result.decision, result.reason, result.message = outcome.decision, outcome.reason, outcome.message
    result.transient = outcome.reason == Reason.PROBE_FAILED and outcome.transient
    if result.accept_length is None and result.server_accept_length is not None:
        # Chat streams (and vLLM's) carry no spec_verify_ct: the server's own acceptance stands in.
        result.accept_length = result.server_accept_length
    if script is not None:
        result.traffic = {}
        result.synthetic = []
        result.message += f" [ScriptedEvidence: the rounds came from --probe-script ({script.key}), not from the servers]"
    if result.synthetic and result.base_reachable:
        result.message += (
            f" [SyntheticTraffic: {', '.join(result.synthetic)} sent random token ids, not prompts: acceptance, and so the speedup, "
            f"differs on real traffic; give the workload a dataset (prompts.source Default, ConfigMap or File)]"
        )
    result.finished_at = datetime.now(UTC)
    return result


async def _check_outputs(
    session: aiohttp.ClientSession,
    urls: tuple[str, str],
    traffic: Mapping[str, WorkloadTraffic],
    check: OutputCheck,
    outcome: Outcome,
    result: ProbeResult,
    request_timeout: float,
    seed: int | None,
    engine: Engine,
) -> Outcome:
    """The greedy completions of both servers compared (outputs.py), in the model name the preflight found."""
    model = next(iter(traffic.values())).model if traffic else "default"
    comparison = await compare_outputs(session, *urls, traffic, check, request_timeout=request_timeout, seed=seed, engine=engine, model=model)
    result.output_match_rate, result.outputs_compared = comparison.match_rate, comparison.compared
    return judge_outputs(outcome, comparison, check.min_match_rate)


def _detail(results: list[WorkloadOutcome], min_speedup: float, state: ArmState | None, rules: RaceRules) -> str:
    parts = []
    if rules.policy == "weighted" and state is not None and state.interval is not None:
        iv = state.interval
        parts.append(f"weighted speedup {iv.estimate:.3f}x [{iv.low:.3f}, {iv.high:.3f}]")
    for w in results:
        if w.speedup is None:
            continue
        hi = "inf" if w.speedup_high is None or not math.isfinite(w.speedup_high) else f"{w.speedup_high:.3f}"
        lo = "0" if w.speedup_low is None else f"{w.speedup_low:.3f}"
        parts.append(f"{w.name} (c={w.concurrency}) {w.speedup:.3f}x [{lo}, {hi}]")
    return "; ".join(parts) + f" vs min speedup {min_speedup:g}"


async def _probe(
    session: aiohttp.ClientSession,
    base_url: str,
    speculative_url: str,
    wls: list[Workload],
    result: ProbeResult,
    *,
    rules: RaceRules,
    decide: Decide,
    evidence: Evidence,
    timeout: float,
    request_timeout: float,
    read_timeout: float,
    seed: int | None,
    on_round: OnRound | None,
    on_evidence: OnEvidence | None,
    script: ScriptedProbe | None = None,
    traffic: Mapping[str, WorkloadTraffic] | None = None,
    engine: Engine | None = None,
) -> Outcome:
    """Measure what the decision asks for, one round at a time, until it decides (reconcile/race.py, given as
    ``decide``): this loop measures and never judges. ``evidence`` may hold the rounds of an earlier run of this probe
    (a restarted operator): they count, and the next round continues their numbering and order."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    rng = random.Random(seed)
    meter = ServerAcceptance(engine or engine_for(None))

    if script is None:
        failed = await _preflight(session, base_url, speculative_url, wls, result, timeout, meter, traffic or {})
        if failed is not None:
            return failed
    elif script.accept_length is not None:
        result.accept_length = evidence.accept_length[SPECULATIVE] = script.accept_length

    by_name = {w.name: w for w in wls}
    names = [w.name for w in wls]
    last: dict[str, dict[str, Measurement]] = {w.name: {} for w in wls}
    spec_tokens = spec_verify = 0
    arms = [SPECULATIVE]
    step = decide(evidence, rules, arms, names)
    rnd = evidence.rounds(SPECULATIVE)

    async def run_one(w: Workload, url: str, check: bool) -> Measurement:
        floor = rules.accept_length_floor if check else None
        return await _measure_one(session, url, w, loop.time, deadline, rng, request_timeout, read_timeout, floor, traffic)

    while isinstance(step, Continue):
        rnd += 1
        round_started = loop.time()
        order = [SPECULATIVE, BASE] if rnd % 2 == 1 else [BASE, SPECULATIVE]
        if script is not None:
            await _scripted_round(script, step.workloads.get(SPECULATIVE, ()), rnd, evidence)
        try:
            for name in step.workloads.get(SPECULATIVE, ()) if script is None else ():
                w = by_name[name]
                measured: dict[str, Measured] = {}
                for variant in order:
                    url = speculative_url if variant == SPECULATIVE else base_url
                    first_speculative = rnd == 1 and variant == SPECULATIVE
                    m = await run_one(w, url, first_speculative)
                    if variant == SPECULATIVE:
                        spec_tokens += m.spec_tokens
                        spec_verify += m.spec_verify_ct
                        result.accept_length = spec_tokens / spec_verify if spec_verify else None
                        if first_speculative and await _drafter_rejected(session, speculative_url, result, m, meter, rules.accept_length_floor):
                            assert result.accept_length is not None
                            evidence.accept_length[SPECULATIVE] = result.accept_length
                            decided = decide(evidence, rules, arms, names)
                            if isinstance(decided, Decided):
                                return Outcome(
                                    decided.decision,
                                    decided.reason,
                                    f"{decided.message} (after {m.requests} request(s) of workload {w.name})",
                                )
                    if m.aborted_early:  # only happens through the drafter check, handled above
                        continue
                    measured[variant] = _measured(m, w, evidence.measurements(SPECULATIVE, name), variant)
                    last[w.name][variant] = m
                if SPECULATIVE in measured and BASE in measured:
                    evidence.add(SPECULATIVE, name, PairedMeasurement(rnd, measured[SPECULATIVE], measured[BASE]))
        except TimeoutError:
            state = decide(evidence, rules, arms, names).arms.get(SPECULATIVE)
            return _timed_out(wls, result, evidence, last, state, rules, timeout)
        result.rounds = rnd
        evidence.seconds += loop.time() - round_started
        server_accept = await meter.read(session, speculative_url, result) if script is None else None
        if server_accept is not None:
            result.server_accept_length = server_accept
        accept = result.accept_length if result.accept_length is not None else result.server_accept_length
        if accept is not None:
            evidence.accept_length[SPECULATIVE] = accept
        step = decide(evidence, rules, arms, names)
        _summarize(wls, result, evidence, last, step.arms.get(SPECULATIVE), rules)
        # The evidence is kept only while more rounds follow: a decided probe's result is recorded in status by the next
        # step (a restart before that resumes from the round before and decides again at once), so the last write is saved.
        await _notify(on_evidence if isinstance(step, Continue) else None, evidence)
        await _notify(on_round, result)
    return _with_rounds_note(Outcome(step.decision, step.reason, step.message), rules.max_rounds)


def _timed_out(wls, result: ProbeResult, evidence: Evidence, last, state: ArmState | None, rules: RaceRules, timeout: float) -> Outcome:
    """The probe's time budget spent: Inconclusive, with the rounds completed so far."""
    _summarize(wls, result, evidence, last, state, rules)
    detail = _detail(result.workloads, rules.min_speedup, state, rules)
    return Outcome(
        Decision.ROLLBACK, Reason.INCONCLUSIVE, f"probe time budget of {timeout:g}s spent after {result.rounds} complete round(s): {detail}"
    )


async def _notify(callback: Callable[[Any], Awaitable[None] | None] | None, value: Any) -> None:
    """Call a sync or async callback (on_round, on_evidence), if there is one."""
    if callback is not None:
        maybe = callback(value)
        if inspect.isawaitable(maybe):
            await maybe


async def _scripted_round(script: ScriptedProbe, workloads: Sequence[str], rnd: int, evidence: Evidence) -> None:
    """One round from the script instead of the servers (probe/scripted.py), taking the script's time."""
    for name in workloads:
        await asyncio.sleep(script.seconds_per_round / max(1, len(workloads)))
        spec_m, base_m = script.pair(name, rnd)
        evidence.add(SPECULATIVE, name, PairedMeasurement(rnd, spec_m, base_m))


async def _measure_one(
    session: aiohttp.ClientSession,
    url: str,
    w: Workload,
    clock: Callable[[], float],
    deadline: float,
    rng: random.Random,
    request_timeout: float,
    read_timeout: float,
    check_floor: float | None,
    traffic: Mapping[str, WorkloadTraffic] | None,
) -> Measurement:
    """One measurement of one workload on one server, within the probe's deadline (TimeoutError past it).

    ``check_floor``: the first speculative measurement stops early once a few finished requests show a drafter that
    accepts nothing (acceptance at or below the floor), so the seed's broken drafter costs seconds, not a benchmark."""
    remaining = deadline - clock()
    if remaining <= 0:
        raise TimeoutError
    floor = check_floor
    stop_early = (lambda m: m.requests >= min(4, w.requests) and drafter_not_accepting(m.accept_length, floor)) if floor is not None else None
    return await asyncio.wait_for(
        measure(
            session,
            url,
            w,
            rng=rng,
            request_timeout=request_timeout,
            read_timeout=read_timeout,
            stop_early=stop_early,
            traffic=traffic.get(w.name) if traffic is not None else None,
        ),
        timeout=remaining,
    )


def _with_rounds_note(outcome: Outcome, max_rounds: int) -> Outcome:
    """An inconclusive outcome says when max_rounds was too few for a promotion at all."""
    if outcome.reason is Reason.INCONCLUSIVE and max_rounds < PROMOTE_MIN_ROUNDS:
        return Outcome(
            outcome.decision,
            outcome.reason,
            outcome.message + f" (max rounds {max_rounds} < {PROMOTE_MIN_ROUNDS}: no promotion without both orders of the servers)",
        )
    return outcome


async def _preflight(
    session: aiohttp.ClientSession,
    base_url: str,
    speculative_url: str,
    wls: list[Workload],
    result: ProbeResult,
    timeout: float,
    meter: ServerAcceptance,
    traffic: Mapping[str, WorkloadTraffic],
) -> Outcome | None:
    """Both servers answer the engine's info endpoint (else the probe fails): their max_running_requests and what it
    means, whether the speculative one speculates, the served model name; then the acceptance counters' baseline."""
    engine = meter.engine
    try:
        base = engine.server_info(await get_json(session, base_url + engine.info_path, timeout=min(30.0, timeout)))
    except ProbeRequestError as exc:
        result.base_reachable = False
        return Outcome(Decision.ROLLBACK, Reason.PROBE_FAILED, f"base server unreachable: {exc}", transient=exc.transient)
    try:
        speculative = engine.server_info(await get_json(session, speculative_url + engine.info_path, timeout=min(30.0, timeout)))
    except ProbeRequestError as exc:
        return Outcome(Decision.ROLLBACK, Reason.PROBE_FAILED, f"speculative server unreachable: {exc}", transient=exc.transient)
    if base.model != speculative.model:
        return Outcome(
            Decision.ROLLBACK,
            Reason.PROBE_FAILED,
            f"the servers serve different model names (base {base.model!r}, speculative {speculative.model!r}): the same prompts cannot go to both",
        )
    for t in traffic.values():
        t.model = speculative.model or t.model
    result.base_max_running_requests = base.max_running_requests
    result.speculative_max_running_requests = speculative.max_running_requests
    for label, cap in (("speculative", result.speculative_max_running_requests), ("base", result.base_max_running_requests)):
        if cap is None:
            continue
        for w in wls:
            if cap < w.concurrency:
                result.warnings.append(
                    f"{label} max_running_requests={cap} is below workload {w.name}'s concurrency {w.concurrency}: "
                    f"SGLang queues the rest (speculative SGLang defaults to 48 unless --max-running-requests "
                    f"is passed)"
                )
    if speculative.speculating is False:
        result.warnings.append(f"speculative {engine.info_path} reports no speculative_algorithm: is it speculating?")
    await meter.start(session, speculative_url, result)
    return None


async def _drafter_rejected(
    session: aiohttp.ClientSession,
    speculative_url: str,
    result: ProbeResult,
    m: Measurement,
    meter: ServerAcceptance,
    floor: float | None,
) -> bool:
    """After the first speculative measurement: does the drafter accept nothing? (The decision then ends the probe at
    once: reconcile/race.py, DrafterNotAccepting.) The acceptance it read is the result's."""
    accept = m.accept_length
    if accept is None:
        accept = await meter.read(session, speculative_url, result)
    if not drafter_not_accepting(accept, floor):
        return False
    result.accept_length = accept
    result.rounds = 0
    return True


def _summarize(wls: list[Workload], result: ProbeResult, evidence: Evidence, last, state: ArmState | None, rules: RaceRules) -> None:
    """Fill the per-workload results from the evidence and the decision's view of the arm (its intervals)."""
    for w, r in zip(wls, result.workloads):
        rows = evidence.measurements(SPECULATIVE, w.name)
        base = [p.base.tok_s for p in rows]
        speculative = [p.speculative.tok_s for p in rows]
        r.rounds = len(rows)
        r.base_tok_s = sum(base) / len(base) if base else None
        r.speculative_tok_s = sum(speculative) / len(speculative) if speculative else None
        r.ratios = [s / b if b > 0 else math.inf for s, b in zip(speculative, base, strict=True)]
        iv = state.workloads.get(w.name) if state is not None else None
        if iv is not None:
            r.speedup, r.speedup_low = iv.estimate, iv.low
            r.speedup_high = iv.high if math.isfinite(iv.high) else None
            r.verdict = judge_paired(iv, rules.min_speedup).value
        if BASE in last[w.name]:
            r.base_latency = last[w.name][BASE].latency_summary()
        if SPECULATIVE in last[w.name]:
            r.speculative_latency = last[w.name][SPECULATIVE].latency_summary()
    if state is not None and state.interval is not None:
        result.speedup, result.speedup_low = state.interval.estimate, state.interval.low
        result.speedup_high = state.interval.high if math.isfinite(state.interval.high) else None


def _measured(m: Measurement, w: Workload, earlier: Sequence[PairedMeasurement], variant: str) -> Measured:
    """A measurement reduced to what the decision reads: tok/s, log tok/s with its variance, the coarse blocks (as many
    as this server's first measurement of the workload had: the pooled variance compares block positions)."""
    lr = _log_rate(m, w)
    profile = _pooled_profile(m, w, [list(getattr(p, variant).profile) for p in earlier[:1]])
    return Measured(m.tokens_per_second, lr.log_rate, lr.var, lr.df, tuple(profile))


def _log_rate(m: Measurement, w: Workload) -> LogRate:
    """The measurement's log tok/s and, when it has enough stream events for time blocks, their variance."""
    blocks = blocks_for(len(m.arrivals), min(w.concurrency, w.requests))
    if not blocks:
        rate = m.tokens_per_second
        return LogRate(math.log(rate) if rate > 0 else -math.inf, math.inf, 1.0)
    return log_rate(m.tokens_per_second, block_rates(m.arrivals, m.started_at, m.duration_s, blocks))


def _pooled_profile(m: Measurement, w: Workload, earlier: Sequence[Sequence[float]]) -> list[float]:
    """The measurement's coarse block rates for the pooled variance: as many blocks as the server's first measurement
    of this workload had (the variance per block position needs the same positions in every row); [] when there are too
    few events."""
    blocks = len(earlier[0]) if earlier else pooled_blocks_for(len(m.arrivals), min(w.concurrency, w.requests))
    if not blocks:
        return []
    return block_rates(m.arrivals, m.started_at, m.duration_s, blocks)


@dataclass
class ServerAcceptance:
    """The speculative server's own acceptance length during the probe, from its /metrics: SGLang's gauge, or for an
    engine that exports counters (vLLM) 1 + accepted / drafts since the preflight's scrape (and per draft position,
    ProbeResult.accept_rate_by_position). Never a lifetime ratio: the server may have served before the probe."""

    engine: Engine
    baseline: SpecMetrics | None = None

    async def _scrape(self, session: aiohttp.ClientSession, url: str, result: ProbeResult) -> SpecMetrics | None:
        try:
            metrics = await scrape_metrics(session, url, only=self.engine.metric_names, engine=self.engine)
        except ProbeRequestError as exc:
            note = f"speculative /metrics unavailable ({exc}); acceptance comes from responses only"
            if note not in result.warnings:
                result.warnings.append(note)
            return None
        return self.engine.read_metrics(metrics)

    async def start(self, session: aiohttp.ClientSession, url: str, result: ProbeResult) -> None:
        """The counters before the first request (a gauge needs no baseline)."""
        if not self.engine.acceptance_from_counters:
            return
        found = await self._scrape(session, url, result)
        self.baseline = found if found is not None and found.counts_acceptance else None
        if found is not None and self.baseline is None:  # vLLM exports the counters only with --speculative-config
            result.warnings.append(f"speculative /metrics has no {self.engine.metric_prefix}spec_decode counters: is it speculating?")

    async def read(self, session: aiohttp.ClientSession, url: str, result: ProbeResult) -> float | None:
        found = await self._scrape(session, url, result)
        if found is None:
            return None
        if not found.counts_acceptance:
            return found.accept_length if found.accept_length and found.accept_length > 0 else None
        window = counter_window(self.baseline, found) if self.baseline is not None else None
        if window is None:
            return None
        result.accept_rate_by_position = list(window.position_rates) if window.position_rates is not None else None
        return window.accept_length
