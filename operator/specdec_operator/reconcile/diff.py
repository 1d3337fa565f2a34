"""Comparing what should exist with what does: ownership, which children need applying, status merge patches."""

from __future__ import annotations

from typing import Any

from .. import manifests as m
from ..manifests import LWS_KIND


def labels_of(obj: dict[str, Any]) -> dict[str, str]:
    return ((obj.get("metadata") or {}).get("labels")) or {}


def annotations_of(obj: dict[str, Any]) -> dict[str, str]:
    return ((obj.get("metadata") or {}).get("annotations")) or {}


def owned_by(obj: dict[str, Any], uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in (obj.get("metadata") or {}).get("ownerReferences") or [])


def _subset(want: dict[str, str], have: dict[str, str]) -> bool:
    return all(have.get(k) == v for k, v in want.items())


def needs_apply(desired: dict[str, Any], observed: dict[str, Any] | None) -> bool:
    """Whether an observed child differs from the desired one in a field the operator sets."""
    if observed is None:
        return True
    if not _subset(labels_of(desired), labels_of(observed)) or not _subset(annotations_of(desired), annotations_of(observed)):
        return True
    if desired["kind"] == "ConfigMap":
        return desired.get("data") != observed.get("data")
    want, have = desired.get("spec") or {}, observed.get("spec") or {}
    if m.is_replicas_only(desired):
        return want.get("replicas") != have.get("replicas")
    if desired["kind"] == "Deployment":
        if want.get("replicas") != have.get("replicas"):
            return True
        want_hash = annotations_of(want["template"]).get(m.ANNOTATION_TEMPLATE_HASH)
        return want_hash != annotations_of(have.get("template") or {}).get(m.ANNOTATION_TEMPLATE_HASH)
    if desired["kind"] == LWS_KIND:
        if want.get("replicas") != have.get("replicas"):
            return True
        want_lwt, have_lwt = want["leaderWorkerTemplate"], have.get("leaderWorkerTemplate") or {}
        if want_lwt.get("size") != have_lwt.get("size"):
            return True
        return any(
            annotations_of(want_lwt[t]).get(m.ANNOTATION_TEMPLATE_HASH) != annotations_of(have_lwt.get(t) or {}).get(m.ANNOTATION_TEMPLATE_HASH)
            for t in ("leaderTemplate", "workerTemplate")
        )
    if want.get("selector") != have.get("selector"):
        return True

    def ports(spec: dict[str, Any]) -> list[tuple[Any, Any, Any]]:
        return [(p.get("name"), p.get("port"), p.get("targetPort")) for p in spec.get("ports") or []]

    return ports(want) != ports(have)


def template_differs(desired: dict[str, Any], observed: dict[str, Any]) -> bool:
    """Whether a server object (Deployment or LeaderWorkerSet) runs another pod template than the desired one (by
    the template hash annotations, which the operator's slim index keeps)."""
    want, have = desired.get("spec") or {}, observed.get("spec") or {}
    if desired["kind"] == "Deployment":
        want_hash = annotations_of(want["template"]).get(m.ANNOTATION_TEMPLATE_HASH)
        return want_hash != annotations_of(have.get("template") or {}).get(m.ANNOTATION_TEMPLATE_HASH)
    want_lwt, have_lwt = want["leaderWorkerTemplate"], have.get("leaderWorkerTemplate") or {}
    return want_lwt.get("size") != have_lwt.get("size") or any(
        annotations_of(want_lwt[t]).get(m.ANNOTATION_TEMPLATE_HASH) != annotations_of(have_lwt.get(t) or {}).get(m.ANNOTATION_TEMPLATE_HASH)
        for t in ("leaderTemplate", "workerTemplate")
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
