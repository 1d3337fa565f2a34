"""How a training Job is doing (reconcile/retrain_progress.py, issue 36 item 2): the Job's conditions, its pods'
container states and its Events, as the API server returns them, read into a state, a reason and one line."""

from __future__ import annotations

import pytest

from specdec_operator.reconcile.retrain_progress import JobState, ProgressReason, job_progress

JOB = {"metadata": {"name": "srv-train-1"}, "spec": {"activeDeadlineSeconds": 5400}, "status": {}}


def job_with(*conditions: tuple[str, str]) -> dict:
    return {**JOB, "status": {"conditions": [{"type": t, "status": "True", "reason": r, "message": "m"} for t, r in conditions]}}


def ended(name: str, code: int, message: str = "") -> dict:
    return {"name": name, "state": {"terminated": {"exitCode": code, "reason": "Error" if code else "Completed", "message": message}}}


def running(name: str) -> dict:
    return {"name": name, "state": {"running": {"startedAt": "2026-12-07T01:00:00Z"}}}


def pod(init: list[dict], main: list[dict] | None = None, created: str = "2026-12-07T01:00:00Z", conditions: list | None = None) -> dict:
    main = main if main is not None else [{"name": "publish", "state": {"waiting": {"reason": "PodInitializing"}}}]
    status = {"initContainerStatuses": init, "containerStatuses": main, "conditions": conditions or [{"type": "PodScheduled", "status": "True"}]}
    return {"metadata": {"creationTimestamp": created}, "status": status}


OK = [ended(s, 0) for s in ("gather", "regenerate")]


@pytest.mark.parametrize(
    ("case", "job", "pods", "events", "state", "reason", "stage", "words"),
    [
        ("no pod yet", JOB, [], [], JobState.PENDING, ProgressReason.STARTING, None, "no pod"),
        (
            "a quota refused the pod",
            JOB,
            [],
            [
                {
                    "reason": "FailedCreate",
                    "message": 'Error creating: pods "srv-train-1-x" is forbidden: exceeded quota: gpus, requested: nvidia.com/gpu=1',
                }
            ],
            JobState.PENDING,
            ProgressReason.QUOTA_REFUSED,
            None,
            "exceeded quota: gpus",
        ),
        (
            "no PriorityClass (a cluster without the chart)",
            JOB,
            [],
            [
                {
                    "reason": "FailedCreate",
                    "message": 'Error creating: pods "srv-train-1-x" is forbidden: no PriorityClass with name specdec-training was found',
                }
            ],
            JobState.PENDING,
            ProgressReason.POD_REFUSED,
            None,
            'refused the pod: Error creating: pods "srv-train-1-x" is forbidden: no PriorityClass with name specdec-training',
        ),
        (
            "between two stages (the next one waits PodInitializing)",
            JOB,
            [pod([*OK, {"name": "capture", "state": {"waiting": {"reason": "PodInitializing"}}}])],
            [],
            JobState.RUNNING,
            ProgressReason.RUNNING,
            "capture",
            "stage capture (3/8)",
        ),
        (
            "no GPU free",
            JOB,
            [
                pod(
                    [],
                    conditions=[
                        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes: Insufficient nvidia.com/gpu"}
                    ],
                )
            ],
            [],
            JobState.PENDING,
            ProgressReason.UNSCHEDULABLE,
            None,
            "Insufficient nvidia.com/gpu",
        ),
        ("stage capture runs", JOB, [pod([*OK, running("capture")])], [], JobState.RUNNING, ProgressReason.RUNNING, "capture", "stage capture (3/8)"),
        (
            "publishing",
            JOB,
            [pod([ended(s, 0) for s in ("gather", "regenerate", "capture", "train", "export")], [running("publish")])],
            [],
            JobState.RUNNING,
            ProgressReason.RUNNING,
            "publish",
            "(8/8)",
        ),
        (
            "done",
            job_with(("SuccessCriteriaMet", "CompletionsReached"), ("Complete", "CompletionsReached")),
            [],
            [],
            JobState.SUCCEEDED,
            ProgressReason.SUCCEEDED,
            None,
            "published",
        ),
        (
            "out of time",
            job_with(("Failed", "DeadlineExceeded")),
            [pod([*OK, running("capture")])],
            [],
            JobState.FAILED,
            ProgressReason.TIMED_OUT,
            None,
            "budget.maxMinutes (5400 s)",
        ),
        (
            "bad input fails at once",
            job_with(("FailureTarget", "PodFailurePolicy"), ("Failed", "PodFailurePolicy")),
            [pod([ended("gather", 2, "specdec-train gather: error: /capture: no chat conversation to train on; capture more traffic")])],
            [],
            JobState.FAILED,
            ProgressReason.BAD_INPUT,
            "gather",
            "in stage gather: specdec-train gather: error: /capture: no chat conversation",
        ),
        (
            "the volume filled",
            job_with(("Failed", "BackoffLimitExceeded")),
            [
                pod(
                    [*OK, ended("capture", 1, "specdec-train capture: failed: OSError: [Errno 28] No space left on device")],
                    created="2026-12-07T01:00:00Z",
                ),
                pod(
                    [*OK, ended("capture", 1, "specdec-train capture: failed: OSError: [Errno 28] No space left on device")],
                    created="2026-12-07T02:00:00Z",
                ),
            ],
            [],
            JobState.FAILED,
            ProgressReason.VOLUME_FULL,
            "capture",
            "volume is full in stage capture",
        ),
        (
            "a stage kept failing",
            job_with(("Failed", "BackoffLimitExceeded")),
            [pod([*OK, ended("capture", 0), ended("train", 137, "")])],
            [],
            JobState.FAILED,
            ProgressReason.FAILED,
            "train",
            "BackoffLimitExceeded in stage train: Error",
        ),
    ],
)
def test_progress(case, job, pods, events, state, reason, stage, words):
    found = job_progress(job, pods, events)
    assert (found.state, found.reason, found.stage) == (state, reason, stage), case
    assert words in found.message and "\n" not in found.message, (case, found.message)
