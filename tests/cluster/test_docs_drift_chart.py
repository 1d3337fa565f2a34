"""docs/install.md's finalizer patch on the real API server (issue 25, item 7; the docs' tables are
tests/unit/test_docs_drift.py and tests/unit/test_docs_drift_rbac.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from specdec_operator import API_GROUP
from tests.support.kube import wait_until
from tests.support.markdown import section

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "specdec-operator"


@pytest.mark.cluster
def test_the_documented_patch_finishes_a_deletion_the_operator_is_gone_for(kubectl: Any) -> None:
    """A SpeculativeServer with the operator's finalizer and no operator: deleting it waits; the documented patch
    (the one-resource form in docs/install.md) ends the wait."""
    cr = {
        "apiVersion": "specdec.io/v1alpha1",
        "kind": "SpeculativeServer",
        "metadata": {"name": "orphan", "finalizers": [f"{API_GROUP}/finalizer"]},
        "spec": {
            "image": "lmsysorg/sglang:v0.5.23-cu130",
            "model": {"volume": {"persistentVolumeClaim": {"claimName": "weights"}}},
            "target": {"path": "llama"},
            "drafter": {"path": "eagle3/llama"},
        },
    }
    kubectl("apply", "-f", "-", input=json.dumps(cr))
    kubectl("delete", "sps", "orphan", "--wait=false")
    stuck = json.loads(kubectl("get", "sps", "orphan", "-o", "json").stdout)
    assert stuck["metadata"].get("deletionTimestamp") and stuck["metadata"]["finalizers"] == [f"{API_GROUP}/finalizer"]
    uninstall_text = section(ROOT / "docs" / "install.md", "### Uninstall")
    one = re.search(r"`kubectl -n NS patch sps NAME (--type json -p '(\[.*?\])')`", uninstall_text)
    assert one, "docs/install.md has no one-resource finalizer patch"
    kubectl("patch", "sps", "orphan", "--type", "json", "-p", one.group(2))
    wait_until(lambda: kubectl("get", "sps", "orphan", check=False).returncode != 0, timeout=30, message="the resource to be gone")
