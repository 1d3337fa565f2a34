"""Reading pods: how each server is doing, and the validator's verdict from the init container."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .. import manifests as m
from .. import rollout
from ..api import Finding, Reason, ValidationStatus, Variant
from ..textutil import clip, parse_time, rfc3339
from .diff import annotations_of, labels_of
from .stuck import diagnose, last_termination

# At most this many findings are read back from a termination message (at most 4096 bytes anyway).
MAX_FINDINGS = 32


@dataclass(frozen=True)
class ServerState:
    """How one variant's server is doing, read from its pods."""

    ready: bool  # a pod of the current template is Ready
    any_ready: bool  # any pod of the variant is Ready (it can serve, even if it is an older template)
    reason: Reason  # Ready, Loading, Validating, Unschedulable, CrashLoop, Starting, NoPod, Replacing
    message: str  # for humans: "loading weights since 2026-12-02T10:00:00Z"
    restarts: int = 0  # restarts of the server container of the current pod


# Waiting reasons that are simply progress, not a problem to report.
_WAITING_NORMAL = {"PodInitializing", "ContainerCreating"}
VALIDATING_MESSAGE = "validating the drafter against the target"
VALIDATOR_FAILED_MESSAGE = "the drafter validator failed (see DrafterCompatible)"


def is_ready(pod: dict[str, Any]) -> bool:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return False


def live(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]


def pods_of(pods: list[dict[str, Any]], variant: Variant) -> list[dict[str, Any]]:
    return live([p for p in pods if labels_of(p).get(m.LABEL_VARIANT) == variant.value])


def server_state(
    pods: list[dict[str, Any]], template_hash: str, events: list[dict[str, Any]] | None = None, gpu_family: str | None = None
) -> ServerState:
    """Describe a variant's server from its pods: ready, loading (since when), crash-looping, ...

    ``events``: the Events about these pods, where the kubelet says what pod states do not (a volume that does not
    mount leaves the pod PodInitializing or ContainerCreating): stuck.diagnose names the cause of a wait.
    ``gpu_family``: the spec's resources.gpuFamily, named when a pod cannot be scheduled."""
    current_pods = live(pods)
    any_ready = any(is_ready(p) for p in current_pods)
    current = [p for p in current_pods if annotations_of(p).get(m.ANNOTATION_TEMPLATE_HASH) == template_hash]
    if any(is_ready(p) for p in current):
        return ServerState(True, True, Reason.READY, "ready")
    if not current:
        if current_pods:
            return ServerState(False, any_ready, Reason.REPLACING, "replacing a pod of an older template")
        return ServerState(False, False, Reason.NO_POD, "no pod yet")
    pod = max(current, key=lambda p: (p.get("metadata") or {}).get("creationTimestamp") or "")
    status = pod.get("status") or {}
    # A new pod beside a Ready one of an older template (a base rolling update): the old one serves meanwhile.
    beside = "; the pod of the older template keeps serving" if any_ready else ""
    cause = diagnose(pod, events, gpu_family)
    if cause is not None and cause.reason != Reason.CRASH_LOOP:
        return ServerState(False, any_ready, cause.reason, clip(cause.message + beside))
    validating = _validator_state(status)
    if validating is not None:
        return ServerState(False, any_ready, Reason.VALIDATING, validating)
    for cs in status.get("containerStatuses") or []:
        if cs.get("name") in m.SERVER_CONTAINERS:
            return _server_container_state(cs, status, any_ready)
    return ServerState(False, any_ready, Reason.STARTING, "starting")


def _validator_state(status: dict[str, Any]) -> str | None:
    """What the init containers are doing, or None once all of them succeeded."""
    for init in status.get("initContainerStatuses") or []:
        state = init.get("state") or {}
        if "terminated" in state and (state["terminated"] or {}).get("exitCode") == 0:
            continue
        if "running" in state or "waiting" in state or not state:
            waiting = state.get("waiting") or {}
            if waiting.get("reason") == "CrashLoopBackOff":
                return VALIDATOR_FAILED_MESSAGE
            if waiting.get("reason") and waiting["reason"] not in _WAITING_NORMAL:
                # ImagePullBackOff, CreateContainerConfigError, ...: the validator cannot even start.
                detail = f"{waiting['reason']}: {waiting.get('message')}" if waiting.get("message") else waiting["reason"]
                return clip(f"the drafter validator cannot start ({detail})")
            return VALIDATING_MESSAGE
        return VALIDATOR_FAILED_MESSAGE
    return None


def _server_container_state(cs: dict[str, Any], status: dict[str, Any], any_ready: bool) -> ServerState:
    state = cs.get("state") or {}
    restarts = int(cs.get("restartCount") or 0)
    waiting = state.get("waiting") or {}
    if waiting.get("reason") == "CrashLoopBackOff":
        # The last termination message says why (SGLang's last words: an unknown flag, an out-of-memory, ...).
        return ServerState(False, any_ready, Reason.CRASH_LOOP, clip(f"crash-looping ({last_termination(cs)})"), restarts)
    # A container that has crashed before keeps saying why while the kubelet runs it again between back-offs (the
    # deadline reads such a wait as the crash loop it is: deadline._named).
    crashed = f" after a crash ({last_termination(cs)})" if restarts and (cs.get("lastState") or {}).get("terminated") else ""
    running = state.get("running")
    if running is not None:
        started = parse_time(running.get("startedAt")) or parse_time(status.get("startTime"))
        # The start time, never the elapsed time: a text that changes with the clock would make every step of every
        # loading server patch its status (docs/scale.md). Clients (kubectl, dashboards) compute the elapsed time,
        # as they do for a pod's age.
        message = f"loading weights since {rfc3339(started)}" if started else "loading weights"
        return ServerState(False, any_ready, Reason.LOADING, clip(message + crashed), restarts)
    if waiting:
        detail = waiting.get("reason") or "waiting"
        if waiting.get("message") and detail not in _WAITING_NORMAL:
            detail = f"{detail}: {waiting['message']}"
        return ServerState(False, any_ready, Reason.STARTING, clip(f"starting ({detail}){crashed}"), restarts)
    return ServerState(False, any_ready, Reason.STARTING, clip("starting" + crashed), restarts)


def parse_validator_report(exit_code: int, message: str | None, revision: str) -> ValidationStatus:
    """status.validation from the validator's exit code and termination message (JSON, or one line of text)."""
    text = (message or "").strip()
    data: Any = None
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except ValueError:
            data = None
    findings: list[Finding] = []
    if isinstance(data, dict) and isinstance(data.get("findings"), list):
        for raw in data["findings"][:MAX_FINDINGS]:
            if not isinstance(raw, dict) or not raw.get("code"):
                continue
            severity = raw.get("severity") if raw.get("severity") in ("error", "warning", "info") else "error"
            findings.append(
                Finding(
                    severity=severity,
                    code=clip(raw["code"], 128),
                    message=clip(raw.get("message")),
                    field=clip(raw["field"], 256) if raw.get("field") else None,
                )
            )
    compatible = exit_code == 0 and not (isinstance(data, dict) and data.get("compatible") is False)
    if not compatible and not any(f.severity == "error" for f in findings):
        if exit_code == 1:
            code, what = Reason.DRAFTER_INCOMPATIBLE, "the validator found the drafter incompatible"
        elif exit_code == 2:
            code, what = Reason.VALIDATOR_INPUT_ERROR, "the validator could not read the model directories"
        else:
            code, what = Reason.VALIDATOR_FAILED, f"the validator exited with code {exit_code}"
        detail = text.splitlines()[0] if text and data is None else ""
        findings.insert(0, Finding(severity="error", code=code.value, message=clip(f"{what}: {detail}" if detail else what)))
    return ValidationStatus(compatible=compatible, findings=findings, revision=revision)


def validation_from_pods(pods: list[dict[str, Any]], revision: str) -> ValidationStatus | None:
    """The validator's verdict for `revision`, read from the speculative pods' init container status."""
    for pod in pods_of(pods, Variant.SPECULATIVE):
        if annotations_of(pod).get(m.ANNOTATION_REVISION) != revision:
            continue
        for init in (pod.get("status") or {}).get("initContainerStatuses") or []:
            if init.get("name") != m.VALIDATOR_CONTAINER:
                continue
            # A failed init container of a Deployment's pod is restarted: its verdict is then in lastState.
            for state in (init.get("state") or {}, init.get("lastState") or {}):
                term = state.get("terminated")
                if term and term.get("reason") == "OOMKilled":
                    # Killed by the kernel: no termination message, and exit code 137 alone says nothing.
                    message = (
                        f"the validator was killed for exceeding its memory limit (OOMKilled, exit code "
                        f"{term.get('exitCode')}); raise the operator's --validator-memory-limit"
                    )
                    return ValidationStatus(
                        compatible=False, revision=revision, findings=[Finding(severity="error", code=Reason.VALIDATOR_OOM_KILLED, message=message)]
                    )
                if term and term.get("exitCode") is not None:
                    return parse_validator_report(int(term["exitCode"]), term.get("message"), revision)
    return None


def finding_summary(validation: ValidationStatus, severities: tuple[str, ...]) -> str:
    return "; ".join(f"{f.code}: {f.message or ''}".rstrip(": ") for f in validation.findings if f.severity in severities)


def error_codes(validation: ValidationStatus) -> list[str]:
    return [f.code for f in validation.findings if f.severity == "error"]


def group_state(desired: int, pods: list[dict[str, Any]], variant: Variant) -> rollout.VariantState:
    """What the walk planner sees of one variant's LeaderWorkerSet: its groups, counted by their leaders.

    A group exists while its leader pod does (terminating while the leader is being deleted) and is Ready when
    its leader is (the leader's readiness needs every rank). ``ready_by_index``: whether each group index up to the
    highest of ``desired`` and the existing ones is Ready, since a LeaderWorkerSet scales down from its highest index.
    """
    leaders = [
        p for p in pods if labels_of(p).get(m.LABEL_VARIANT) == variant.value and labels_of(p).get(m.LABEL_ROLE, m.ROLE_LEADER) == m.ROLE_LEADER
    ]
    terminating = sum(1 for p in leaders if (p.get("metadata") or {}).get("deletionTimestamp"))
    ready_indexes = set()
    for pod in live(leaders):
        index = labels_of(pod).get(m.LWS_LABEL_GROUP_INDEX)
        if is_ready(pod) and index is not None and index.isdigit():
            ready_indexes.add(int(index))
    size = max([desired, *(i + 1 for i in ready_indexes)])
    by_index = tuple(i in ready_indexes for i in range(size))
    return rollout.VariantState(desired=desired, pods=len(leaders), ready=len(ready_indexes), terminating=terminating, ready_by_index=by_index)
