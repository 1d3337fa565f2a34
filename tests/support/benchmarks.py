"""The scripts in benchmarks/ as modules, for the tests that run their setups (profiles, workloads, campaigns)
at a smaller size or check their arithmetic. benchmarks/ is a folder of scripts, not a package: each is loaded
from its file once per session."""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@functools.cache
def load_benchmark(name: str) -> ModuleType:
    """benchmarks/<name>.py as the module `benchmarks_<name>` (not run as a script: its main() is not called)."""
    path = BENCHMARKS / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", path)
    assert spec is not None and spec.loader is not None, f"no benchmark {path}"
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file executes
    spec.loader.exec_module(module)
    return module
