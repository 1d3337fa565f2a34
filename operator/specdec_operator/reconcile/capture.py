"""spec.retraining.capture in a step (docs/capture.md): the capture objects a step wants, whether the stable Service
selects the capture proxies, status.retraining.capture, its Events, and what turning capture off deletes.

The stable Service selects the proxies only while one of them is Ready (and ``<name>-serving``, where they send the
traffic, exists); otherwise it selects the servers as without capture: capture fails open, serving never waits for it.
No server pod template depends on capture, so turning it on or off restarts no server.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .. import manifests as m
from ..api import Reason, SpeculativeServerSpec, SpeculativeServerStatus
from ..api_retraining import CaptureSettings, CaptureStatus, RetrainingStatus, capture_on
from ..textutil import clip
from .capture_objects import ClaimShape, capture_name, claim, fronted, proxy_deployment, serving_name, serving_service
from .diff import needs_apply, owned_by
from .model import Event, Observed, Plan

ACTIVE_STATES = ("Starting", "On", "Bypassed")


def settings_of(spec: SpeculativeServerSpec) -> CaptureSettings | None:
    return capture_on(getattr(spec, "retraining", None))


def proxy_deployment_observed(observed: Observed) -> dict[str, Any] | None:
    """The capture proxy's Deployment as observed (a multi-node resource's watch files Deployments as retiring)."""
    name = capture_name(observed.name)
    found = observed.deployments.get(name) or observed.retiring.get(name)
    return found if found is not None and found.get("kind", "Deployment") == "Deployment" else None


def proxy_ready(observed: Observed) -> bool:
    deployment = proxy_deployment_observed(observed)
    return deployment is not None and int(((deployment.get("status") or {}).get("readyReplicas")) or 0) >= 1


def routed(spec: SpeculativeServerSpec, observed: Observed) -> bool:
    """Whether the stable Service is to select the capture proxies now."""
    return settings_of(spec) is not None and proxy_ready(observed) and serving_name(observed.name) in observed.services


def claim_shape(capture: CaptureSettings, stored: CaptureStatus | None) -> ClaimShape:
    """The claim as it was created (recorded in status.retraining.capture), or as the spec asks for a new one."""
    if stored is not None and stored.state in ACTIVE_STATES and stored.claim_size and stored.claim_access_mode:
        return ClaimShape(stored.claim_size, stored.claim_storage_class_name, stored.claim_access_mode)
    return ClaimShape.of(capture)


def stored_capture(status: SpeculativeServerStatus) -> CaptureStatus | None:
    return status.retraining.capture if status.retraining is not None else None


def with_capture(
    facts_spec: SpeculativeServerSpec,
    observed: Observed,
    settings: m.ManifestSettings,
    services: list[dict[str, Any]],
    stored: CaptureStatus | None = None,
) -> list[dict[str, Any]]:
    """``services`` (the stable one last) with the capture objects: the claim and ``<name>-serving`` before them, the
    stable Service fronted by the proxies while they route, the proxies' Deployment after.

    The claim is applied with the Deployment when that is created or changed, and while no proxy is Ready (a claim
    deleted meanwhile is made again); not at every step: the operator does not watch claims, and a resource that
    applies something at each step never settles. It keeps the shape it was created with (claim_shape)."""
    capture = settings_of(facts_spec)
    if capture is None:
        return services
    name, namespace = observed.name, observed.namespace
    stable_name = m.child_name(name, None)
    stable = next(s for s in services if s["metadata"]["name"] == stable_name)
    shape = claim_shape(capture, stored)
    deployment = proxy_deployment(name, namespace, facts_spec, capture, settings, shape.access_mode)
    front = routed(facts_spec, observed)
    applying_claim = needs_apply(deployment, proxy_deployment_observed(observed)) or not proxy_ready(observed)
    out = [claim(name, namespace, shape)] if applying_claim else []
    out.append(serving_service(stable, name))
    out += [fronted(s, name) if front and s is stable else s for s in services]
    return [*out, deployment]


def observed_capture_child(observed: Observed, obj: dict[str, Any]) -> tuple[bool, dict[str, Any] | None]:
    """(whether ``obj`` is a capture object, its observed copy): the claim is never observed (not watched)."""
    if obj["kind"] == "PersistentVolumeClaim":
        return True, None
    if obj["kind"] == "Deployment" and obj["metadata"]["name"] == capture_name(observed.name):
        return True, proxy_deployment_observed(observed)
    return False, None


# ---------------------------------------------------------------------------------------------------------------
# status.retraining.capture, Events, deletion


def capture_status(spec: SpeculativeServerSpec, observed: Observed, stored: CaptureStatus | None) -> CaptureStatus | None:
    name = observed.name
    capture = settings_of(spec)
    claim_name = capture_name(name)
    if capture is None:
        if not _leftovers(observed):
            return None
        return CaptureStatus(
            state="Off",
            claim_name=claim_name,
            message=f"capture turned off: deleting the capture proxy, Service {serving_name(name)} and claim {claim_name}",
        )
    shape = claim_shape(capture, stored)
    kept = (
        ""
        if shape == ClaimShape.of(capture)
        else (
            f"; the claim keeps the size, class and access mode it was created with ({shape.size}): turn capture off and on to change "
            "them (that deletes the records)"
        )
    )
    if routed(spec, observed):
        what = "prompts and answers" if capture.include_responses else "prompts"
        state, message = (
            "On",
            (
                f"the stable Service's traffic passes the capture proxy {claim_name}; {capture.sample_share:.4g} of chat/completions requests "
                f"({what}) go to claim {claim_name} (cap {capture.max_bytes} bytes, {capture.retention_hours} h); the servers were not restarted"
            ),
        )
    elif stored is not None and stored.state in ("On", "Bypassed") and proxy_deployment_observed(observed) is not None:
        state = "Bypassed"
        message = f"no capture pod of {claim_name} is Ready: the stable Service selects the servers directly and nothing is captured until one is"
    else:
        state = "Starting"
        message = (
            f"starting the capture proxy {claim_name} (claim {claim_name}): the servers serve directly until it is Ready; they are not restarted"
        )
    return CaptureStatus(
        state=state,
        claim_name=claim_name,
        claim_size=shape.size,
        claim_storage_class_name=shape.storage_class_name,
        claim_access_mode=shape.access_mode,
        # As the capture proxies count the claim (the controller reads them: controller/capturecount.py); None: not known.
        conversations=observed.captured_samples,
        message=clip(message + kept, 1024),
    )


def capture_events(stored: CaptureStatus | None, new: CaptureStatus | None, name: str) -> list[Event]:
    """Events of a change of status.retraining.capture.state (derived from the stored status: a restart repeats none)."""
    before = stored.state if stored is not None else "Off"
    after = new.state if new is not None else "Off"
    if before == after:
        return []
    if after == "Starting":
        message = (
            f"capture turned on: creating the capture proxy {capture_name(name)} in front of the servers (a Deployment of its own: "
            "the serving pods are not restarted); the stable Service selects it once it is Ready"
        )
        return [Event("Normal", Reason.CAPTURE_STARTING, message)]
    if after == "On":
        return [Event("Normal", Reason.CAPTURE_STARTED, clip(new.message or "") if new is not None else "")]
    if after == "Bypassed":
        return [Event("Warning", Reason.CAPTURE_BYPASSED, clip(new.message or "") if new is not None else "")]
    message = (
        f"capture turned off: the stable Service selects the servers; the capture proxy, Service {serving_name(name)} and claim "
        f"{capture_name(name)} with the captured records are deleted"
    )
    return [Event("Normal", Reason.CAPTURE_STOPPED, message)] if before in ACTIVE_STATES else []


def _leftovers(observed: Observed) -> list[tuple[str, str, dict[str, Any]]]:
    """The capture objects of this resource still there (owned by it), as (apiVersion, kind, object)."""
    found = [("apps/v1", "Deployment", proxy_deployment_observed(observed)), ("v1", "Service", observed.services.get(serving_name(observed.name)))]
    return [(api, kind, o) for api, kind, o in found if o is not None and owned_by(o, observed.uid)]


def deletions(spec: SpeculativeServerSpec, observed: Observed) -> list[dict[str, Any]]:
    """What turning capture off deletes, the claim first (its records go with it; Kubernetes keeps it until no pod
    mounts it), then ``<name>-serving`` and the proxies (after this step's applies re-point the stable Service)."""
    leftovers = _leftovers(observed) if settings_of(spec) is None else []
    if not leftovers:
        return []
    namespace = observed.namespace
    out: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": capture_name(observed.name), "namespace": namespace}}
    ]
    for api_version, kind, obj in reversed(leftovers):  # the Service, then the Deployment
        meta = obj.get("metadata") or {}
        out.append({"apiVersion": api_version, "kind": kind, "metadata": {"name": meta["name"], "namespace": namespace, "uid": meta.get("uid")}})
    return out


def finish(plan: Plan, spec: SpeculativeServerSpec, observed: Observed, stored: SpeculativeServerStatus) -> Plan:
    """A step's plan with status.retraining.capture, its Events and the deletions of capture turned off."""
    if plan.refused:
        return plan
    before = stored_capture(stored)
    new = capture_status(spec, observed, before)
    retraining = plan.new_status.retraining or RetrainingStatus()
    retraining = retraining.model_copy(update={"capture": new})
    retraining_or_none = None if retraining == RetrainingStatus() else retraining
    delete = deletions(spec, observed)
    return dataclasses.replace(
        plan,
        new_status=plan.new_status.model_copy(update={"retraining": retraining_or_none}),
        events=[*plan.events, *capture_events(before, new, observed.name)],
        delete=[*delete, *plan.delete],
        settled=plan.settled and not delete,
    )
