"""`make test-unit` as a first command (issue 33): the chart's tests are skipped, not failed, where `make tools` has
not built helm (tests/unit/conftest.py), and the `timing` tests run after the rest in one process, as `make test`
runs them (the Makefile's test-unit target; docs/development.md says both)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from _pytest.mark.expression import Expression

ROOT = Path(__file__).resolve().parents[2]

# Stands in for the venv's pytest so that the recipe itself is what runs: each call appends its arguments to
# $CALLS and exits with the next code of $CODES (the first phase's, then the second's).
RECORDING_PYTEST = """#!/bin/bash
n=$(( $(wc -l < "$CALLS") ))
printf '%s\\n' "$(printf '%q ' "$@")" >> "$CALLS"
codes=($CODES)
exit "${codes[$n]:-0}"
"""


def make_test_unit(tmp_path: Path, codes: str) -> tuple[subprocess.CompletedProcess[str], list[list[str]]]:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    pytest_bin = venv / "bin" / "pytest"
    pytest_bin.write_text(RECORDING_PYTEST)
    pytest_bin.chmod(0o755)
    calls = tmp_path / "calls"
    calls.write_text("")
    env = {**os.environ, "CALLS": str(calls), "CODES": codes}
    # -o venv: the venv prerequisite is taken as built (the recipe under test is test-unit's own).
    proc = subprocess.run(
        ["make", "--no-print-directory", "-o", "venv", f"VENV={venv}", "test-unit"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return proc, [shlex.split(line) for line in calls.read_text().splitlines()]


def selects(argv: list[str], marks: set[str]) -> bool:
    """Whether the call's -m expression selects a test with these marks (pytest's own expression language)."""
    expression = Expression.compile(argv[argv.index("-m") + 1])

    def marked(name: str, /, **_: str | int | bool | None) -> bool:
        return name in marks

    return expression.evaluate(marked)


def test_the_timing_tests_run_after_the_rest_in_one_process(tmp_path: Path) -> None:
    proc, calls = make_test_unit(tmp_path, "0 0")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    parallel, timing = calls
    assert parallel[parallel.index("-n") + 1] == "auto" and parallel[-1] == "tests/unit"
    assert timing[timing.index("-n") + 1] == "0" and timing[-1] == "tests/unit"
    # Every unit test runs in exactly one phase; the real-engine ones (vLLM servers) in neither.
    assert selects(parallel, set()) and not selects(timing, set())
    assert selects(timing, {"timing"}) and not selects(parallel, {"timing"})
    assert not selects(parallel, {"realengine"}) and not selects(timing, {"realengine", "timing"})


@pytest.mark.parametrize(
    ("codes", "fails"),
    [("1 0", True), ("0 1", True), ("0 5", False), ("5 0", False)],
    ids=["parallel-failed", "timing-failed", "no-timing-test-selected", "no-other-test-selected"],
)
def test_both_phases_run_and_either_failing_fails_the_target(tmp_path: Path, codes: str, fails: bool) -> None:
    proc, calls = make_test_unit(tmp_path, codes)
    assert len(calls) == 2, "the timing phase runs after a failed parallel phase too"
    assert (proc.returncode != 0) == fails, proc.stdout + proc.stderr
    first, second = (c if c != "5" else "0" for c in codes.split())
    assert f"parallel phase exit {first}, timing phase exit {second}" in proc.stdout


def test_the_chart_tests_are_skipped_naming_make_tools_where_helm_is_not_built(tmp_path: Path) -> None:
    empty = tmp_path / "no-tools"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "SPECDEC_KUBECONFIG"))}
    env["SPECDEC_TOOLS_DIR"] = str(empty)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-n", "0", "-rs", "tests/unit/test_chart.py", "-k", "lint or bad_values"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert re.search(r"\d+ (failed|errors?)\b", out) is None, out
    assert " skipped" in out and f"helm not built in {empty}: run `make tools`" in out, out
