"""The docs' lists are checked against the code, so they cannot drift (issue 25, item 7).

- docs/operator.md's printer-column table against the CRD's additionalPrinterColumns;
- its reason table against the Reason enum;
- its Event table against the Events the code can post (read from the source: Event(...) calls, the decisions
  (Decision, Reason) pairs, which become Events, and the reasons of phase Failed, which does too);
- the README's quick start and docs/install.md's uninstall order (the resources before the operator, the
  finalizer the operator really uses).

tests/cluster/test_docs_drift_chart.py: the chart README's RBAC table against the rules `helm template` renders, in
each install mode, and the documented finalizer patch on a real API server.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from specdec_operator import API_GROUP, crd
from specdec_operator.api import Reason
from tests.support.markdown import section, table

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "operator" / "specdec_operator"
CHART = ROOT / "charts" / "specdec-operator"
OPERATOR_DOC = ROOT / "docs" / "operator.md"


# ---------------------------------------------------------------------------------------------------------
# Printer columns, reasons


def test_the_printer_column_table_is_the_crds() -> None:
    documented = [(name, field, shown) for name, field, shown in table(OPERATOR_DOC, "column | field | shown")]
    actual = [(c["name"], c["jsonPath"], "wide" if c.get("priority", 0) > 0 else "always") for c in crd.PRINTER_COLUMNS]
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


def emitted_events() -> dict[str, set[str]]:
    """Event reason -> the Event types the code can post it with, read from the package's source."""
    events: dict[str, set[str]] = {}

    def add(reasons: set[str], types: set[str]) -> None:
        for reason in reasons:
            events.setdefault(reason, set()).update(types)

    for _path, module in _modules():
        for node in ast.walk(module):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Event" and len(node.args) >= 2:
                add(_reasons(node.args[1]), _strings(node.args[0]))
            # A decision becomes an Event (reconcile/events.py, _decision_event): promote Normal, rollback Warning.
            if isinstance(node, (ast.Call, ast.Tuple)):
                parts = [*node.args, *(k.value for k in node.keywords)] if isinstance(node, ast.Call) else list(node.elts)
                decisions = {d for p in parts if (d := _attr(p, "Decision"))}
                if len(decisions) == 1:
                    add({Reason[r].value for p in parts if (r := _attr(p, "Reason"))}, {"Normal"} if decisions == {"PROMOTE"} else {"Warning"})
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
    return events


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
    assert "Ready" not in emitted and "Loading" not in emitted  # condition reasons, never Events


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
