"""The probe: paired rounds of the base and one or more speculative servers (arms), the evidence after every round,
and the decision the caller gives it (reconcile/race.py's). This layer measures and never judges: what goes wrong is
recorded as a fact on the evidence (probe/evidence.py RunFacts), and the decision turns it into a Reason
(reconcile/probe_outcome.py)."""

from __future__ import annotations

import asyncio
import inspect
import math
import random
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import aiohttp
from pydantic import ValidationError

from ..api import OutputCheck, Variant, Workload
from ..engines import Engine, engine_for
from ..errors import InputError
from .client import Measurement, ProbeRequestError, measure
from .datasets import Prompt
from .decide import PROMOTE_MIN_ROUNDS, drafter_not_accepting, judge_paired, normalize_policy
from .evidence import (
    ArmState,
    Continue,
    Decide,
    Decided,
    Evidence,
    FailureKind,
    Measured,
    PairedMeasurement,
    ProbeFailure,
    RaceRules,
    RunFacts,
    TimeBudgetSpent,
)
from .outputs import compare_outputs, output_facts
from .preflight import DEFAULT_ARM, ServerAcceptance, ServerFacts, arm_label, preflight
from .result import DEFAULT_CONFIDENCE, ArmResult, ProbeResult, WorkloadOutcome
from .scripted import ScriptedProbe
from .stats import LogRate, block_rates, blocks_for, log_rate, pooled_blocks_for
from .traffic import WorkloadTraffic, build_traffic

__all__ = ["DEFAULT_CONFIDENCE", "ArmResult", "ProbeResult", "WorkloadOutcome", "measurement_order", "run_probe"]

BASE, SPECULATIVE = Variant.BASE.value, Variant.SPECULATIVE.value
ARM_NAME = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$")

OnRound = Callable[[ProbeResult], "Awaitable[None] | None"]
OnEvidence = Callable[[Evidence], "Awaitable[None] | None"]


def _arm_urls(speculative_url: str | None, arms: Mapping[str, str] | None) -> dict[str, str]:
    """The arms by name: ``speculative_url`` is the arm "speculative" (a plain probe), ``arms`` any others."""
    found = {DEFAULT_ARM: speculative_url} if speculative_url is not None else {}
    for name, url in (arms or {}).items():
        if not isinstance(name, str) or not ARM_NAME.match(name) or name == BASE:
            raise InputError(f"--arm {name!r}: an arm's name is lower-case letters, digits, '.', '_' or '-' (not 'base'), e.g. eagle3-k4")
        if name in found:
            raise InputError(f"--arm {name}: named twice (the --speculative server is the arm {DEFAULT_ARM!r})")
        found[name] = url
    if not found:
        raise InputError("--speculative or --arm NAME=URL: at least one speculative server to measure against the base")
    return found


def _check_arguments(
    base_url: str,
    arms: Mapping[str, str],
    workloads: Sequence[Workload],
    min_speedup: float,
    max_rounds: int,
    accept_length_floor: float | None,
    confidence: float,
) -> None:
    flags = [("--base", base_url)] + [("--speculative" if name == DEFAULT_ARM else f"--arm {name}", url) for name, url in arms.items()]
    for flag, url in flags:
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


def _scripts(script: ScriptedProbe | Mapping[str, ScriptedProbe] | None, arms: Sequence[str]) -> dict[str, ScriptedProbe] | None:
    """Each arm's script: a mapping names every arm; one ScriptedProbe serves every arm (its ``arms`` entries, or
    itself with the arm in its key: the rounds' noise differs between arms)."""
    if script is None:
        return None
    if isinstance(script, ScriptedProbe):
        return {arm: script.for_arm(arm) for arm in arms}
    missing = [arm for arm in arms if arm not in script]
    if missing:
        raise InputError(f"script: no scripted rounds for arm(s) {', '.join(missing)}; script every arm or none")
    return {arm: script[arm] for arm in arms}


async def run_probe(
    base_url: str,
    speculative_url: str | None,
    workloads: Iterable[Workload | dict[str, Any]],
    *,
    arms: Mapping[str, str] | None = None,
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
    script: ScriptedProbe | Mapping[str, ScriptedProbe] | None = None,
    settle_s: float | None = None,
) -> ProbeResult:
    """Measure each speculative arm against ``base_url``, one round at a time, until ``decide`` decides.

    ``speculative_url`` is the arm named "speculative" (the operator's one speculative server); ``arms`` maps more
    arms' names to their URLs (a race; ``speculative_url`` may then be None). ``decide`` is the decision
    (reconcile/race.py ``decide``: the operator, ``specdec probe`` and the benchmarks pass that one); every Reason
    comes from it, this layer only records facts. ``evidence``: what an earlier run of this probe measured (a
    restarted operator resumes it; evidence.from_compact has checked it is of this revision); ``on_evidence`` (sync
    or async) gets the evidence after every round, to keep it. ``script``: the rounds come from it instead of from the
    servers (probe/scripted.py: one for every arm, or one per arm by name); the decision is the same.

    Each round measures exactly what the decision asks for (``Continue.workloads``: arm -> workloads). Every arm is
    paired with a base measurement of its own, adjacent in time; odd rounds measure each arm before its base and the
    arms in their order, even rounds the mirror image (:func:`measurement_order`), so drift on the machine hits both
    sides of every pair. The decision's intervals come from the time blocks inside each measurement and the spread
    between rounds (:mod:`.stats`). ``timeout`` bounds the whole probe (the fact: TimeBudgetSpent),
    ``request_timeout``/``read_timeout`` each request (a failed request: ProbeFailure). ``on_round`` (sync or async)
    gets the partial result after each round. ``settle_s``: the pause before a measurement of one server that follows
    one of another (default the engine's ``idle_spin_s``): the server measured before may still be spinning.
    ``datasets`` maps a workload name to its prompts; other workloads use
    their source (traffic.py). ``output_check`` compares the greedy completions of the arm the decision would promote
    (of the only arm, whatever the decision) with the base's afterwards (outputs.py; None: not compared).
    ``engine``: the servers' engine (engines/; default SGLang). Bad arguments raise InputError; everything else ends
    in a ProbeResult.
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
    arm_urls = _arm_urls(speculative_url, arms)
    _check_arguments(base_url, arm_urls, wls, min_speedup, max_rounds, accept_length_floor, confidence)
    if settle_s is not None and not (math.isfinite(settle_s) and 0 <= settle_s <= 60):
        raise InputError(f"--settle {settle_s}: seconds between 0 and 60 (0 turns the pause off; default the engine's idle spin)")
    scripts = _scripts(script, list(arm_urls))
    traffic = build_traffic(wls, datasets, seed, engine)
    result = ProbeResult(policy=policy_key, min_speedup=float(min_speedup), confidence=confidence, started_at=datetime.now(UTC))
    runs = {name: _ArmRun.new(name, url.rstrip("/"), wls, engine) for name, url in arm_urls.items()}
    result.arms = {name: run.result for name, run in runs.items()}
    result.show_arm(next(iter(runs.values())).result)
    result.traffic = {name: t.description for name, t in traffic.items()}
    result.synthetic = [name for name, t in traffic.items() if t.synthetic]
    evidence = evidence if evidence is not None else Evidence()
    evidence.facts = RunFacts()  # facts belong to one run: a resumed probe's rounds count, its facts do not
    rules = _rules(wls, min_speedup, confidence, max_rounds, policy_key, accept_length_floor)
    own_session = session is None
    if own_session:
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=max(w.concurrency for w in wls) + 8))
    assert session is not None
    loop = _ProbeLoop(session, base_url.rstrip("/"), runs, wls, result, rules, decide, evidence, traffic, engine, scripts)
    settle = engine.idle_spin_s if settle_s is None else settle_s
    try:
        await loop.run(timeout, request_timeout, read_timeout, seed, on_round, on_evidence, settle)
        # Scripted rounds skip the output check unless the script asks for it (checkOutputs: its servers answer).
        real_outputs = script is None or (
            script.check_outputs if isinstance(script, ScriptedProbe) else all(s.check_outputs for s in script.values())
        )
        if output_check is not None and output_check.enabled and real_outputs and evidence.facts.failure is None:
            await loop.check_outputs(output_check, request_timeout, seed)
    except ProbeRequestError as exc:
        evidence.facts.failure = ProbeFailure(FailureKind.REQUEST, str(exc), exc.transient)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # a bug or an unforeseen server answer must still end in a decision
        evidence.facts.failure = ProbeFailure(FailureKind.ERROR, f"{type(exc).__name__}: {exc}")
    finally:
        if own_session:
            await session.close()
    return loop.finish(_final(decide, evidence, rules, list(runs), [w.name for w in wls]))


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


def _final(decide: Decide, evidence: Evidence, rules: RaceRules, arms: list[str], workloads: list[str]) -> Decided:
    """The decision once the loop has ended (decided, a failure, the time budget): a decision function that fails or
    still asks for rounds is itself a failure of the probe, never a promotion."""
    try:
        step = decide(evidence, rules, arms, workloads)
        if isinstance(step, Decided):
            return step
        raise RuntimeError(f"the decision asked for more rounds after the probe ended: {dict(step.workloads)}")
    except Exception as exc:
        evidence.facts.failure = ProbeFailure(FailureKind.ERROR, f"{type(exc).__name__}: {exc}")
    step = decide(evidence, rules, arms, workloads)
    assert isinstance(step, Decided), "a failure is always decided"
    return step


def measurement_order(
    asked: Mapping[str, Sequence[str]], arms: Sequence[str], workloads: Sequence[str], rnd: int
) -> list[tuple[str, str, tuple[str, str]]]:
    """What round ``rnd`` measures, in order: ``(workload, arm, (first, second))`` for every workload the decision
    asked of an arm (``asked``: arm -> workloads). Workload by workload (their order), and within one workload each arm
    with a base measurement of its own right before or after it: odd rounds take the arms in their order, each before
    its base; even rounds the mirror image (the arms reversed, each after its base). Linear drift then cancels within
    every arm's pair over two rounds, and no arm always runs first on a workload."""
    odd = rnd % 2 == 1
    order = list(arms) if odd else list(reversed(arms))
    plan = []
    for workload in workloads:
        for arm in order:
            if workload in asked.get(arm, ()):
                plan.append((workload, arm, (arm, BASE) if odd else (BASE, arm)))
    return plan


@dataclass
class _ArmRun:
    """One arm while the probe runs: its result, its acceptance meter and counts, its last measurements per workload."""

    result: ArmResult
    meter: ServerAcceptance
    spec_tokens: int = 0
    spec_verify: int = 0
    last: dict[str, dict[str, Measurement]] = field(default_factory=dict)  # workload -> SPECULATIVE/BASE -> measurement

    @classmethod
    def new(cls, name: str, url: str, wls: Sequence[Workload], engine: Engine) -> _ArmRun:
        result = ArmResult(name, url, workloads=[WorkloadOutcome(w.name, w.concurrency, w.weight) for w in wls])
        return cls(result, ServerAcceptance(engine, arm_label(name)), last={w.name: {} for w in wls})

    def count(self, m: Measurement) -> None:
        self.spec_tokens += m.spec_tokens
        self.spec_verify += m.spec_verify_ct
        self.result.accept_length = self.spec_tokens / self.spec_verify if self.spec_verify else None


class _ProbeLoop:
    """Measure what the decision asks for, one round at a time, until it decides: this loop measures and never
    judges. ``evidence`` may hold the rounds of an earlier run of this probe (a restarted operator): they count, and
    the next round continues their numbering and order."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        runs: dict[str, _ArmRun],
        wls: list[Workload],
        result: ProbeResult,
        rules: RaceRules,
        decide: Decide,
        evidence: Evidence,
        traffic: Mapping[str, WorkloadTraffic],
        engine: Engine,
        scripts: Mapping[str, ScriptedProbe] | None,
    ) -> None:
        self.session, self.base_url, self.runs, self.wls, self.result = session, base_url, runs, wls, result
        self.rules, self._decide, self.evidence, self.traffic, self.engine, self.scripts = rules, decide, evidence, traffic, engine, scripts
        self.by_name = {w.name: w for w in wls}
        self.names = [w.name for w in wls]
        self.measure_one: Callable[[Workload, str, float | None], Awaitable[Measurement]] | None = None
        self.last_measured: tuple[str, float] | None = None  # (url, when its measurement ended): the settle's origin

    def decide(self) -> Continue | Decided:
        return self._decide(self.evidence, self.rules, list(self.runs), self.names)

    async def run(
        self,
        timeout: float,
        request_timeout: float,
        read_timeout: float,
        seed: int | None,
        on_round: OnRound | None,
        on_evidence: OnEvidence | None,
        settle_s: float = 0.0,
    ) -> None:
        clock = asyncio.get_running_loop().time
        deadline = clock() + timeout
        rng = random.Random(seed)

        async def measure_one(w: Workload, url: str, floor: float | None) -> Measurement:
            # After another server's measurement, wait out its idle spin (run_probe's settle_s) so that this one starts on a quiet
            # machine: a measurement that follows its own server's needs none, so without the pause the second
            # measurement of every pair ran slower, and the pairs' alternating order became the rounds' spread.
            if self.last_measured is not None and self.last_measured[0] != url:
                pause = self.last_measured[1] + settle_s - clock()
                if pause > 0:
                    await asyncio.sleep(min(pause, max(0.0, deadline - clock())))
            try:
                return await _measure_one(self.session, url, w, clock, deadline, rng, request_timeout, read_timeout, floor, self.traffic)
            finally:
                self.last_measured = (url, clock())

        self.measure_one = measure_one
        if not await self._start(timeout):
            return
        step = self.decide()
        rnd = max(self.evidence.rounds(arm) for arm in self.runs)
        while isinstance(step, Continue):
            rnd += 1
            round_started = clock()
            try:
                if await self._round(rnd, step):
                    return  # a drafter that accepts nothing decided the probe at its first measurement
            except TimeoutError:
                self.evidence.facts.time_budget = TimeBudgetSpent(timeout, self.result.rounds)
                return
            self.result.rounds = rnd
            self.evidence.seconds += clock() - round_started
            await self._read_acceptance([arm for arm in step.workloads if arm in self.runs])
            step = self.decide()
            self.summarize(step)
            # The evidence is kept only while more rounds follow: a decided probe's result is recorded in status by the
            # next step (a restart before that resumes from the round before and decides again at once).
            await _notify(on_evidence if isinstance(step, Continue) else None, self.evidence)
            await _notify(on_round, self.result)

    async def _start(self, timeout: float) -> bool:
        """The preflight (or the script's acceptance): False when a server cannot be measured (the fact is recorded)."""
        if self.scripts is not None:
            for arm, script in self.scripts.items():
                if script.accept_length is not None:
                    self.runs[arm].result.accept_length = self.evidence.accept_length[arm] = script.accept_length
            return True
        urls = {arm: run.result.url for arm, run in self.runs.items()}
        found = await preflight(self.session, self.base_url, urls, self.wls, timeout, self.engine, self.traffic)
        if isinstance(found, ProbeFailure):
            self.evidence.facts.failure = found
            self.result.base_reachable = not (found.kind is FailureKind.UNREACHABLE and found.server == BASE)
            return False
        self._servers(found)
        for run in self.runs.values():
            await run.meter.start(self.session, run.result.url, self.result.warnings)
        return True

    def _servers(self, found: ServerFacts) -> None:
        self.result.base_max_running_requests = found.caps.get(BASE)
        for arm, run in self.runs.items():
            run.result.max_running_requests = found.caps.get(arm)
        self.result.speculative_max_running_requests = self.result.arms[next(iter(self.runs))].max_running_requests
        self.result.warnings.extend(found.warnings)

    async def _round(self, rnd: int, step: Continue) -> bool:
        """One round as the decision asked (measurement_order); True when the decision came within it (a drafter
        rejected at its first measurement decided the probe)."""
        plan = measurement_order(step.workloads, list(self.runs), self.names, rnd)
        if self.scripts is not None:
            await self._scripted_round(plan, step, rnd)
            return False
        rejected: set[str] = set()
        for name, arm, order in plan:
            if arm in rejected:
                continue
            run, w = self.runs[arm], self.by_name[name]
            measured: dict[str, Measured] = {}
            for server in order:
                variant = BASE if server == BASE else SPECULATIVE
                check = rnd == 1 and variant == SPECULATIVE
                assert self.measure_one is not None
                m = await self.measure_one(w, self.base_url if variant == BASE else run.result.url, self.rules.accept_length_floor if check else None)
                if variant == SPECULATIVE:
                    run.count(m)
                    if check and await self._drafter_rejected(run, m, w):
                        rejected.add(arm)
                        if isinstance(self.decide(), Decided):
                            return True
                        break
                if m.aborted_early:  # only through the drafter check, handled above
                    continue
                measured[variant] = _measured(m, w, self.evidence.measurements(arm, name), variant)
                run.last[name][variant] = m
            if arm not in rejected and SPECULATIVE in measured and BASE in measured:
                self.evidence.add(arm, name, PairedMeasurement(rnd, measured[SPECULATIVE], measured[BASE]))
        return False

    async def _scripted_round(self, plan: list[tuple[str, str, tuple[str, str]]], step: Continue, rnd: int) -> None:
        """One round from the scripts instead of the servers (probe/scripted.py), taking the scripts' time."""
        assert self.scripts is not None
        for name, arm, _order in plan:
            script = self.scripts[arm]
            await asyncio.sleep(script.seconds_per_round / max(1, len(step.workloads.get(arm, ()))))
            spec_m, base_m = script.pair(name, rnd)
            self.evidence.add(arm, name, PairedMeasurement(rnd, spec_m, base_m))

    async def _drafter_rejected(self, run: _ArmRun, m: Measurement, w: Workload) -> bool:
        """After an arm's first measurement: does its drafter accept nothing? The acceptance (the measurement's, else
        the server's) goes into the evidence with where it was read; the decision says what follows
        (reconcile/race.py: the arm stops, DrafterNotAccepting when no arm is left)."""
        accept = m.accept_length
        if accept is None:
            accept = await run.meter.read(self.session, run.result.url, self.result.warnings)
        if not drafter_not_accepting(accept, self.rules.accept_length_floor):
            return False
        assert accept is not None
        run.result.accept_length = self.evidence.accept_length[run.result.name] = accept
        self.evidence.facts.accept_read[run.result.name] = f"after {m.requests} request(s) of workload {w.name}"
        return True

    async def _read_acceptance(self, arms: Sequence[str]) -> None:
        """After a round: each measured arm's acceptance (its responses', else its server's) into the evidence."""
        for arm in arms:
            r = self.runs[arm].result
            if self.scripts is None:
                server_accept = await self.runs[arm].meter.read(self.session, r.url, self.result.warnings)
                if server_accept is not None:
                    r.server_accept_length = server_accept
                r.accept_rate_by_position = self.runs[arm].meter.position_rates
            accept = r.accept_length if r.accept_length is not None else r.server_accept_length
            if accept is not None:
                self.evidence.accept_length[arm] = accept

    def summarize(self, step: Continue | Decided) -> None:
        """Every arm's per-workload results from the evidence and the decision's view of it (its intervals); the lead
        arm's become the top-level ones."""
        for arm, run in self.runs.items():
            _summarize_arm(run, self.wls, self.evidence, step.arms.get(arm), self.rules)
        winner = step.winner if isinstance(step, Decided) else None
        self.result.show_arm(_lead(self.result.arms, winner))

    async def check_outputs(self, check: OutputCheck, request_timeout: float, seed: int | None) -> None:
        """The greedy completions of the arm the decision would promote (of the only arm, whatever the decision)
        compared with the base's, in the model name the preflight found (outputs.py): a fact for the decision."""
        step = self.decide()
        arm = step.winner if isinstance(step, Decided) and step.winner else (next(iter(self.runs)) if len(self.runs) == 1 else None)
        if arm is None:
            return  # a race promotes nothing: no arm's outputs matter
        model = next(iter(self.traffic.values())).model if self.traffic else "default"
        comparison = await compare_outputs(
            self.session,
            self.base_url,
            self.runs[arm].result.url,
            self.traffic,
            check,
            request_timeout=request_timeout,
            seed=seed,
            engine=self.engine,
            model=model,
        )
        self.result.output_match_rate, self.result.outputs_compared = comparison.match_rate, comparison.compared
        self.evidence.facts.outputs = output_facts(comparison, arm, check.min_match_rate)

    def finish(self, decided: Decided) -> ProbeResult:
        """The decision into the result, with the notes on what was measured (scripted rounds, random token ids)."""
        result = self.result
        if decided.arms:
            self.summarize(decided)
        for run in self.runs.values():
            if run.result.accept_length is None and run.result.server_accept_length is not None:
                # Chat streams (and vLLM's) carry no spec_verify_ct: the server's own acceptance stands in.
                run.result.accept_length = run.result.server_accept_length
        result.winner = decided.winner
        result.show_arm(_lead(result.arms, decided.winner))
        result.decision, result.reason, result.message = decided.decision, decided.reason, decided.message
        result.transient = decided.transient
        if self.scripts is not None:
            result.traffic = {}
            result.synthetic = []
            keys = ", ".join(sorted({s.key for s in self.scripts.values()}))
            result.message += f" [ScriptedEvidence: the rounds came from --probe-script ({keys}), not from the servers]"
        if result.synthetic and result.base_reachable:
            result.message += (
                f" [SyntheticTraffic: {', '.join(result.synthetic)} sent random token ids, not prompts: acceptance, and so the speedup, "
                f"differs on real traffic; give the workload a dataset (prompts.source Default, ConfigMap or File)]"
            )
        result.finished_at = datetime.now(UTC)
        return result


def _lead(arms: Mapping[str, ArmResult], winner: str | None) -> ArmResult:
    """The arm the top-level result shows: the winner, else the only arm, else the one with the highest estimate."""
    if winner is not None and winner in arms:
        return arms[winner]
    return max(arms.values(), key=lambda a: a.speedup if a.speedup is not None else -math.inf)


async def _notify(callback: Callable[[Any], Awaitable[None] | None] | None, value: Any) -> None:
    """Call a sync or async callback (on_round, on_evidence), if there is one."""
    if callback is not None:
        maybe = callback(value)
        if inspect.isawaitable(maybe):
            await maybe


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

    ``check_floor``: an arm's first measurement stops early once a few finished requests show a drafter that accepts
    nothing (acceptance at or below the floor), so the seed's broken drafter costs seconds, not a benchmark."""
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


def _summarize_arm(run: _ArmRun, wls: list[Workload], evidence: Evidence, state: ArmState | None, rules: RaceRules) -> None:
    """Fill one arm's per-workload results from the evidence and the decision's view of the arm (its intervals)."""
    arm = run.result
    for w, r in zip(wls, arm.workloads):
        rows = evidence.measurements(arm.name, w.name)
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
        if BASE in run.last[w.name]:
            r.base_latency = run.last[w.name][BASE].latency_summary()
        if SPECULATIVE in run.last[w.name]:
            r.speculative_latency = run.last[w.name][SPECULATIVE].latency_summary()
    arm.rounds = evidence.rounds(arm.name)
    if state is not None:
        arm.outcome = state.outcome.value
        if state.interval is not None:
            arm.speedup, arm.speedup_low = state.interval.estimate, state.interval.low
            arm.speedup_high = state.interval.high if math.isfinite(state.interval.high) else None


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
