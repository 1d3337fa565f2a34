"""Load-aware speculation's building blocks (loadaware.py, reconcile/loadaware.py): SGLang's adaptive mode configured
from a measured curve, checked against SGLang's own parser and rules; the decisions end to end at the probe level on
scripted rounds at the speedups of simulators that run SGLang's adaptive rule (simulator/adaptive.py), and one
`timing` test that measures such a simulator in real time."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
from pathlib import Path

import pytest

from specdec_operator import resource
from specdec_operator import sglang as sglang_args
from specdec_operator.api import ProbeStatus, Workload, WorkloadResult
from specdec_operator.cli.probe import run_probe
from specdec_operator.loadaware import adaptive_config, adaptive_unsupported_reason
from specdec_operator.probe import parse_workload
from specdec_operator.probe.curve import BreakEven
from specdec_operator.probe.run import ProbeResult
from specdec_operator.probe.scripted import ScriptedProbe
from specdec_operator.reconcile.loadaware import LoadAwareProbe, adaptive_verdict, load_aware_probe_for, never_slower
from specdec_operator.simulator import SimulatorServer
from specdec_operator.simulator.adaptive import AdaptiveSteps, speculative_cuda_graph_batch_sizes
from specdec_operator.simulator.model import Profile, profile_from_dict
from tests.support.trace_replay import analytic_speedup

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "llama31-8b-eagle3.yaml"


def llama(**drafter) -> tuple[dict, object]:
    doc, _ = resource.load_custom_resource(str(EXAMPLE))
    spec = dict(doc["spec"])
    extra = drafter.pop("extra_args", None)
    spec["drafter"] = {**spec["drafter"], **drafter}
    if extra is not None:
        spec["sglang"] = {**spec.get("sglang", {}), "extraArgs": extra}
    return spec, resource.parse_spec(spec)


def sglang_server_args(spec, config_path: str):
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    argv = sglang_args.render_argv(spec, "speculative", adaptive_config_path=config_path)
    flags = argv[len(sglang_args.RELEASES[spec.sglang_version].entrypoint) :]
    for flag in (f for f in flags if f.startswith("--")):
        assert flag.split("=", 1)[0] in parser._option_string_actions, f"{flag} is not a declared SGLang flag"
    return ServerArgs.from_cli_args(parser.parse_args(flags))


@pytest.mark.parametrize(
    "drafter",
    [
        {},
        {"eagleTopk": 4, "numDraftTokens": 8},
        {"extra_args": ["--enable-two-batch-overlap"]},
        {"extra_args": ["--enable-pdmux"]},
        {"extra_args": ["--enable-multi-layer-eagle"]},
    ],
)
def test_the_unsupported_reason_is_sglangs_own_for_the_rendered_server(drafter) -> None:
    from sglang.srt.speculative.adaptive_spec_params import adaptive_unsupported_reason as sglangs

    _, spec = llama(**drafter)
    server_args = sglang_server_args(spec, "/etc/specdec/adaptive/config.json")
    assert server_args.speculative_adaptive is True
    assert server_args.speculative_adaptive_config == "/etc/specdec/adaptive/config.json"
    assert adaptive_unsupported_reason(spec) == sglangs(server_args)


def test_the_plain_speculative_server_is_rendered_as_before() -> None:
    _, spec = llama()
    plain = sglang_args.render_argv(spec, "speculative")
    adaptive = sglang_args.render_argv(spec, "speculative", adaptive_config_path="/c.json")
    assert adaptive == plain + ["--speculative-adaptive", "--speculative-adaptive-config", "/c.json"]
    assert "--speculative-adaptive" not in sglang_args.render_argv(spec, "base", adaptive_config_path="/c.json")


def test_the_table_drafts_below_the_pessimistic_break_even_and_never_above() -> None:
    plan = adaptive_config(BreakEven(40.1, 18.5, 69.4, "40.1 [18.5, 69.4]"), num_steps=3)
    assert plan is not None and plan.no_draft_from == 19
    assert plan.config == {"1": {"candidate_steps": [3]}, "19": {"candidate_steps": [0]}}
    open_low = adaptive_config(BreakEven(12.0, None, 30.0, "12 [<1, 30]"), num_steps=5)
    assert open_low is not None and open_low.no_draft_from == 12  # an open low end: the estimate
    only_one = adaptive_config(BreakEven(1.4, 1.1, 2.0, "1.4 [1.1, 2]"), num_steps=3)
    assert only_one is not None and only_one.config["2"] == {"candidate_steps": [0]}  # one stream still drafts
    assert adaptive_config(BreakEven(1.0, None, 1.5, "1 [<1, 1.5]"), num_steps=3) is None  # nothing left to draft on
    assert adaptive_config(BreakEven(None, None, None, "none in 1-128 (faster at every measured concurrency)"), num_steps=3) is None


def workload(name: str, concurrency: int, speedup: float, low: float | None, high: float | None) -> WorkloadResult:
    return WorkloadResult(name=name, concurrency=concurrency, speedup=speedup, speedup_low=low, speedup_high=high)


def test_never_slower_promotes_only_without_a_measured_loss_and_with_a_measured_win() -> None:
    win = workload("c1", 1, 2.0, 1.8, 2.2)
    even = workload("c128", 128, 1.0, 0.97, 1.03)
    loss = workload("c64", 64, 0.9, 0.85, 0.95)
    assert never_slower(ProbeStatus(workloads=[win, even]), 1.0)[0] == "promote"
    decision, reason, message = never_slower(ProbeStatus(workloads=[win, even, loss]), 1.0)
    assert (decision, reason) == ("rollback", "NoLoadWithSpeedup") and "c64" in message
    assert never_slower(ProbeStatus(workloads=[even]), 1.0)[1] == "NoLoadWithSpeedup"  # equal is not a win
    assert never_slower(ProbeStatus(workloads=[workload("c1", 1, 1.1, 1.05, None)]), 1.0)[0] == "promote"  # open high end
    assert never_slower(ProbeStatus(workloads=[]), 1.0)[1] == "NoLoadWithSpeedup"
    # A workload the probe never measured (its time ran out first) may be where drafting loses: no promotion.
    unmeasured = WorkloadResult(name="c128", concurrency=128)
    decision, reason, message = never_slower(ProbeStatus(workloads=[win, unmeasured]), 1.0)
    assert (decision, reason) == ("rollback", "NoLoadWithSpeedup") and "not measured at c128 (c=128)" in message


def test_an_adaptive_probe_that_ended_for_another_reason_than_speed_keeps_it() -> None:
    curve = [workload("c1", 1, 2.0, 1.8, 2.2), workload("c128", 128, 1.0, 0.97, 1.03)]
    measured = ProbeStatus(decision="rollback", reason="Inconclusive", message="inconclusive", workloads=curve)
    assert adaptive_verdict(measured, 1.0)[:2] == ("promote", "LoadAwareSpeedup")  # the speed verdict gives way
    mismatch = measured.model_copy(update={"reason": "OutputMismatch", "message": "outputs differ at chat"})
    assert adaptive_verdict(mismatch, 1.0) == ("rollback", "OutputMismatch", "outputs differ at chat")
    failed = ProbeStatus(decision="rollback", reason="ProbeFailed", rounds=0)
    assert adaptive_verdict(failed, 1.0) == ("rollback", "ProbeFailed", "the adaptive server could not be measured")


BASE_STEPS = [[1, 10.0], [128, 80.0]]
MIXED_STEPS = [[1, 12.0], [128, 400.0]]  # tests/unit/test_probe.py's MIXED: 2.1x at one stream, 0.5x at 128
WORKLOADS = [parse_workload(f"c{c}:{c}:32:64:{max(4, c)}") for c in (1, 8, 32, 128)]


def profile(name: str, step_ms, accept=None, **extra) -> Profile:
    speculative = None
    if accept is not None:
        speculative = {"algorithm": "EAGLE3", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4, "accept_length_mean": accept}
    return profile_from_dict(
        {"name": name, "load_seconds": 0, "max_running_requests": 256, "prefill_tokens_per_s": 200000, "step_ms": step_ms,
         "speculative": speculative, "jitter": 0.01, "errors": {}, "stream_interval": 8, **extra}
    )  # fmt: skip


def adaptive_truth(base: Profile, adaptive: Profile, w: Workload) -> float:
    """The adaptive simulator's own speedup on a workload (no jitter, no host overhead): trace_replay.analytic_speedup's
    model with each decode batch at its bucket's steps under SGLang's rule (simulator/adaptive.py). The tables here
    have one candidate per bucket, numSteps or 0: the static speculative server's step, or the target's alone."""
    spec = adaptive.speculative
    assert spec is not None and adaptive.adaptive is not None
    graphs = speculative_cuda_graph_batch_sizes(adaptive.max_running_requests)
    steps = AdaptiveSteps(adaptive.adaptive, spec.num_steps, graphs).steps_for_batch(min(w.concurrency, adaptive.max_running_requests))
    assert steps in (0, spec.num_steps), steps
    served = adaptive if steps else dataclasses.replace(adaptive, step_ms=adaptive.target_step_ms, speculative=None, adaptive=None)
    return analytic_speedup(base, served, w)


def scripted_probe(key: str, speedups: dict[str, float], *, accept: float | None = None, adaptive: bool = False) -> ProbeStatus:
    """A probe decided on scripted rounds at these speedups (probe/scripted.py: seeded noise, no servers, no sleeping),
    through the operator's own decision: the same on every machine."""
    script = ScriptedProbe(key, speedups, accept_length=accept, seconds_per_round=0.0)
    urls = ("http://base.invalid", "http://speculative.invalid")
    # An adaptive server does not draft from its no-draft batch size up: its acceptance length there is 1.0 by
    # design, so the acceptance floor (DrafterNotAccepting) does not apply to its probe.
    result = asyncio.run(run_probe(*urls, WORKLOADS, max_rounds=4, accept_length_floor=None if adaptive else 1.1, script=script))
    return result.to_status("rev")


def test_a_table_derived_from_the_first_probe_makes_the_adaptive_server_never_slower() -> None:
    """A drafter that wins at one stream (2.1x) and loses at 128 (0.5x): the plain probe rolls it back; the table
    derived from its curve (reconcile/loadaware.py's load-aware probe), served by SGLang's adaptive rule, keeps the
    win at one stream and the base's rate where drafting lost, and the second probe's never-slower rule promotes it.
    Both probes run on scripted rounds at the simulators' own speedups."""
    _, spec = llama()
    base, mixed = profile("base", BASE_STEPS), profile("mixed", MIXED_STEPS, 2.5)
    plain = scripted_probe("mixed", {w.name: analytic_speedup(base, mixed, w) for w in WORKLOADS}, accept=2.5)
    assert (plain.decision, plain.reason) == ("rollback", "SpeedupBelowThreshold"), plain.message
    trial = load_aware_probe_for(spec, plain)
    assert isinstance(trial, LoadAwareProbe) and 1 < trial.plan.no_draft_from < 32, trial
    # Judged by never-slower without the table, the plain server still loses where it lost.
    assert never_slower(plain, spec.rollout.min_speedup)[:2] == ("rollback", "NoLoadWithSpeedup")
    adaptive = profile("mixed-adaptive", MIXED_STEPS, 2.5, target_step_ms=BASE_STEPS, adaptive=trial.plan.config)
    truths = {w.name: adaptive_truth(base, adaptive, w) for w in WORKLOADS}
    assert truths["c1"] > 2.0 and truths["c32"] == truths["c128"] == pytest.approx(1.0)
    second = scripted_probe("mixed-adaptive", truths, adaptive=True)
    decision, reason, message = adaptive_verdict(second, spec.rollout.min_speedup)
    assert (decision, reason) == ("promote", "LoadAwareSpeedup"), (message, second.message)
    by_name = {w.name: w for w in second.workloads or []}
    assert by_name["c1"].speedup_low is not None and by_name["c1"].speedup_low > 1.0  # the win at one stream stays
    assert by_name["c128"].speedup == pytest.approx(1.0, abs=0.1)  # the base's rate where drafting lost


def test_an_adaptive_server_that_still_loses_somewhere_is_rolled_back() -> None:
    """The same kind of table on a drafter that loses even at one stream (accept 1.1): never-slower says no."""
    base = profile("base", BASE_STEPS)
    plan = adaptive_config(BreakEven(8.0, 5.0, 12.0, "8 [5, 12]"), num_steps=3)
    assert plan is not None
    weak = profile("weak-adaptive", [[1, 14.0], [128, 400.0]], 1.1, target_step_ms=BASE_STEPS, adaptive=plan.config)
    truths = {w.name: adaptive_truth(base, weak, w) for w in WORKLOADS}
    assert truths["c1"] < 1.0
    second = scripted_probe("weak-adaptive", truths, adaptive=True)
    decision, reason, message = adaptive_verdict(second, 1.0)
    assert (decision, reason) == ("rollback", "NoLoadWithSpeedup") and "c1 (c=1)" in message, message


def probe(base: Profile, speculative: Profile, seed: int, *, max_rounds: int, adaptive: bool = False) -> ProbeResult:
    """A probe measured in real time against two simulators."""

    async def scenario() -> ProbeResult:
        async with contextlib.AsyncExitStack() as stack:
            b = await stack.enter_async_context(SimulatorServer(base, time_scale=2, seed=seed, load_seconds=0))
            s = await stack.enter_async_context(SimulatorServer(speculative, time_scale=2, seed=seed + 1, load_seconds=0))
            return await run_probe(b, s, WORKLOADS, seed=seed, max_rounds=max_rounds, accept_length_floor=None if adaptive else 1.1)

    return asyncio.run(scenario())


@pytest.mark.timing
def test_a_probe_of_the_adaptive_simulator_measures_the_curve_the_decisions_are_scripted_with() -> None:
    """Measuring, in real time (no decision is asserted): MIXED served with a table that drafts below batch 7, as the
    table derived above, measures about adaptive_truth's speedups, which the tests above script: the win at one
    stream, the base's rate from the no-draft batch size up."""
    base = profile("base", BASE_STEPS)
    plan = adaptive_config(BreakEven(9.3, 6.7, 12.9, "9.33 [6.68, 12.9]"), num_steps=3)
    assert plan is not None and plan.no_draft_from == 7
    adaptive = profile("mixed-adaptive", MIXED_STEPS, 2.5, target_step_ms=BASE_STEPS, adaptive=plan.config)
    measured = {w.name: w.speedup for w in probe(base, adaptive, seed=5, max_rounds=2, adaptive=True).workloads}
    truths = {w.name: adaptive_truth(base, adaptive, w) for w in WORKLOADS}
    assert all(measured.values()), measured
    # Bounds, not a decision: a busy host moves each point a little, never by a third, and never reorders the win.
    assert all(truths[n] / 1.3 < (measured[n] or 0.0) < truths[n] * 1.3 for n in truths), (measured, truths)
    assert (measured["c1"] or 0.0) > max(measured[n] or 0.0 for n in ("c8", "c32", "c128")), measured


def test_specdec_adaptive_config_turns_a_probe_document_into_sglangs_table(tmp_path, capsys) -> None:
    import json

    from specdec_operator.cli import main as specdec_main

    document = tmp_path / "probe.json"
    document.write_text(
        json.dumps({"decision": "rollback", "break_even": {"concurrency": 40.1, "low": 18.5, "high": 69.4, "summary": "40.1 [18.5, 69.4]"}})
    )
    assert specdec_main(["adaptive-config", "--probe-json", str(document), "--num-steps", "3"]) == 0
    assert json.loads(capsys.readouterr().out) == {"1": {"candidate_steps": [3]}, "19": {"candidate_steps": [0]}}
    faster = tmp_path / "faster.json"
    faster.write_text(
        json.dumps(
            {"break_even": {"concurrency": None, "low": None, "high": None, "summary": "none in 1-128 (faster at every measured concurrency)"}}
        )
    )
    assert specdec_main(["adaptive-config", "--probe-json", str(faster), "--num-steps", "3"]) == 1
    assert "no load range to speculate on" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert specdec_main(["adaptive-config", "--probe-json", str(bad), "--num-steps", "3"]) == 2
    assert "no break_even in it" in capsys.readouterr().err
    assert specdec_main(["adaptive-config", "--probe-json", str(tmp_path / "missing.json"), "--num-steps", "3"]) == 2
