"""A pod's status as a kubelet writes it, for hack/job_runner.py (pure functions of what ran).

Only what a kubelet of `restartPolicy: Never` pods reports: the phase (Pending while init containers run, Running,
then Succeeded or Failed), the conditions, each container's state (waiting PodInitializing, running, terminated with
its exit code, reason, message and times) and the pod's start time. The Job controller reads the phase and, for its
podFailurePolicy, the terminated exit codes; the operator reads the publish container's termination message.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

MESSAGE_LIMIT = 4096  # a kubelet keeps at most 4096 bytes of a termination message
LOG_FALLBACK_LINES, LOG_FALLBACK_BYTES = 80, 2048  # FallbackToLogsOnError: the log's last 80 lines, at most 2048 bytes


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Finished:
    """One container that ran: its exit code, termination message and times."""

    exit_code: int
    message: str
    started_at: str
    finished_at: str


def termination_message(written: str, log_tail: str, exit_code: int, policy: str | None) -> str:
    """What a kubelet puts in `terminated.message`: the file's text (at most 4096 bytes), or with
    FallbackToLogsOnError and a failure and an empty file, the log's tail."""
    text = written.encode()[:MESSAGE_LIMIT].decode(errors="ignore")
    if not text.strip() and exit_code != 0 and policy == "FallbackToLogsOnError":
        lines = log_tail.splitlines()[-LOG_FALLBACK_LINES:]
        text = "\n".join(lines).encode()[-LOG_FALLBACK_BYTES:].decode(errors="ignore")
    return text


def container_state(name: str, image: str, finished: Finished | None, running_since: str | None) -> dict[str, Any]:
    state: dict[str, Any]
    if finished is not None:
        reason = "Completed" if finished.exit_code == 0 else "Error"
        terminated = {"exitCode": finished.exit_code, "reason": reason, "startedAt": finished.started_at, "finishedAt": finished.finished_at}
        if finished.message:
            terminated["message"] = finished.message
        state = {"terminated": terminated}
    elif running_since is not None:
        state = {"running": {"startedAt": running_since}}
    else:
        state = {"waiting": {"reason": "PodInitializing"}}
    return {
        "name": name,
        "image": image,
        "imageID": "",
        "containerID": f"job-runner://{name}" if finished or running_since else None,
        "ready": running_since is not None and finished is None,
        "restartCount": 0,
        "started": running_since is not None and finished is None,
        "state": state,
    }


def pod_status(pod: dict[str, Any], finished: dict[str, Finished], running: tuple[str, str] | None, started_at: str, host_ip: str) -> dict[str, Any]:
    """The whole status of `pod` given the containers that finished and the one running (name, since)."""
    spec = pod["spec"]
    inits, mains = spec.get("initContainers") or [], spec["containers"]

    def states(containers: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for c in containers:
            since = running[1] if running and running[0] == c["name"] else None
            out.append(container_state(c["name"], c.get("image", ""), finished.get(c["name"]), since))
        return out

    failed = any(f.exit_code != 0 for f in finished.values())
    initialized = all(c["name"] in finished and finished[c["name"]].exit_code == 0 for c in inits)
    main_done = all(c["name"] in finished for c in mains)
    if failed:
        phase = "Failed"
    elif initialized and main_done:
        phase = "Succeeded"
    elif initialized:
        phase = "Running"
    else:
        phase = "Pending"
    ready = phase == "Running" and running is not None
    t = now()
    conditions = [
        {"type": "PodReadyToStartContainers", "status": "True", "lastTransitionTime": started_at},
        {"type": "Initialized", "status": str(initialized), "lastTransitionTime": t},
        {
            "type": "Ready",
            "status": str(ready),
            "lastTransitionTime": t,
            **({} if ready else {"reason": "PodCompleted" if phase in ("Succeeded", "Failed") else "ContainersNotReady"}),
        },
        {"type": "ContainersReady", "status": str(ready), "lastTransitionTime": t},
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": started_at},
    ]
    return {
        "phase": phase,
        "conditions": conditions,
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "podIP": host_ip,
        "podIPs": [{"ip": host_ip}],
        "startTime": started_at,
        "qosClass": pod.get("status", {}).get("qosClass", "BestEffort"),
        "initContainerStatuses": states(inits),
        "containerStatuses": states(mains),
    }
