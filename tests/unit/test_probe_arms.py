"""The probe measures, reconcile decides, for N arms.

* Every Reason a probe can end with comes from the decision (reconcile/race.py with reconcile/probe_outcome.py), from
  facts the probe records (probe/evidence.py RunFacts): pure-function tests on written evidence.
* The loop (probe/run.py) measures exactly what the decision asks for, each arm paired with a base measurement of its
  own, in an order that alternates by round: asserted on what the client sent to real simulators (an aiohttp trace of
  its requests), with a planned decision so that what is asked does not depend on the host's timing.
* A race's winner is asserted on scripted arms (probe/scripted.py), never on real-time timing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import re
import socket
import subprocess
import sys
from collections.abc import Sequence
from contextlib import AsyncExitStack

import aiohttp
import pytest

from specdec_operator.api import Decision, Reason
from specdec_operator.cli import main as specdec_main
from specdec_operator.cli.probe import run_probe
from specdec_operator.errors import InputError
from specdec_operator.probe import parse_workload
from specdec_operator.probe.evidence import (
    Continue,
    Decided,
    Evidence,
    FailureKind,
    Measured,
    OutputFacts,
    PairedMeasurement,
    ProbeFailure,
    RaceRules,
    TimeBudgetSpent,
)
from specdec_operator.probe.run import measurement_order
from specdec_operator.probe.scripted import ScriptedProbe, load_script
from specdec_operator.reconcile.race import decide
from specdec_operator.simulator import SimulatorProcess, SimulatorServer, load_profile, profile_from_dict

RULES = RaceRules(labels={"chat": "chat (c=1)"})


def pair(rnd: int, speedup: float, sd: float = 0.04) -> PairedMeasurement:
    half = sd * sd / 2.0
    return PairedMeasurement(rnd, Measured(100.0 * speedup, math.log(100.0 * speedup), half, 30.0), Measured(100.0, math.log(100.0), half, 30.0))


def evidence_of(arm_speedups: dict[str, Sequence[float]]) -> Evidence:
    evidence = Evidence("rev", 1)
    for arm, speedups in arm_speedups.items():
        for rnd, s in enumerate(speedups, start=1):
            evidence.add(arm, "chat", pair(rnd, s))
    return evidence


def decided(evidence: Evidence, arms: Sequence[str] = ("speculative",), rules: RaceRules = RULES) -> Decided:
    step = decide(evidence, rules, list(arms), ["chat"])
    assert isinstance(step, Decided), step
    return step


# --- Reasons from facts (pure) ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "failure, message, transient",
    [
        (
            ProbeFailure(FailureKind.UNREACHABLE, "http://b/server_info: refused", True, server="base"),
            "base server unreachable: http://b/server_info: refused",
            True,
        ),
        (ProbeFailure(FailureKind.UNREACHABLE, "http://s: 503", True, server="speculative"), "speculative server unreachable: http://s: 503", True),
        (
            ProbeFailure(FailureKind.UNREACHABLE, "http://f: refused", False, server="fast"),
            "speculative server fast unreachable: http://f: refused",
            False,
        ),
        (
            ProbeFailure(FailureKind.MODEL_MISMATCH, models=(("base", "llama"), ("speculative", "qwen"))),
            "the servers serve different model names (base 'llama', speculative 'qwen'): the same prompts cannot go to both",
            False,
        ),
        (
            ProbeFailure(FailureKind.MODEL_MISMATCH, models=(("base", "llama"), ("a", "llama"), ("b", None))),
            "the servers serve different model names (base 'llama', a 'llama', b None): the same prompts cannot go to all",
            False,
        ),
        (ProbeFailure(FailureKind.REQUEST, "http://s/generate: HTTP 500: boom", True), "probe failed: http://s/generate: HTTP 500: boom", True),
        (ProbeFailure(FailureKind.ERROR, "RuntimeError: a bug"), "probe failed: RuntimeError: a bug", False),
    ],
)
def test_every_probe_failure_is_probe_failed_from_its_fact(failure, message, transient):
    # Even evidence that would promote: a probe that could not measure everything decides nothing on what it has.
    evidence = evidence_of({"speculative": [2.0, 2.0, 2.0]})
    assert decided(evidence).decision is Decision.PROMOTE
    evidence.facts.failure = failure
    got = decided(evidence)
    assert (got.decision, got.reason, got.message, got.transient, got.winner) == (Decision.ROLLBACK, Reason.PROBE_FAILED, message, transient, None)


def test_a_spent_time_budget_is_inconclusive_with_the_intervals_so_far():
    evidence = evidence_of({"speculative": [1.5]})
    assert isinstance(decide(evidence, RULES, ["speculative"], ["chat"]), Continue)  # a promotion needs two rounds
    evidence.facts.time_budget = TimeBudgetSpent(30.0, 1)
    got = decided(evidence)
    assert (got.decision, got.reason, got.winner, got.transient) == (Decision.ROLLBACK, Reason.INCONCLUSIVE, None, False)
    assert got.message.startswith("probe time budget of 30s spent after 1 complete round(s): chat (c=1) 1.500x [")
    assert got.message.endswith(" vs min speedup 1") and got.arms["speculative"].rounds == 1


def test_a_time_budget_spent_before_any_round_says_so():
    evidence = Evidence("rev", 1)
    evidence.facts.time_budget = TimeBudgetSpent(2.5, 0)
    assert (
        decided(evidence).message == "probe time budget of 2.5s spent after 0 complete round(s): no complete round after 0 round(s) vs min speedup 1"
    )


def outputs(rate: float | None, arm: str = "speculative") -> OutputFacts:
    return OutputFacts(arm, rate, 8, 3, (40, 12, 7, 90, 5), 0.9)


def test_outputs_below_the_minimum_match_rate_turn_a_promotion_into_output_mismatch():
    evidence = evidence_of({"speculative": [2.0, 2.0, 2.0]})
    speed = decided(evidence)
    evidence.facts.outputs = outputs(0.5)
    got = decided(evidence)
    assert (got.decision, got.reason, got.winner) == (Decision.ROLLBACK, Reason.OUTPUT_MISMATCH, None)
    assert got.message.startswith(
        "output mismatch: the speculative server's greedy completions match the base's on 50.0% of their tokens "
        "(mean share before the first difference over 8 prompts, 3 identical; first differences at tokens [5, 7, 12, 40, 90]) < minMatchRate 0.9"
    )
    assert got.message.endswith(f"; the speed measurement alone would have promoted ({speed.message})")


def test_outputs_at_or_above_the_minimum_leave_the_decision_as_it_is():
    for rate in (0.9, 1.0, None):  # None: nothing compared
        evidence = evidence_of({"speculative": [2.0, 2.0, 2.0]})
        speed = decided(evidence)
        evidence.facts.outputs = outputs(rate)
        assert decided(evidence) == speed


def test_an_output_mismatch_of_a_rollback_keeps_the_speed_reason_in_its_message():
    evidence = evidence_of({"speculative": [0.5, 0.5]})
    speed = decided(evidence)
    assert speed.reason is Reason.SPEEDUP_BELOW_THRESHOLD
    evidence.facts.outputs = outputs(0.2)
    got = decided(evidence)
    assert got.reason is Reason.OUTPUT_MISMATCH and got.message.endswith(f"; speed: {speed.message}")


def test_an_output_mismatch_of_a_race_names_the_winner_it_checked():
    evidence = evidence_of({"fast": [2.5, 2.5], "slow": [0.5, 0.5]})
    assert decided(evidence, ["fast", "slow"]).winner == "fast"
    evidence.facts.outputs = outputs(0.1, "fast")
    got = decided(evidence, ["fast", "slow"])
    assert got.reason is Reason.OUTPUT_MISMATCH and got.message.startswith("output mismatch: the speculative server fast's greedy completions")


def test_a_drafter_stopped_at_its_first_measurement_says_where_its_acceptance_was_read():
    evidence = Evidence("rev", 1)
    evidence.accept_length["speculative"] = 1.0
    evidence.facts.accept_read["speculative"] = "after 4 request(s) of workload chat"
    got = decided(evidence)
    assert got.reason is Reason.DRAFTER_NOT_ACCEPTING and got.message.endswith("the base keeps serving (after 4 request(s) of workload chat)")


def test_an_inconclusive_decision_says_when_the_round_budget_allows_no_promotion():
    got = decided(evidence_of({"speculative": [1.01]}), rules=RaceRules(max_rounds=1, labels=RULES.labels))
    assert got.reason is Reason.INCONCLUSIVE
    assert got.message.endswith("(max rounds 1 < 2: no promotion without both orders of the servers)")


def test_nothing_in_probe_sets_a_reason():
    from pathlib import Path

    import specdec_operator.probe as probe

    offenders = [
        f"{p.name}:{i}"
        for p in Path(probe.__file__).parent.glob("*.py")
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(r"\bReason\.[A-Z]", line)
    ]
    assert offenders == []


# --- the loop's order (pure) --------------------------------------------------------------------------------------


def test_measurement_order_pairs_every_arm_with_its_own_base_and_mirrors_by_round():
    asked = {"a": ("chat", "batch"), "b": ("chat",), "c": ("chat", "batch")}
    arms, workloads = ["a", "b", "c"], ["chat", "batch"]
    assert measurement_order(asked, arms, workloads, 1) == [
        ("chat", "a", ("a", "base")),
        ("chat", "b", ("b", "base")),
        ("chat", "c", ("c", "base")),
        ("batch", "a", ("a", "base")),
        ("batch", "c", ("c", "base")),
    ]
    assert measurement_order(asked, arms, workloads, 2) == [
        ("chat", "c", ("base", "c")),
        ("chat", "b", ("base", "b")),
        ("chat", "a", ("base", "a")),
        ("batch", "c", ("base", "c")),
        ("batch", "a", ("base", "a")),
    ]
    # A plain probe (one arm) keeps the order it always had: speculative first in odd rounds, base first in even ones.
    assert [o for _, _, o in measurement_order({"speculative": ("chat",)}, ["speculative"], ["chat"], 3)] == [("speculative", "base")]
    assert [o for _, _, o in measurement_order({"speculative": ("chat",)}, ["speculative"], ["chat"], 4)] == [("base", "speculative")]


# --- the loop against simulators: what it measured, in which order ------------------------------------------------


def prof(name: str, step_ms: float, accept: float | None, **extra: object) -> object:
    spec = None if accept is None else {"algorithm": "EAGLE3", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4, "accept_length_mean": accept}
    return profile_from_dict(
        {
            "name": name,
            "load_seconds": 0,
            "max_running_requests": 256,
            "prefill_tokens_per_s": 200000,
            "step_ms": [[1, step_ms], [128, step_ms * 8]],
            "speculative": spec,
            "jitter": 0.01,
            "errors": {},
            "stream_interval": 8,
            **extra,
        }
    )


class PlannedDecision:
    """A decision that asks for a fixed plan of rounds (arm -> workloads per round) and then stops: the loop's measuring is
    then independent of the host's timing. It records the evidence's rounds it was shown."""

    def __init__(self, plan: list[dict[str, tuple[str, ...]]]) -> None:
        self.plan = plan
        self.calls = 0

    def __call__(self, evidence: Evidence, rules: RaceRules, arms: Sequence[str], workloads: Sequence[str]) -> Continue | Decided:
        self.calls += 1
        done = max((evidence.rounds(a) for a in arms), default=0)
        if evidence.facts.failure is not None or done >= len(self.plan):
            return (
                decide(evidence, rules, arms, workloads)
                if evidence.facts.failure is not None
                else Decided(Decision.ROLLBACK, Reason.INCONCLUSIVE, "plan done", None, {})
            )
        return Continue(self.plan[done], {})


async def traced_probe(servers: dict[str, object], workload: str = "w:1:16:16:2", **kwargs) -> tuple[object, list[list[str]]]:
    """Run a probe of the simulators ``servers`` ("base" and each arm's profile) through a session that logs every POST
    (the server it went to); the log is split into rounds at each on_round call. Returns the result and, per round, the
    servers in the order they were measured (consecutive requests to one server are one measurement)."""
    log: list[str] = []
    by_port: dict[int, str] = {}

    async def on_request_start(session, ctx, params):
        if params.method == "POST":
            log.append(by_port[params.url.port])

    trace = aiohttp.TraceConfig()
    trace.on_request_start.append(on_request_start)
    async with AsyncExitStack() as stack:
        urls = {}
        for i, (name, profile) in enumerate(servers.items()):
            server = await stack.enter_async_context(SimulatorServer(profile, time_scale=20, seed=i, load_seconds=0))
            by_port[int(server.rsplit(":", 1)[1])] = name
            urls[name] = server
        session = await stack.enter_async_context(aiohttp.ClientSession(trace_configs=[trace]))
        arms = {name: url for name, url in urls.items() if name != "base"}
        result = await run_probe(
            urls["base"], None, [parse_workload(workload)], arms=arms, session=session, on_round=lambda r: log.append("|"), seed=1, **kwargs
        )
    rounds: list[list[str]] = [[]]
    for server in log:
        if server == "|":
            rounds.append([])
        elif not rounds[-1] or rounds[-1][-1] != server:
            rounds[-1].append(server)
    return result, [r for r in rounds if r]


GOOD, OK, SLOW = prof("good", 8.0, 2.5), prof("ok", 10.0, 2.0), prof("slow", 20.0, 1.3)
BASE = prof("base", 10.0, None)


def test_the_loop_measures_exactly_what_the_decision_asks_each_arm_paired_and_the_order_alternating():
    plan = [{"a": ("w",), "b": ("w",), "c": ("w",)}, {"a": ("w",), "c": ("w",)}, {"c": ("w",)}]
    planned = PlannedDecision(plan)
    evidence = Evidence("rev", 1)
    # No acceptance floor: a 2-request measurement's acceptance is too noisy to be the subject here (the next test's is).
    servers = {"base": BASE, "a": GOOD, "b": SLOW, "c": OK}
    result, rounds = asyncio.run(traced_probe(servers, decide=planned, evidence=evidence, accept_length_floor=None))
    assert result.message.startswith("plan done"), result.message
    assert rounds == [
        ["a", "base", "b", "base", "c", "base"],  # round 1: the arms in order, each before its own base measurement
        ["base", "c", "base", "a"],  # round 2: the mirror image, b no longer asked for
        ["c", "base"],  # round 3: odd again
    ]
    assert {arm: [p.round for p in evidence.measurements(arm, "w")] for arm in "abc"} == {"a": [1, 2], "b": [1], "c": [1, 2, 3]}
    # Every pair has its own base measurement (a shared one would give equal base tok/s within a round).
    first = [evidence.measurements(arm, "w")[0].base.tok_s for arm in "abc"]
    assert len(set(first)) == 3
    assert result.rounds == 3 and set(result.arms) == {"a", "b", "c"} and [result.arms[a].rounds for a in "abc"] == [2, 1, 3]


def test_an_arm_whose_drafter_accepts_nothing_stops_at_its_first_measurement_and_the_others_go_on():
    custom = load_profile("kimi-k25-custom-eagle3")  # accepts nothing (the seed's broken drafter)
    base = load_profile("sglang-base-kimi-k25")
    result, rounds = asyncio.run(
        traced_probe({"base": base, "good": load_profile("kimi-k2-public-eagle3"), "broken": custom}, decide=decide, max_rounds=3)
    )
    # Round 1: good and its base; broken's first measurement stops early and gets no base measurement; after it,
    # broken is never measured again (whatever the decision says of good).
    assert rounds[0] == ["good", "base", "broken"]
    assert all("broken" not in r for r in rounds[1:])
    assert result.arms["broken"].outcome == "NotAccepting" and result.arms["broken"].accept_length <= 1.1
    assert result.arms["broken"].rounds == 0 and result.arms["good"].rounds >= 1
    assert result.winner in (None, "good")


def test_a_failed_request_of_one_arm_fails_the_probe_transiently():
    broken = prof("broken", 10.0, 2.0, errors={"http_500_rate": 1.0})
    result, _ = asyncio.run(traced_probe({"base": BASE, "good": GOOD, "bad": broken}, decide=decide))
    assert (result.decision, result.reason, result.transient) == ("rollback", "ProbeFailed", True)
    assert result.message.startswith("probe failed: ") and "HTTP 500" in result.message


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_arm_fails_the_preflight_and_names_the_arm():
    async def go():
        async with (
            SimulatorServer(BASE, time_scale=20, seed=0, load_seconds=0) as base,
            SimulatorServer(GOOD, time_scale=20, seed=1, load_seconds=0) as good,
        ):
            dead = f"http://127.0.0.1:{free_port()}"
            return await run_probe(base, good, [parse_workload("w:1:16:16:2")], arms={"gone": dead})

    result = asyncio.run(go())
    assert (result.decision, result.reason, result.base_reachable, result.transient) == ("rollback", "ProbeFailed", True, True)
    assert result.message.startswith("speculative server gone unreachable: "), result.message
    assert result.rounds == 0


# --- a race decided on scripted arms ------------------------------------------------------------------------------


def test_a_race_of_three_scripted_arms_promotes_the_clear_winner_and_stops_the_others():
    scripts = {
        "slow": ScriptedProbe("race/slow", 0.5, seconds_per_round=0.0, accept_length=1.6),
        "even": ScriptedProbe("race/even", 1.0, seconds_per_round=0.0, accept_length=2.0),
        "fast": ScriptedProbe("race/fast", 2.5, seconds_per_round=0.0, accept_length=3.1),
    }
    evidence = Evidence("rev", 1)
    url = "http://127.0.0.1:9"
    result = asyncio.run(
        run_probe(url, None, [parse_workload("chat:1:16:16:2")], arms=dict.fromkeys(scripts, url), script=scripts, evidence=evidence)
    )
    assert (result.decision, result.reason, result.winner) == ("promote", "SpeedupConfirmed", "fast"), result.message
    assert "arm fast wins" in result.message
    rounds = {arm: [p.round for p in evidence.measurements(arm, "chat")] for arm in scripts}
    assert rounds["slow"] == [1, 2]  # failed at the first look with a between-round spread: never measured again
    assert rounds["fast"] == [1, 2]
    assert result.arms["slow"].outcome == "Failed" and result.arms["fast"].outcome == "Passed"
    assert result.arms["even"].outcome in ("CannotWin", "Futile")
    assert {a: r.accept_length for a, r in result.arms.items()} == {"slow": 1.6, "even": 2.0, "fast": 3.1}
    # The top level is the winner's; the JSON document has every arm.
    assert result.accept_length == 3.1 and result.speedup == result.arms["fast"].speedup
    doc = result.to_dict()
    assert doc["winner"] == "fast" and set(doc["arms"]) == set(scripts) and doc["arms"]["slow"]["outcome"] == "Failed"


def test_a_single_arm_probe_keeps_its_status_and_json_shape():
    script = ScriptedProbe("one", 2.0, seconds_per_round=0.0, accept_length=2.4)
    url = "http://127.0.0.1:9"
    result = asyncio.run(run_probe(url, url, [parse_workload("chat:1:16:16:2")], script=script))
    assert (result.decision, result.winner, list(result.arms)) == ("promote", "speculative", ["speculative"])
    assert "arms" not in result.to_dict()
    status = result.to_status("rev-1")
    assert (status.decision, status.reason, status.accept_length, status.rounds) == ("promote", "SpeedupConfirmed", 2.4, 2)


def test_a_script_file_scripts_each_arm(tmp_path):
    path = tmp_path / "script.yaml"
    path.write_text("demo:\n  speedup: 1.0\n  arms:\n    fast: {speedup: 2.5, acceptLength: 3.0}\n")
    script = load_script(path)["demo"]
    assert script.for_arm("fast").speedup == 2.5 and script.for_arm("fast").accept_length == 3.0
    assert script.for_arm("speculative") is script and script.for_arm("other").key == "demo/other"
    path.write_text("demo:\n  arms: {fast: {speedup: 2.5, arms: {}}}\n")
    with pytest.raises(InputError, match="unknown field"):
        load_script(path)


# --- arguments --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "arms, match",
    [
        ({"Bad Name": "http://x"}, "an arm's name is lower-case"),
        ({"base": "http://x"}, "not 'base'"),
        ({"speculative": "http://x"}, "named twice"),
        ({"fast": "ftp://x"}, "--arm fast 'ftp://x': must be an http"),
    ],
)
def test_bad_arms_are_refused_with_one_line(arms, match):
    with pytest.raises(InputError, match=match):
        asyncio.run(run_probe("http://b", "http://s", [parse_workload("w:1:8:8:1")], arms=arms))


def test_no_speculative_server_at_all_is_refused():
    with pytest.raises(InputError, match="at least one speculative server"):
        asyncio.run(run_probe("http://b", None, [parse_workload("w:1:8:8:1")]))


@pytest.mark.parametrize("value", ["fast", "=http://x", "fast=", "fast=ftp://x"])
def test_cli_refuses_a_malformed_arm_in_one_line(value, capsys):
    assert specdec_main(["probe", "--base", "http://127.0.0.1:9", "--arm", value, "--workload", "w:1:8:8:1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--arm" in err


def test_cli_races_arms_and_reports_each_one():
    # The shape of a race's output from `specdec probe --arm` against simulator processes; which arm wins is the
    # decision's (asserted above on scripted arms), so only that the winner, if any, is one of the arms.
    flags = ("--time-scale", "20", "--load-seconds", "0", "--seed", "3")
    with (
        SimulatorProcess("llama31-8b-base", *flags) as base,
        SimulatorProcess("llama31-8b-eagle3", *flags) as eagle3,
        SimulatorProcess("llama31-8b-eagle3-wide", *flags) as wide,
    ):
        argv = ["probe", "--base", base, "--arm", f"eagle3={eagle3}", "--arm", f"wide={wide}", "--workload", "one:1:16:64:2", "--seed", "1"]
        run = subprocess.run(
            [sys.executable, "-m", "specdec_operator.cli", *argv, "--json", "--max-rounds", "3"], capture_output=True, text=True, timeout=120
        )
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert set(doc["arms"]) == {"eagle3", "wide"} and doc["winner"] in (None, "eagle3", "wide")
    outcomes = {"Passed", "Failed", "Futile", "NotAccepting", "CannotWin", "Inconclusive", "Undecided"}
    for arm in doc["arms"].values():
        assert arm["outcome"] in outcomes and arm["rounds"] >= 1 and arm["workloads"][0]["name"] == "one"
    assert doc["winner"] is None or doc["arms"][doc["winner"]]["outcome"] == "Passed"


def test_a_script_with_check_outputs_compares_the_real_servers_outputs_after_its_scripted_rounds(tmp_path):
    # checkOutputs: the speed is scripted, the greedy completions are the servers' own: a fast server that corrupts
    # 5 % of its tokens is rolled back for OutputMismatch; without it no server is asked for outputs at all.
    from specdec_operator.api import OutputCheck

    path = tmp_path / "script.yaml"
    path.write_text("fast: {speedup: 3.0, acceptLength: 2.5, checkOutputs: true}\nplain: {speedup: 3.0}\n")
    scripts = load_script(path)
    assert scripts["fast"].check_outputs and not scripts["plain"].check_outputs
    base = load_profile("llama31-8b-base")
    corrupt = dataclasses.replace(base, name="corrupt", errors=dataclasses.replace(base.errors, corrupt_token_share=0.05))
    check = OutputCheck.model_validate({"enabled": True, "prompts": 4, "maxTokens": 32, "minMatchRate": 0.9})

    async def scenario():
        async with AsyncExitStack() as stack:
            b = await stack.enter_async_context(SimulatorServer(base, time_scale=20, seed=1, load_seconds=0))
            s = await stack.enter_async_context(SimulatorServer(corrupt, time_scale=20, seed=2, load_seconds=0))
            wl = [parse_workload("chat:1:16:16:2")]
            checked = await run_probe(b, s, wl, script=scripts["fast"], output_check=check)
            unchecked = await run_probe(b, s, wl, script=scripts["plain"], output_check=check)
            return checked, unchecked

    checked, unchecked = asyncio.run(scenario())
    assert checked.outputs_compared == 4 and checked.output_match_rate is not None
    assert (str(checked.decision), str(checked.reason)) == ("rollback", "OutputMismatch"), checked.message
    assert unchecked.outputs_compared is None and str(unchecked.reason) == "SpeedupConfirmed"
    path.write_text("fast: {speedup: 3.0, checkOutputs: 1}\n")
    with pytest.raises(InputError, match="checkOutputs 1: must be true or false"):
        load_script(path)
