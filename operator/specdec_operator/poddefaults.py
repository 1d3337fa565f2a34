"""Operator-wide defaults for the server pods' settings that every resource would otherwise repeat (issue 34).

A platform team sets them once (the chart's ``operator.serverPodDefaults``, passed as ``specdec run
--server-pod-defaults JSON``): the pull secrets of a private mirror (the validator image is pulled in every tenant
namespace too), a priority class, the tolerations of the GPU nodes' taints, a pod security context. They are merged
under each resource's own ``spec.podTemplate`` before anything is rendered, and the resource wins:

- ``priorityClassName``: the resource's when it sets one, else the default;
- ``securityContext`` (the pod's): merged key by key, the resource's keys win (a nested object such as
  seLinuxOptions is taken whole from whichever side sets it);
- ``imagePullSecrets`` and ``tolerations``: merged, not replaced: the defaults first, then the resource's own; a pull
  secret of the same name, or a toleration equal to one of the resource's, is listed once. A resource cannot drop a
  default list entry (a platform's mirror secret stays).

Pure: a spec and the defaults in, a spec out. Only the server pods' template (and the dataset reader pod, which takes
the pull secrets and tolerations of the same template) read spec.podTemplate, so nothing else changes; the revision
does not include podTemplate, so a new default restarts the servers without a new probe.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from .api import LocalObjectReference, PodTemplate, SpeculativeServerSpec
from .errors import InputError

# The podTemplate fields an operator-wide default may set (camelCase, as in spec.podTemplate).
FIELDS = ("imagePullSecrets", "priorityClassName", "tolerations", "securityContext")


@dataclass(frozen=True)
class ServerPodDefaults:
    """The operator-wide defaults, parsed (empty: nothing is merged)."""

    image_pull_secrets: tuple[str, ...] = ()
    priority_class_name: str | None = None
    tolerations: tuple[dict[str, Any], ...] = ()
    security_context: dict[str, Any] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.image_pull_secrets or self.priority_class_name or self.tolerations or self.security_context)


def parse(text: str, source: str = "--server-pod-defaults") -> ServerPodDefaults:
    """The defaults from their JSON (or YAML flow) text; a one-line InputError naming the field and the fix."""
    import yaml

    try:
        data = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as exc:
        raise InputError(f"{source}: not valid JSON: {str(exc).splitlines()[0]}") from None
    data = data or {}
    if not isinstance(data, dict):
        raise InputError(f"{source}: must be a JSON object with some of {', '.join(FIELDS)}")
    unknown = sorted(set(data) - set(FIELDS))
    if unknown:
        raise InputError(f"{source}: {unknown[0]} is not an operator-wide default: use {', '.join(FIELDS)} (others belong in spec.podTemplate)")
    try:
        # The same schema as spec.podTemplate: a default the API server would refuse in a resource is refused here.
        template = PodTemplate.model_validate({k: v for k, v in data.items() if v not in (None, "", [], {})})
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise InputError(f"{source}: {where}: {err['msg']}") from None
    return ServerPodDefaults(
        image_pull_secrets=tuple(ref.name for ref in template.image_pull_secrets or []),
        priority_class_name=template.priority_class_name or None,
        tolerations=tuple(template.tolerations or []),
        security_context=dict(template.security_context or {}),
    )


def to_json(defaults: ServerPodDefaults) -> str:
    """The flag's value for ``defaults`` (what the chart renders from operator.serverPodDefaults)."""
    out: dict[str, Any] = {}
    if defaults.image_pull_secrets:
        out["imagePullSecrets"] = [{"name": n} for n in defaults.image_pull_secrets]
    if defaults.priority_class_name:
        out["priorityClassName"] = defaults.priority_class_name
    if defaults.tolerations:
        out["tolerations"] = list(defaults.tolerations)
    if defaults.security_context:
        out["securityContext"] = defaults.security_context
    return json.dumps(out, sort_keys=True)


def merged(spec: SpeculativeServerSpec, defaults: ServerPodDefaults) -> SpeculativeServerSpec:
    """``spec`` with the defaults merged under its podTemplate (the module docstring says how); ``spec`` itself is
    returned when there are none, so a resource renders exactly as before."""
    if not defaults:
        return spec
    own = spec.pod_template
    update: dict[str, Any] = {}
    if defaults.image_pull_secrets:
        mine = [ref.name for ref in own.image_pull_secrets or []]
        names = [n for n in defaults.image_pull_secrets if n not in mine] + mine
        update["image_pull_secrets"] = [LocalObjectReference(name=n) for n in names]
    if defaults.priority_class_name and not own.priority_class_name:
        update["priority_class_name"] = defaults.priority_class_name
    if defaults.tolerations:
        mine_t = list(own.tolerations or [])
        update["tolerations"] = [dict(t) for t in defaults.tolerations if t not in mine_t] + mine_t
    if defaults.security_context:
        update["security_context"] = {**defaults.security_context, **(own.security_context or {})}
    return spec.model_copy(update={"pod_template": own.model_copy(update=update)})
