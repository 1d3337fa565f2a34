"""Prompt datasets from ConfigMaps, end to end: the real `specdec run` process on the local control plane reads a
workload's ConfigMap through the API server when its probe starts (docs/probe.md, "Prompts").

A bad dataset (a malformed line, a missing key) ends with DatasetInvalid, a condition message naming the ConfigMap,
the key and the line, and no request sent to either server; a good one is what the probe sends (status.probe.traffic
names it, and no SyntheticTraffic warning is given).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from test_operator_e2e import GROUP, PLURAL, VERSION, Operator, compatible_annotations, example, operator, sims, wait_phase  # noqa: F401

pytestmark = pytest.mark.cluster

DECIDED = {"Promoted", "RolledBack", "Invalid", "Failed"}


def dataset_workload(config_map: str, key: str) -> list[dict[str, Any]]:
    return [
        {
            "name": "team-chat",
            "concurrency": 4,
            "requests": 8,
            "inputTokens": 128,
            "outputTokens": 48,
            "prompts": {"source": "ConfigMap", "configMap": {"name": config_map, "key": key}, "format": "Chat", "outputLength": "Fixed"},
        }
    ]


def chat_lines(n: int) -> str:
    return "".join(
        json.dumps({"messages": [{"role": "user", "content": f"Write a Python function number {i} that sorts a list."}]}) + "\n" for i in range(n)
    )


def test_config_map_datasets_bad_line_and_missing_key_are_refused_before_any_request_and_a_good_one_is_sent(
    operator: Operator, sims: Any, namespace: str, custom_objects: Any, core_v1: Any
) -> None:
    servers = {}
    for name in ("bad-line", "no-key", "good"):
        servers[name] = (sims.start("llama31-8b-base"), sims.start("llama31-8b-eagle3"))
        operator.map(f"{name}-base", servers[name][0].url)
        operator.map(f"{name}-spec", servers[name][1].url)
    operator.start()
    good = chat_lines(12)
    core_v1.create_namespaced_config_map(
        namespace,
        {"metadata": {"name": "team-prompts"}, "data": {"good.jsonl": good, "bad.jsonl": chat_lines(1) + '{"messages": "not a list"}\n'}},
    )
    for name, key in (("bad-line", "bad.jsonl"), ("no-key", "absent.jsonl"), ("good", "good.jsonl")):
        cr = example("llama31-8b-eagle3.yaml", name, namespace, annotations=compatible_annotations(), workloads=dataset_workload("team-prompts", key))
        cr["spec"]["rollout"]["outputCheck"] = {"enabled": False}
        custom_objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, cr)

    for name, expected in (("bad-line", ["team-prompts", "bad.jsonl", "line 2"]), ("no-key", ["team-prompts", "absent.jsonl", "good.jsonl"])):
        st = wait_phase(custom_objects, namespace, name, DECIDED, timeout=120)
        assert st["phase"] == "RolledBack" and st["probe"]["reason"] == "DatasetInvalid", st.get("message")
        assert st["activeVariant"] == "base" and st["probe"]["rounds"] == 0
        message = {c["type"]: c for c in st["conditions"]}["SpeedupVerified"]["message"]
        assert all(part in message for part in expected), message
        assert "\n" not in message and "Traceback" not in message
        base, spec = servers[name]
        # Nothing was sent: the dataset is read and parsed before the first request (the probe's readiness checks
        # are GETs, never counted as requests).
        assert base.sim.engine.requests_total == 0 and spec.sim.engine.requests_total == 0

    st = wait_phase(custom_objects, namespace, "good", DECIDED, timeout=180)
    assert st["probe"]["reason"] != "DatasetInvalid", st.get("message")
    assert "team-prompts" in (st["probe"].get("traffic") or ""), st["probe"]
    assert not st["probe"].get("syntheticTraffic")
    base, spec = servers["good"]
    assert base.sim.engine.requests_total > 0 and spec.sim.engine.requests_total > 0
    reasons = [e.reason for e in core_v1.list_namespaced_event(namespace).items if e.involved_object.name == "good"]
    assert "SyntheticTraffic" not in reasons
