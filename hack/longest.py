#!/usr/bin/env python3
"""The longest functions and classes of a source tree, in lines (decorators excluded), read with `ast`.

python3 hack/longest.py operator/specdec_operator 5
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def sizes(root: Path) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    functions: list[tuple[int, str]] = []
    classes: list[tuple[int, str]] = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                (classes if isinstance(node, ast.ClassDef) else functions).append((lines, f"{path.relative_to(root)}:{node.name}"))
    return sorted(functions, reverse=True), sorted(classes, reverse=True)


def main(argv: list[str]) -> int:
    root, top = Path(argv[0] if argv else "operator/specdec_operator"), int(argv[1]) if len(argv) > 1 else 5
    functions, classes = sizes(root)
    for label, items in (("functions", functions), ("classes", classes)):
        print(label)
        for lines, name in items[:top]:
            print(f"  {lines:4d} {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
