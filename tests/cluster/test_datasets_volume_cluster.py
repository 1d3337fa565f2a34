"""Prompt datasets from a file on the model volume or on a PVC, end to end: the real `specdec run` process on the
local control plane creates a reader pod per File workload when its probe starts, fetches the dataset from it and
deletes it (docs/probe.md, "Prompts").

The reader pods are kwok pods, so nothing runs in them: this module plays their kubelet. For every reader pod the
scheduler placed on a node, it runs the pod's own command (`specdec dataset-serve ...`) as a local process, with
the pod's mount (/dataset) standing for a local directory: the model volume's (the example's hostPath) or the
claim's, and maps the pod in the operator's --endpoints file, the way the simulators stand for the server pods.
A pod the scheduler cannot place (a claim that does not exist) is never run, as on a real node.

A malformed line, a missing file and a missing claim end with DatasetInvalid, a condition message naming the path,
the claim and the line, and no request sent to either server; a good file on a bound claim is what the probe sends
(status.probe.traffic names it, with its count of prompts) and its reader pod is gone afterwards.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hack.reader_kubelet import READER_SELECTOR, ReaderKubelet, write_endpoints_file
from tests.support.kube import wait_until
from tests.support.operator_process import GROUP, PLURAL, VERSION, Operator, compatible_annotations, example, wait_phase

pytestmark = pytest.mark.cluster

DECIDED = {"Promoted", "RolledBack", "Invalid", "Failed"}


def file_workload(path: str, claim: str | None = None) -> list[dict[str, Any]]:
    file = {"path": path, **({"claimName": claim} if claim else {})}
    return [
        {
            "name": "team-chat",
            "concurrency": 4,
            "requests": 8,
            "inputTokens": 128,
            "outputTokens": 48,
            "prompts": {"source": "File", "file": file, "format": "Chat", "outputLength": "Fixed"},
        }
    ]


def chat_lines(n: int) -> str:
    return "".join(
        json.dumps({"messages": [{"role": "user", "content": f"Write a Python function number {i} that sorts a list."}]}) + "\n" for i in range(n)
    )


@pytest.fixture
def reader_kubelet(core_v1: Any, namespace: str, operator: Operator, tmp_path: Path) -> Any:
    def write() -> None:
        write_endpoints_file(operator.workdir / "endpoints.yaml", operator.endpoints)

    kubelet = ReaderKubelet(core_v1, namespace, operator.endpoints, write, operator.workdir, tmp_path / "model-volume", tmp_path / "claims")
    yield kubelet
    kubelet.stop()


def bound_claim(core_v1: Any, namespace: str, name: str, kubelet: ReaderKubelet) -> None:
    """A PVC bound to a PV of its own (static binding by the controller-manager; kwok nodes mount nothing)."""
    pv = f"{namespace}-{name}"[:63]
    kubelet.volumes.append(pv)
    core_v1.create_persistent_volume(
        {
            "metadata": {"name": pv},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadOnlyMany"],
                "storageClassName": "",
                "hostPath": {"path": f"/data/{name}"},
                "claimRef": {"namespace": namespace, "name": name},
            },
        }
    )
    core_v1.create_namespaced_persistent_volume_claim(
        namespace,
        {
            "metadata": {"name": name},
            "spec": {"accessModes": ["ReadOnlyMany"], "storageClassName": "", "volumeName": pv, "resources": {"requests": {"storage": "1Gi"}}},
        },
    )
    wait_until(
        lambda: core_v1.read_namespaced_persistent_volume_claim(name, namespace).status.phase == "Bound", timeout=60, message=f"PVC {name} Bound"
    )


def test_file_datasets_a_bad_line_a_missing_file_and_a_missing_claim_are_refused_before_any_request_and_a_good_one_is_sent(
    operator: Operator, sims: Any, reader_kubelet: ReaderKubelet, namespace: str, custom_objects: Any, core_v1: Any, tmp_path: Path
) -> None:
    (tmp_path / "model-volume" / "datasets").mkdir(parents=True)
    (tmp_path / "model-volume" / "datasets" / "bad.jsonl").write_text(chat_lines(2) + '{"messages": "not a list"}\n')
    (tmp_path / "claims" / "team-data" / "chat").mkdir(parents=True)
    (tmp_path / "claims" / "team-data" / "chat" / "good.jsonl").write_text(chat_lines(13))
    bound_claim(core_v1, namespace, "team-data", reader_kubelet)
    cases = {
        "bad-line": (file_workload("datasets/bad.jsonl"), ["datasets/bad.jsonl", "the model volume", "line 3"]),
        "no-file": (file_workload("datasets/absent.jsonl"), ["datasets/absent.jsonl", "the model volume", "no such file"]),
        "no-claim": (file_workload("chat/good.jsonl", claim="absent-claim"), ["chat/good.jsonl", "absent-claim", "not found"]),
        "good": (file_workload("chat/good.jsonl", claim="team-data"), []),
    }
    servers = {}
    for name in cases:
        servers[name] = (sims.start("llama31-8b-base"), sims.start("llama31-8b-eagle3"))
        operator.map(f"{name}-base", servers[name][0].url)
        operator.map(f"{name}-spec", servers[name][1].url)
    operator.start()
    reader_kubelet.start()
    for name, (workloads, _) in cases.items():
        cr = example("llama31-8b-eagle3.yaml", name, namespace, annotations=compatible_annotations(), workloads=workloads)
        cr["spec"]["rollout"]["outputCheck"] = {"enabled": False}
        custom_objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, cr)

    for name, (_, expected) in cases.items():
        if name == "good":
            continue
        st = wait_phase(custom_objects, namespace, name, DECIDED, timeout=180)
        assert st["phase"] == "RolledBack" and st["probe"]["reason"] == "DatasetInvalid", st.get("message")
        assert st["activeVariant"] == "base" and st["probe"]["rounds"] == 0
        message = {c["type"]: c for c in st["conditions"]}["SpeedupVerified"]["message"]
        assert all(part in message for part in expected), message
        print(f"{name}: {message}")
        assert "\n" not in message and "Traceback" not in message
        base, spec = servers[name]
        # Nothing was sent: the dataset is read and parsed before the first request (the probe's readiness checks
        # are GETs, never counted as requests).
        assert base.sim.engine.requests_total == 0 and spec.sim.engine.requests_total == 0

    st = wait_phase(custom_objects, namespace, "good", DECIDED, timeout=240)
    assert st["probe"]["reason"] != "DatasetInvalid", st.get("message")
    traffic = st["probe"].get("traffic") or ""
    assert "file chat/good.jsonl on claim team-data, 13 prompts" in traffic, st["probe"]
    assert not st["probe"].get("syntheticTraffic")
    base, spec = servers["good"]
    assert base.sim.engine.requests_total > 0 and spec.sim.engine.requests_total > 0
    reasons = [e.reason for e in core_v1.list_namespaced_event(namespace).items if e.involved_object.name == "good"]
    assert "SyntheticTraffic" not in reasons

    # Every case had its reader pod, each ran the pod's own command, and the operator deleted them all.
    assert {f"{name}-dataset-team-chat" for name in cases} <= reader_kubelet.seen_pods
    assert "no-claim-dataset-team-chat" not in reader_kubelet.commands  # never scheduled, never run
    wait_until(lambda: not core_v1.list_namespaced_pod(namespace, label_selector=READER_SELECTOR).items, timeout=60, message="reader pods deleted")
