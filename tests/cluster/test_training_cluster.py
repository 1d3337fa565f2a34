"""spec.retraining.training on the local control plane (docs/retraining.md): the real `specdec run` process starts the
training Job `<name>-train-1` by itself after the drift monitor rolls a promoted drafter back, and a restarted
operator starts no second Job, whether its status recorded the Job or not.

The Job is asserted as the API server holds it (name, owner, labels, priority class, trigger), and its pod as the
operator reads it into status (the scheduler's words: the claims it mounts are not there). It does not run: the
control plane's nodes are kwok's, with no real containers, and the revisions claim does not exist (nothing creates it
yet). What the Job does is tested in tests/unit/test_trainjob_stages.py, the states read from its objects in
tests/cluster/test_trainjob_cluster.py."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.kube import wait_until
from tests.support.operator_process import (
    GROUP,
    LLAMA_EAGLE3_SCRIPT,
    PLURAL,
    VERSION,
    Operator,
    compatible_annotations,
    event_reasons,
    example,
    status,
    step_after_now,
    wait_phase,
)
from tests.support.simulators import Simulators, generate_traffic

pytestmark = pytest.mark.cluster


def _training(custom_objects: Any, namespace: str, name: str) -> dict:
    return (status(custom_objects, namespace, name).get("retraining") or {}).get("training") or {}


def _jobs(batch_v1: Any, namespace: str) -> list[str]:
    return sorted(j.metadata.name for j in batch_v1.list_namespaced_job(namespace).items)


@pytest.fixture
def training_priority_class(kube_client: Any) -> Any:
    """The chart's PriorityClass specdec-training (value -100, never preempting), which the Job's pod names: without it
    the pod is refused at creation. Deleted afterwards unless it was there before (a chart release's)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    scheduling = client.SchedulingV1Api(kube_client)
    body = {"metadata": {"name": "specdec-training"}, "value": -100, "preemptionPolicy": "Never", "globalDefault": False}
    try:
        scheduling.create_priority_class(body)
        made = True
    except ApiException as exc:
        if exc.status != 409:
            raise
        made = False
    yield
    if made:
        scheduling.delete_priority_class("specdec-training")


def test_a_drift_rollback_starts_the_training_job_and_a_restarted_operator_starts_no_second(
    operator: Operator, sims: Simulators, namespace: str, custom_objects: Any, core_v1: Any, batch_v1: Any, training_priority_class: Any
) -> None:
    name = "llama"
    operator.map(f"{name}-base", sims.start("llama31-8b-base").url)
    spec_sim = sims.start("llama31-8b-eagle3")
    operator.map(f"{name}-spec", spec_sim.url)
    operator.script(name, **LLAMA_EAGLE3_SCRIPT)
    operator.start()
    retraining = {"capture": {"enabled": True, "sampleShare": 0.1}, "training": {"budget": {"gpus": 1}}}
    cr = example(
        "llama31-8b-eagle3.yaml", name, namespace, annotations=compatible_annotations(), monitor__interval=5, monitor__window=2, retraining=retraining
    )
    custom_objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, cr)
    assert wait_phase(custom_objects, namespace, name, {"Promoted", "RolledBack", "Failed"}, timeout=120)["phase"] == "Promoted"
    promoted = _training(custom_objects, namespace, name)
    assert promoted.get("waiting") == "NoTrigger" and _jobs(batch_v1, namespace) == []

    # The drafter stops being accepted: the monitor rolls it back, and the rollback starts the training Job.
    spec_sim.sim.engine.set_accept_length_mean(1.0)
    with generate_traffic(spec_sim.url, tokens=32):
        st = wait_phase(custom_objects, namespace, name, {"RolledBack"}, timeout=90)
    assert st["reason"] == "AcceptanceDrift" and st["activeVariant"] == "base"
    wait_until(lambda: _jobs(batch_v1, namespace) == [f"{name}-train-1"], timeout=30, message="the training Job")
    job = batch_v1.read_namespaced_job(f"{name}-train-1", namespace)
    owner = job.metadata.owner_references[0]
    assert owner.kind == "SpeculativeServer" and owner.name == name and owner.controller
    assert job.metadata.labels["app.kubernetes.io/component"] == "retraining" and job.metadata.labels["specdec.io/retrain"] == "1"
    assert job.metadata.annotations["specdec.io/trigger"] == "Drift"
    assert job.spec.template.spec.priority_class_name == "specdec-training"
    assert "app.kubernetes.io/instance" not in (job.spec.template.metadata.labels or {})  # never counted as a server
    record = wait_until(lambda: _training(custom_objects, namespace, name).get("job") and _training(custom_objects, namespace, name), timeout=30)
    assert record["job"] == f"{name}-train-1" and record["trigger"] == "Drift" and record["jobsStarted"] == 1
    assert record["state"] in ("Pending", "Running")
    wait_until(lambda: "RetrainStarted" in event_reasons(core_v1, namespace, name), timeout=20, message="RetrainStarted Event")
    # Its pod, read by the operator's step (training pods are not watched), waits for the claims it mounts.
    waiting = wait_until(
        lambda: (t := step_after_now(custom_objects, namespace, name)["retraining"]["training"])["reason"] == "TrainingUnschedulable" and t,
        timeout=90,
        interval=1,
        message="TrainingUnschedulable",
    )
    assert waiting["state"] == "Pending" and "persistentvolumeclaim" in waiting["message"].lower(), waiting["message"]
    assert [
        p.metadata.labels["batch.kubernetes.io/job-name"]
        for p in core_v1.list_namespaced_pod(namespace, label_selector="app.kubernetes.io/component=retraining").items
    ] == [f"{name}-train-1"]

    # A restarted operator (SIGKILL) reads the Job back: no second Job, no second RetrainStarted.
    operator.kill()
    operator.start()
    st = step_after_now(custom_objects, namespace, name)
    assert st["phase"] == "RolledBack" and st["retraining"]["training"]["waiting"] == "TrainingRunning"
    assert _jobs(batch_v1, namespace) == [f"{name}-train-1"]
    assert event_reasons(core_v1, namespace, name).count("RetrainStarted") == 1

    # An operator that created the Job but lost the status write: the next one adopts the Job instead of making another.
    operator.kill()
    custom_objects.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, name, {"status": {"retraining": {"training": None}}})
    assert not _training(custom_objects, namespace, name)
    operator.start()
    adopted = wait_until(lambda: _training(custom_objects, namespace, name).get("job") and _training(custom_objects, namespace, name), timeout=60)
    assert adopted["job"] == f"{name}-train-1" and adopted["jobsStarted"] == 1 and adopted["trigger"] == "Drift"
    step_after_now(custom_objects, namespace, name)
    assert _jobs(batch_v1, namespace) == [f"{name}-train-1"]
