"""The probe: statistics, decision rules, and decisions against simulators whose truth is known."""

from __future__ import annotations

import asyncio
import json
import math
import random
import socket
import subprocess
import sys
import time
from contextlib import AsyncExitStack

import pytest

from specdec_operator.api import Prompts, Workload
from specdec_operator.cli import main as specdec_main
from specdec_operator.cli.probe import run_probe
from specdec_operator.errors import InputError
from specdec_operator.probe import ProbeResult, parse_sglang_metrics, parse_workload, scrape_metrics
from specdec_operator.probe.decide import Verdict, combine_all, judge, normalize_policy
from specdec_operator.probe.stats import (
    log_ratio_interval,
    per_look_level,
    t_cdf,
    t_quantile,
    weighted_percentile,
    weighted_round_ratios,
)
from specdec_operator.resource import dump
from specdec_operator.simulator import SimulatorProcess, SimulatorServer, load_profile, profile_from_dict
from tests.support.trace_replay import ReplayedProbe, analytic_speedup, traces_by_shape

# --- statistics ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "p, df, expected",
    [(0.975, 1, 12.7062), (0.975, 2, 4.3027), (0.975, 10, 2.2281), (0.995, 4, 4.6041), (0.95, 30, 1.6973)],
)
def test_t_quantile_matches_tables(p, df, expected):
    assert t_quantile(p, df) == pytest.approx(expected, rel=1e-4)
    assert t_cdf(t_quantile(p, df), df) == pytest.approx(p, abs=1e-9)
    assert t_quantile(1 - p, df) == pytest.approx(-expected, rel=1e-4)


def test_log_ratio_interval_covers_the_truth_at_its_level():
    # Log-normal round-to-round noise, 3 to 6 rounds: the coverage must be at least close to nominal.
    rng = random.Random(11)
    for n in (3, 4, 6):
        hits = 0
        trials = 2000
        for _ in range(trials):
            ratios = [1.3 * math.exp(rng.gauss(0, 0.05)) for _ in range(n)]
            iv = log_ratio_interval(ratios, 0.95)
            hits += iv.low <= 1.3 <= iv.high
        assert hits / trials == pytest.approx(0.95, abs=0.02)


def test_interval_edge_cases():
    one = log_ratio_interval([1.5], 0.95)
    assert one.low == 0 and one.high == math.inf
    flat = log_ratio_interval([1.2, 1.2, 1.2], 0.95)
    assert flat.low == pytest.approx(1.2) and flat.high == pytest.approx(1.2)
    assert log_ratio_interval([1.0, 0.0, 1.0], 0.95).high == math.inf
    assert per_look_level(0.95, 4) == pytest.approx(0.9875)


def test_weighted_round_ratios_and_percentiles():
    series = weighted_round_ratios({"a": [2.0, 2.0], "b": [0.5, 1.0, 9.0]}, {"a": 3.0, "b": 1.0})
    assert series == pytest.approx([(6 + 0.5) / 4, (6 + 1.0) / 4])  # only rounds where both were measured
    assert weighted_percentile([(1.0, 1), (2.0, 98), (3.0, 1)], 50) == 2.0
    assert weighted_percentile([], 50) is None


def test_judge_is_strict_and_needs_three_rounds():
    iv = log_ratio_interval([1.5, 1.6, 1.55], 0.95)
    assert judge(iv, 1.0) is Verdict.PASS
    assert judge(log_ratio_interval([1.5, 1.6], 0.95), 1.0) is Verdict.UNDECIDED
    assert judge(log_ratio_interval([0.5, 0.55, 0.52], 0.95), 1.0) is Verdict.FAIL
    # An interval touching the threshold is not evidence (noiseless equal servers).
    assert judge(log_ratio_interval([1.0, 1.0, 1.0], 0.95), 1.0) is Verdict.UNDECIDED
    assert combine_all({"a": Verdict.PASS, "b": Verdict.FAIL}) is Verdict.FAIL
    assert combine_all({"a": Verdict.PASS, "b": Verdict.UNDECIDED}) is Verdict.UNDECIDED
    assert normalize_policy("WeightedMix") == "weighted" and normalize_policy("AllWorkloads") == "all"


def test_workload_parsing_and_coercion():
    w = parse_workload("chat:16:1024:256:64")
    assert (w.name, w.concurrency, w.input_tokens, w.output_tokens, w.requests, w.weight) == ("chat", 16, 1024, 256, 64, 1.0)
    assert parse_workload("x:1:2:3:4:2.5").weight == 2.5
    cr = Workload.model_validate({"name": "c", "concurrency": 8, "inputTokens": 10, "outputTokens": 20, "requests": 9, "weight": 2})
    assert (cr.input_tokens, cr.output_tokens, cr.requests, cr.weight) == (10, 20, 9, 2.0)
    for bad in ("chat:16:1024:256", "chat:x:1:1:1", "chat:0:1:1:1"):
        with pytest.raises(InputError, match="workload"):
            parse_workload(bad)


def test_metrics_parser_averages_over_tp_ranks():
    text = (
        "# HELP sglang:spec_accept_length x\n# TYPE sglang:spec_accept_length gauge\n"
        'sglang:spec_accept_length{model_name="m",tp_rank="0"} 2.0\n'
        'sglang:spec_accept_length{model_name="m",tp_rank="1"} 3.0\n'
        "# HELP other_metric y\n# TYPE other_metric gauge\nother_metric 5\n"
    )
    assert parse_sglang_metrics(text) == {"sglang:spec_accept_length": 2.5}


def test_metrics_parser_skips_histogram_buckets_but_keeps_sum_and_count_and_refuses_non_prometheus_text():
    text = (
        "# HELP sglang:e2e_request_latency_seconds x\n# TYPE sglang:e2e_request_latency_seconds histogram\n"
        'sglang:e2e_request_latency_seconds_bucket{le="0.1",model_name="m"} 1.0\n'
        'sglang:e2e_request_latency_seconds_bucket{le="+Inf",model_name="m"} 4.0\n'
        'sglang:e2e_request_latency_seconds_sum{model_name="m"} 2.5\n'
        'sglang:e2e_request_latency_seconds_count{model_name="m"} 4.0\n'
    )
    assert parse_sglang_metrics(text) == {"sglang:e2e_request_latency_seconds_sum": 2.5, "sglang:e2e_request_latency_seconds_count": 4.0}
    with pytest.raises(ValueError):
        parse_sglang_metrics("<html><body>502 Bad Gateway</body></html>\n")
    # One gauge asked for: only its lines are parsed (a broken line elsewhere does not matter).
    text += 'sglang:spec_accept_length{tp_rank="0"} 3.0\nsglang:spec_accept_length{tp_rank="1"} 2.0\nbroken{ line\n'
    assert parse_sglang_metrics(text, only=frozenset({"sglang:spec_accept_length"})) == {"sglang:spec_accept_length": 2.5}


# --- decisions against simulators ------------------------------------------------------------------


def prof(name, step_ms, spec_accept=None, *, max_running=256, jitter=0.01, **extra):
    spec = None
    if spec_accept is not None:
        spec = {"algorithm": "EAGLE3", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4, "accept_length_mean": spec_accept}
    return profile_from_dict(
        {
            "name": name,
            "load_seconds": 0,
            "max_running_requests": max_running,
            "prefill_tokens_per_s": 200000,
            "step_ms": step_ms,
            "speculative": spec,
            "jitter": jitter,
            "errors": extra.pop("errors", {}),
            # SGLang's --stream-interval: fewer events per token keeps the host's share of the timing small.
            "stream_interval": extra.pop("stream_interval", 8),
            **extra,
        }
    )


# Step times are long enough that the whole test (client and both simulators on one event loop) streams at
# most a few thousand tokens a second: the host, not the model, would otherwise set the ratios.
BASE = prof("base", [[1, 10.0], [128, 80.0]])
WIN = prof("win", [[1, 12.0], [128, 120.0]], 2.5)  # 2.08x at c=1, 1.67x at c=128
LOSS = prof("loss", [[1, 16.0], [128, 140.0]], 1.3)  # 0.81x at c=1, 0.74x at c=128
MIXED = prof("mixed", [[1, 12.0], [128, 400.0]], 2.5)  # 2.08x at c=1, 0.5x at c=128

SINGLE = parse_workload("single:1:32:64:2")
WIDE = parse_workload("wide:128:32:16:128")


async def probe_between(base, candidate, workloads, *, scale=2.0, seed=0, **kwargs) -> ProbeResult:
    async with AsyncExitStack() as stack:
        b = await stack.enter_async_context(SimulatorServer(base, time_scale=scale, seed=seed, load_seconds=0))
        c = await stack.enter_async_context(SimulatorServer(candidate, time_scale=scale, seed=seed + 1000, load_seconds=0))
        return await run_probe(b, c, workloads, seed=seed, **kwargs)


# The decisions below are made on the simulators' recorded rounds (docs/benchmarks/probe-study-traces-*.json: the
# quieter-machine stand-in and beside a busy make test), replayed through the whole probe loop (run_probe with a
# script, tests/support/trace_replay.py) at the simulators' analytic speedups: the same rounds on every machine, so
# a busy host cannot turn a clear decision Inconclusive. What only a real measurement shows (how close the measured
# speedup comes to the model, the drafter's acceptance, the servers' caps) is measured in real time, and asserted
# only on what was measured.
RECORDED = [(label, pair) for label in ("favoured", "loaded") for pair in ("equal", "eagle3")]
UNUSED_URL = "http://127.0.0.1:9"  # a replayed probe sends no request


def probe_replayed(recorded, base, candidate, workloads, *, key="probe", one_stream_noise=False, **kwargs) -> ProbeResult:
    """A probe of ``workloads`` decided on ``recorded`` (label, pair)'s rounds of each workload's shape (one stream or
    concurrent; ``one_stream_noise``: the one-stream rounds for every workload), at the analytic speedup of
    ``candidate`` over ``base`` on each workload."""
    truths = {w.name: analytic_speedup(base, candidate, w) for w in workloads}
    traces = traces_by_shape(*recorded, [w.model_copy(update={"concurrency": 1}) for w in workloads] if one_stream_noise else workloads)
    script = ReplayedProbe("/".join((*recorded, key)), truths, traces=traces)
    return asyncio.run(run_probe(UNUSED_URL, UNUSED_URL, workloads, script=script, **kwargs))


def test_clear_win_promotes_with_intervals_above_one():
    workloads = [SINGLE, parse_workload("mid:16:32:64:32")]
    truths = {w.name: analytic_speedup(BASE, WIN, w) for w in workloads}
    assert truths["single"] == pytest.approx(2.08, abs=0.01) and truths["mid"] > 1.5
    for recorded in RECORDED:
        # The concurrent workload's recorded rounds (batch-32: single rounds from 0.4x to 3x of their mean) may leave
        # even a 1.8x undecided after 6 rounds: never a rollback for its speed, at worst Inconclusive.
        concurrent_noise = probe_replayed(recorded, BASE, WIN, workloads)
        assert concurrent_noise.reason in ("SpeedupConfirmed", "Inconclusive"), (recorded, concurrent_noise.message)
        result = probe_replayed(recorded, BASE, WIN, workloads, one_stream_noise=True)
        assert (result.decision, result.reason) == ("promote", "SpeedupConfirmed"), (recorded, result.message)
        assert 2 <= result.rounds <= 6, recorded  # a promotion needs both orders of the servers (PROMOTE_MIN_ROUNDS)
        for w in result.workloads:
            assert 1.0 < w.speedup_low <= truths[w.name] <= w.speedup_high, (recorded, result.message)
        assert result.workloads[0].speedup == pytest.approx(truths["single"], rel=0.15), (recorded, result.message)
        assert not result.warnings


def test_clear_loss_rolls_back_below_threshold():
    truth = analytic_speedup(BASE, LOSS, SINGLE)
    assert truth == pytest.approx(0.81, abs=0.01)
    for recorded in RECORDED:
        result = probe_replayed(recorded, BASE, LOSS, [SINGLE])
        assert result.decision == "rollback", (recorded, result.message)
        # On one stream with the quieter machine's noise the interval clears the threshold (below); beside a busy
        # machine a 19 % loss may stop by futility first (Inconclusive, which rolls back too).
        if recorded[0] == "favoured":
            assert result.reason == "SpeedupBelowThreshold", (recorded, result.message)
            assert result.workloads[0].speedup_high < 1.0 and result.workloads[0].speedup == pytest.approx(truth, rel=0.1)


@pytest.mark.timing
def test_the_probe_measures_a_win_faster_and_a_loss_slower_than_the_base_and_counts_the_drafters_acceptance():
    # Measuring, in real time: two rounds at most, whatever they decide. Client round trips and busy cores add the same
    # host time to both servers' requests, which pulls a measured ratio towards 1 and adds noise (the study's loaded
    # one-stream rounds came out at 0.58x to 1.12x of the model's; 1.38x for this 2.08x beside a load of 14): what
    # holds on any machine is a win measured clearly faster, a loss slower, neither beyond the model, and the
    # acceptance, which is counted, not timed.
    win_model, loss_model = analytic_speedup(BASE, WIN, SINGLE), analytic_speedup(BASE, LOSS, SINGLE)
    win = asyncio.run(probe_between(BASE, WIN, [SINGLE, parse_workload("mid:16:32:64:32")], scale=2, max_rounds=2))
    assert 1 <= win.rounds <= 2 and all(w.speedup for w in win.workloads), win.message
    assert 1.2 < win.workloads[0].speedup < win_model * 1.15, win.message
    assert win.accept_length == pytest.approx(2.5, rel=0.1)
    assert not win.warnings
    loss = asyncio.run(probe_between(BASE, LOSS, [SINGLE], scale=4, max_rounds=2))
    assert loss_model * 0.85 < loss.workloads[0].speedup < 1.0, loss.message


def test_seed_custom_drafter_is_rejected_in_seconds():
    base, custom = load_profile("sglang-base-kimi-k25"), load_profile("kimi-k25-custom-eagle3")
    t = time.perf_counter()
    result = asyncio.run(probe_between(base, custom, [parse_workload("chat:4:64:128:16")], scale=20))
    assert time.perf_counter() - t < 5
    assert (result.decision, result.reason) == ("rollback", "DrafterNotAccepting"), result.message
    assert result.rounds == 0 and result.accept_length <= 1.1


@pytest.mark.timing
def test_seed_public_drafter_loses_at_128_and_warns_about_the_cap_of_48():
    base, public = load_profile("sglang-base-kimi-k25"), load_profile("kimi-k2-public-eagle3")
    # Random ids: the seed's accept length (2.26) is the profile's own, not a per-kind value of the default prompts.
    c128 = parse_workload("c128:128:8:16:144").model_copy(update={"prompts": Prompts(source="Random")})
    # Measured in real time, one round: the servers' caps (the speculative server's 48 queues the rest of 128), the
    # drafter's acceptance and the loss the cap's waves cost. The seed measured 849 / 2370 = 0.36x in steady state;
    # the model of this short run says 0.38x, and busy cores pull a measured ratio towards 1 (0.48x to 0.57x seen at
    # time scale 2, and once 0.62x, in make test's timing phase). At time scale 1 (4.4 s, not 2.2 s) the simulators'
    # own CPU per token weighs half as much against the simulated times: 0.43x on a quiet machine, and still 0.628x
    # once in session 40's timing phase. What this measures is a loss well below 1 (the decision on it is asserted on
    # recorded rounds): the bound is 0.7, a 30 % loss, above what busy cores have shown.
    measured = asyncio.run(probe_between(base, public, [c128], scale=1, max_rounds=1))
    assert measured.rounds == 1 and measured.workloads[0].speedup < 0.7, measured.message
    assert any("max_running_requests=48" in w and "128" in w for w in measured.warnings)
    assert measured.accept_length == pytest.approx(2.26, rel=0.1)
    # The decision at the model's loss, on recorded rounds: below the threshold, whatever the machine's noise.
    assert analytic_speedup(base, public, c128) < 0.4
    for recorded in RECORDED:
        result = probe_replayed(recorded, base, public, [c128])
        assert (result.decision, result.reason) == ("rollback", "SpeedupBelowThreshold"), (recorded, result.message)
        assert result.workloads[0].speedup_high < 1.0


def test_seed_public_drafter_single_stream_is_not_promoted():
    base, public = load_profile("sglang-base-kimi-k25"), load_profile("kimi-k2-public-eagle3")
    one = parse_workload("one:1:32:64:2")
    assert analytic_speedup(base, public, one) == pytest.approx(0.99, abs=0.01)  # the seed's one-stream tie
    for recorded in RECORDED:
        result = probe_replayed(recorded, base, public, [one], max_rounds=4)
        assert result.decision == "rollback" and result.reason in ("Inconclusive", "SpeedupBelowThreshold"), (recorded, result.message)


def test_win_at_one_loss_at_128_under_both_policies():
    # What is tested here is how the policies combine workloads, so the intervals are the cheaper 95 % ones.
    fast = {"confidence": 0.95}
    for recorded in RECORDED:
        all_policy = probe_replayed(recorded, BASE, MIXED, [SINGLE, WIDE], policy="all", **fast)
        assert (all_policy.decision, all_policy.reason) == ("rollback", "SpeedupBelowThreshold"), (recorded, all_policy.message)
        by_name = {w.name: w for w in all_policy.workloads}
        assert by_name["single"].speedup_low > 1 and by_name["wide"].speedup_high < 1, recorded

        mostly_single = [parse_workload("single:1:32:64:2:9"), parse_workload("wide:128:32:16:128:1")]
        weighted = probe_replayed(recorded, BASE, MIXED, mostly_single, policy="weighted", **fast)
        assert (weighted.decision, weighted.reason) == ("promote", "SpeedupConfirmed"), (recorded, weighted.message)
        # Within 25 %: a noisy trace's two rounds (batch-32's range from 0.45x to 2.8x of its mean) move the estimate,
        # but the weights still show (an unweighted mean would be 1.3x, here and below).
        assert weighted.speedup == pytest.approx((9 * 2.08 + 0.5) / 10, rel=0.25), (recorded, weighted.message)

        mostly_wide = [parse_workload("single:1:32:64:2:1"), parse_workload("wide:128:32:16:128:9")]
        weighted = probe_replayed(recorded, BASE, MIXED, mostly_wide, policy="weighted", max_rounds=10, **fast)
        # The weight of the loss shows in the estimate (the model's 0.66x; an unweighted mean would be 1.3x).
        assert (weighted.decision, weighted.reason) == ("rollback", "SpeedupBelowThreshold"), (recorded, weighted.message)
        assert weighted.speedup == pytest.approx((2.08 + 9 * 0.5) / 10, rel=0.25), (recorded, weighted.message)


def test_equal_servers_never_promote_on_recorded_simulator_noise():
    # 20 probes per recorded pair of identical simulators (quieter and beside a busy machine), each drawing its own
    # rounds, at most 5 rounds each. test_probe_stats.py's futility test runs equal servers with 5 % step jitter in
    # real time; the 100-run benchmark (benchmarks/probe_null.py) promoted none either.
    equal = [r for r in RECORDED if r[1] == "equal"]
    workloads = [parse_workload("small:4:16:32:8")]
    results = [probe_replayed(t, BASE, BASE, workloads, key=f"seed-{s}", max_rounds=5) for t in equal for s in range(20)]
    assert len(results) == 20 * len(equal) == 40
    assert [r.decision for r in results] == ["rollback"] * 40, [r.message for r in results if r.decision != "rollback"]
    assert {r.reason for r in results} <= {"Inconclusive", "SpeedupBelowThreshold"}
    assert len({r.message for r in results}) > 20  # the probes drew different rounds


def test_injected_http_errors_fail_the_probe():
    broken = prof("broken", [[1, 12.0], [128, 60.0]], 2.5, errors={"http_500_rate": 0.5})
    result = asyncio.run(probe_between(BASE, broken, [parse_workload("w:2:16:16:8")], scale=4))
    assert (result.decision, result.reason) == ("rollback", "ProbeFailed")
    assert "HTTP 500" in result.message


def test_injected_timeouts_fail_the_probe():
    hanging = prof("hanging", [[1, 12.0], [128, 60.0]], 2.5, errors={"timeout_rate": 1.0})
    t = time.perf_counter()
    result = asyncio.run(probe_between(BASE, hanging, [parse_workload("w:2:16:16:4")], scale=4, request_timeout=1.0, read_timeout=0.5))
    assert (result.decision, result.reason) == ("rollback", "ProbeFailed")
    assert "timed out" in result.message and time.perf_counter() - t < 5


def test_spent_time_budget_is_inconclusive():
    slow = prof("slow", [[1, 200.0]], 2.5)
    result = asyncio.run(probe_between(BASE, slow, [parse_workload("w:1:16:64:4")], scale=1, timeout=1.0))
    assert (result.decision, result.reason) == ("rollback", "Inconclusive")
    assert "time budget" in result.message


def test_status_document_is_camel_case_with_rfc3339_times():
    result = asyncio.run(probe_between(BASE, WIN, [SINGLE], scale=4))
    status = dump(result.to_status())
    assert set(status) == {"decision", "reason", "rounds", "startedAt", "finishedAt", "acceptLength", "speedup", "message", "workloads", "traffic"}
    assert status["startedAt"].endswith("Z") and "T" in status["startedAt"]
    assert set(status["workloads"][0]) == {
        "name",
        "concurrency",
        "baseTokensPerSecond",
        "speculativeTokensPerSecond",
        "speedup",
        "speedupLow",
        "speedupHigh",
    }
    # The operator writes this into the CR: it must validate against the API model.
    from specdec_operator.api import ProbeStatus

    ProbeStatus.model_validate(status)


def test_on_round_sees_each_round():
    seen = []

    async def scenario():
        async def hook(result):
            seen.append((result.rounds, result.workloads[0].rounds))

        return await probe_between(BASE, WIN, [SINGLE], scale=4, on_round=hook)

    result = asyncio.run(scenario())
    # The hook sees every round, in order, whatever the decision (which depends on the host's timing here: a busy
    # machine once made this clear win Inconclusive; decisions are asserted on recorded rounds above). No decision
    # before round 2 (PROMOTE_MIN_ROUNDS), so there are at least two.
    assert result.rounds >= 2 and seen == [(i, i) for i in range(1, result.rounds + 1)], (result.message, seen)


def test_scrape_metrics_reads_the_simulator():
    async def scenario():
        async with SimulatorServer(load_profile("kimi-k2-public-eagle3"), time_scale=20, seed=1, load_seconds=0) as url:
            await run_probe(url, url, [parse_workload("w:2:8:64:4")], max_rounds=1)
            return await scrape_metrics(None, url)

    metrics = asyncio.run(scenario())
    assert 1.5 < metrics["sglang:spec_accept_length"] < 3.5
    assert metrics["sglang:num_running_reqs"] == 0
    assert metrics["sglang:generation_tokens_total"] >= 2 * 4 * 64


def test_bad_arguments_raise_input_error():
    with pytest.raises(InputError, match="min-speedup"):
        asyncio.run(run_probe("http://a", "http://b", [SINGLE], min_speedup=0))
    with pytest.raises(InputError, match="policy"):
        asyncio.run(run_probe("http://a", "http://b", [SINGLE], policy="most"))
    with pytest.raises(InputError, match="--base"):
        asyncio.run(run_probe("a:1", "http://b", [SINGLE]))
    for settle in (-1.0, float("nan"), 61.0):
        with pytest.raises(InputError, match="--settle"):
            asyncio.run(run_probe("http://a", "http://b", [SINGLE], settle_s=settle))


# --- the command line ----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_cli_unreachable_base_exits_3_and_bad_workload_exits_2(capsys):
    dead = f"http://127.0.0.1:{free_port()}"
    assert specdec_main(["probe", "--base", dead, "--candidate", dead, "--workload", "w:1:8:8:1", "--json"]) == 3
    out, err = capsys.readouterr()
    assert json.loads(out)["reason"] == "ProbeFailed" and "base server unreachable" in err
    assert specdec_main(["probe", "--base", dead, "--candidate", dead, "--workload", "w:1:8"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "NAME:CONCURRENCY" in err


def test_cli_json_against_simulator_processes():
    flags = ("--time-scale", "4", "--load-seconds", "0", "--seed", "3")
    with SimulatorProcess("llama31-8b-base", *flags) as base, SimulatorProcess("llama31-8b-eagle3", *flags) as candidate:
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "specdec_operator.cli",
                "probe",
                "--base",
                base,
                "--candidate",
                candidate,
                "--workload",
                "one:1:32:64:2",
                "--workload",
                "eight:8:32:64:16",
                "--json",
                "--seed",
                "1",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, run.stderr
        doc = json.loads(run.stdout)
        # The JSON's shape and the progress lines, not a decision made on real timing in the parallel phase (it failed
        # there once beside a load of 10): a drafter measured faster, never rolled back for its speed. Promotion
        # itself is asserted on recorded rounds above.
        assert doc["reason"] in ("SpeedupConfirmed", "Inconclusive") and doc["workloads"][0]["speedup"] > 1.0, doc
        assert {"decision", "reason", "rounds", "accept_length", "workloads"} <= set(doc)
        assert set(doc["workloads"][0]) >= {"name", "concurrency", "base_tok_s", "candidate_tok_s", "speedup", "speedup_low", "speedup_high"}
        assert "round 2" in run.stderr  # progress lines (no promotion before round 2, and a 2x drafter never rolls back at 1)
