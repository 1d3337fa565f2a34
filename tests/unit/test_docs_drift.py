"""The docs' lists are checked against the code, so they cannot drift (issue 25, item 7).

- docs/operator.md's printer-column table against the CRD's additionalPrinterColumns;
- its reason table against the Reason enum;
- its Event table against the Events the code can post (read from the source: Event(...) calls, a computed reason
  through the `if` that guards it (a condition's reason `in _STUCK`), the decisions' (Decision, Reason) pairs,
  which become Events, and the reasons of phase Failed, which does too); an Event call it cannot read fails;
- every name the docs (README.md, docs/*.md, charts/*/README.md) give as an Event (`a Warning Event X`, `X Event`)
  against the same reader, Kubernetes' own reasons aside;
- the README's quick start and docs/install.md's uninstall order (the resources before the operator, the
  finalizer the operator really uses).

tests/unit/test_docs_drift_names.py: every path, make target, flag, metric, alert and Event the docs name exists.
tests/unit/test_docs_drift_rbac.py and tests/cluster/test_docs_drift_chart.py: the chart README's RBAC table
against the rules `helm template` renders, in each install mode, and the documented finalizer patch on a real API
server.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

from specdec_operator import API_GROUP, crd
from specdec_operator.api import ConditionType, Phase, Reason
from tests.support.markdown import section, table

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "operator" / "specdec_operator"
CHART = ROOT / "charts" / "specdec-operator"
OPERATOR_DOC = ROOT / "docs" / "operator.md"


# ---------------------------------------------------------------------------------------------------------
# Printer columns, reasons


def test_the_printer_column_table_is_the_crds() -> None:
    documented = [(name, field, shown) for name, field, shown in table(OPERATOR_DOC, "column | field | shown")]
    actual = [(c["name"], c["jsonPath"], "wide" if c.get("priority", 0) > 0 else "always") for c in cast(list[dict[str, Any]], crd.PRINTER_COLUMNS)]
    assert documented == actual


def test_the_reason_table_names_every_reason_once() -> None:
    names = [name.strip() for row in table(OPERATOR_DOC, "reason | where") for name in row[0].split(",")]
    assert sorted(names) == sorted(r.value for r in Reason), "docs/operator.md's reason table differs from api.Reason"


# ---------------------------------------------------------------------------------------------------------
# Events


def _modules() -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path, ast.parse(path.read_text(), str(path))


def _attr(node: ast.AST, owner: str) -> str | None:
    """`Owner.NAME` -> NAME."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == owner:
        return node.attr
    return None


def _strings(node: ast.AST) -> set[str]:
    """The string constants an expression can evaluate to ("Warning" if x else "Normal" -> both)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.IfExp):
        return _strings(node.body) | _strings(node.orelse)
    return set()


def _reasons(node: ast.AST) -> set[str]:
    return {Reason[name].value for sub in ast.walk(node) if (name := _attr(sub, "Reason")) and name in Reason.__members__}


# Event(type, reason, ...) calls whose reason is not a `Reason.X` of their own, and the rule above that reads the
# reasons they post: (function, the reason's expression) -> that rule.
COVERED_ELSEWHERE = {
    ("_decision_event", "decision.reason"): "the decisions' (Decision, Reason) pairs",
    ("transition_events", "new.reason"): "the reasons of phase Failed",
    ("transition_events", "Phase.FAILED"): "none: the fallback of a Failed phase without a reason, which no step writes",
}


def _parents(module: ast.Module) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(module) for child in ast.iter_child_nodes(node)}


def _module_constants(module: ast.Module) -> dict[str, ast.AST]:
    return {t.id: node.value for node in module.body if isinstance(node, ast.Assign) for t in node.targets if isinstance(t, ast.Name)}


def _guarded_reasons(expr: ast.AST, call: ast.AST, parents: dict[ast.AST, ast.AST], constants: dict[str, ast.AST]) -> set[str]:
    """The reasons ``expr`` can have where ``call`` runs, read from the `if`s around it: `expr in NAME` (a module
    constant of Reason members, e.g. events.py's _STUCK) or `expr == Reason.X`."""
    found: set[str] = set()
    node, parent = call, parents.get(call)
    while parent is not None:
        if isinstance(parent, ast.If) and node in parent.body:
            tests = parent.test.values if isinstance(parent.test, ast.BoolOp) and isinstance(parent.test.op, ast.And) else [parent.test]
            for test in tests:
                if isinstance(test, ast.Compare) and len(test.ops) == 1 and ast.dump(test.left) == ast.dump(expr):
                    right = test.comparators[0]
                    if isinstance(test.ops[0], ast.In) and isinstance(right, ast.Name) and right.id in constants:
                        found |= _reasons(constants[right.id])
                    elif isinstance(test.ops[0], ast.Eq):
                        found |= _reasons(right)
        node, parent = parent, parents.get(parent)
    return found


def _enclosing_function(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> str:
    while node in parents:
        node = parents[node]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return node.name
    return ""


# Decisions the lifecycle is given but that never become an Event of their own: a race waiting for a slot runs the
# lifecycle with a stand-in rollback (reason RaceQueued) so that no speculative server is held, and
# reconcile/candidate_race.queued replaces that plan's Events with its one RaceQueued Event (Normal).
NEVER_ANNOUNCED_DECISIONS = {"RaceQueued"}


def read_events() -> tuple[dict[str, set[str]], list[str]]:
    """Event reason -> the Event types the code can post it with, read from the package's source; and the Event
    calls whose reason this reader cannot tell (each must be taught to it)."""
    events: dict[str, set[str]] = {}
    unread: list[str] = []

    def add(reasons: set[str], types: set[str]) -> None:
        for reason in reasons:
            events.setdefault(reason, set()).update(types)

    for path, module in _modules():
        parents, constants = _parents(module), _module_constants(module)
        for node in ast.walk(module):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Event" and len(node.args) >= 2:
                reason, types = node.args[1], _strings(node.args[0])
                add(_reasons(reason), types)
                # The parts of the reason that are not a Reason member: a value read from a status (after.reason).
                parts = reason.values if isinstance(reason, ast.BoolOp) else [reason]
                for part in parts:
                    if _reasons(part):
                        continue
                    guarded = _guarded_reasons(part, node, parents, constants)
                    add(guarded, types)
                    if not guarded and (_enclosing_function(node, parents), ast.unparse(part)) not in COVERED_ELSEWHERE:
                        unread.append(f"{path.relative_to(ROOT)}:{node.lineno}: Event({ast.unparse(node.args[0])}, {ast.unparse(part)}, ...)")
            # A decision becomes an Event (reconcile/events.py, _decision_event): promote Normal, rollback Warning.
            if isinstance(node, (ast.Call, ast.Tuple)):
                parts = [*node.args, *(k.value for k in node.keywords)] if isinstance(node, ast.Call) else list(node.elts)
                decisions = {d for p in parts if (d := _attr(p, "Decision"))}
                if len(decisions) == 1:
                    reasons = {Reason[r].value for p in parts if (r := _attr(p, "Reason"))} - NEVER_ANNOUNCED_DECISIONS
                    add(reasons, {"Normal"} if decisions == {"PROMOTE"} else {"Warning"})
            # Phase Failed posts a Warning with its reason: PhaseOutcome(Phase.FAILED, Reason.X) and fail(..., reason).
            if isinstance(node, ast.Call) and node.args and _attr(node.args[0], "Phase") == "FAILED":
                add({r for a in node.args[1:2] for r in _reasons(a)}, {"Warning"})
            # ... and reconcile/refused.py's refusals (the reasons its functions return, and refused_plan's argument).
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in ("refusal", "api_refusal_reason"):
                add(_reasons(node), {"Warning"})
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "refused_plan":
                add({r for a in node.args for r in _reasons(a)}, {"Warning"})
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name != "fail":
                calls_fail = any(isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr == "fail" for c in ast.walk(node))
                if calls_fail:
                    for c in ast.walk(node):
                        if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr == "fail":
                            add({r for a in c.args for r in _reasons(a)}, {"Warning"})
                        if isinstance(c, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "reason" for t in c.targets):
                            add(_reasons(c.value), {"Warning"})
    return events, unread


def emitted_events() -> dict[str, set[str]]:
    """Event reason -> the Event types the code can post it with, read from the package's source."""
    return read_events()[0]


def test_the_event_reader_reads_every_event_the_code_makes() -> None:
    """An Event whose reason is computed (a condition's reason, a decision's) is read through the `if` that guards
    it or a rule of the reader; one it cannot read fails here, so no Event slips past the table."""
    assert read_events()[1] == []


def test_the_event_table_is_what_the_code_can_post() -> None:
    documented = {row[0]: row[1] for row in table(OPERATOR_DOC, "Event reason | type | when")}
    emitted = emitted_events()
    assert set(documented) == set(emitted), (
        f"documented only: {sorted(set(documented) - set(emitted))}; emitted only: {sorted(set(emitted) - set(documented))}"
    )
    for reason, types in emitted.items():
        for kind in types:
            assert kind in documented[reason], f"{reason} is posted as {kind}; docs/operator.md says {documented[reason]!r}"
        assert documented[reason].split()[0] in types, f"{reason}: docs/operator.md says {documented[reason]!r}, the code posts {types}"


def test_the_event_reader_finds_what_it_must() -> None:
    """The source reader itself: decisions, phase Failed and plain Events are all found (it can fail)."""
    emitted = emitted_events()
    assert emitted["SpeedupConfirmed"] == {"Normal"} and emitted["DrafterNotAccepting"] == {"Warning"}
    assert emitted["DrafterCompatible"] == {"Normal", "Warning"}
    assert {"NameConflict", "InvalidSpec", "Forbidden", "ApplyRejected", "LeaderWorkerSetMissing"} <= set(emitted)
    # The waits' causes, posted with a condition's reason (events.py, _stuck_events: `after.reason in _STUCK`).
    for cause in ("VolumeNotMounted", "ImageNotPulled", "ContainerConfigError", "Unschedulable", "CrashLoop"):
        assert emitted[cause] == {"Warning"}, cause
    assert "Ready" not in emitted and "Loading" not in emitted  # condition reasons, never Events


# ---------------------------------------------------------------------------------------------------------
# Event reasons named in prose

_CAMEL = r"[A-Z][a-z]+(?:[A-Z][a-z0-9]*)+"
_NAMED_AS_EVENT = [
    re.compile(rf"\b(?:Warning|Normal) Events? `?({_CAMEL})`?"),
    re.compile(rf"`?\b({_CAMEL})`?,? (?:\(?(?:Warning|Normal)\)? )?Events?\b"),
    re.compile(rf"\bEvents? `?({_CAMEL})`?"),
]
# Reasons Kubernetes itself posts, which the docs cite (the kubelet's, the scheduler's).
KUBERNETES_EVENTS = {"FailedMount", "FailedAttachVolume", "FailedScheduling", "BackOff", "Failed"}


def _code_names() -> set[str]:
    """Classes and functions of the package: `StopProbe`, `Event` are not reasons."""
    names = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                names.add(node.name)
    return names


def events_named(docs: list[Path]) -> list[tuple[str, str]]:
    """(where, name) of every name the docs give as an Event's reason, phases, condition types and code names aside."""
    not_reasons = {p.value for p in Phase} | {c.value for c in ConditionType} | _code_names()
    named: list[tuple[str, str]] = []
    for doc in docs:
        text = " ".join(doc.read_text().split())
        for pattern in _NAMED_AS_EVENT:
            for m in pattern.finditer(text):
                if m.group(1) not in not_reasons and (doc.name, m.group(1)) not in named:
                    named.append((doc.name, m.group(1)))
    return named


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted(ROOT.glob("charts/*/README.md"))]


def test_every_event_the_docs_name_is_one_the_operator_posts() -> None:
    emitted = set(emitted_events()) | KUBERNETES_EVENTS
    wrong = sorted({f"{where}: {name}" for where, name in events_named(documents()) if name not in emitted})
    assert not wrong, "Events the docs name that the operator does not post:\n" + "\n".join(wrong)


def test_the_event_name_reader_finds_what_it_must(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text("a Warning Event `VolumeNotMounted`, an `ImageNotPulled` Event, a RolledBack Event, StopProbe, the Event class.\nDrafterGone\n")
    assert [name for _, name in events_named([doc])] == ["VolumeNotMounted", "ImageNotPulled"]


# ---------------------------------------------------------------------------------------------------------
# The first hour: quick start and uninstall


def _commands(text: str) -> list[str]:
    blocks = re.findall(r"```console\n(.*?)```", text, re.DOTALL)
    return [line.split("#")[0].strip() for block in blocks for line in block.splitlines() if line.strip()]


def test_the_quick_start_installs_the_chart_applies_an_example_and_uninstalls_in_order() -> None:
    commands = _commands(section(ROOT / "README.md", "## Quick start"))
    install = next(i for i, c in enumerate(commands) if c.startswith("helm install"))
    assert "charts/specdec-operator" in commands[install] and (ROOT / "charts" / "specdec-operator" / "Chart.yaml").is_file()
    applied = next(i for i, c in enumerate(commands) if c.startswith("kubectl apply -f"))
    assert install < applied
    example = commands[applied].split()[-1]
    assert (ROOT / example).is_file(), example
    from specdec_operator.resource import load_custom_resource

    load_custom_resource(str(ROOT / example))  # admitted as the API server would
    delete = next(i for i, c in enumerate(commands) if c.startswith("kubectl delete sps"))
    uninstall = next(i for i, c in enumerate(commands) if c.startswith("helm uninstall"))
    assert applied < delete < uninstall, "the resources go first, while the operator can remove their finalizer"


def test_install_md_uninstalls_in_order_and_says_what_to_do_without_the_operator() -> None:
    uninstall_text = section(ROOT / "docs" / "install.md", "### Uninstall")
    commands = _commands(uninstall_text)
    delete = next(i for i, c in enumerate(commands) if c.startswith("kubectl delete sps"))
    uninstall = next(i for i, c in enumerate(commands) if c.startswith("helm uninstall"))
    crds = next(i for i, c in enumerate(commands) if c.startswith("kubectl delete crd"))
    assert delete < uninstall < crds
    # The finalizer it names is the one the operator sets, and the way out removes it with a patch.
    finalizer = f"{API_GROUP}/finalizer"
    sources = " ".join(path.read_text() for path in PACKAGE.rglob("kopf_tuning.py"))
    assert finalizer in sources.replace('f"{API_GROUP}/finalizer"', finalizer)
    assert f"`{finalizer}`" in uninstall_text
    assert re.search(r"kubectl .*patch sps .*remove.*/metadata/finalizers", uninstall_text)


def test_the_documented_finalizer_patch_is_valid_json_patch() -> None:
    import json

    uninstall_text = section(ROOT / "docs" / "install.md", "### Uninstall")
    patches: list[Any] = [json.loads(p) for p in re.findall(r"-p '(\[.*?\])'", uninstall_text)]
    assert patches and all(p == [{"op": "remove", "path": "/metadata/finalizers"}] for p in patches)
