"""Fixtures of the tests that need no control plane (tests/unit, `make test-unit`); the shared ones are registered
from tests/conftest.py."""

import os
from pathlib import Path

import pytest

from hack import devcluster

UNIT = Path(__file__).resolve().parent


def _helm() -> Path:
    return devcluster.tools_dir() / "helm"


def _no_helm() -> str | None:
    """Why the chart's tests cannot run here, or None when helm is built."""
    path = _helm()
    if os.access(path, os.X_OK):
        return None
    return f"helm not built in {path.parent}: run `make tools` (or just `hack/tools.sh helm`) to run the chart's tests"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without helm, the tests of tests/unit that use it are skipped as they are collected: a skip mark (not a skip
    raised by the fixture) is what `-ra` folds into one summary line per file instead of one per test."""
    reason = _no_helm()
    if reason is None:
        return
    for item in items:
        if "helm_bin" in getattr(item, "fixturenames", ()) and UNIT in item.path.parents:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def helm_bin() -> str:
    """The pinned helm (v4) that `make tools` builds, for the chart's tests (tests/support/kube.py's fixture of the
    same name serves the cluster tests and fails without it). Here only helm is needed, not the control plane's
    binaries, and a machine without it (`make test-unit` as its first command: helm is minutes of Go to build) skips
    the chart's tests naming the command that builds it; `make test` builds it before any test runs."""
    reason = _no_helm()
    if reason is not None:
        pytest.skip(reason)
    return str(_helm())
