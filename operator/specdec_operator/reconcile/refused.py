"""A step that serves nothing: phase Failed with a one-line reason, and its Event once.

Three things stop a spec before the lifecycle runs, each observed by the controller and decided here:

* the spec cannot be read or rendered (``Observed.spec_error``, or an InputError of the command-line renderer), the
  resource's name cannot name its Services (dotted, or too long for <name>-spec), or a rule of today's CRD that an
  older CRD admitted (a NEXTN drafter with a path): InvalidSpec, in the admission rule's words;
* a multi-node spec in a cluster that does not serve LeaderWorkerSets (``Observed.leader_worker_sets_served``):
  LeaderWorkerSetMissing, naming what to install;
* the API server refused a request in a way retrying cannot fix (``Observed.api_refusal``): Forbidden (403) or
  ApplyRejected (400, 422, or server-side apply's 500 "failed to create typed patch object" for a child that does
  not fit its type, e.g. a free-form spec field such as sglang.env holding a number where EnvVar wants a string).

Nothing is created or changed: the children that exist stay as they are. The first two are a spec the operator
cannot serve: the status says it with observedGeneration and the Ready condition (kubectl wait, Argo CD). An API
refusal is reported from outside a step: only phase, reason and message change.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from .. import manifests as m
from ..api import (
    MAX_NAME_LENGTH,
    NEXTN_PATH_MESSAGE,
    SERVICE_NAME_PATTERN,
    ConditionType,
    Phase,
    Reason,
    SpeculativeServerSpec,
    SpeculativeServerStatus,
)
from ..textutil import rfc3339
from .conditions import Conditions
from .events import transition_events
from .model import ApiRefusal, Observed, Plan

# Server-side apply's answer when a child does not fit its type; retrying cannot fix it.
TYPED_PATCH_FAILED = "failed to create typed patch object"


def api_refusal_reason(refusal: ApiRefusal) -> Reason | None:
    """Forbidden or ApplyRejected for the refusals retrying cannot fix; None for the others (retried, not reported)."""
    typed_patch = refusal.status == 500 and TYPED_PATCH_FAILED in refusal.body
    if refusal.status in (400, 403, 422) or typed_patch:
        return Reason.FORBIDDEN if refusal.status == 403 else Reason.APPLY_REJECTED
    return None


def name_error(name: str) -> str | None:
    """Why a SpeculativeServer of this name cannot be served, or None: the CRD's root rule (api.NAME_RULES), for a
    resource admitted under an older CRD. Its Services would be refused one step at a time, after its GPU servers
    were made."""
    if re.fullmatch(SERVICE_NAME_PATTERN, name) and len(name) <= MAX_NAME_LENGTH:
        return None
    return (
        f"metadata.name {name!r} cannot name this server's Services ({m.child_name(name, 'speculative')!r} and others): "
        f"use at most {MAX_NAME_LENGTH} lowercase letters, digits and '-', starting with a letter, no dots, e.g. {_suggest(name)!r}"
    )


def _suggest(name: str) -> str:
    cleaned = re.sub(r"[^a-z0-9-]+", "-", name.lower()).lstrip("0123456789-")
    return cleaned[:MAX_NAME_LENGTH].rstrip("-") or "server"


def refusal(spec: SpeculativeServerSpec | None, observed: Observed) -> tuple[Reason, str] | None:
    """Why this spec is not served now (reason, one-line message), or None."""
    if observed.spec_error is not None:
        return Reason.INVALID_SPEC, observed.spec_error
    invalid_name = name_error(observed.name)
    if invalid_name is not None:
        return Reason.INVALID_SPEC, invalid_name
    if spec is not None and spec.drafter.algorithm == "NEXTN" and spec.drafter.path:
        # Admitted under an older CRD (before its rule): no validator is rendered for NEXTN, so the step would wait
        # for a verdict that never comes, with both servers Ready and no deadline.
        return Reason.INVALID_SPEC, NEXTN_PATH_MESSAGE
    if spec is not None and not observed.leader_worker_sets_served:
        missing = m.lws_missing_message(spec, frozenset())
        if missing is not None:
            return Reason.LEADER_WORKER_SET_MISSING, missing
    return None


def refused_plan(
    prev: SpeculativeServerStatus, observed: Observed, now: datetime, reason: Reason | None, message: str, *, whole_status: bool = True
) -> Plan:
    """The plan of a refused step: the stored status with phase Failed (``reason`` None: the status unchanged).

    ``whole_status``: observedGeneration and the Ready condition say it too (a spec the operator cannot serve);
    otherwise only phase, reason and message change (an API refusal)."""
    change: dict[str, Any] = {}
    if reason is not None:
        change = {"phase": Phase.FAILED, "reason": reason, "message": message}
        if whole_status:
            change["observed_generation"] = observed.generation
            conditions = Conditions(prev.conditions, observed.generation, rfc3339(now))
            conditions.set(ConditionType.READY, "False", reason, message)
            change["conditions"] = conditions.items()
    new = prev.model_copy(update=change)
    return Plan(revision="", apply=[], new_status=new, events=transition_events(prev, new, name=observed.name, workloads=[]), refused=True)


def api_refused_plan(prev: SpeculativeServerStatus, observed: Observed, now: datetime, refused: ApiRefusal) -> Plan:
    reason = api_refusal_reason(refused)
    message = f"the API server refused a request ({refused.status}): {refused.message}"[:1024]
    return refused_plan(prev, observed, now, reason, message, whole_status=False)
