"""One reconcile step of a SpeculativeServer, as a pure function.

``reconcile(spec, observed, status, now)`` looks at what exists (the five children, their pods, the result of
a probe that just finished, a fresh metrics scrape) and at the last status, and returns a :class:`Plan`:
the children that must be created or changed, the complete new status, the Events to post, and whether a
probe must start (or stop). The Kopf handlers do nothing but gather ``observed``, call this, and apply the plan.

Restart safety comes from the status: the validation result and every decision are stored with the speculative
revision they are for (``api.speculative_revision``). A decided revision is never probed again, so a restarted
operator reads its decisions back instead of making them again; a probe that was running when the operator
stopped (phase Probing, no decision for the revision) is simply started again. Events are posted only for
transitions between the stored status and the new one, so a restart does not repeat them either.

The lifecycle (design.md)::

    Pending -> Validating -> Invalid                           (drafter incompatible; base keeps serving)
                          -> Deploying -> Probing -> Promoted   (stable Service -> speculative)
                                                  -> RolledBack (stable Service -> base; reason recorded)
    Promoted -> RolledBack                                      (AcceptanceDrift)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable

from . import manifests as m
from .api import ConditionType, DecisionReason, Phase, SpeculativeServerSpec, Variant, speculative_revision
from .monitor import Sample, observe

BASE = Variant.BASE.value
SPECULATIVE = Variant.SPECULATIVE.value

# Findings and messages read back from a pod are bounded: a termination message is at most 4096 bytes anyway,
# and a status is not a log.
MAX_FINDINGS = 32
MAX_TEXT = 1024


@dataclass(frozen=True)
class Settings:
    """Operator settings the decisions depend on."""

    manifests: m.ManifestSettings = m.ManifestSettings()
    # A speculative server whose main container restarted this often (CrashLoopBackOff) is given up on:
    # the decision for its revision is ProbeFailed and it is scaled to 0 instead of holding its GPUs.
    crash_restart_limit: int = 3


@dataclass(frozen=True)
class Observed:
    """What the handlers saw in the cluster (and in their own process) for one SpeculativeServer."""

    name: str
    namespace: str
    uid: str
    generation: int
    deployments: dict[str, dict[str, Any]] = field(default_factory=dict)  # by object name
    services: dict[str, dict[str, Any]] = field(default_factory=dict)  # by object name
    pods: list[dict[str, Any]] = field(default_factory=list)  # pods labelled with this instance
    probe_running: str | None = None  # revision of the probe task running in this process, if any
    probe_result: dict[str, Any] | None = None  # status.probe of a probe that just finished (has "revision")
    probe_progress: str | None = None  # what the running probe has done so far ("round 2 of up to 6")
    scrape: Sample | None = None  # a metrics scrape of the speculative server taken for this step
    previous_scrape: Sample | None = None  # the scrape before it (tells an idle server from a working one)


@dataclass(frozen=True)
class Event:
    type: str  # Normal or Warning
    reason: str
    message: str


@dataclass
class Plan:
    """What to do now."""

    revision: str
    apply: list[dict[str, Any]]  # children to create or update (server-side apply; owner reference added by the caller)
    status: dict[str, Any]  # the complete new status (camelCase)
    events: list[Event]
    start_probe: bool  # start a probe of `revision` (none is running in this process)
    cancel_probe: bool  # the running probe is for another revision or must not go on
    monitor_due: bool  # the speculative server should be scraped now (checked before the next step)
    next_scrape_in: float | None = None  # seconds until the next scrape is due (None: no monitoring)
    # Decided, and every server that should run is ready: nothing in the status changes with time alone, so only
    # an event (or the slow resync) needs a step. Unsettled resources are stepped often (deadlines, probe progress).
    settled: bool = False
    # Apply the Services before the Deployments: an existing Service is re-pointed while a Deployment changes
    # (traffic must leave a server before it is scaled to 0). Otherwise everything is applied at once.
    switch_first: bool = False
    desired: list[dict[str, Any]] = field(default_factory=list)  # all children this object should have


# -----------------------------------------------------------------------------------------------------------
# Small helpers


def rfc3339(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def _clip(text: Any, limit: int = MAX_TEXT) -> str:
    text = str(text or "")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _annotations(obj: dict[str, Any]) -> dict[str, str]:
    return ((obj.get("metadata") or {}).get("annotations")) or {}


def _labels(obj: dict[str, Any]) -> dict[str, str]:
    return ((obj.get("metadata") or {}).get("labels")) or {}


def owned_by(obj: dict[str, Any], uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in (obj.get("metadata") or {}).get("ownerReferences") or [])


def set_condition(
    conditions: list[dict[str, Any]], ctype: str, status: str, reason: str, message: str, generation: int, now: str
) -> None:
    """Set one condition in place, keeping lastTransitionTime when its status did not change."""
    for cond in conditions:
        if cond.get("type") == ctype:
            if cond.get("status") != status:
                cond["lastTransitionTime"] = now
            cond.update(status=status, reason=reason, message=_clip(message, 4096), observedGeneration=generation)
            return
    conditions.append(
        {"type": ctype, "status": status, "reason": reason, "message": _clip(message, 4096), "observedGeneration": generation, "lastTransitionTime": now}
    )


# -----------------------------------------------------------------------------------------------------------
# Reading pods


@dataclass(frozen=True)
class ServerState:
    """How one variant's server is doing, read from its pods."""

    ready: bool  # a pod of the current template is Ready
    any_ready: bool  # any pod of the variant is Ready (it can serve, even if it is an older template)
    reason: str  # CamelCase: Ready, Loading, Validating, Unschedulable, CrashLoop, Starting, NoPod, Replacing
    message: str  # for humans: "loading weights since 2026-12-02T10:00:00Z"
    restarts: int = 0  # restarts of the server container of the current pod


# Waiting reasons that are simply progress, not a problem to report.
_WAITING_NORMAL = {"PodInitializing", "ContainerCreating"}


def _is_ready(pod: dict[str, Any]) -> bool:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return False


def _live(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]


def _pods_of(pods: list[dict[str, Any]], variant: str) -> list[dict[str, Any]]:
    return _live([p for p in pods if _labels(p).get(m.LABEL_VARIANT) == variant])


def server_state(pods: list[dict[str, Any]], template_hash: str) -> ServerState:
    """Describe a variant's server from its pods: ready, loading (since when), crash-looping, ..."""
    live = _live(pods)
    any_ready = any(_is_ready(p) for p in live)
    current = [p for p in live if _annotations(p).get(m.ANNOTATION_TEMPLATE_HASH) == template_hash]
    if any(_is_ready(p) for p in current):
        return ServerState(True, True, "Ready", "ready")
    if not current:
        if live:
            return ServerState(False, any_ready, "Replacing", "replacing a pod of an older template")
        return ServerState(False, False, "NoPod", "no pod yet")
    pod = max(current, key=lambda p: (p.get("metadata") or {}).get("creationTimestamp") or "")
    status = pod.get("status") or {}
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return ServerState(False, any_ready, "Unschedulable", _clip(f"waiting for a node: {cond.get('message') or cond.get('reason') or 'unschedulable'}"))
    for init in status.get("initContainerStatuses") or []:
        state = init.get("state") or {}
        if "terminated" in state and (state["terminated"] or {}).get("exitCode") == 0:
            continue
        if "running" in state or "waiting" in state or not state:
            waiting = state.get("waiting") or {}
            if waiting.get("reason") == "CrashLoopBackOff":
                return ServerState(False, any_ready, "Validating", "the drafter validator failed (see DrafterCompatible)")
            if waiting.get("reason") and waiting["reason"] not in _WAITING_NORMAL:
                # ImagePullBackOff, CreateContainerConfigError, ...: the validator cannot even start.
                detail = f"{waiting['reason']}: {waiting.get('message')}" if waiting.get("message") else waiting["reason"]
                return ServerState(False, any_ready, "Validating", _clip(f"the drafter validator cannot start ({detail})"))
            return ServerState(False, any_ready, "Validating", "validating the drafter against the target")
        return ServerState(False, any_ready, "Validating", "the drafter validator failed (see DrafterCompatible)")
    for cs in status.get("containerStatuses") or []:
        if cs.get("name") != m.SERVER_CONTAINER:
            continue
        state = cs.get("state") or {}
        restarts = int(cs.get("restartCount") or 0)
        waiting = state.get("waiting") or {}
        if waiting.get("reason") == "CrashLoopBackOff":
            last = ((cs.get("lastState") or {}).get("terminated")) or {}
            why = last.get("reason") or "Error"
            code = last.get("exitCode")
            detail = f"{why}, exit code {code}" if code is not None else why
            return ServerState(False, any_ready, "CrashLoop", _clip(f"crash-looping ({detail}; {restarts} restarts)"), restarts)
        running = state.get("running")
        if running is not None:
            started = parse_time(running.get("startedAt")) or parse_time(status.get("startTime"))
            # The start time, never the elapsed time: a text that changes with the clock makes every step of every
            # loading server patch its status (benchmarks/scale.py found that twice; docs/scale.md). Clients
            # (kubectl, dashboards) compute the elapsed time, as they do for a pod's age.
            return ServerState(False, any_ready, "Loading", f"loading weights since {rfc3339(started)}" if started else "loading weights", restarts)
        if waiting:
            detail = waiting.get("reason") or "waiting"
            if waiting.get("message") and detail not in _WAITING_NORMAL:
                detail = f"{detail}: {waiting['message']}"
            return ServerState(False, any_ready, "Starting", _clip(f"starting ({detail})"), restarts)
    return ServerState(False, any_ready, "Starting", "starting")


def parse_validator_report(exit_code: int, message: str | None, revision: str) -> dict[str, Any]:
    """status.validation from the validator's exit code and termination message (JSON, or one line of text)."""
    text = (message or "").strip()
    data: Any = None
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except ValueError:
            data = None
    findings: list[dict[str, Any]] = []
    if isinstance(data, dict) and isinstance(data.get("findings"), list):
        for raw in data["findings"][:MAX_FINDINGS]:
            if not isinstance(raw, dict) or not raw.get("code"):
                continue
            severity = raw.get("severity") if raw.get("severity") in ("error", "warning", "info") else "error"
            finding = {"severity": severity, "code": _clip(raw["code"], 128), "message": _clip(raw.get("message"))}
            if raw.get("field"):
                finding["field"] = _clip(raw["field"], 256)
            findings.append(finding)
    if exit_code == 0:
        compatible = not (isinstance(data, dict) and data.get("compatible") is False)
    else:
        compatible = False
    if not compatible and not any(f["severity"] == "error" for f in findings):
        if exit_code == 1:
            code, what = "DrafterIncompatible", "the validator found the drafter incompatible"
        elif exit_code == 2:
            code, what = "ValidatorInputError", "the validator could not read the model directories"
        else:
            code, what = "ValidatorFailed", f"the validator exited with code {exit_code}"
        detail = text.splitlines()[0] if text and data is None else ""
        findings.insert(0, {"severity": "error", "code": code, "message": _clip(f"{what}: {detail}" if detail else what)})
    return {"compatible": compatible, "findings": findings, "revision": revision}


def validation_from_pods(pods: list[dict[str, Any]], revision: str) -> dict[str, Any] | None:
    """The validator's verdict for `revision`, read from the speculative pods' init container status."""
    for pod in _pods_of(pods, SPECULATIVE):
        if _annotations(pod).get(m.ANNOTATION_REVISION) != revision:
            continue
        for init in (pod.get("status") or {}).get("initContainerStatuses") or []:
            if init.get("name") != m.VALIDATOR_CONTAINER:
                continue
            # A failed init container of a Deployment's pod is restarted: its verdict is then in lastState.
            for state in (init.get("state") or {}, init.get("lastState") or {}):
                term = state.get("terminated")
                if term and term.get("reason") == "OOMKilled":
                    # Killed by the kernel: no termination message, and exit code 137 alone says nothing.
                    message = (f"the validator was killed for exceeding its memory limit (OOMKilled, exit code "
                               f"{term.get('exitCode')}); raise the operator's --validator-memory-limit")
                    return {"compatible": False, "revision": revision,
                            "findings": [{"severity": "error", "code": "ValidatorOOMKilled", "message": message}]}
                if term and term.get("exitCode") is not None:
                    return parse_validator_report(int(term["exitCode"]), term.get("message"), revision)
    return None


def _finding_summary(findings: list[dict[str, Any]], severities: tuple[str, ...]) -> str:
    return "; ".join(f"{f['code']}: {f.get('message') or ''}".rstrip(": ") for f in findings if f.get("severity") in severities)


# -----------------------------------------------------------------------------------------------------------
# Comparing desired and observed children


def _subset(want: dict[str, str], have: dict[str, str]) -> bool:
    return all(have.get(k) == v for k, v in want.items())


def needs_apply(desired: dict[str, Any], observed: dict[str, Any] | None) -> bool:
    """Whether an observed child differs from the desired one in a field the operator sets."""
    if observed is None:
        return True
    if not _subset(_labels(desired), _labels(observed)) or not _subset(_annotations(desired), _annotations(observed)):
        return True
    want, have = desired.get("spec") or {}, observed.get("spec") or {}
    if desired["kind"] == "Deployment":
        if want.get("replicas") != have.get("replicas"):
            return True
        want_hash = _annotations(want["template"]).get(m.ANNOTATION_TEMPLATE_HASH)
        return want_hash != _annotations(have.get("template") or {}).get(m.ANNOTATION_TEMPLATE_HASH)
    if want.get("selector") != have.get("selector"):
        return True
    ports = lambda spec: [(p.get("name"), p.get("port"), p.get("targetPort")) for p in spec.get("ports") or []]  # noqa: E731
    return ports(want) != ports(have)


# -----------------------------------------------------------------------------------------------------------
# The step


def _default_render(spec: SpeculativeServerSpec, variant: str) -> list[str]:
    from .sglang import render_argv

    return render_argv(spec, Variant(variant))


def reconcile(
    spec: SpeculativeServerSpec,
    observed: Observed,
    status: dict[str, Any] | None,
    now: datetime,
    settings: Settings = Settings(),
    render_argv: Callable[[SpeculativeServerSpec, str], list[str]] = _default_render,
    rendered: dict[str, Any] | None = None,
) -> Plan:
    """Compute the next step for one SpeculativeServer (see the module docstring).

    ``rendered``: a dict the caller keeps for this object while its spec (generation) stays the same; the pod
    templates are rendered into it once instead of on every step (they were a third of a step's CPU).
    """
    prev = dict(status or {})
    now_s = rfc3339(now)
    name, ns, gen = observed.name, observed.namespace, observed.generation
    rev = speculative_revision(spec)
    events: list[Event] = []

    # --- desired children (replicas and the stable selector are filled in below)
    ms = settings.manifests
    templates = rendered if rendered is not None else {}
    for v in (BASE, SPECULATIVE):
        if v not in templates:
            templates[v] = m.pod_template(name, spec, v, render_argv(spec, v), rev, ms)
    deps = {
        v: m.deployment(name, ns, spec, v, replicas=1, revision=rev, settings=ms, template=templates[v])
        for v in (BASE, SPECULATIVE)
    }
    want_hash = {v: deps[v]["spec"]["template"]["metadata"]["annotations"][m.ANNOTATION_TEMPLATE_HASH] for v in deps}

    observed_children = {**observed.deployments, **observed.services}
    conflicts = sorted(
        n for n in (m.child_name(name, BASE), m.child_name(name, SPECULATIVE), name) if n in observed_children and not owned_by(observed_children[n], observed.uid)
    )

    base_state = server_state(_pods_of(observed.pods, BASE), want_hash[BASE])
    spec_state = server_state(_pods_of(observed.pods, SPECULATIVE), want_hash[SPECULATIVE])
    states = {BASE: base_state, SPECULATIVE: spec_state}

    # --- validation of this revision: stored, or read from the speculative pod's init container now
    prev_validation = prev.get("validation") or {}
    validation = prev_validation if prev_validation.get("revision") == rev and prev_validation.get("compatible") is not None else None
    if validation is None:
        if not spec.drafter.path:
            validation = {
                "compatible": True,
                "findings": [{"severity": "info", "code": "NoSeparateDrafter", "message": f"{spec.drafter.algorithm} drafts with the target's own layers"}],
                "revision": rev,
            }
        else:
            validation = validation_from_pods(observed.pods, rev)
        if validation is not None:
            if validation["compatible"]:
                warnings = _finding_summary(validation["findings"], ("warning",))
                events.append(Event("Warning" if warnings else "Normal", "DrafterCompatible", f"drafter is compatible with the target{'; warnings: ' + warnings if warnings else ''}"))
            else:
                events.append(
                    Event("Warning", "DrafterIncompatible", f"{_finding_summary(validation['findings'], ('error',))}; speculative server scaled to 0, the base server keeps serving")
                )
    invalid = validation is not None and validation.get("compatible") is False

    # --- the decision for this revision: stored, just measured, or forced by a crash-looping server
    prev_probe = prev.get("probe") or {}
    decision = prev_probe if prev_probe.get("revision") == rev and prev_probe.get("decision") else None
    new_decision = False
    if decision is None and not invalid and not conflicts:
        result = observed.probe_result
        if result and result.get("revision") == rev and result.get("decision"):
            decision = {**result, "finishedAt": result.get("finishedAt") or now_s}
            decision.setdefault("startedAt", prev_probe.get("startedAt") if prev_probe.get("revision") == rev else None)
            decision = {k: v for k, v in decision.items() if v is not None}
            new_decision = True
        elif validation and validation.get("compatible") and spec_state.reason == "CrashLoop" and spec_state.restarts >= settings.crash_restart_limit:
            decision = {
                "decision": "rollback",
                "reason": DecisionReason.PROBE_FAILED.value,
                "message": f"speculative server never became ready: {spec_state.message}",
                "rounds": 0,
                "revision": rev,
                "finishedAt": now_s,
            }
            new_decision = True
    if new_decision:
        if decision["decision"] == "promote":
            events.append(Event("Normal", decision.get("reason") or DecisionReason.SPEEDUP_CONFIRMED.value, f"promoted: {decision.get('message') or ''}".rstrip(": ")))
        else:
            events.append(Event("Warning", decision.get("reason") or DecisionReason.INCONCLUSIVE.value, f"rolled back: {decision.get('message') or ''}; the base server keeps serving".replace(": ;", ":")))

    # --- drift monitor (only while promoted)
    monitor_status: dict[str, Any] | None = None
    promoted = bool(decision and decision.get("decision") == "promote")
    if promoted and spec.monitor.enabled:
        prev_monitor = prev.get("monitor") if prev.get("phase") == Phase.PROMOTED.value else None
        monitor_status = dict(prev_monitor or {"belowFloorCount": 0})
        if observed.scrape is not None:
            verdict = observe(monitor_status, observed.scrape, floor=spec.monitor.accept_length_floor, window=spec.monitor.window, previous=observed.previous_scrape)
            monitor_status = verdict.status
            if verdict.drifted:
                accept = monitor_status.get("acceptLength")
                decision = {
                    **decision,
                    "decision": "rollback",
                    "reason": DecisionReason.ACCEPTANCE_DRIFT.value,
                    "message": (
                        f"acceptance length {accept} stayed below monitor.acceptLengthFloor {spec.monitor.accept_length_floor} "
                        f"for {monitor_status['belowFloorCount']} consecutive scrapes (promoted at speedup {decision.get('speedup')}); "
                        "not promoted again for this revision"
                    ),
                    "finishedAt": now_s,
                }
                promoted = False
                events.append(Event("Warning", DecisionReason.ACCEPTANCE_DRIFT.value, f"rolled back: {decision['message']}"))
    elif decision and decision.get("reason") == DecisionReason.ACCEPTANCE_DRIFT.value:
        monitor_status = prev.get("monitor")  # the evidence of the drift rollback stays visible
    rolled_back = bool(decision and decision.get("decision") == "rollback")

    # --- replicas
    replicas = {BASE: 1, SPECULATIVE: 1}
    if invalid:
        replicas[SPECULATIVE] = 0
    if rolled_back and decision.get("reason") == DecisionReason.PROBE_FAILED.value and not decision.get("rounds"):
        # The speculative server failed before a single round: it cannot serve, so it does not hold GPUs.
        replicas[SPECULATIVE] = 0
    if decision and not spec.rollout.keep_base_warm:
        # The loser is scaled to 0 only once the winner serves, so traffic never lands on nothing.
        if promoted and spec_state.any_ready:
            replicas[BASE] = 0
        if rolled_back and base_state.any_ready:
            replicas[SPECULATIVE] = 0
    for v in deps:
        deps[v]["spec"]["replicas"] = replicas[v]

    # --- the stable Service: the active variant
    desired_active = SPECULATIVE if promoted else BASE
    stable_observed = observed.services.get(name)
    current_active = m.service_variant(stable_observed) if stable_observed else None
    active = desired_active
    if not states[desired_active].any_ready:
        # Never route to nothing while the other server can answer (both give the same answers):
        if desired_active == SPECULATIVE and base_state.any_ready:
            active = BASE  # the promoted server is restarting: the base answers meanwhile
        elif current_active == SPECULATIVE and spec_state.any_ready:
            active = SPECULATIVE  # a rollback to a cold base waits until the base serves
    if current_active in states and current_active != active and name not in conflicts:
        events.append(Event("Normal", "TrafficSwitched", f"stable Service {name} now selects the {active} server"))

    # Services before Deployments: when one step both switches the stable Service and scales the losing server
    # to 0, the Service must leave that server first (Plan.switch_first: the handlers then apply one kind at a
    # time, in this order).
    desired = [
        m.service(name, ns, BASE, settings=ms),
        m.service(name, ns, SPECULATIVE, settings=ms),
        m.service(name, ns, None, active=active, settings=ms),
        deps[BASE],
        deps[SPECULATIVE],
    ]
    conflict_names = set(conflicts)
    observed_by_kind = {"Deployment": observed.deployments, "Service": observed.services}
    to_apply = [
        obj
        for obj in desired
        if obj["metadata"]["name"] not in conflict_names and needs_apply(obj, observed_by_kind[obj["kind"]].get(obj["metadata"]["name"]))
    ]

    # --- phase, reason, message
    probing = False
    if conflicts:
        phase, reason = Phase.FAILED.value, "NameConflict"
        message = f"objects not owned by this SpeculativeServer already use its names: {', '.join(conflicts)}; delete or rename them"
    elif invalid:
        phase = Phase.INVALID.value
        errors = [f for f in validation["findings"] if f["severity"] == "error"]
        reason = errors[0]["code"] if errors else "DrafterIncompatible"
        message = f"drafter incompatible ({', '.join(f['code'] for f in errors)}); the base server keeps serving"
    elif decision:
        phase = Phase.PROMOTED.value if promoted else Phase.ROLLED_BACK.value
        reason = decision.get("reason") or ("SpeedupConfirmed" if promoted else "Inconclusive")
        message = decision.get("message") or reason
    elif not observed.deployments and not observed.pods:
        phase, reason, message = Phase.PENDING.value, "Creating", "creating the base and speculative servers"
    elif validation is None:
        phase, reason = Phase.VALIDATING.value, "Validating"
        if spec_state.reason in ("Loading", "Ready") or spec_state.message == "validating the drafter against the target":
            message = f"validating the drafter against the target; base: {base_state.message}"
        elif spec_state.reason == "Validating":  # the validator cannot start or failed without a verdict yet
            message = f"{spec_state.message}; base: {base_state.message}"
        else:  # the validator has not started: say why (no node with free GPUs, image pull, ...)
            message = f"validating the drafter: speculative pod {spec_state.message}; base: {base_state.message}"
    elif not (base_state.ready and spec_state.ready):
        phase, reason = Phase.DEPLOYING.value, "Loading"
        message = f"base: {base_state.message}; speculative: {spec_state.message}"
    else:
        phase, reason, probing = Phase.PROBING.value, "Probing", True
        started = (prev_probe.get("startedAt") if prev_probe.get("revision") == rev and observed.probe_running == rev else None) or now_s
        message = f"measuring the speculative server against the base ({len(spec.rollout.workloads)} workloads) since {started}"
        if observed.probe_progress and observed.probe_running == rev:
            message += f"; {observed.probe_progress}"

    # --- status.probe
    if decision:
        probe_status: dict[str, Any] | None = decision
    elif probing:
        probe_status = {"revision": rev, "startedAt": started}
    elif prev_probe.get("revision") == rev:
        probe_status = prev_probe
    else:
        probe_status = None

    start_probe = probing and observed.probe_running != rev
    cancel_probe = observed.probe_running is not None and (observed.probe_running != rev or bool(decision) or bool(conflicts) or invalid)
    if start_probe:
        events.append(Event("Normal", "ProbeStarted", f"both servers are ready: measuring {', '.join(w.name for w in spec.rollout.workloads)} (revision {rev})"))

    # --- conditions
    conditions = [dict(c) for c in prev.get("conditions") or []]

    def cond(ctype: ConditionType, status_: str, reason_: str, message_: str) -> None:
        set_condition(conditions, ctype.value, status_, reason_, message_, gen, now_s)

    if validation is None:
        cond(ConditionType.DRAFTER_COMPATIBLE, "Unknown", "Validating", "the validator runs as the speculative pod's init container")
    elif validation["compatible"]:
        warnings = _finding_summary(validation["findings"], ("warning",))
        cond(ConditionType.DRAFTER_COMPATIBLE, "True", "Compatible", f"compatible; warnings: {warnings}" if warnings else "compatible")
    else:
        errors = [f for f in validation["findings"] if f["severity"] == "error"]
        cond(ConditionType.DRAFTER_COMPATIBLE, "False", errors[0]["code"] if errors else "DrafterIncompatible", _finding_summary(validation["findings"], ("error", "warning")))

    for ctype, variant in ((ConditionType.BASE_READY, BASE), (ConditionType.SPECULATIVE_READY, SPECULATIVE)):
        st = states[variant]
        if replicas[variant] == 0 and not st.ready:
            why = "drafter incompatible" if variant == SPECULATIVE and invalid else "it lost the comparison and rollout.keepBaseWarm is false"
            if variant == SPECULATIVE and rolled_back and not invalid and decision.get("reason") == DecisionReason.PROBE_FAILED.value and not decision.get("rounds"):
                why = "it never became ready"
            cond(ctype, "False", "ScaledDown", f"scaled to 0: {why}")
        else:
            cond(ctype, "True" if st.ready else "False", st.reason, st.message)

    if decision:
        if promoted:
            cond(ConditionType.SPEEDUP_VERIFIED, "True", decision.get("reason") or "SpeedupConfirmed", decision.get("message") or "")
        else:
            cond(ConditionType.SPEEDUP_VERIFIED, "False", decision.get("reason") or "Inconclusive", decision.get("message") or "")
    elif invalid:
        cond(ConditionType.SPEEDUP_VERIFIED, "False", "NotProbed", "the drafter is incompatible; nothing to measure")
    else:
        cond(ConditionType.SPEEDUP_VERIFIED, "Unknown", "Probing" if probing else "WaitingForServers", message if probing else "the probe starts when both servers are ready")

    # Ready means traffic sent to the stable Service is answered: the Service exists (it is created beside the
    # steps, so it can trail the servers under load) and the server it selects is ready.
    if name not in conflict_names and stable_observed is None:
        cond(ConditionType.READY, "False", "ServicePending", f"stable Service {name} is being created; it will select the {active} server")
    else:
        serving = states[active].any_ready and name not in conflict_names
        cond(
            ConditionType.READY,
            "True" if serving else "False",
            "Serving" if serving else "NoReadyServer",
            f"stable Service {name} selects the {active} server" + ("" if serving else f", which is not ready ({states[active].message})"),
        )

    accept = (monitor_status or {}).get("acceptLength")
    if accept is None and decision:
        accept = decision.get("acceptLength")
    new_status: dict[str, Any] = {
        "phase": phase,
        "activeVariant": active,
        "reason": reason,
        "message": _clip(message),
        "speedup": decision.get("speedup") if decision else None,
        "acceptLength": accept,
        "observedGeneration": gen,
        "conditions": conditions,
        "validation": validation,
        "probe": probe_status,
        "monitor": monitor_status,
    }
    if prev.get("phase") != phase and phase in (Phase.FAILED.value,):
        events.append(Event("Warning", reason, message))

    monitor_due, next_scrape_in = False, None
    if promoted and spec.monitor.enabled and phase == Phase.PROMOTED.value:
        last = parse_time((monitor_status or {}).get("lastScrapeTime"))
        monitor_due = last is None or (now - last).total_seconds() >= spec.monitor.interval
        next_scrape_in = 0.0 if last is None else max(0.0, spec.monitor.interval - (now - last).total_seconds())

    switch_first = any(o["kind"] == "Deployment" for o in to_apply) and any(
        o["kind"] == "Service" and o["metadata"]["name"] in observed.services for o in to_apply
    )
    settled = (
        phase in (Phase.PROMOTED.value, Phase.ROLLED_BACK.value, Phase.INVALID.value)
        and not probing
        and not to_apply
        and all(states[v].ready for v in (BASE, SPECULATIVE) if replicas[v] > 0)
    )

    return Plan(
        revision=rev,
        apply=to_apply,
        status=new_status,
        events=events,
        start_probe=start_probe,
        cancel_probe=cancel_probe,
        monitor_due=monitor_due,
        next_scrape_in=next_scrape_in,
        settled=settled,
        switch_first=switch_first,
        desired=desired,
    )


def merge_patch(old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any] | None:
    """A JSON merge patch (RFC 7386) turning `old` into `new`, or None when they are equal.

    Keys missing from `new` become null (removed); nested mappings are diffed recursively; lists are replaced.
    Kopf's own bookkeeping under status.kopf is left alone.
    """
    old = old or {}
    patch: dict[str, Any] = {}
    for key in set(old) | set(new):
        if key == "kopf":
            continue
        have, want = old.get(key), new.get(key)
        if have == want:
            continue
        if isinstance(have, dict) and isinstance(want, dict):
            sub = merge_patch(have, want)
            if sub:
                patch[key] = sub
        else:
            patch[key] = want
    return patch or None
