"""The captured conversations counted (docs/capture.md, "How many are stored"): real capture proxies on real HTTP
count the claim's records on their /metrics (written, deleted by retention, written by another replica, before a
restart, turned off), and the operator reads them (controller/capturecount.py) into status.retraining.capture and
the training rule's count: the highest figure of the Ready proxies that answer, None (never 0) when none does."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

from drafter_training.gather import gather
from specdec_operator.capture.proxy import CaptureProxy, running
from specdec_operator.controller.capturecount import COUNT_EVERY_S, RETRY_S, CaptureCounts, claim_conversations, counted_pods, stored_conversations
from specdec_operator.controller.config import Endpoints, OperatorConfig
from specdec_operator.controller.state import ResourceState
from specdec_operator.reconcile.capture_objects import CAPTURE_APP, proxy_deployment
from specdec_operator.resource import parse_spec
from tests.support.world import World, llama_spec, to_promoted
from tests.unit.test_capture_proxy import Upstream, chat, make_proxy, serving

KEY = ("ns", "llama")
CAPTURE = {"enabled": True, "sampleShare": 1.0}


@asynccontextmanager
async def proxy_pod(proxy: CaptureProxy) -> AsyncIterator[tuple[str, str]]:
    """A capture proxy as its pod runs it: the traffic port and the admin port (/metrics), as (traffic, admin) URLs."""
    async with running(proxy) as url, serving(proxy.admin_app()) as admin:
        yield url, admin


async def send(session: aiohttp.ClientSession, url: str, *bodies: dict[str, Any], path: str = "/v1/chat/completions") -> None:
    for body in bodies:
        async with session.post(url + path, json=body) as answer:
            assert answer.status == 200
            await answer.read()


async def scraped(session: aiohttp.ClientSession, admin: str) -> float | None:
    async with session.get(admin + "/metrics") as answer:
        return stored_conversations(await answer.text())


def gathered(directory: Path, out: Path) -> int:
    """What the training Job's gather stage reads as conversations there (repeats included, as the count)."""
    stats = gather(directory, out, heldout_share=0.0)
    return stats["conversations"] + stats["repeated"]


def test_the_proxies_count_the_claim_across_replicas_retention_restart_and_turning_off(tmp_path: Path) -> None:
    claim = tmp_path / "claim"
    upstream = Upstream()

    async def scenario() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with AsyncExitStack() as stack, aiohttp.ClientSession() as s:
            up = await stack.enter_async_context(serving(upstream.app))
            a, b = make_proxy(up, claim, segment_bytes=600), make_proxy(up, claim)
            b.store.writer = "pod-b"
            url_a, admin_a = await stack.enter_async_context(proxy_pod(a))
            url_b, admin_b = await stack.enter_async_context(proxy_pod(b))
            await asyncio.gather(a.queue.join(), b.queue.join())
            await a.count(), await b.count()
            out["empty"] = await scraped(s, admin_a)
            # Five usable conversations through replica a (three files at 600 bytes), two through b, and records no
            # training can use: a completions prompt, messages that are no conversation.
            await send(s, url_a, *(chat(f"question {i} " + "x" * 150) for i in range(5)))
            await send(s, url_b, chat("from b"), chat("from b"))  # a repeat: counted, as the Job's gather reads it
            await send(s, url_a, {"model": "m", "prompt": "a completion"}, path="/v1/completions")
            await send(s, url_b, {"model": "m", "messages": "not a list"})
            await asyncio.gather(a.queue.join(), b.queue.join())
            await a.count(), await b.count()
            out["a"], out["b"] = await scraped(s, admin_a), await scraped(s, admin_b)
            out["records"] = a.metrics.claim.count.records if a.metrics.claim.count else None
            out["gathered"] = gathered(claim, tmp_path / "gather-1")
            # Retention: replica a's oldest file is past it; a deletes it, b's count falls too.
            oldest = sorted(claim.glob("capture-*-pod-a.jsonl"))[0]
            out["in_oldest"] = len(oldest.read_text().splitlines())
            os.utime(oldest, (1.0, 1.0))
            await a.enforce()
            await b.count()
            out["after_retention"] = await scraped(s, admin_b)
        # Both replicas stopped (a restart: new pods, new names). A new proxy counts every file already there,
        # pod-a's and pod-b's, once it has read them; before that its /metrics says nothing, not 0.
        async with serving(upstream.app) as up:
            c = make_proxy(up, claim)
            c.store.writer = "pod-c"
            async with serving(c.admin_app()) as admin_c, aiohttp.ClientSession() as s:
                out["restarted_before_count"] = await scraped(s, admin_c)
                await c.count()
                out["restarted"] = await scraped(s, admin_c)
                out["gathered_after"] = gathered(claim, tmp_path / "gather-2")
                # Turning capture off deletes the claim's records: the count falls to 0.
                for path in claim.glob("capture-*.jsonl"):
                    path.unlink()
                await c.count()
                out["off"] = await scraped(s, admin_c)
        return out

    out = asyncio.run(scenario())
    assert out["empty"] == 0.0  # counted, and nothing there yet
    assert out["a"] == out["b"] == 7 == out["gathered"]  # the claim's count, from either replica; gather agrees
    assert out["records"] == 9  # every record, the two no training can use included
    assert out["in_oldest"] >= 1 and out["after_retention"] == 7 - out["in_oldest"]
    assert out["restarted_before_count"] is None
    assert out["restarted"] == out["after_retention"] == out["gathered_after"]
    assert out["off"] == 0.0


def test_a_started_proxy_counts_the_claim_by_itself(tmp_path: Path) -> None:
    lines = [json.dumps({"endpoint": "chat", "messages": [{"role": "user", "content": f"q{i}"}]}) for i in range(3)]
    (tmp_path / "capture-20261201T000000Z-000001-old-pod.jsonl").write_text("\n".join(lines) + "\n" + '{"endpoint": "chat", "mess')
    upstream = Upstream()

    async def scenario() -> float | None:
        async with serving(upstream.app) as up:
            proxy = make_proxy(up, tmp_path)
            async with proxy_pod(proxy) as (_, admin), aiohttp.ClientSession() as s:
                for _ in range(100):  # the count starts with the proxy; no call from here
                    found = await scraped(s, admin)
                    if found is not None:
                        return found
                    await asyncio.sleep(0.05)
        return None

    assert asyncio.run(scenario()) == 3  # the line still being written is not counted


def _timed_file(directory: Path, stamp: str, writer: str, times: list[str]) -> Path:
    lines = [json.dumps({"time": t, "endpoint": "chat", "messages": [{"role": "user", "content": f"q {t}"}]}) for t in times]
    path = directory / f"capture-{stamp}-000001-{writer}.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_conversations_since_a_time_do_not_fall_when_retention_deletes_older_files(tmp_path: Path) -> None:
    """GET /count?since= on the admin port: the conversations captured at or after a time (the last training Job's
    start), from the records' own time. Retention deleting the oldest file lowers the whole count, not this one; the
    operator reads it with the count (CaptureCounts.due) for the lost-retrain rule (reconcile/retrain.py)."""
    old = _timed_file(tmp_path, "20261207T050000Z", "pod-a", ["2026-12-07T05:00:00.000+00:00"] * 4)
    _timed_file(tmp_path, "20261207T055900Z", "pod-a", ["2026-12-07T05:59:00.000+00:00", "2026-12-07T06:01:00.000+00:00"])
    _timed_file(tmp_path, "20261207T061000Z", "pod-b", ["2026-12-07T06:10:00.000+00:00"] * 3)
    start = "2026-12-07T06:00:00Z"
    upstream = Upstream()
    spec = parse_spec(llama_spec(**{"retraining.capture": CAPTURE}))

    async def scenario() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with AsyncExitStack() as stack, aiohttp.ClientSession() as s:
            up = await stack.enter_async_context(serving(upstream.app))
            proxy = make_proxy(up, tmp_path)
            admin = await stack.enter_async_context(serving(proxy.admin_app()))
            async with s.get(admin + "/count", params={"since": start}) as answer:
                out["before_count"] = answer.status
            await proxy.count()
            async with s.get(admin + "/count", params={"since": "yesterday"}) as answer:
                out["bad"] = (answer.status, (await answer.json())["error"])
            counts = CaptureCounts(Endpoints({"ns/pod/cap-a": admin}), timeout=2.0)
            stack.push_async_callback(counts.close)
            state = ResourceState(uid="u")
            out["whole"] = await counts.due(KEY, state, spec, [ready_pod("cap-a")], since=start)
            out["since"] = state.captured.since_start if state.captured else None
            old.unlink()  # retention: the oldest file goes
            await proxy.count()
            state = ResourceState(uid="u")
            out["whole_after"] = await counts.due(KEY, state, spec, [ready_pod("cap-a")], since=start)
            out["since_after"] = state.captured.since_start if state.captured else None
            fresh = ResourceState(uid="u")
            await counts.due(KEY, fresh, spec, [ready_pod("cap-a")])  # no Job started yet: nothing to count since
            out["no_job_yet"] = fresh.captured.since_start if fresh.captured else "unread"
        return out

    out = asyncio.run(scenario())
    assert out["before_count"] == 503  # not counted yet: not a 0
    assert out["bad"][0] == 400 and "since must be an RFC 3339 time" in out["bad"][1]
    assert (out["whole"], out["since"]) == (9, 4)  # 06:01 and three at 06:10 are at or after the start
    assert (out["whole_after"], out["since_after"]) == (5, 4)  # the whole count fell by the deleted file, "since" did not
    assert out["no_job_yet"] is None


def ready_pod(name: str, ip: str | None = "10.0.0.1", ready: bool = True, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {"app.kubernetes.io/name": CAPTURE_APP, "app.kubernetes.io/instance": "llama"}}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-02T09:00:00Z"
    return {"metadata": meta, "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": str(ready)}]}}


def test_the_operator_reads_the_highest_figure_of_the_proxies_that_answer_and_none_when_none_does(tmp_path: Path) -> None:
    upstream = Upstream()
    spec = parse_spec(llama_spec(**{"retraining.capture": CAPTURE}))
    plain = parse_spec(llama_spec())

    async def scenario() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with AsyncExitStack() as stack, aiohttp.ClientSession() as s:
            up = await stack.enter_async_context(serving(upstream.app))
            a, b = make_proxy(up, tmp_path), make_proxy(up, tmp_path)
            b.store.writer = "pod-b"
            url_a, admin_a = await stack.enter_async_context(proxy_pod(a))
            _, admin_b = await stack.enter_async_context(proxy_pod(b))
            mapping = {"ns/pod/cap-a": admin_a, "ns/pod/cap-b": admin_b, "ns/pod/cap-dead": "http://127.0.0.1:9"}
            counts = CaptureCounts(Endpoints(mapping), timeout=2.0)
            stack.push_async_callback(counts.close)
            now = [1000.0]
            counts.clock = lambda: now[0]
            await send(s, url_a, chat("one"), chat("two"), chat("three"))
            await a.queue.join()
            await a.count()  # b counted when it started (0) and not since: a's figure is the newer, and the higher
            out["a_only_counted"] = await counts.read(KEY, {"cap-a": None, "cap-b": None, "cap-dead": None})
            out["dead_only"] = await counts.read(KEY, {"cap-dead": None})
            out["no_address"] = await counts.read(KEY, {"cap-gone": None})
            state = ResourceState(uid="u")
            pods = [ready_pod("cap-a"), ready_pod("cap-b"), ready_pod("cap-dead"), ready_pod("cap-starting", ready=False)]
            out["first"] = await counts.due(KEY, state, spec, pods)
            await send(s, url_a, chat("four"))
            await a.queue.join()
            await a.count(), await b.count()  # both have counted the claim now: the same figure twice, not twice the count
            now[0] += COUNT_EVERY_S - 1
            out["within_a_minute"] = await counts.due(KEY, state, spec, pods)
            now[0] += 1
            out["a_minute_later"] = await counts.due(KEY, state, spec, pods)
            out["none_ready"] = await counts.due(KEY, ResourceState(uid="u"), spec, [ready_pod("cap-a", ready=False)])
            dead = ResourceState(uid="u")
            out["all_unreachable"] = await counts.due(KEY, dead, spec, [ready_pod("cap-dead")])
            counts.endpoints.mapping["ns/pod/cap-dead"] = admin_a  # it answers from now on
            now[0] += RETRY_S - 1
            out["unknown_within_retry"] = await counts.due(KEY, dead, spec, [ready_pod("cap-dead")])
            now[0] += 1
            out["unknown_retried"] = await counts.due(KEY, dead, spec, [ready_pod("cap-dead")])
            out["off"] = await counts.due(KEY, state, plain, pods)
            out["off_state"] = state.captured
        return out

    out = asyncio.run(scenario())
    assert out["a_only_counted"] == 3  # b counted the claim when it started (0): the newer, higher figure stands
    assert out["dead_only"] is None and out["no_address"] is None  # unreachable or no address: unknown, never 0
    assert out["first"] == 3 and out["within_a_minute"] == 3 and out["a_minute_later"] == 4
    assert out["none_ready"] is None and out["all_unreachable"] is None
    assert out["unknown_within_retry"] is None and out["unknown_retried"] == 4  # an unknown count is asked again sooner
    assert out["off"] is None and out["off_state"] is None


def test_the_readable_pods_and_the_combination() -> None:
    pods = [ready_pod("a"), ready_pod("b", ip=None), ready_pod("c", ready=False), ready_pod("d", deleting=True)]
    assert counted_pods(pods) == {"a": "10.0.0.1", "b": None}
    assert claim_conversations([None, 12.0, 15.0]) == 15 and claim_conversations([None, None]) is None and claim_conversations([0.0]) == 0
    assert stored_conversations("# no such metric\nother_metric 3\n") is None and stored_conversations("not prometheus {") is None


def test_the_count_reaches_status_known_or_not() -> None:
    """Through reconcile: the count read shows in status.retraining.capture.conversations; an unknown one is absent."""
    world = World(llama_spec(**{"retraining": {"capture": CAPTURE}}))
    to_promoted(world)
    world.deployments["llama-capture"]["status"] = {"readyReplicas": 1}
    known = world.step(captured_samples=150)
    assert known.status["retraining"]["capture"]["conversations"] == 150
    unknown = world.step(captured_samples=None)
    assert unknown.status["retraining"]["capture"].get("conversations") is None


def test_the_operators_step_reads_the_ready_proxies_into_status(tmp_path: Path) -> None:
    """Runtime's guarded step (the daemon's): the capture pods from the index are read before the step and the count
    is written to status.retraining.capture.conversations."""
    from specdec_operator.controller.metrics import OperatorMetrics
    from specdec_operator.controller.runtime import Children, Runtime
    from tests.support.runtime import LOG, FakeProbes, FakeWriter
    from tests.support.runtime import llama_spec as runtime_spec

    upstream = Upstream()
    body = {
        "metadata": {"name": "llama", "namespace": "ns", "uid": "uid-1", "generation": 1},
        "spec": {**runtime_spec(), "retraining": {"capture": CAPTURE}},
    }

    async def scenario() -> tuple[Any, Any]:
        async with serving(upstream.app) as up:
            proxy = make_proxy(up, tmp_path)
            async with proxy_pod(proxy) as (url, admin), aiohttp.ClientSession() as s:
                await send(s, url, chat("one"), chat("two"))
                await proxy.queue.join()
                await proxy.count()
                writer = FakeWriter()
                config = OperatorConfig(endpoints=Endpoints({"ns/pod/llama-capture-x": admin}))
                runtime = Runtime(config, OperatorMetrics(), writer=writer, probes=FakeProbes())  # type: ignore[arg-type]
                children = Children(
                    pods=lambda _: [],
                    servers=lambda _: [c for c in writer.children.values() if c["kind"] == "Deployment"],
                    services=lambda _: [c for c in writer.children.values() if c["kind"] == "Service"],
                    config_maps=lambda _: [],
                    capture_pods=lambda _: [ready_pod("llama-capture-x")],
                )
                state = runtime.resource(KEY, "uid-1")
                try:
                    for _ in range(2):
                        _, failed = await runtime._guarded_step(KEY, state, {**body, "status": writer.status}, children, LOG)
                        assert not failed
                finally:
                    await runtime.close()
                return writer.status, state.captured

    status, captured = asyncio.run(scenario())
    assert status["retraining"]["capture"]["conversations"] == 2 and captured is not None and captured.conversations == 2


def test_the_proxy_pods_carry_the_label_the_operators_pod_watch_selects() -> None:
    """managed-by lets the operator's server-side filtered pod watch see them; the capture app's name keeps them out
    of the servers' pods (controller/handlers.py indexes them apart)."""
    from specdec_operator import manifests as m
    from specdec_operator.api_retraining import CaptureSettings

    spec = parse_spec(llama_spec(**{"retraining.capture": CAPTURE}))
    deployment = proxy_deployment("llama", "ns", spec, CaptureSettings(**{"sampleShare": 0.5}), m.ManifestSettings())
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels[m.LABEL_MANAGED_BY] == m.MANAGED_BY and labels[m.LABEL_NAME] == CAPTURE_APP


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A Kubernetes label selector (matchLabels, matchExpressions In/NotIn/Exists/DoesNotExist) against labels."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for rule in selector.get("matchExpressions", []):
        key, op, values = rule["key"], rule["operator"], rule.get("values", [])
        found = {"In": labels.get(key) in values, "NotIn": labels.get(key) not in values, "Exists": key in labels, "DoesNotExist": key not in labels}
        if not found[op]:
            return False
    return True


def test_the_charts_server_network_policy_leaves_the_capture_proxies_reachable(helm_bin: str) -> None:
    """With the chart's NetworkPolicies on, the servers' policy (ingress from the operator on the servers' port only)
    must not select the capture proxies now that they carry managed-by: the clients reach them through the stable
    Service, the operator reads their count on 9091."""
    from specdec_operator import manifests as m
    from specdec_operator.api_retraining import CaptureSettings
    from tests.support.chart import by_kind, render

    docs = render(helm_bin, None, "--set", "networkPolicy.enabled=true", "--set", "networkPolicy.namespaces={team-a}")
    (servers,) = [p for p in by_kind(docs, "NetworkPolicy") if p["metadata"]["name"].endswith("-servers")]
    world = World(llama_spec(**{"retraining": {"capture": CAPTURE}}))
    world.step()
    spec = parse_spec(llama_spec(**{"retraining.capture": CAPTURE}))
    proxy = proxy_deployment("llama", "ns", spec, CaptureSettings(**{"sampleShare": 0.5}), m.ManifestSettings())
    selector = servers["spec"]["podSelector"]
    assert _selects(selector, world.template("base")["metadata"]["labels"]) and _selects(
        selector, world.template("speculative")["metadata"]["labels"]
    )
    assert not _selects(selector, proxy["spec"]["template"]["metadata"]["labels"])


def test_kubectl_specdec_status_says_how_many_conversations_are_stored() -> None:
    from specdec_operator.cli.kubectl_specdec import describe
    from specdec_operator.reconcile import read_status

    world = World(llama_spec(**{"retraining": {"capture": CAPTURE}}))
    to_promoted(world)
    world.deployments["llama-capture"]["status"] = {"readyReplicas": 1}
    known = describe("llama", read_status(world.step(captured_samples=1234).status), {})
    assert "  capture: On, claim llama-capture (2Gi), 1234 conversations stored" in known.splitlines()
    unknown = describe("llama", read_status(world.step(captured_samples=None).status), {})
    assert "  capture: On, claim llama-capture (2Gi)" in unknown.splitlines()


def test_the_loop_wakes_when_the_count_is_due_and_not_sooner() -> None:
    from specdec_operator.controller.capturecount import count_wait
    from specdec_operator.controller.state import Captured

    state = ResourceState(uid="u")
    assert count_wait(state, 100.0) is None  # capture off
    state.captured = Captured(100.0 + COUNT_EVERY_S, 7, "counted")
    assert count_wait(state, 100.0) == COUNT_EVERY_S and count_wait(state, 150.0) == 10.0 and count_wait(state, 200.0) == 1.0
    state.captured = Captured(100.0 + RETRY_S, None, "none answered")
    assert count_wait(state, 100.0) == RETRY_S
    state.captured = Captured(float("-inf"), None, "no capture proxy is Ready")
    assert count_wait(state, 100.0) == COUNT_EVERY_S  # no timer of a second while a proxy cannot start
