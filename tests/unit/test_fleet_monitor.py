"""The fleet monitor: every Ready speculative pod scraped (concurrently, bounded), the drift rule on the fleet's
acceptance length weighted by verify calls, one sick pod reported by name and not rolled back on its own."""

from __future__ import annotations

import asyncio
import os
from datetime import timedelta

import pytest
import yaml
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec_operator.api import MonitorStatus, SickPod
from specdec_operator.controller.config import Endpoints, OperatorConfig
from specdec_operator.controller.probescheduler import ProbeScheduler
from specdec_operator.controller.runtime import monitored_pods
from specdec_operator.errors import InputError
from specdec_operator.monitor import (
    PodEvidence,
    Sample,
    fleet_accept_length,
    observe,
    observe_fleet,
    pod_evidence,
    remember,
    sick_pods,
    weighted_median,
)
from tests.support.world import NOW, World, llama_spec, reasons, to_promoted


def fleet(values: dict[str, float | None], calls: dict[str, float], t: int, previous_calls: dict[str, float] | None = None):
    """Samples of pods at time t: accept length (None: failed scrape) and verify-call counters."""
    now = {
        n: Sample(time=f"t{t}", accept_length=v, verify_calls=calls[n]) if v is not None else Sample(time=f"t{t}", error="refused")
        for n, v in values.items()
    }
    before = {n: Sample(time=f"t{t - 1}", verify_calls=c) for n, c in (previous_calls or {}).items()}
    return now, before


# --- aggregation


def test_the_fleet_acceptance_is_weighted_by_verify_calls_in_the_window() -> None:
    now = {"a": Sample(time="t1", accept_length=3.0, verify_calls=1100.0), "b": Sample(time="t1", accept_length=1.5, verify_calls=400.0)}
    before = {"a": Sample(time="t0", verify_calls=800.0), "b": Sample(time="t0", verify_calls=100.0)}
    evidence = [pod_evidence(n, s, before[n]) for n, s in now.items()]
    assert [e.verify_calls for e in evidence if e] == [300.0, 300.0]  # the window's calls, not the counters
    assert fleet_accept_length([e for e in evidence if e]) == pytest.approx(2.25)
    verdict = observe_fleet(None, now, before, floor=2.0, window=1)
    assert verdict.evidence and not verdict.drifted
    assert verdict.status.accept_length == 2.25 and verdict.status.pods == 2 and verdict.status.verify_calls == 600


def test_a_pod_without_new_verify_calls_is_no_evidence_and_weighs_nothing() -> None:
    # b is idle (its gauge is stale from long ago) and would drag the fleet below the floor if it counted.
    now = {"a": Sample(time="t1", accept_length=2.8, verify_calls=500.0), "b": Sample(time="t1", accept_length=1.0, verify_calls=90.0)}
    before = {"a": Sample(time="t0", verify_calls=400.0), "b": Sample(time="t0", verify_calls=90.0)}
    assert pod_evidence("b", now["b"], before["b"]) is None
    verdict = observe_fleet(MonitorStatus(below_floor_count=1), now, before, floor=1.5, window=2)
    assert verdict.status.accept_length == 2.8 and verdict.status.below_floor_count == 0
    # No pod with evidence: the whole scrape is no evidence, the counter stays.
    idle = {"a": Sample(time="t2", accept_length=1.0, verify_calls=500.0), "b": Sample(time="t2", error="timed out")}
    verdict = observe_fleet(MonitorStatus(below_floor_count=1, accept_length=1.2), idle, {"a": now["a"], "b": now["b"]}, floor=1.5, window=2)
    assert not verdict.evidence and not verdict.drifted and verdict.status.below_floor_count == 1 and verdict.status.accept_length == 1.2


def test_first_scrape_of_a_pod_weighs_its_calls_since_it_started() -> None:
    e = pod_evidence("new", Sample(time="t", accept_length=2.0, verify_calls=42.0), None)
    assert e == PodEvidence("new", 2.0, 42.0)
    # Without the counter (an older server): counted once, never judged.
    e = pod_evidence("old", Sample(time="t", accept_length=2.0, generated_tokens=10.0), Sample(time="t0", generated_tokens=5.0))
    assert e is not None and e.verify_calls is None and e.weight == 1.0


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(st.one_of(st.none(), st.floats(min_value=0.5, max_value=4.0)), min_size=1, max_size=30),
    moves=st.lists(st.integers(min_value=0, max_value=3), min_size=30, max_size=30),
    floor=st.floats(min_value=1.05, max_value=3.0),
    window=st.integers(min_value=1, max_value=5),
)
def test_a_one_pod_fleet_is_judged_exactly_as_the_single_server_rule(values, moves, floor, window) -> None:
    single, fleet_status, previous, calls = None, None, None, 0.0
    for i, value in enumerate(values):
        calls += moves[i]
        sample = Sample(time=f"t{i}", error="x") if value is None else Sample(time=f"t{i}", accept_length=value, verify_calls=calls)
        a = observe(single, sample, floor=floor, window=window, previous=previous)
        b = observe_fleet(fleet_status, {"pod": sample}, {"pod": previous} if previous else None, floor=floor, window=window)
        assert (a.evidence, a.drifted, a.status.below_floor_count, a.status.accept_length) == (
            b.evidence,
            b.drifted,
            b.status.below_floor_count,
            b.status.accept_length,
        )
        single, fleet_status = a.status, b.status
        previous = sample if not sample.error else previous
        if a.drifted:
            break


def test_remember_keeps_the_last_good_scrape_of_each_pod_and_forgets_gone_pods() -> None:
    good = Sample(time="t0", accept_length=2.0, verify_calls=10.0)
    kept = remember({"a": good, "gone": good}, {"a": Sample(time="t1", error="refused"), "b": good})
    assert kept == {"a": good, "b": good}


# --- the sick pod


def healthy_five_and(sick_value: float, calls: float = 300.0) -> list[PodEvidence]:
    return [PodEvidence(f"p{i}", 2.8 - 0.05 * i, 300.0) for i in range(5)] + [PodEvidence("sick", sick_value, calls)]


def test_weighted_median() -> None:
    assert weighted_median([(1.0, 1.0), (2.0, 1.0), (3.0, 1.0)]) == 2.0
    assert weighted_median([(1.0, 10.0), (2.0, 1.0), (3.0, 1.0)]) == 1.0
    assert weighted_median([(1.0, 1.0), (2.0, 1.0)]) == 1.0  # the lower one on an exact tie


def test_one_pod_far_below_its_peers_is_sick_and_the_rule_is_stated_in_accepted_tokens() -> None:
    verdicts = sick_pods(healthy_five_and(1.3))
    assert {n for n, v in verdicts.items() if v} == {"sick"}
    found = verdicts["sick"]
    assert found is not None and found.accept_length == 1.3 and found.peers_accept_length == 2.7
    # 1.3 accepts 0.3 draft tokens per verify step, the peers' median 1.7: below half. 2.0 (1.0 accepted) is not.
    assert verdicts["p0"] is None
    assert sick_pods(healthy_five_and(2.0))["sick"] is None
    assert sick_pods(healthy_five_and(1.84))["sick"] is not None  # 0.84 < 0.85
    # A pod at the bonus token only (nothing accepted) among peers at 2.0 is sick, though 1.0 is half of 2.0.
    peers_at_two = [PodEvidence(f"p{i}", 2.0, 100.0) for i in range(3)] + [PodEvidence("zero", 1.0, 100.0)]
    assert sick_pods(peers_at_two)["zero"] is not None


def test_too_few_verify_calls_or_peers_judge_nothing() -> None:
    assert "sick" not in sick_pods(healthy_five_and(1.0, calls=5.0))  # not enough calls behind its own value
    two = [PodEvidence("a", 2.8, 300.0), PodEvidence("b", 1.0, 300.0)]
    assert sick_pods(two) == {}  # one peer each: who is the sick one?
    three = [PodEvidence("a", 2.8, 300.0), PodEvidence("b", 2.7, 5.0), PodEvidence("c", 1.0, 300.0)]
    assert sick_pods(three) == {}  # b's few calls make it no peer: a and c have one peer each


def test_one_sick_pod_is_reported_and_the_fleet_is_not_rolled_back_for_it() -> None:
    names = [f"llama-spec-{i}" for i in range(6)]
    calls = dict.fromkeys(names, 0.0)
    status: MonitorStatus | None = None
    previous = None
    for t in range(1, 6):
        calls = {n: c + 250.0 for n, c in calls.items()}
        values = {n: (1.05 if n == "llama-spec-3" else 2.8) for n in names}
        now, _ = fleet(values, calls, t)
        verdict = observe_fleet(status, now, previous, floor=1.5, window=2)
        assert not verdict.drifted
        status, previous = verdict.status, remember(previous, now)
        assert [p.name for p in status.sick_pods] == ["llama-spec-3"]
        assert status.sick_pods[0].since == "t1"  # kept from the first judgement
    assert status is not None and status.accept_length == pytest.approx((5 * 2.8 + 1.05) / 6, abs=1e-4)


def test_a_sick_mark_is_kept_without_evidence_dropped_when_healthy_or_gone() -> None:
    stored = MonitorStatus(sick_pods=[SickPod(name="s", accept_length=1.1, peers_accept_length=2.8, since="t0")])
    peers = {f"p{i}": Sample(time="t1", accept_length=2.8, verify_calls=300.0) for i in range(3)}
    # s is idle this scrape: no evidence, the mark stays.
    idle = observe_fleet(
        stored,
        {**peers, "s": Sample(time="t1", accept_length=1.1, verify_calls=50.0)},
        {"s": Sample(time="t0", verify_calls=50.0)},
        floor=1.5,
        window=3,
    )
    assert [p.name for p in idle.status.sick_pods] == ["s"]
    healthy = observe_fleet(stored, {**peers, "s": Sample(time="t1", accept_length=2.7, verify_calls=300.0)}, None, floor=1.5, window=3)
    assert healthy.status.sick_pods == []
    gone = observe_fleet(stored, peers, None, floor=1.5, window=3)
    assert gone.status.sick_pods == []


def test_the_aggregate_going_bad_rolls_the_fleet_back_by_the_window_rule() -> None:
    names = [f"p{i}" for i in range(6)]
    status, previous, calls = None, None, dict.fromkeys(names, 0.0)
    drifted_at = None
    for t in range(1, 10):
        calls = {n: c + 200.0 for n, c in calls.items()}
        bad = t >= 3
        # From t3 every pod accepts little: 1.2 everywhere, no pod sick (they agree), the fleet below 1.5.
        now, _ = fleet({n: (1.2 if bad else 2.8) for n in names}, calls, t)
        verdict = observe_fleet(status, now, previous, floor=1.5, window=3)
        status, previous = verdict.status, remember(previous, now)
        assert status.sick_pods == []
        if verdict.drifted:
            drifted_at = t
            break
    assert drifted_at == 5 and status is not None and status.below_floor_count == 3


# --- in the lifecycle: the Event, and no rollback for one pod


def test_reconcile_posts_one_event_naming_the_sick_pod_and_rolls_back_on_the_aggregate() -> None:
    world = World(llama_spec())  # monitor: floor 1.5, window 4, interval 15
    to_promoted(world)
    names = [f"llama-spec-{i}" for i in range(6)]
    t, calls, previous = NOW, dict.fromkeys(names, 0.0), None
    posted = []
    for _ in range(4):
        t += timedelta(seconds=15)
        calls = {n: c + 100.0 for n, c in calls.items()}
        now = {n: Sample(time=t.isoformat(), accept_length=1.0 if n == "llama-spec-4" else 2.9, verify_calls=calls[n]) for n in names}
        plan = world.step(now=t, scrape=now, previous_scrape=previous)
        previous = now
        posted += [e for e in plan.events if e.reason == "SpeculativePodSick"]
        assert plan.status["phase"] == "Promoted"
        assert [p["name"] for p in plan.status["monitor"]["sickPods"]] == ["llama-spec-4"]
    (event,) = posted  # once, on the transition
    assert event.type == "Warning" and "llama-spec-4" in event.message and "not rolled back" in event.message
    for _ in range(4):
        t += timedelta(seconds=15)
        calls = {n: c + 100.0 for n, c in calls.items()}
        now = {n: Sample(time=t.isoformat(), accept_length=1.2, verify_calls=calls[n]) for n in names}
        plan = world.step(now=t, scrape=now, previous_scrape=previous)
        previous = now
    assert plan.status["phase"] == "RolledBack" and plan.status["reason"] == "AcceptanceDrift"
    assert "over 6 pods" in plan.status["probe"]["message"] and "AcceptanceDrift" in reasons(plan)


def test_monitored_pods_are_the_ready_speculative_ones_and_not_workers() -> None:
    def pod(name, variant, ready=True, deleting=False, role=None, ip="10.0.0.1"):
        labels = {"specdec.io/variant": variant, **({"specdec.io/role": role} if role else {})}
        meta = {"name": name, "labels": labels, **({"deletionTimestamp": "x"} if deleting else {})}
        return {"metadata": meta, "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}

    pods = [
        pod("s0", "speculative"),
        pod("s1", "speculative", ready=False),
        pod("s2", "speculative", deleting=True),
        pod("b0", "base"),
        pod("lead", "speculative", role="leader", ip="10.0.0.9"),
        pod("work", "speculative", role="worker"),
    ]
    assert monitored_pods(pods) == {"s0": "10.0.0.1", "lead": "10.0.0.9"}


# --- endpoints


def test_endpoints_map_pods_fall_back_to_the_variant_service_then_the_pod_ip(tmp_path) -> None:
    path = tmp_path / "endpoints.yaml"
    path.write_text(yaml.safe_dump({"ns/llama-spec": "http://127.0.0.1:1/", "ns/pod/llama-spec-a": "http://127.0.0.1:2"}))
    ep = Endpoints.from_file(str(path))
    assert ep.pod_url("ns", "llama-spec-a", "10.1.1.1", "llama-spec") == "http://127.0.0.1:2"
    assert ep.pod_url("ns", "llama-spec-b", "10.1.1.1", "llama-spec") == "http://127.0.0.1:1"
    assert ep.pod_url("other", "x", "10.1.1.1", "llama-spec") == "http://10.1.1.1:30000"
    assert ep.pod_url("other", "x", "fd00::5", "llama-spec") == "http://[fd00::5]:30000"
    assert ep.pod_url("other", "x", None, "llama-spec") is None
    # The file is read again when it changes (a pod mapped after it exists) ...
    path.write_text(yaml.safe_dump({"ns/llama-spec": "http://127.0.0.1:1", "ns/pod/llama-spec-b": "http://127.0.0.1:3"}))
    os.utime(path, ns=(1, 10**18))
    assert ep.pod_url("ns", "llama-spec-b", None, "llama-spec") == "http://127.0.0.1:3"
    # ... and a file that no longer parses keeps the mapping it had, and says why.
    path.write_text("ns/pod/x: 3\n")
    os.utime(path, ns=(1, 2 * 10**18))
    assert ep.pod_url("ns", "llama-spec-b", None, "llama-spec") == "http://127.0.0.1:3"
    assert ep.reload_error is not None and "'ns/pod/x'" in ep.reload_error


@pytest.mark.parametrize("key", ["a/b/c", "ns/pod/", "/svc", "a/pod/b/c"])
def test_endpoints_refuse_keys_that_are_neither_a_service_nor_a_pod(tmp_path, key) -> None:
    path = tmp_path / "e.yaml"
    path.write_text(yaml.safe_dump({key: "http://127.0.0.1:1"}))
    with pytest.raises(InputError, match=r"namespace/pod/<pod>"):
        Endpoints.from_file(str(path))


# --- scrapes: concurrent, bounded, real HTTP and Prometheus text


def exposition(accept: float, calls: float) -> str:
    from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

    registry = CollectorRegistry()
    Gauge("sglang:spec_accept_length", "x", registry=registry).set(accept)
    Counter("sglang:spec_verify_calls", "x", registry=registry).inc(calls)
    return generate_latest(registry).decode()


def test_scrapes_of_a_fleet_run_concurrently_within_the_bound(tmp_path) -> None:
    async def go() -> tuple[dict[str, Sample], int, float]:
        in_flight, peak = 0, 0

        async def metrics(request: web.Request) -> web.Response:
            nonlocal in_flight, peak
            in_flight += 1
            peak = max(peak, in_flight)
            await asyncio.sleep(0.2)
            in_flight -= 1
            return web.Response(text=exposition(2.0 + int(request.match_info.get("n", "0")) / 10, 100.0), content_type="text/plain")

        app = web.Application()
        app.router.add_get("/{n}/metrics", metrics)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        mapping = {f"ns/pod/llama-spec-{n}": f"http://127.0.0.1:{port}/{n}" for n in range(6)}
        config = OperatorConfig(endpoints=Endpoints(mapping), max_concurrent_scrapes=3)
        scheduler = ProbeScheduler(config)
        try:
            loop = asyncio.get_running_loop()
            started = loop.time()
            pods = {f"llama-spec-{n}": None for n in range(6)} | {"llama-spec-noip": None}
            samples = await scheduler.scrape(("ns", "llama"), pods)
            elapsed = loop.time() - started
        finally:
            await scheduler.close()
            await runner.cleanup()
        return samples, peak, elapsed

    samples, peak, elapsed = asyncio.run(go())
    assert peak == 3  # concurrent, and never above the bound
    assert 0.35 < elapsed < 1.2  # 6 pods of 0.2 s in two waves, not 1.2 s one after another
    assert [samples[f"llama-spec-{n}"].accept_length for n in range(6)] == [2.0, 2.1, 2.2, 2.3, 2.4, 2.5]
    assert samples["llama-spec-0"].verify_calls == 100.0
    assert samples["llama-spec-noip"].error == "the pod has no IP yet"
