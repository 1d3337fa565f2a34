"""`kubectl specdec`: steer a SpeculativeServer by hand, and see its measured speedup curve in the terminal.

Installed with the package as the `kubectl-specdec` executable, which kubectl finds on PATH as a plugin:

    kubectl specdec status NAME [-n NS]            phase, decision and the speedup against concurrency
    kubectl specdec retry NAME [-n NS]             probe the same revision again (the base keeps running)
    kubectl specdec abort NAME --reason TEXT       back to the base now, and stay there (until `resume`)
    kubectl specdec promote NAME --reason TEXT     promote without, or against, the probe's verdict
    kubectl specdec pause NAME / resume NAME       stop / continue a fleet's walk (refused for one server: nothing
                                                   to pause there); resume also lifts an abort
                                                   and a promote
    kubectl specdec revisions NAME [--pin REV]     the trained drafter revisions with their figures; --pin REV
                                                   (or --unpin) prints the patch of spec.retraining.revision to
                                                   commit to Git, and changes nothing (kubectl_revisions.py)

Every verb but `status` and `revisions` patches annotations on the object (steering.py says what each means), so the
same request can be made from Git by carrying the annotation in the manifest.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from datetime import UTC, datetime
from typing import Any, cast

from .. import API_GROUP, API_VERSION, PLURAL, steering
from ..api import ProbeMeasurement, ProbeStatus, SpeculativeServerStatus, WorkloadResult
from ..textutil import parse_time
from . import kubectl_revisions

VERBS = ("status", "retry", "abort", "promote", "pause", "resume", "revisions")


def annotation_patch(verb: str, reason: str | None = None, now: datetime | None = None) -> dict[str, Any]:
    """The merge patch of metadata.annotations that asks for ``verb`` (None deletes an annotation)."""
    if verb == "retry":
        token = (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        changes: dict[str, str | None] = {steering.RETRY: token}
    elif verb == "abort":
        changes = {steering.ABORT: reason or "aborted with kubectl specdec", steering.PROMOTE: None}
    elif verb == "promote":
        changes = {steering.PROMOTE: reason or "promoted with kubectl specdec", steering.ABORT: None}
    elif verb == "pause":
        changes = {steering.PAUSED: "true"}
    elif verb == "resume":
        changes = {steering.PAUSED: None, steering.ABORT: None, steering.PROMOTE: None}
    else:
        raise ValueError(f"unknown verb {verb!r}")
    return {"metadata": {"annotations": changes}}


def pause_does_nothing(name: str, spec: dict[str, Any]) -> str | None:
    """Why `pause` would do nothing to this resource, or None: it holds a fleet's walk, and a one-server resource
    (spec.replicas below 2) takes no walk steps, so nothing would be paused while the command said it was."""
    replicas = spec.get("replicas", 1)
    if isinstance(replicas, int) and replicas >= 2:
        return None
    return (
        f"{name} has spec.replicas {replicas}: pause holds a fleet's walk (spec.replicas 2 or more) and does nothing to one server; "
        "nothing written (kubectl specdec abort keeps the base serving)"
    )


def curve_measurement(status: SpeculativeServerStatus) -> ProbeMeasurement | None:
    """The measurement whose curve to draw: the plain probe's for a load-aware decision (the table comes from it)."""
    probe = status.probe
    if probe is None:
        return None
    if probe.load_aware is not None and probe.load_aware.plain_probe is not None and probe.load_aware.plain_probe.workloads:
        return probe.load_aware.plain_probe
    return probe if probe.workloads else None


def draw_curve(workloads: list[WorkloadResult], break_even: float | None = None, width: int = 56, height: int = 16) -> str:
    """Speedup (rows) against concurrency (columns, log scale): 'o' the estimate, '|' its interval, '-' 1.0x,
    'X' the break-even on the 1.0x line. Plain text, for a terminal."""
    points = sorted((w for w in workloads if w.speedup is not None), key=lambda w: w.concurrency)
    if not points:
        return "(no measured workloads)"
    values = [1.0] + [v for w in points for v in (w.speedup, w.speedup_low, w.speedup_high) if v is not None]
    low, high = min(values), max(values)
    pad = max((high - low) * 0.08, 0.05)
    low, high = max(0.0, low - pad), high + pad
    xs = [math.log2(max(w.concurrency, 1)) for w in points]
    x_low, x_high = min(xs), max(xs)
    span = (x_high - x_low) or 1.0

    def column(concurrency: float) -> int:
        return round((math.log2(max(concurrency, 1)) - x_low) / span * (width - 1)) if x_high > x_low else width // 2

    def row(value: float) -> int:
        return round((high - value) / (high - low) * (height - 1))

    grid = [[" "] * width for _ in range(height)]
    one = row(1.0)
    for c in range(width):
        grid[one][c] = "-"
    if break_even is not None and x_low <= math.log2(max(break_even, 1)) <= x_high:
        grid[one][column(break_even)] = "X"
    for w in points:
        c = column(w.concurrency)
        top = row(w.speedup_high if w.speedup_high is not None else w.speedup)  # type: ignore[arg-type]
        bottom = row(w.speedup_low if w.speedup_low is not None else w.speedup)  # type: ignore[arg-type]
        for r in range(top, bottom + 1):
            grid[r][c] = "|"
        grid[row(w.speedup)][c] = "o"  # type: ignore[arg-type]
    lines = []
    for r, cells in enumerate(grid):
        value = 1.0 if r == one else high - r * (high - low) / (height - 1)
        label = f"{value:5.2f}x" if r in (0, one, height - 1) else " " * 6
        lines.append(f"{label} {''.join(cells).rstrip()}")
    axis = [" "] * (width + 8)
    for w in points:
        text = str(w.concurrency)
        start = 7 + min(column(w.concurrency), width - len(text))
        for i, ch in enumerate(text):
            axis[start + i] = ch
    lines.append("       " + "".join(axis[7:]).rstrip())
    lines.append("       concurrent streams (log scale); o speedup, | interval, - 1.0x, X break-even")
    return "\n".join(lines)


def probe_cost(probe: ProbeStatus) -> str | None:
    """What the decision cost (status.probe.gpuSeconds), and over how long its probe ran."""
    if probe.gpu_seconds is None:
        return None
    line = f"{probe.gpu_seconds:,.0f} GPU-seconds ({probe.gpu_seconds / 3600:.2f} GPU-hours)"
    plain = probe.load_aware.plain_probe if probe.load_aware is not None else None
    if plain is not None and plain.gpu_seconds is not None:
        line += f", both probes: the plain one {plain.gpu_seconds:,.0f}"
    started, finished = parse_time(probe.started_at), parse_time(probe.finished_at)
    if started is not None and finished is not None:
        line += f"; {'the last ' if plain is not None else ''}probe ran {(finished - started).total_seconds():,.0f} s"
    return line


def race_table(status: SpeculativeServerStatus) -> list[str]:
    """A race of candidates (status.race, status.candidates): one line per candidate and workload, with the interval."""
    race, table = status.race, status.candidates or []
    if race is None or not table:
        return []
    cost = f", {race.gpu_seconds:,.0f} GPU-seconds" if race.gpu_seconds is not None else ""
    head = f"  race of {len(table)} candidates: {race.state}" + (f", winner {race.winner}" if race.winner else "")
    head += (f", in the slot {race.current}" if race.state == "Running" and race.current else "") + cost
    lines = ["", head, "  candidate            method      state       accept  workload             speedup  interval        reason"]
    for row in table:
        accept = f"{row.accept_length:.2f}" if row.accept_length is not None else "-"
        first = f"  {row.name[:20]:<20} {row.algorithm[:11]:<11} {row.state:<11} {accept:>6}  "
        workloads = row.workloads or []
        if not workloads:
            lines.append(f"{first}{'-':<20} {'-':>7}  {'-':<15} {row.reason or '-'}")
        for i, w in enumerate(workloads):
            interval = f"[{w.speedup_low:.2f}, {w.speedup_high:.2f}]" if w.speedup_low is not None and w.speedup_high is not None else "-"
            speedup = f"{w.speedup:.2f}x" if w.speedup is not None else "-"
            lead = first if i == 0 else " " * len(first)
            lines.append(f"{lead}{w.name[:20]:<20} {speedup:>7}  {interval:<15} {(row.reason or '-') if i == 0 else ''}".rstrip())
    return lines


def describe(name: str, status: SpeculativeServerStatus, annotations: dict[str, str]) -> str:
    """`kubectl specdec status`: what the operator says, what was asked by hand, and the curve."""
    lines = [f"{name}: {status.phase or 'Unknown'} ({status.reason or '-'}), serving {status.active_variant or '-'}"]
    if status.message:
        lines.append(f"  {status.message}")
    asked = steering.read(annotations)
    requests = [f"{key}={annotations[key]}" for key in steering.ANNOTATIONS if key in annotations]
    if requests:
        # status.replicas is spec.replicas as the operator last saw it: one server takes no walk steps to pause.
        one = status.replicas is not None and status.replicas < 2
        paused = " (paused does nothing to one server: it holds a fleet's walk)" if one else " (paused)"
        lines.append(f"  by hand: {', '.join(requests)}" + (paused if asked.paused else ""))
    probe = status.probe
    if probe is not None and probe.decision is not None:
        speedup = f"{probe.speedup:.2f}x" if probe.speedup is not None else "-"
        lines.append(f"  decision: {probe.decision} ({probe.reason or '-'}), speedup {speedup}, revision {probe.revision or '-'}")
        cost = probe_cost(probe)
        if cost is not None:
            lines.append(f"  cost: {cost}")
    lines += race_table(status)
    capture = status.retraining.capture if status.retraining is not None else None
    if capture is not None:  # spec.retraining.capture (docs/capture.md): its state and claim, never what it holds
        stored = f", {capture.conversations} conversations stored" if capture.conversations is not None else ""
        lines.append(f"  capture: {capture.state}, claim {capture.claim_name or '-'} ({capture.claim_size or '-'}){stored}")
    measurement = curve_measurement(status)
    if measurement is None or not measurement.workloads:
        lines.append("  no speedup measured yet")
        return "\n".join(lines)
    lines.append("")
    lines.append("  workload             streams  speedup  interval")
    for w in sorted(measurement.workloads, key=lambda w: w.concurrency):
        interval = f"[{w.speedup_low:.2f}, {w.speedup_high:.2f}]" if w.speedup_low is not None and w.speedup_high is not None else "-"
        speedup = f"{w.speedup:.2f}x" if w.speedup is not None else "-"
        lines.append(f"  {w.name[:20]:<20} {w.concurrency:>7}  {speedup:>7}  {interval}")
    even = measurement.break_even
    if even is not None and even.summary:
        lines.append(f"  break-even concurrency: {even.summary}")
    lines.append("")
    lines.append(draw_curve(measurement.workloads, even.concurrency if even is not None else None))
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kubectl specdec", description="Steer a SpeculativeServer, see its measured speedup and its drafter revisions."
    )
    parser.add_argument("verb", choices=VERBS)
    parser.add_argument("name", help="the SpeculativeServer")
    parser.add_argument("-n", "--namespace", help="its namespace (default: the kubeconfig context's)")
    parser.add_argument("--reason", help="why (abort, promote): recorded in status and in a Warning Event")
    parser.add_argument("--context", help="the kubeconfig context to use")
    pin = parser.add_mutually_exclusive_group()
    pin.add_argument("--pin", metavar="REVISION", help="revisions: print the patch that pins REVISION (or 'drafter': spec.drafter); applies nothing")
    pin.add_argument("--unpin", action="store_true", help="revisions: print the patch that unpins (the operator chooses); applies nothing")
    return parser


def load_namespace(args: argparse.Namespace) -> str:
    """Load the kubeconfig (KUBECONFIG read now: the client library reads it once, at import; kubectl's own rule, a
    list of files) and answer the namespace to use: --namespace, else the context's, else default."""
    from kubernetes import config

    kubeconfig = os.environ.get("KUBECONFIG") or None
    config.load_kube_config(config_file=kubeconfig, context=args.context)
    contexts, current = config.list_kube_config_contexts(config_file=kubeconfig)
    chosen = next((c for c in contexts if c["name"] == args.context), current) if args.context else current
    return args.namespace or chosen["context"].get("namespace") or "default"


def show_revisions(args: argparse.Namespace, namespace: str, obj: dict[str, Any]) -> int:
    """`revisions`: the table, or with --pin/--unpin the patch to commit (never applied)."""
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    if not (args.pin or args.unpin):
        print(kubectl_revisions.revisions_table(args.name, spec, status))
        return 0
    try:
        print(kubectl_revisions.pin_instructions(args.name, namespace, None if args.unpin else args.pin, status))
    except kubectl_revisions.PinRefused as exc:
        print(f"kubectl specdec revisions: error: {exc}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.verb == "promote" and not (args.reason or "").strip():
        print(
            "kubectl specdec promote: error: --reason is required: a promotion without a probe's verdict is recorded with its reason", file=sys.stderr
        )
        return 2
    if (args.pin or args.unpin) and args.verb != "revisions":
        print(f"kubectl specdec {args.verb}: error: --pin and --unpin belong to `kubectl specdec revisions`", file=sys.stderr)
        return 2
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config.config_exception import ConfigException

    try:
        namespace = load_namespace(args)
    except (ConfigException, OSError, TypeError, KeyError) as exc:
        print(f"kubectl specdec: error: cannot load the kubeconfig ({exc}); set KUBECONFIG or pass --context", file=sys.stderr)
        return 2
    api = client.CustomObjectsApi()
    try:
        if args.verb == "status":
            obj = cast(dict[str, Any], api.get_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, args.name))
            status = SpeculativeServerStatus.model_validate(obj.get("status") or {})
            print(describe(args.name, status, (obj.get("metadata") or {}).get("annotations") or {}))
            return 0
        if args.verb == "revisions":
            obj = cast(dict[str, Any], api.get_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, args.name))
            return show_revisions(args, namespace, obj)
        if args.verb == "pause":
            obj = cast(dict[str, Any], api.get_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, args.name))
            nothing = pause_does_nothing(args.name, obj.get("spec") or {})
            if nothing is not None:
                print(f"kubectl specdec pause: error: {nothing}", file=sys.stderr)
                return 1
        api.patch_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, args.name, annotation_patch(args.verb, args.reason))
    except ApiException as exc:
        print(f"kubectl specdec {args.verb}: error: speculativeserver {namespace}/{args.name}: {exc.status} {exc.reason}", file=sys.stderr)
        return 1
    print(f"speculativeserver.{API_GROUP}/{args.name} {args.verb} requested")
    return 0


if __name__ == "__main__":
    sys.exit(main())
