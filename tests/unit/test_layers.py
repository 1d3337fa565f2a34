"""The package's layers (docs/architecture.md): the controller and the CLI above the pure core (reconcile,
manifests, trainjob, rollout, monitor, loadaware) above the domain libraries; no module imports from a layer above its own."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "operator" / "specdec_operator"
CONTROLLER = {"controller", "cli"}
CORE = {"reconcile", "manifests", "trainjob", "rollout", "monitor", "loadaware"}  # trainjob renders a child as manifests does


def layer(top: str) -> int:
    """2: controller and CLI; 1: the pure core; 0: the domain libraries (and the package's root)."""
    return 2 if top in CONTROLLER else 1 if top in CORE else 0


def imported_tops(path: Path) -> set[str]:
    """The package's top-level modules a file imports (relative imports, resolved; absolute specdec_operator ones)."""
    here = list(path.relative_to(PACKAGE).parent.parts)
    tops = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level > 0:
            base = here[: len(here) - (node.level - 1)]
            targets = [base + node.module.split(".")] if node.module else [base + [alias.name] for alias in node.names]
            tops.update(t[0] for t in targets if t)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("specdec_operator."):
            tops.add((node.module or "").split(".")[1])
    return tops


def test_no_module_imports_from_a_layer_above_its_own() -> None:
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        own = path.relative_to(PACKAGE).with_suffix("").parts[0]
        upward += [f"{path.relative_to(PACKAGE)} imports {top}" for top in imported_tops(path) if layer(top) > layer(own)]
    assert upward == []
