"""The engine seam holds (issue 33 item 5): outside engines/ and enginefacts.py no code branches on an engine's name
or decides on its own which engine a missing one means; it asks enginefacts (standard library only, so the API, the
validator and drafter_training share it) or an Engine from engines/."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from specdec_operator import enginefacts
from specdec_operator.choices import ENGINES
from specdec_operator.engines import default_engine, engine_named, engine_names

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "operator" / "specdec_operator"
SCANNED = [PACKAGE, REPO / "drafter_training"]
# Where the engines' names belong: each engine's module, and the facts themselves.
EXEMPT = [PACKAGE / "engines", PACKAGE / "enginefacts.py"]
NAMES = {"sglang", "vllm"}
# Lines that name SGLang as something other than the serving engine, by a word on the line.
ALLOWED = {
    # `specdec-train capture --source sglang`: hidden states captured from an SGLang server, whatever engine serves later.
    "drafter_training/cli.py": ("source",),
}


def _is_name(node: ast.AST | None) -> bool:
    """A string literal naming an engine (SGLang, vllm, ...), or a tuple/list/set of literals that holds one."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.lower() in NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_is_name(e) for e in node.elts)
    return False


def engine_name_branches(source: str) -> list[tuple[int, str]]:
    """(line, what) for each place a module decides by an engine's name literal: a comparison with one (==, !=, in),
    a default that is one (function parameters, dataclass fields, argparse's default=/choices=, dict.get's or `or`'s
    fallback, engine_named("SGLang")), or a table keyed by them."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(_is_name(x) for x in [node.left, *node.comparators]):
            found.append((node.lineno, "compares with an engine name"))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if any(_is_name(d) for d in [*node.args.defaults, *node.args.kw_defaults]):
                found.append((node.lineno, f"{node.name}() defaults a parameter to an engine name"))
        elif isinstance(node, ast.ClassDef):
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and _is_name(stmt.value):
                    found.append((stmt.lineno, f"{node.name} defaults a field to an engine name"))
        elif isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg in ("default", "choices") and _is_name(kw.value):
                    found.append((node.lineno, f"{kw.arg}= names an engine"))
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
            if called == "get" and len(node.args) == 2 and _is_name(node.args[1]):
                found.append((node.lineno, ".get() falls back to an engine name"))
            if called in ("engine_named", "facts_for") and any(_is_name(a) for a in node.args):
                found.append((node.lineno, f"{called}() picks an engine by a name literal"))
        elif isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or) and _is_name(node.values[-1]):
            found.append((node.lineno, "`or` falls back to an engine name"))
        elif isinstance(node, ast.Dict) and any(_is_name(k) for k in node.keys):
            found.append((node.lineno, "a table keyed by engine names"))
    return found


def _scanned_files() -> list[Path]:
    files = []
    for root in SCANNED:
        for path in sorted(root.rglob("*.py")):
            if not any(path == e or e in path.parents for e in EXEMPT):
                files.append(path)
    return files


def test_no_module_outside_the_seam_branches_on_an_engine_name():
    files = _scanned_files()
    assert len(files) > 50  # the scan sees the package, not an empty directory
    found = []
    for path in files:
        lines = path.read_text().splitlines()
        for line, what in engine_name_branches("\n".join(lines)):
            shown = str(path.relative_to(REPO))
            if any(word in lines[line - 1] for word in ALLOWED.get(shown, ())):
                continue
            found.append(f"{shown}:{line}: {what}")
    assert found == [], "ask enginefacts (facts_for(name).x, DEFAULT) instead:\n" + "\n".join(found)


def test_no_engine_module_imports_another_engines():
    """An engine's module takes what engines share from engines/paths.py or enginefacts, not from another engine's
    module (vLLM's renderer imported its paths from the SGLang module before issue 33)."""
    modules = sorted(p for p in (PACKAGE / "engines").glob("*.py") if p.stem in NAMES)
    assert [p.stem for p in modules] == sorted(NAMES)
    for path in modules:
        others = NAMES - {path.stem}
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                parts = (node.module or "").split(".") + [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                parts = [part for a in node.names for part in a.name.split(".")]
            else:
                continue
            assert not others & set(parts), f"engines/{path.name}:{node.lineno} imports {ast.unparse(node)}"


@pytest.mark.parametrize(
    "code",
    [
        'if engine == "vllm":\n    pass\n',
        'x = "SGLang" != spec.engine\n',
        'ok = engine in ("sglang", "other")\n',
        'def f(engine: str = "sglang"):\n    pass\n',
        'class R:\n    engine: str = "SGLang"\n',
        'p.add_argument("--engine", default="sglang")\n',
        'p.add_argument("--engine", choices=["sglang", "vllm"])\n',
        'e = data.get("engine", "SGLang")\n',
        'NAMES = {"sglang": "SGLang"}\n',
        'e = engine or engine_named("SGLang")\n',
        'e = doc.get("engine") or "sglang"\n',
    ],
)
def test_the_scan_sees_each_kind_of_branch(code: str):
    assert engine_name_branches(code), code


def test_the_scan_leaves_other_uses_of_the_word_alone():
    # A container or label named sglang, a capture source, a message: not decisions about the serving engine.
    code = 'APP_NAME = "sglang"\nmsg = f"SGLang {v}"\nidx = new_index("sglang", target)\nok = engine == DEFAULT.name\n'
    assert engine_name_branches(code) == []


def test_the_facts_are_the_engines_and_the_default_is_named_once():
    assert [f.name for f in enginefacts.ENGINES] == list(enginefacts.ENGINE_NAMES) == engine_names()
    assert [f.cli_name for f in enginefacts.ENGINES] == list(enginefacts.CLI_NAMES) == list(ENGINES)
    for facts in enginefacts.ENGINES:
        engine = engine_named(facts.name)
        assert engine.facts is facts and engine.cli_name == facts.cli_name
        assert engine.metric_names == facts.metric_names and engine.metric_prefix == facts.metric_prefix
        assert all(m.startswith(facts.metric_prefix) for m in facts.metric_names)
        assert enginefacts.facts_for(facts.name) is enginefacts.facts_for(facts.cli_name.upper()) is facts
    assert default_engine().facts is enginefacts.DEFAULT
    with pytest.raises(ValueError, match="'tgi' is not one of SGLang, vLLM"):
        enginefacts.facts_for("tgi")
    # The two layer-id conventions: one trained layer set, ids one apart (docs/vllm-cpu.md).
    inputs = [1, 2, 3]
    assert enginefacts.SGLANG.ids_for_inputs(inputs) == [0, 1, 2] and enginefacts.VLLM.ids_for_inputs(inputs) == inputs
    for facts in enginefacts.ENGINES:
        assert facts.captured_inputs(facts.ids_for_inputs(inputs)) == inputs


def test_enginefacts_imports_only_the_standard_library():
    tree = ast.parse((PACKAGE / "enginefacts.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            # Only the package's own root (its __init__, constants and nothing else).
            assert node.level == 1 and node.module is None, ast.dump(node)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            assert all(n.split(".")[0] in sys.stdlib_module_names for n in names), names
    # What importing it (and the validator, which needs it) pulls in: no pydantic, no API.
    script = (
        "import sys, specdec_operator.enginefacts, specdec_operator.validator.cli\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('pydantic', 'torch', 'kopf', 'kubernetes') "
        "or m in ('specdec_operator.api', 'specdec_operator.engines'))\n"
        "print(bad)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr
