"""`kubectl specdec revisions NAME [--pin REVISION | --unpin]`: the drafter revisions the operator trained for a
resource, and the patch that pins one (issue 36, item 4).

A revision is what the training Job `<name>-train-<n>` published; the operator records each in
status.retraining.revisions (newest last) with its figures: the offline acceptance on the held-out slice against
the serving drafter's, the live acceptance and speedup of its race, its outcome and why. Choosing one by hand is
the user's decision and lives in Git (spec.retraining.revision), so the operator never rewrites the spec and a
GitOps controller sees no drift: this command never writes anything. ``--pin`` prints the manifest change to
commit, the same as a JSON merge patch, and the `kubectl patch` line for a cluster that no GitOps controller owns.

Everything here reads the object as a plain dict (spec and status as the API server returns them): a field the
operator did not write is shown as "-", and an older operator's status (no revisions yet) prints an empty table.
"""

from __future__ import annotations

import json
from typing import Any

from .. import API_GROUP, PLURAL

DRAFTER = "drafter"  # spec.retraining.revision's value that pins spec.drafter (the contract's name)
UNUSABLE = frozenset({"Pruned"})  # outcomes whose directory is gone from the revisions claim: nothing to serve


class PinRefused(ValueError):
    """A --pin the resource cannot honour; its message is one line naming the revision and what to do."""


def _section(obj: dict[str, Any], *keys: str) -> dict[str, Any]:
    value: Any = obj
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return value if isinstance(value, dict) else {}


def revision_rows(status: dict[str, Any]) -> list[dict[str, Any]]:
    """status.retraining.revisions as recorded (newest last); rows without a name are skipped."""
    rows = _section(status, "retraining").get("revisions")
    return [r for r in rows if isinstance(r, dict) and isinstance(r.get("name"), str)] if isinstance(rows, list) else []


def serving_revision(status: dict[str, Any]) -> str:
    """The revision serving now: status.retraining.serving, or "drafter" (spec.drafter) when unset."""
    serving = _section(status, "retraining").get("serving")
    return serving if isinstance(serving, str) and serving else DRAFTER


def pinned_revision(spec: dict[str, Any]) -> str | None:
    """spec.retraining.revision: the revision pinned in Git, or None (the operator chooses)."""
    pinned = _section(spec, "retraining").get("revision")
    return pinned if isinstance(pinned, str) and pinned else None


def _number(value: Any, fmt: str) -> str:
    return format(value, fmt) if isinstance(value, int | float) and not isinstance(value, bool) else "-"


def _created(value: Any) -> str:
    """2026-12-07T04:50:12Z -> 2026-12-07 04:50 (minutes are enough to tell revisions apart by eye)."""
    if not isinstance(value, str) or len(value) < 16:
        return "-"
    return value[:10] + " " + value[11:16]


def _drafter_path(spec: dict[str, Any]) -> str:
    drafter = _section(spec, "drafter")
    return str(drafter.get("path") or drafter.get("name") or drafter.get("method") or "spec.drafter")


HEADER = f"   {'revision':<28} {'created':<16} {'trigger':<9} {'offline':>11} {'accept':>6} {'speedup':>7}  {'outcome':<9} reason"


def _line(mark: str, row: dict[str, Any]) -> str:
    offline, serving_offline = _number(row.get("offlineAcceptLength"), ".2f"), _number(row.get("servingOfflineAcceptLength"), ".2f")
    speedup = _number(row.get("speedup"), ".2f")
    return (
        f"{mark:<2} {str(row['name'])[:28]:<28} {_created(row.get('createdAt')):<16} {str(row.get('trigger') or '-')[:9]:<9} "
        f"{(offline + '/' + serving_offline) if (offline, serving_offline) != ('-', '-') else '-':>11} {_number(row.get('acceptLength'), '.2f'):>6} "
        f"{(speedup + 'x') if speedup != '-' else '-':>7}  {str(row.get('outcome') or '-')[:9]:<9} {row.get('reason') or '-'}"
    ).rstrip()


def revisions_table(name: str, spec: dict[str, Any], status: dict[str, Any]) -> str:
    """`kubectl specdec revisions NAME`: one line per revision (and spec.drafter's first), '*' on the serving one,
    'P' on the pinned one, then who chooses."""
    rows = revision_rows(status)
    serving, pinned = serving_revision(status), pinned_revision(spec)
    names = {r["name"] for r in rows}

    def mark(revision: str) -> str:
        return ("*" if revision == serving else "") + ("P" if revision == pinned else "")

    lines = [f"{name}: {len(rows)} trained revision(s)"]
    lines.append("offline: acceptance length on the held-out slice, the revision's/the serving drafter's; accept, speedup: live, its race")
    lines += ["", HEADER, _line(mark(DRAFTER), {"name": DRAFTER, "reason": f"spec.drafter ({_drafter_path(spec)})"})]
    lines += [_line(mark(r["name"]), r) for r in rows]
    lines.append("")
    lines.append(f"* serving: {serving}" + ("" if serving == DRAFTER else " (status.retraining.serving)"))
    if pinned is None:
        lines.append("P pinned: none; the operator chooses (the newest Promoted revision serves, else spec.drafter)")
    else:
        missing = "" if pinned == DRAFTER or pinned in names else " (not among the recorded revisions: see status and Events)"
        lines.append(f"P pinned: {pinned} (spec.retraining.revision, from Git){missing}")
    refused = _section(status, "retraining").get("pinRefused")
    if isinstance(refused, str) and refused:
        lines.append(f"  not honoured: {refused}")
    lines.append(f"To pin one: kubectl specdec revisions {name} --pin REVISION  (prints the patch to commit; changes nothing)")
    return "\n".join(lines)


def pin_patch(revision: str | None) -> dict[str, Any]:
    """The JSON merge patch that pins ``revision`` (None: unpin; a merge patch's null deletes the field)."""
    return {"spec": {"retraining": {"revision": revision}}}


def check_pin(revision: str, status: dict[str, Any]) -> dict[str, Any] | None:
    """The recorded row of the revision to pin (None for "drafter"); PinRefused when it cannot serve."""
    if revision == DRAFTER:
        return None
    rows = {r["name"]: r for r in revision_rows(status)}
    row = rows.get(revision)
    if row is None:
        known = ", ".join([DRAFTER, *rows]) if rows else DRAFTER
        raise PinRefused(f"--pin {revision}: no such revision in status.retraining.revisions; one of: {known}")
    if row.get("outcome") in UNUSABLE:
        raise PinRefused(f"--pin {revision}: its outcome is {row['outcome']}: its files are gone from the revisions claim; pin another")
    return row


def pin_instructions(name: str, namespace: str, revision: str | None, status: dict[str, Any]) -> str:
    """What `--pin REVISION` (or `--unpin`, revision None) prints: the change to commit to Git, as a manifest
    fragment and as a JSON merge patch, and the `kubectl patch` line. Raises PinRefused."""
    row = check_pin(revision, status) if revision is not None else None
    patch = json.dumps(pin_patch(revision), separators=(",", ":"))
    if revision is None:
        what = f"To unpin {name} (the operator chooses again: the newest Promoted revision, else spec.drafter)"
        fragment = ["spec:", "  retraining:", "    revision: null   # or delete the line"]
    else:
        figures = ""
        if row is not None:
            accept, speedup = _number(row.get("acceptLength"), ".2f"), _number(row.get("speedup"), ".2f")
            figures = f" (outcome {row.get('outcome') or '-'}, live acceptance {accept}, speedup {speedup}x)"
        elif revision == DRAFTER:
            figures = " (spec.drafter)"
        what = f"To pin {name} to {revision}{figures}"
        fragment = ["spec:", "  retraining:", f"    revision: {revision}"]
    lines = [f"{what}, commit this change to its manifest in Git:", ""]
    lines += ["  " + line for line in fragment]
    lines += ["", "The same as a JSON merge patch:", f"  {patch}", ""]
    lines.append("Where no GitOps controller owns the object (Argo CD or Flux would put Git's spec back):")
    lines.append(f"  kubectl patch {PLURAL}.{API_GROUP} {name} -n {namespace} --type merge -p '{patch}'")
    if row is not None and row.get("outcome") == "Lost":
        lines += ["", f"Note: {revision} lost its race ({row.get('reason') or '-'}); pinning it anyway is your decision."]
    lines += ["", "Nothing was changed: kubectl specdec prints the patch; choosing a revision is yours, in Git."]
    return "\n".join(lines)
