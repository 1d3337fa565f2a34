"""The retraining Job against the real API server (issue 36, item 2): the rendered Job is admitted, the Job controller
makes its pod from the template (so the pod passes admission too: its PriorityClass resolved to a priority below
serving), and rendering it again, as a restarted operator would, meets AlreadyExists rather than a second Job.
reconcile/retrain_progress.py reads the real objects: the pod waiting for a node (its claims do not exist here), and a
quota that refuses the next Job's pod."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from specdec_operator import API_GROUP, API_VERSION, PLURAL
from specdec_operator import trainjob as t
from specdec_operator.api_retraining_job import RetrainingTraining
from specdec_operator.reconcile.retrain_progress import ProgressReason, job_progress
from specdec_operator.resource import parse_spec
from tests.support.kube import wait_until

pytestmark = pytest.mark.cluster

EXAMPLE = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "llama31-8b-eagle3.yaml").read_text())


def test_the_api_server_admits_the_job_and_its_pod_once(kube_client, custom_objects, batch_v1, core_v1, namespace):
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    scheduling = client.SchedulingV1Api(kube_client)
    priority_class = f"specdec-training-{namespace}"  # cluster-scoped: one per test, as the chart makes one per release
    scheduling.create_priority_class(
        client.V1PriorityClass(
            metadata=client.V1ObjectMeta(name=priority_class),
            value=t.PRIORITY_CLASS_VALUE,
            preemption_policy="Never",
            description="specdec-operator training Jobs: below serving",
        )
    )
    try:
        cr = copy.deepcopy(EXAMPLE)
        cr["metadata"] = {"name": "llama31-8b"}
        owner = custom_objects.create_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, cr)
        spec = parse_spec(cr["spec"])
        settings = t.TrainingJobSettings(priority_class_name=priority_class)
        data = t.TrainingData(capture_claim="llama31-8b-capture", revisions_claim="llama31-8b-revisions")
        training = RetrainingTraining.model_validate({"budget": {"gpus": 1, "maxMinutes": 30}})
        job = t.training_job("llama31-8b", namespace, owner["metadata"]["uid"], spec, training, data, 1, "Drift", settings)
        created = batch_v1.create_namespaced_job(namespace, job)
        assert created.metadata.name == "llama31-8b-train-1" and created.spec.active_deadline_seconds == 1800

        again = t.training_job("llama31-8b", namespace, owner["metadata"]["uid"], spec, training, data, 1, "Drift", settings)
        with pytest.raises(ApiException) as refused:
            batch_v1.create_namespaced_job(namespace, again)
        assert refused.value.status == 409 and "AlreadyExists" in refused.value.body
        assert [j.metadata.name for j in batch_v1.list_namespaced_job(namespace).items] == ["llama31-8b-train-1"]

        pods = wait_until(
            lambda: core_v1.list_namespaced_pod(namespace, label_selector="job-name=llama31-8b-train-1").items,
            timeout=60,
            message="the Job controller's pod",
        )
        pod = pods[0]
        assert pod.spec.priority == t.PRIORITY_CLASS_VALUE and pod.spec.priority_class_name == priority_class
        assert [c.name for c in pod.spec.init_containers] == list(t.STAGES) and pod.spec.containers[0].name == "publish"
        assert pod.metadata.labels["specdec.io/training-for"] == "llama31-8b"

        def progress(number: int):
            name = t.job_name("llama31-8b", number)
            as_dict = kube_client.sanitize_for_serialization
            pods = core_v1.list_namespaced_pod(namespace, label_selector=f"job-name={name}").items
            events = core_v1.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}").items
            return job_progress(as_dict(batch_v1.read_namespaced_job(name, namespace)), [as_dict(p) for p in pods], [as_dict(e) for e in events])

        waiting = wait_until(lambda: (p := progress(1)).reason == ProgressReason.UNSCHEDULABLE and p, timeout=60, message="the pod Unschedulable")
        assert "persistentvolumeclaim" in waiting.message and "\n" not in waiting.message

        core_v1.create_namespaced_resource_quota(
            namespace, client.V1ResourceQuota(metadata=client.V1ObjectMeta(name="one-pod"), spec=client.V1ResourceQuotaSpec(hard={"pods": "1"}))
        )
        wait_until(lambda: core_v1.read_namespaced_resource_quota("one-pod", namespace).status.used, timeout=30, message="the quota counted")
        second = t.training_job("llama31-8b", namespace, owner["metadata"]["uid"], spec, training, data, 2, "Drift", settings)
        batch_v1.create_namespaced_job(namespace, second)
        refused = wait_until(lambda: (p := progress(2)).reason == ProgressReason.QUOTA_REFUSED and p, timeout=60, message="the quota's refusal")
        assert "exceeded quota: one-pod" in refused.message
    finally:
        scheduling.delete_priority_class(priority_class)
