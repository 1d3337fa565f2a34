"""reconcile/stuck.py: the cause of a wait, read from pod documents and Events as the API server returns them.

The pod and Event shapes below are the kubelet's and the scheduler's (messages copied from their formats:
FailedMount from the kubelet's volume manager, FailedScheduling from the scheduler's fit errors).
"""

from datetime import UTC, datetime

import pytest

from specdec_operator import manifests as m
from specdec_operator.api import Reason
from specdec_operator.reconcile.deadline import passed
from specdec_operator.reconcile.stuck import diagnose, events_for, gpu_family_of, last_termination


def pod(name="demo-speculative-abc", uid="u-1", **status):
    return {
        "metadata": {"name": name, "uid": uid},
        "spec": {
            "initContainers": [{"name": "validate-drafter", "image": "specdec/operator:1"}],
            "containers": [{"name": "sglang", "image": "lmsysorg/sglang:v0.5.23-cu129"}],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [{"key": m.GPU_FAMILY_LABEL, "operator": "In", "values": ["b200"]}]}]
                    }
                }
            },
        },
        "status": status,
    }


def waiting(name, reason, message=None, image=None):
    state = {"waiting": {"reason": reason, **({"message": message} if message else {})}}
    return {"name": name, "state": state, **({"image": image} if image else {})}


def event(reason, message, uid="u-1", name="demo-speculative-abc", when="2026-12-04T10:00:00Z"):
    return {
        "type": "Warning",
        "reason": reason,
        "message": message,
        "involvedObject": {"kind": "Pod", "name": name, "uid": uid},
        "lastTimestamp": when,
    }


def test_unschedulable_names_the_missing_resource_and_the_gpu_family():
    p = pod(
        conditions=[
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/5 nodes are available: 3 Insufficient nvidia.com/gpu, 2 node(s) didn't match Pod's node affinity/selector.",
            }
        ]
    )
    cause = diagnose(p)
    assert cause is not None and cause.reason == Reason.UNSCHEDULABLE
    assert "not enough nvidia.com/gpu on nodes of GPU family b200" in cause.message
    assert cause.pod == "demo-speculative-abc"


def test_unschedulable_names_the_spec_gpu_family_where_the_operator_copy_of_the_pod_has_no_spec():
    from specdec_operator.controller.kopf_tuning import slim_pod

    message = "0/5 nodes are available: 1 Insufficient nvidia.com/gpu, 4 node(s) didn't match Pod's node affinity/selector."
    slim = slim_pod(pod(conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}]))
    assert "spec" not in slim  # what reconcile sees of a pod
    assert "GPU family" not in diagnose(slim).message
    cause = diagnose(slim, gpu_family="hopper")
    assert cause is not None and "not enough nvidia.com/gpu on nodes of GPU family hopper" in cause.message


def test_unschedulable_without_an_insufficient_resource_says_no_node_fits():
    p = pod(conditions=[{"type": "PodScheduled", "status": "False", "message": "0/2 nodes are available: 2 node(s) had untolerated taint."}])
    cause = diagnose(p)
    assert cause is not None and "no node fits on nodes of GPU family b200" in cause.message


def test_hostpath_that_does_not_exist_is_a_volume_not_mounted_naming_the_volume():
    p = pod(initContainerStatuses=[waiting("validate-drafter", "PodInitializing")], containerStatuses=[waiting("sglang", "PodInitializing")])
    events = [
        event("Scheduled", "Successfully assigned ns/demo-speculative-abc to node-1"),
        event(
            "FailedMount",
            'MountVolume.SetUp failed for volume "models" : hostPath type check failed: /models/llama is not a directory',
            when="2026-12-04T10:00:05Z",
        ),
    ]
    cause = diagnose(p, events)
    assert cause is not None and cause.reason == Reason.VOLUME_NOT_MOUNTED
    assert "volume models is not mounted" in cause.message
    assert "/models/llama is not a directory" in cause.message


def test_unmounted_volume_list_from_the_timeout_event():
    p = pod(containerStatuses=[waiting("sglang", "ContainerCreating")])
    events = [event("FailedMount", "Unable to attach or mount volumes: unmounted volumes=[models cache], unattached volumes=[]: timed out")]
    cause = diagnose(p, events)
    assert cause is not None and "volume models, cache is not mounted" in cause.message


def test_multi_attach_of_a_read_write_once_claim():
    p = pod(containerStatuses=[waiting("sglang", "ContainerCreating")])
    events = [event("FailedAttachVolume", 'Multi-Attach error for volume "pvc-1234" Volume is already used by pod(s) other-0')]
    cause = diagnose(p, events)
    assert cause is not None and cause.reason == Reason.VOLUME_NOT_MOUNTED and "pvc-1234" in cause.message


def test_events_of_another_pod_or_an_older_pod_of_the_same_name_do_not_count():
    p = pod(containerStatuses=[waiting("sglang", "ContainerCreating")])
    others = [
        event("FailedMount", 'MountVolume.SetUp failed for volume "models"', uid="u-old"),
        event("FailedMount", 'MountVolume.SetUp failed for volume "models"', uid="u-2", name="other"),
    ]
    assert diagnose(p, others) is None
    assert events_for(p, others) == []


def test_a_mount_event_is_history_once_the_containers_run():
    p = pod(containerStatuses=[{"name": "sglang", "state": {"running": {"startedAt": "2026-12-04T10:01:00Z"}}}])
    assert diagnose(p, [event("FailedMount", 'MountVolume.SetUp failed for volume "models"')]) is None


def test_image_that_cannot_be_pulled_names_image_and_container():
    p = pod(containerStatuses=[waiting("sglang", "ImagePullBackOff", 'Back-off pulling image "lmsysorg/sglang:v0.5.23-cu129"')])
    cause = diagnose(p)
    assert cause is not None and cause.reason == Reason.IMAGE_NOT_PULLED
    assert "image lmsysorg/sglang:v0.5.23-cu129 of container sglang cannot be pulled: ImagePullBackOff" in cause.message


def test_validator_image_pull_is_seen_in_the_init_container():
    p = pod(initContainerStatuses=[waiting("validate-drafter", "ErrImagePull", image="specdec/operator:1")])
    cause = diagnose(p)
    assert cause is not None and cause.reason == Reason.IMAGE_NOT_PULLED and "validate-drafter" in cause.message


def test_missing_secret_is_a_container_config_error():
    p = pod(containerStatuses=[waiting("sglang", "CreateContainerConfigError", 'secret "hf-token" not found')])
    cause = diagnose(p)
    assert cause is not None and cause.reason == Reason.CONTAINER_CONFIG_ERROR and 'secret "hf-token" not found' in cause.message


def test_crash_loop_carries_the_last_termination_message_on_one_line():
    cs = waiting("sglang", "CrashLoopBackOff", "back-off 5m0s restarting failed container")
    cs["restartCount"] = 7
    cs["lastState"] = {"terminated": {"reason": "Error", "exitCode": 1, "message": "error: unrecognized arguments:\n --foo"}}
    cause = diagnose(pod(containerStatuses=[cs]))
    assert cause is not None and cause.reason == Reason.CRASH_LOOP
    assert "exit code 1, 7 restarts; last message: error: unrecognized arguments: --foo" in cause.message
    assert "\n" not in cause.message


def test_last_termination_without_a_message():
    assert last_termination({"lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}) == "OOMKilled, exit code 137, 0 restarts"


def test_normal_progress_is_not_a_cause():
    assert diagnose(pod(containerStatuses=[waiting("sglang", "ContainerCreating")])) is None
    assert diagnose(pod(containerStatuses=[{"name": "sglang", "state": {"running": {}}}])) is None
    assert diagnose(pod()) is None


def test_gpu_family_from_a_node_selector():
    p = pod()
    p["spec"] = {"nodeSelector": {m.GPU_FAMILY_LABEL: "h200"}}
    assert gpu_family_of(p) == "h200"
    assert gpu_family_of({"spec": {}}) is None


@pytest.mark.parametrize(
    ("since", "seconds", "expired"),
    [("2026-12-04T10:00:00Z", 600, True), ("2026-12-04T10:05:00Z", 600, False), (None, 600, False)],
)
def test_deadline(since, seconds, expired):
    now = datetime(2026, 12, 4, 10, 10, 30, tzinfo=UTC)
    assert passed(since, now, seconds) is expired
