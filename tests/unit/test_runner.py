"""`specdec run`: flags and the endpoints mapping fail on one line; Services resolve to DNS or the mapping only."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from specdec_operator.controller.config import Endpoints
from specdec_operator.controller.runner import build_parser, default_priority
from specdec_operator.errors import InputError


def run(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "specdec_operator.cli", "run", *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "KUBECONFIG": str(tmp_path / "nothing")},
    )


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--endpoints", "missing.yaml"], "--endpoints missing.yaml: cannot read"),
        (["--reconcile-interval", "0"], "--reconcile-interval"),
        (["--metrics-port", "abc"], "--metrics-port"),
        (["--peering", "x", "--standalone"], "not allowed with"),
        (["--namespace", "a", "--all-namespaces"], "not allowed with"),
    ],
)
def test_bad_flags_give_one_line_and_exit_2(args: list[str], needle: str, tmp_path: Path) -> None:
    proc = run(*args, tmp_path=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_no_credentials_is_one_line(tmp_path: Path) -> None:
    proc = run("--standalone", "--metrics-port", "0", tmp_path=tmp_path)
    assert proc.returncode == 2 and "no Kubernetes credentials" in proc.stderr and "Traceback" not in proc.stderr


def test_endpoints_file_is_validated(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("team/svc: ftp://x\n")
    with pytest.raises(InputError, match="team/svc"):
        Endpoints.from_file(str(bad))
    bad.write_text("- a\n- b\n")
    with pytest.raises(InputError, match="must map"):
        Endpoints.from_file(str(bad))
    good = tmp_path / "good.yaml"
    good.write_text("demo/llama-base: http://127.0.0.1:31001/\n")
    endpoints = Endpoints.from_file(str(good))
    assert endpoints.url("demo", "llama-base") == "http://127.0.0.1:31001"
    # Anything not in the mapping is reached by cluster DNS, on SGLang's port: never a host from elsewhere.
    assert endpoints.url("demo", "llama-spec") == "http://llama-spec.demo.svc:30000"


def test_defaults_and_priority_order() -> None:
    args = build_parser().parse_args([])
    assert args.reconcile_interval == 10.0 and args.metrics_port == 8080 and not args.namespace
    assert args.resync_interval == 300.0 and args.max_concurrent_reconciles == 16
    older = default_priority()
    import time

    time.sleep(0.01)
    assert default_priority() < older  # an older replica outranks a newer one
    assert older > 0


def test_operator_metrics_exposition() -> None:
    from prometheus_client import generate_latest

    from specdec_operator.controller.metrics import OperatorMetrics

    metrics = OperatorMetrics()
    metrics.observe_status("ns", "llama", {"phase": "Promoted", "activeVariant": "speculative", "speedup": 1.9, "acceptLength": 2.8})
    metrics.rollbacks.labels("ns", "srv", "AcceptanceDrift").inc()
    text = generate_latest(metrics.registry).decode()
    assert 'specdec_speedup{name="llama",namespace="ns"} 1.9' in text
    assert 'specdec_active_variant{name="llama",namespace="ns",variant="speculative"} 1.0' in text
    assert 'specdec_active_variant{name="llama",namespace="ns",variant="base"} 0.0' in text
    assert 'specdec_phase{name="llama",namespace="ns",phase="Promoted"} 1.0' in text
    assert 'specdec_rollbacks_total{name="srv",namespace="ns",reason="AcceptanceDrift"} 1.0' in text
    # A later status without measurements (a new revision validating) keeps the last measured values.
    metrics.observe_status("ns", "llama", {"phase": "Validating", "activeVariant": "base"})
    text = generate_latest(metrics.registry).decode()
    assert 'specdec_speedup{name="llama",namespace="ns"} 1.9' in text and 'specdec_accept_length{name="llama",namespace="ns"} 2.8' in text
    assert 'specdec_phase{name="llama",namespace="ns",phase="Validating"} 1.0' in text
    assert 'specdec_phase{name="llama",namespace="ns",phase="Promoted"} 0.0' in text
    metrics.forget("ns", "llama")
    assert 'name="llama"' not in generate_latest(metrics.registry).decode()


def test_forgetting_a_server_drops_its_counters_too() -> None:
    from prometheus_client import generate_latest

    from specdec_operator.controller.metrics import OperatorMetrics

    metrics = OperatorMetrics()
    metrics.rollbacks.labels("ns", "gone", "AcceptanceDrift").inc()
    metrics.probes.labels("ns", "gone", "rollback", "ProbeFailed").inc()
    metrics.probes.labels("ns", "kept", "promote", "SpeedupConfirmed").inc()
    metrics.forget("ns", "gone")
    text = generate_latest(metrics.registry).decode()
    assert 'name="gone"' not in text
    assert 'specdec_probes_total{decision="promote",name="kept",namespace="ns",reason="SpeedupConfirmed"} 1.0' in text


def test_probes_beyond_the_limit_wait_for_a_slot_and_all_finish() -> None:
    """--max-concurrent-probes: a probe past the limit says it waits, starts when a slot frees, and decides."""
    import asyncio

    import yaml

    from specdec_operator.controller.config import Endpoints, OperatorConfig
    from specdec_operator.controller.probescheduler import ProbeScheduler
    from specdec_operator.resource import parse_spec
    from specdec_operator.simulator import SimulatorServer, load_profile

    spec = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "llama31-8b-eagle3.yaml").read_text())["spec"]
    spec["rollout"]["workloads"] = [{"name": "one", "concurrency": 1, "inputTokens": 16, "outputTokens": 16, "requests": 1}]
    spec["rollout"]["maxRounds"] = 3

    async def scenario() -> None:
        async with (
            SimulatorServer(load_profile("llama31-8b-base"), time_scale=50, load_seconds=0) as base,
            SimulatorServer(load_profile("llama31-8b-eagle3"), time_scale=50, load_seconds=0) as speculative,
        ):
            urls = {f"ns/{n}-{v}": url for n in ("a", "b") for v, url in (("base", str(base)), ("spec", str(speculative)))}
            probes = ProbeScheduler(OperatorConfig(endpoints=Endpoints(urls), max_concurrent_probes=1))
            parsed = parse_spec(spec)
            probes.start(("ns", "a"), parsed, "rev-a", on_done=lambda: None)
            await asyncio.sleep(0.01)  # the first takes the only slot
            probes.start(("ns", "b"), parsed, "rev-b", on_done=lambda: None)
            await asyncio.sleep(0.01)
            assert "waiting for a probe slot" in probes.progress(("ns", "b"))
            assert probes.running(("ns", "a")) == "rev-a"
            while probes.finished(("ns", "a")) is None or probes.finished(("ns", "b")) is None:
                assert "waiting" not in (probes.progress(("ns", "b")) or "") or probes.running(("ns", "a"))
                await asyncio.sleep(0.05)
            a, b = probes.finished(("ns", "a")), probes.finished(("ns", "b"))
            assert probes.progress(("ns", "b")) is None
            assert a.revision == "rev-a" and b.revision == "rev-b"
            assert a.decision in ("promote", "rollback") and b.decision in ("promote", "rollback")
            assert a.reason != "ProbeFailed" and b.reason != "ProbeFailed", (a, b)
            await probes.close()

    asyncio.run(scenario())


def test_lean_diffbase_builds_the_same_essence_as_kopfs_without_copying_status() -> None:
    import kopf

    from specdec_operator.controller.kopf_tuning import LeanDiffBaseStorage

    managed = [{"manager": "kube-controller-manager", "fieldsV1": {"f:status": {f"f:{i}": {} for i in range(50)}}}]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "p",
            "namespace": "n",
            "uid": "u",
            "resourceVersion": "7",
            "labels": {"app": "x"},
            "managedFields": managed,
            "annotations": {"note": "kept", "kopf.zalando.org/last-handled-configuration": "{}"},
            "ownerReferences": [{"kind": "ReplicaSet", "name": "r", "uid": "1"}],
        },
        "spec": {"containers": [{"name": "c", "image": "i", "args": ["--a", "1"]}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }
    replicaset = {**pod, "kind": "ReplicaSet", "metadata": {**pod["metadata"], "ownerReferences": [{"kind": "Deployment", "name": "d", "uid": "2"}]}}
    for body in (pod, replicaset, {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}}):
        expected = kopf.AnnotationsDiffBaseStorage().build(body=kopf.Body(body))
        assert LeanDiffBaseStorage().build(body=kopf.Body(body)) == expected
    essence = LeanDiffBaseStorage().build(body=kopf.Body(pod))
    assert (
        "status" not in essence
        and essence["metadata"]["annotations"] == {"note": "kept"}
        and essence["spec"]["containers"][0]["args"] == ["--a", "1"]
    )
    # Handlers that filter on status fields get Kopf's own (whole-object) essence.
    assert LeanDiffBaseStorage().build(body=kopf.Body(pod), extra_fields=["status.phase"]) == kopf.AnnotationsDiffBaseStorage().build(
        body=kopf.Body(pod), extra_fields=["status.phase"]
    )


def test_lean_progress_storage_clears_what_kopfs_clears_and_copies_only_when_it_must() -> None:
    import copy

    import kopf

    from specdec_operator.controller.kopf_tuning import LeanDiffBaseStorage, LeanProgressStorage

    plain = LeanDiffBaseStorage().build(
        body=kopf.Body(
            {
                "kind": "Pod",
                "metadata": {"name": "p", "labels": {"app": "x"}, "annotations": {"note": "kept"}},
                "spec": {"containers": [{"name": "c"}]},
                "status": {"phase": "Running"},
            }
        )
    )
    marked = {
        "metadata": {"annotations": {"note": "kept", "kopf.zalando.org/reconcile": '{"started": "2026-12-03T00:00:00"}'}},
        "spec": {"a": 1},
        "status": {"kopf": {"progress": {"reconcile": {"retries": 1}}}, "phase": "x"},
    }
    annotated = {"metadata": {"annotations": {"note": "kept", "kopf.zalando.org/reconcile": "{}"}}, "spec": {"a": 1}}
    empties = {"metadata": {"labels": {}, "annotations": {}}, "spec": {"a": 1}, "status": {}}
    for essence in (plain, marked, annotated, empties, {"spec": {}}, {"metadata": {}}):
        original = copy.deepcopy(essence)
        expected = kopf.SmartProgressStorage().clear(essence=copy.deepcopy(essence))
        cleared = LeanProgressStorage().clear(essence=essence)
        assert cleared == expected, essence
        if cleared is not essence:  # a copy was made: the input is left as it was
            assert essence == original
    # Nothing to strip (the usual case: LeanDiffBaseStorage's essences have no status): no copy at all.
    assert LeanProgressStorage().clear(essence=plain) is plain
    assert LeanProgressStorage().clear(essence=marked) is not marked
    assert "kopf.zalando.org/reconcile" not in LeanProgressStorage().clear(essence=marked)["metadata"]["annotations"]
    assert LeanProgressStorage().clear(essence=annotated)["metadata"]["annotations"] == {"note": "kept"}


def test_only_creating_the_stable_service_goes_beside_the_step() -> None:
    from specdec_operator import manifests as m
    from specdec_operator.controller.execute import creates_virtual_ip

    stable, headless = m.service("llama", "ns", None), m.service("llama", "ns", "base")
    assert creates_virtual_ip(stable, {}) and not creates_virtual_ip(stable, {"llama": stable})  # an update waits in the step (a switch)
    assert not creates_virtual_ip(headless, {})
    assert not creates_virtual_ip({"kind": "Deployment", "metadata": {"name": "llama-base"}, "spec": {}}, {})


def test_the_operators_api_requests_are_timed_by_verb_and_resource() -> None:
    """KubernetesWriter.request against a real HTTP server: each request lands in specdec_api_request_duration_seconds."""
    import asyncio
    import http.server
    import threading

    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException
    from prometheus_client import generate_latest

    from specdec_operator.controller.kubewriter import KubernetesWriter
    from specdec_operator.controller.metrics import OperatorMetrics

    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_PATCH(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.append((self.command, self.path, self.headers.get("Content-Type")))
            body = b'{"kind": "Status"}' if "status" in self.path else b'{"message": "no"}'
            self.send_response(200 if "status" in self.path else 422)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        configuration = k8s.Configuration(host=f"http://127.0.0.1:{server.server_port}")
        metrics = OperatorMetrics()
        writer = KubernetesWriter(metrics, k8s.ApiClient(configuration))
        asyncio.run(writer.patch_status("ns", "llama", {"phase": "Pending"}))
        with pytest.raises(ApiException):  # 422: refused, still timed
            writer.request(
                "PATCH",
                "/apis/apps/v1/namespaces/{namespace}/deployments/{name}",
                {"namespace": "ns", "name": "llama-base"},
                content_type="application/apply-patch+yaml",
                body=b"{}",
            )
    finally:
        server.shutdown()
    assert [(method, kind) for method, _, kind in seen] == [("PATCH", "application/merge-patch+json"), ("PATCH", "application/apply-patch+yaml")]
    text = generate_latest(metrics.registry).decode()
    assert 'specdec_api_request_duration_seconds_count{resource="speculativeservers/status",verb="PATCH"} 1.0' in text
    assert 'specdec_api_request_duration_seconds_count{resource="deployments",verb="APPLY"} 1.0' in text
