"""hack/job_runner.py plays the kubelet for training Jobs on the local control plane (issue 36, item 5).

A tiny Job shaped like the operator's training Job (the retraining label, init containers then `publish`, a claim
without a PersistentVolume, an emptyDir, `restartPolicy: Never`, the podFailurePolicy's exit 2) whose containers are
small shell and Python commands. The runner binds its pod to its own node, runs the containers as processes with the
volumes on local directories, and writes the pod's status; the real Job controller completes the Job, or fails it at
once for exit 2. What publish wrote to /dev/termination-log is in the pod's status as its termination message, and
the Job's CPU-seconds are the processes' own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hack.job_mapping import VolumeDirs
from hack.job_runner import NODE, JobRunner
from tests.support.kube import wait_until

pytestmark = pytest.mark.cluster

MESSAGE = {"schema": 1, "revision": "tiny-train-1", "path": "tiny-train-1", "heldout": 2}


WORK = "import sys; sum(i * i for i in range(3 * 10**6)); open(sys.argv[1], 'w').write('staged\\n')"
PUBLISH = "import shutil, sys; shutil.copy(sys.argv[1], sys.argv[2]); open(sys.argv[3], 'w').write(sys.argv[4])"


def tiny_job(name: str, stage: list[str]) -> dict[str, Any]:
    """Paths are whole arguments, as in the operator's Jobs: the runner maps arguments, not shell text."""
    mounts = [{"name": "revisions", "mountPath": "/revisions"}, {"name": "tmp", "mountPath": "/tmp"}]
    publish = ["python3", "-c", PUBLISH, "/tmp/staged", f"/revisions/{name}", "/dev/termination-log", json.dumps(MESSAGE)]

    def container(cname: str, command: list[str]) -> dict[str, Any]:
        return {"name": cname, "image": "local", "command": command, "volumeMounts": mounts, "terminationMessagePolicy": "FallbackToLogsOnError"}

    labels = {"app.kubernetes.io/component": "retraining", "app.kubernetes.io/name": "drafter-training"}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "backoffLimit": 1,
            "podFailurePolicy": {"rules": [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [2]}}]},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "initContainers": [
                        container("work", ["python3", "-c", WORK, "/tmp/staged"]),
                        container("stage", stage),
                    ],
                    "containers": [container("publish", publish)],
                    "volumes": [{"name": "revisions", "persistentVolumeClaim": {"claimName": "tiny-revisions"}}, {"name": "tmp", "emptyDir": {}}],
                },
            },
        },
    }


@pytest.fixture
def runner(kube_client: Any, namespace: str, tmp_path: Path):
    r = JobRunner(kube_client, tmp_path, VolumeDirs(tmp_path), namespaces={namespace}).start(interval=0.5)
    yield r
    r.stop()


def _condition(batch_v1: Any, namespace: str, name: str) -> Any:
    job = batch_v1.read_namespaced_job(name, namespace)
    return next((c for c in job.status.conditions or [] if c.type in ("Complete", "Failed") and c.status == "True"), None)


def test_the_runner_runs_a_jobs_pod_and_the_job_controller_completes_it(runner, batch_v1, core_v1, namespace, tmp_path):
    batch_v1.create_namespaced_job(namespace, tiny_job("tiny-train-1", ["true"]))
    done = wait_until(lambda: _condition(batch_v1, namespace, "tiny-train-1"), timeout=120, message="the Job complete")
    assert done.type == "Complete", runner.jobs
    pod = core_v1.list_namespaced_pod(namespace, label_selector="job-name=tiny-train-1").items[0]
    assert pod.spec.node_name == NODE and pod.status.phase == "Succeeded"
    assert [(s.name, s.state.terminated.exit_code) for s in pod.status.init_container_statuses] == [("work", 0), ("stage", 0)]
    publish = pod.status.container_statuses[0]
    assert publish.name == "publish" and json.loads(publish.state.terminated.message) == MESSAGE
    # The claim is a directory here, shared by the pods that mount it; the emptyDir carried staged/ between containers.
    assert (tmp_path / "claims" / namespace / "tiny-revisions" / "tiny-train-1").read_text() == "staged\n"
    record = runner.jobs[f"{namespace}/tiny-train-1"]
    assert record["outcome"] == "Succeeded" and [c["name"] for c in record["containers"]] == ["work", "stage", "publish"]
    assert record["containers"][0]["cpuSeconds"] > 0.05 and record["cpuSeconds"] >= record["containers"][0]["cpuSeconds"]
    assert json.loads((tmp_path / "jobs" / namespace / "tiny-train-1.json").read_text())["terminationMessage"] == json.dumps(MESSAGE)


def test_a_stage_exiting_2_fails_the_job_at_once_with_its_last_line(runner, batch_v1, core_v1, namespace):
    batch_v1.create_namespaced_job(namespace, tiny_job("tiny-train-2", ["sh", "-c", "echo 'gather: /capture: no chat conversation' >&2; exit 2"]))
    failed = wait_until(lambda: _condition(batch_v1, namespace, "tiny-train-2"), timeout=120, message="the Job failed")
    assert failed.type == "Failed" and failed.reason == "PodFailurePolicy"
    pods = core_v1.list_namespaced_pod(namespace, label_selector="job-name=tiny-train-2").items
    assert len(pods) == 1 and pods[0].status.phase == "Failed"  # no retry: the podFailurePolicy failed the Job
    stage = pods[0].status.init_container_statuses[1].state.terminated
    assert stage.exit_code == 2 and "no chat conversation" in stage.message  # FallbackToLogsOnError: the log's tail
    assert pods[0].status.container_statuses[0].state.waiting.reason == "PodInitializing"
    assert runner.jobs[f"{namespace}/tiny-train-2"]["outcome"] == "Failed"
