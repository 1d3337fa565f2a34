"""Regression tests for what benchmarks/scale.py (1,000 SpeculativeServers, docs/scale.md) found broken. Pure."""

from __future__ import annotations

import math

from specdec_operator import api
from specdec_operator import manifests as m
from specdec_operator.probe import stats


def test_wildly_noisy_rounds_give_an_unbounded_interval_not_an_overflow() -> None:
    # Two paired rounds 40,000x apart (probes sharing an overloaded server) at a strict per-look level: the
    # interval's upper end used to overflow math.exp, and the probe ended ProbeFailed instead of undecided.
    interval = stats.log_ratio_interval([0.005, 200.0], stats.per_look_level(0.95, 12))
    assert interval.high == math.inf and interval.low >= 0.0 and math.isfinite(interval.estimate)
    assert not (interval.low >= 1.0)  # cannot confirm a speedup


def test_only_the_stable_service_allocates_a_cluster_ip() -> None:
    # 3 ClusterIPs per resource was what broke first: the API server allocated a few per second.
    assert "clusterIP" not in m.service("llama", "ns", None)["spec"]
    for variant in (api.Variant.BASE, api.Variant.SPECULATIVE):
        svc = m.service("llama", "ns", variant)
        assert svc["spec"]["clusterIP"] == "None"
        # Headless: clients reach the pod's own IP, so the Service port must be the container's port.
        assert svc["spec"]["ports"][0]["targetPort"] == m.PORT_NAME
