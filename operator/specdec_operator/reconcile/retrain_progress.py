"""How a training Job is doing (issue 36, item 2), read from the Job, its pods and its Events (pure).

What status and Events will say of a retraining Job (trainjob.py): pending (and why: no GPU free, a quota refused its
pod), running (and which stage), succeeded (its revision is published), or failed (and why: out of time, bad input,
the volume full, a stage that kept failing). A failed Job never touches serving: the outcome only says so.

Inputs are the objects as the API server returns them (dicts, camelCase): the Job, its pods (newest last or not:
the newest is picked by creation time) and the Events whose involvedObject is the Job.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from ..trainjob import BAD_INPUT_EXIT, PUBLISH, STAGES

NO_SPACE = "No space left on device"
QUOTA_WORDS = ("exceeded quota", "forbidden: exceeded")


class JobState(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class ProgressReason(StrEnum):
    STARTING = "TrainingStarting"
    UNSCHEDULABLE = "TrainingUnschedulable"
    QUOTA_REFUSED = "TrainingQuotaRefused"
    POD_REFUSED = "TrainingPodRefused"
    RUNNING = "TrainingRunning"
    SUCCEEDED = "TrainingSucceeded"
    TIMED_OUT = "TrainingTimedOut"
    BAD_INPUT = "TrainingBadInput"
    VOLUME_FULL = "TrainingVolumeFull"
    FAILED = "TrainingFailed"


@dataclass(frozen=True)
class JobProgress:
    state: JobState
    reason: ProgressReason
    message: str
    stage: str | None = None  # the stage running, or the one that failed


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind and c.get("status") == "True":
            return dict(c)
    return None


def _statuses(pod: dict[str, Any]) -> list[dict[str, Any]]:
    status = pod.get("status") or {}
    return list(status.get("initContainerStatuses") or []) + list(status.get("containerStatuses") or [])


def _failed_stage(pod: dict[str, Any]) -> tuple[str, int, str] | None:
    """The first stage whose container ended with a non-zero exit: (name, exit code, its termination message)."""
    for s in _statuses(pod):
        ended = (s.get("state") or {}).get("terminated") or (s.get("lastState") or {}).get("terminated")
        if ended and ended.get("exitCode", 0) != 0:
            message = (ended.get("message") or ended.get("reason") or "").strip().splitlines()
            return s.get("name", "?"), int(ended["exitCode"]), message[-1] if message else ""
    return None


def _running_stage(pod: dict[str, Any]) -> str | None:
    """The stage running, or the one starting after a stage that ended well: between two init containers the kubelet
    shows the next as waiting (PodInitializing) for a moment, which is not the pod starting again."""
    previous_done = False
    for s in _statuses(pod):
        state = s.get("state") or {}
        if "running" in state or ("waiting" in state and previous_done):
            return s.get("name")
        previous_done = ((state.get("terminated") or {}).get("exitCode")) == 0
    return None


def _created(pod: dict[str, Any]) -> str:
    return (pod.get("metadata") or {}).get("creationTimestamp") or ""


def _newest(pods: list[dict[str, Any]]) -> dict[str, Any] | None:
    return max(pods, key=_created, default=None)


def _failure(job: dict[str, Any], pods: list[dict[str, Any]], failed: dict[str, Any]) -> JobProgress:
    why = failed.get("reason") or ""
    newest_first = sorted(pods, key=_created, reverse=True)
    found = next((f for f in map(_failed_stage, newest_first) if f is not None), None)
    stage, code, text = found if found else (None, None, "")
    where = f" in stage {stage}" if stage else ""
    if why == "DeadlineExceeded":
        seconds = (job.get("spec") or {}).get("activeDeadlineSeconds")
        return JobProgress(
            JobState.FAILED, ProgressReason.TIMED_OUT, f"ran past budget.maxMinutes ({seconds} s){where}; nothing was published", stage
        )
    if NO_SPACE in text:
        return JobProgress(JobState.FAILED, ProgressReason.VOLUME_FULL, f"the volume is full{where}: {text}", stage)
    if code == BAD_INPUT_EXIT or why == "PodFailurePolicy":
        return JobProgress(
            JobState.FAILED, ProgressReason.BAD_INPUT, f"input the pipeline cannot use{where}: {text or failed.get('message', '')}", stage
        )
    detail = f": {text}" if text else ""
    return JobProgress(JobState.FAILED, ProgressReason.FAILED, f"{why or 'failed'}{where}{detail}", stage)


def job_progress(job: dict[str, Any], pods: list[dict[str, Any]], events: list[dict[str, Any]] | None = None) -> JobProgress:
    """The Job's state, a reason and a one-line message (no prompt text: only stage names and the tools' own lines)."""
    if _condition(job, "Complete") or _condition(job, "SuccessCriteriaMet"):
        return JobProgress(JobState.SUCCEEDED, ProgressReason.SUCCEEDED, "every stage succeeded; the revision is published")
    failed = _condition(job, "Failed") or _condition(job, "FailureTarget")
    if failed:
        return _failure(job, pods, failed)
    pod = _newest(pods)
    if pod is None:
        refused = [e for e in events or [] if e.get("reason") == "FailedCreate"]
        if refused:
            # The Job controller's words: a quota, or any other admission refusal (e.g. no PriorityClass
            # specdec-training: the chart creates it, a cluster without the chart may not have it).
            words = " ".join((refused[-1].get("message") or "").split())
            if any(w in words for w in QUOTA_WORDS):
                return JobProgress(JobState.PENDING, ProgressReason.QUOTA_REFUSED, f"a quota refused the pod: {words}")
            return JobProgress(JobState.PENDING, ProgressReason.POD_REFUSED, f"the API server refused the pod: {words}")
        return JobProgress(JobState.PENDING, ProgressReason.STARTING, "no pod yet")
    scheduled = next((c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") == "PodScheduled"), None)
    if scheduled is not None and scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
        return JobProgress(JobState.PENDING, ProgressReason.UNSCHEDULABLE, f"the pod waits for a node: {scheduled.get('message', '')}")
    stage = _running_stage(pod)
    if stage is None:
        return JobProgress(JobState.PENDING, ProgressReason.STARTING, "the pod is starting")
    order = [*STAGES, PUBLISH]
    number = order.index(stage) + 1 if stage in order else None
    counted = f" ({number}/{len(order)})" if number else ""
    return JobProgress(JobState.RUNNING, ProgressReason.RUNNING, f"stage {stage}{counted} runs", stage)
