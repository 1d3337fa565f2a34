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
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import urllib3
import yaml
from kubernetes import watch
from kubernetes.client.rest import ApiException

from tests.support.kube import wait_until
from tests.support.operator_process import GROUP, PLURAL, VERSION, Operator, compatible_annotations, example, free_port, wait_phase

pytestmark = pytest.mark.cluster

DECIDED = {"Promoted", "RolledBack", "Invalid", "Failed"}
READER_SELECTOR = "app.kubernetes.io/name=specdec-dataset-reader"
MOUNT = "/dataset"


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


class ReaderKubelet:
    """Runs each scheduled reader pod's command locally, its volume a local directory, and maps it for the operator."""

    def __init__(self, core_v1: Any, namespace: str, operator: Operator, model_volume: Path, claims: Path) -> None:
        self.core_v1, self.namespace, self.operator = core_v1, namespace, operator
        self.model_volume, self.claims = model_volume, claims
        self.procs: dict[str, subprocess.Popen] = {}  # pod uid -> the reader process
        self.commands: dict[str, list[str]] = {}  # pod name -> the pod's command, as the operator wrote it
        self.seen_pods: set[str] = set()
        self.volumes: list[str] = []  # PersistentVolumes the test created (cluster-scoped: deleted at the end)
        self.stopped = threading.Event()
        self.error: Exception | None = None  # what stopped the loop (an assertion on a reader pod): raised by stop()
        self.thread = threading.Thread(target=self._watch, name="reader-kubelet", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _local_root(self, pod: Any) -> Path:
        (volume,) = pod.spec.volumes
        if volume.persistent_volume_claim is not None:
            return self.claims / volume.persistent_volume_claim.claim_name
        assert volume.host_path is not None, volume  # the example's model volume
        return self.model_volume

    def _run(self, pod: Any) -> None:
        (container,) = pod.spec.containers
        command = list(container.command)
        self.commands[pod.metadata.name] = command
        assert command[:2] == ["specdec", "dataset-serve"], command
        assert container.volume_mounts[0].mount_path == MOUNT and container.volume_mounts[0].read_only
        args = command[2:]
        file = args[args.index("--file") + 1]
        assert file.startswith(MOUNT + "/"), file
        args[args.index("--file") + 1] = str(self._local_root(pod) / file[len(MOUNT) + 1 :])
        port = free_port()
        args[args.index("--port") + 1] = str(port)
        log = open(self.operator.workdir / f"reader-{pod.metadata.name}.log", "w")
        self.procs[pod.metadata.uid] = subprocess.Popen(
            [sys.executable, "-m", "specdec_operator.cli", "dataset-serve", *args, "--host", "127.0.0.1"], stdout=log, stderr=subprocess.STDOUT
        )
        self.operator.endpoints[f"{self.namespace}/pod/{pod.metadata.name}"] = f"http://127.0.0.1:{port}"
        path = self.operator.workdir / "endpoints.yaml"
        staged = path.with_suffix(".new")
        staged.write_text(yaml.safe_dump(self.operator.endpoints))
        os.replace(staged, path)  # the operator rereads the file when it changes: never a half-written one

    def _watch(self) -> None:
        try:
            self._loop()
        except Exception as error:
            self.error = error

    def _loop(self) -> None:
        # A watch, not a poll: a pod the scheduler refuses (no claim) lives only until the operator reads its
        # condition and deletes it, which can be shorter than any poll interval. The watch resumes from the last
        # resourceVersion it saw, so no pod is missed between its streams.
        resource_version = None
        while not self.stopped.is_set():
            try:
                if resource_version is None:
                    listed = self.core_v1.list_namespaced_pod(self.namespace, label_selector=READER_SELECTOR)
                    resource_version = listed.metadata.resource_version
                    for pod in listed.items:
                        self._saw(pod)
                stream = watch.Watch().stream(
                    self.core_v1.list_namespaced_pod,
                    self.namespace,
                    label_selector=READER_SELECTOR,
                    resource_version=resource_version,
                    timeout_seconds=2,
                )
                for event in stream:
                    pod = event["object"]
                    resource_version = pod.metadata.resource_version
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self._saw(pod)
                    if self.stopped.is_set():
                        break
            except ApiException as e:
                if e.status == 410:  # the resourceVersion is too old: list again
                    resource_version = None
                self.stopped.wait(0.2)
            except urllib3.exceptions.HTTPError:  # the API server is busy (a dropped or timed-out stream): look again
                self.stopped.wait(0.2)

    def _saw(self, pod: Any) -> None:
        self.seen_pods.add(pod.metadata.name)
        if pod.metadata.uid not in self.procs and pod.spec.node_name and not pod.metadata.deletion_timestamp:
            self._run(pod)

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(10)
        for proc in self.procs.values():
            proc.terminate()
            proc.wait(10)
        for pv in self.volumes:
            try:
                self.core_v1.delete_persistent_volume(pv)
            except ApiException as error:
                if error.status != 404:  # 404: already gone
                    raise
        if self.error is not None:
            raise AssertionError(f"the reader kubelet stopped: {type(self.error).__name__}: {self.error}") from self.error


@pytest.fixture
def reader_kubelet(core_v1: Any, namespace: str, operator: Operator, tmp_path: Path) -> Any:
    kubelet = ReaderKubelet(core_v1, namespace, operator, tmp_path / "model-volume", tmp_path / "claims")
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
