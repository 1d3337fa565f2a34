"""The measurements benchmarks/scale.py reports (docs/scale.md): quantiles, the API server's latency, audit counts. Pure."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.support.benchmarks import load_benchmark


@pytest.fixture(scope="module")
def scale():
    return load_benchmark("scale")


def test_histogram_quantile_interpolates_within_a_bucket_as_prometheus_does(scale) -> None:
    buckets = [(0.1, 50.0), (1.0, 90.0), (float("inf"), 100.0)]
    assert scale.histogram_quantile(buckets, 0.5) == pytest.approx(0.1)
    assert scale.histogram_quantile(buckets, 0.7) == pytest.approx(0.1 + 0.9 * 20 / 40)
    assert scale.histogram_quantile(buckets, 0.99) == 1.0  # in the +Inf bucket: its lower bound


def test_server_latency_is_the_window_between_two_samples_reads_and_writes_apart(scale) -> None:
    before = Counter(
        {
            ("latency", "write", "0.5"): 10,
            ("latency", "write", "1"): 10,
            ("latency", "write", "+Inf"): 10,
            ("latency", "read", "0.5"): 4,
            ("latency", "read", "1"): 4,
            ("latency", "read", "+Inf"): 4,
            ("PATCH", "pods", "status"): 7,
        }
    )
    after = Counter(
        {
            ("latency", "write", "0.5"): 10,
            ("latency", "write", "1"): 90,
            ("latency", "write", "+Inf"): 110,
            ("latency", "read", "0.5"): 4,
            ("latency", "read", "1"): 4,
            ("latency", "read", "+Inf"): 4,
            ("PATCH", "pods", "status"): 9,
        }
    )
    window = scale.server_latency(before, after)
    # 100 writes in the window: none under 0.5 s (the bucket with no change still bounds the interpolation), 80
    # under 1 s, 20 above.
    assert window["write"]["requests"] == 100
    assert window["write"]["p50_s"] == pytest.approx(0.5 + 0.5 * 50 / 80)
    assert window["write"]["p99_s"] == 1.0 and window["write"]["share_over_1s"] == pytest.approx(0.2)
    assert "read" not in window  # no read in the window: no made-up quantile
    assert scale.request_counts(after - before) == Counter({("PATCH", "pods", "status"): 2})


def test_audit_clients_counts_per_window_and_tells_the_admin_clients_apart(scale, tmp_path: Path) -> None:
    t0 = datetime(2026, 12, 3, 6, 0, tzinfo=UTC)

    def event(seconds: float, user: str, verb: str, resource: str, agent: str = "", sub: str = "") -> str:
        at = t0.timestamp() + seconds
        stamp = datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        ref = {"resource": resource, **({"subresource": sub} if sub else {})}
        return json.dumps({"stageTimestamp": stamp, "user": {"username": user}, "userAgent": agent, "verb": verb, "objectRef": ref})

    gc = "system:serviceaccount:kube-system:generic-garbage-collector"
    log = tmp_path / "audit.log"
    log.write_text(
        "\n".join(
            [
                event(1, gc, "get", "speculativeservers"),
                event(2, gc, "get", "speculativeservers"),
                event(3, "specdec-admin", "patch", "speculativeservers", "kopf/1.45.2", "status"),
                event(4, "specdec-admin", "create", "speculativeservers", "OpenAPI-Generator/37.0.2/python"),
                "not json: a torn last line",
                event(12, "kwok-controller", "update", "leases"),
            ]
        )
        + "\n"
    )
    counts = scale.audit_clients(log, {"settling": (t0.timestamp(), t0.timestamp() + 10), "idle": (t0.timestamp() + 10, t0.timestamp() + 20)})
    assert counts["settling"][0] == f"2 {gc} get speculativeservers"
    assert "1 admin:kopf/1.45.2 patch speculativeservers/status" in counts["settling"]
    assert "1 admin:OpenAPI-Generator/37.0.2/python create speculativeservers" in counts["settling"]
    assert counts["idle"] == ["1 kwok-controller update leases"]
