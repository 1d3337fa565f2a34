"""The chart README's RBAC table against the rules `helm template` renders, in each install mode (issue 25, item 7;
the documented finalizer patch on a real API server is tests/cluster/test_docs_drift_chart.py)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.markdown import table

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "specdec-operator"


def _helm_rules(helm_bin: str, *values: str) -> dict[tuple[str, str, bool], set[str]]:
    """(api group, resource, limited to named objects) -> verbs, over every Role and ClusterRole the chart renders."""
    args = [helm_bin, "template", "specdec", str(CHART), "--namespace", "specdec-system"]
    for value in values:
        args += ["--set", value]
    out = subprocess.run(args, capture_output=True, text=True, timeout=120, check=True).stdout
    rules: dict[tuple[str, str, bool], set[str]] = {}
    for doc in yaml.safe_load_all(out):
        if not doc or doc.get("kind") not in ("Role", "ClusterRole"):
            continue
        for rule in doc.get("rules") or []:
            for group in rule.get("apiGroups") or []:
                for resource in rule.get("resources") or []:
                    rules.setdefault((group, resource, bool(rule.get("resourceNames"))), set()).update(rule["verbs"])
    return rules


def _documented_rules(modes: set[str]) -> dict[tuple[str, str, bool], set[str]]:
    rules: dict[tuple[str, str, bool], set[str]] = {}
    for group, resource, verbs, mode, _why in table(CHART / "README.md", "API group | resource | verbs | mode"):
        if mode not in modes:
            continue
        named = "(the peering object only)" in verbs
        key = ("" if group == '""' else group, resource, named)
        rules.setdefault(key, set()).update(verbs.replace("(the peering object only)", "").split())
    return rules


@pytest.mark.parametrize(
    "values, modes",
    [
        ((), {"both", "cluster-wide"}),
        (("watch.allNamespaces=false", "watch.namespaces={a,b}"), {"both", "namespaced"}),
        (("rbac.ownerReferencesPermissionEnforcement=true",), {"both", "cluster-wide", "finalizers"}),
    ],
    ids=["cluster-wide", "namespaced", "owner-references-enforcement"],
)
def test_the_rbac_table_is_the_charts(helm_bin: str, values: tuple[str, ...], modes: set[str]) -> None:
    assert _documented_rules(modes) == _helm_rules(helm_bin, *values)


def test_no_document_denies_a_grant_the_chart_makes(helm_bin: str) -> None:
    granted = {resource for (_group, resource, _named) in _helm_rules(helm_bin)}
    documents = [ROOT / "README.md", CHART / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for resource, words in (("configmaps", "ConfigMaps"), ("secrets", "Secrets")):
        if resource not in granted:
            continue
        for path in documents:
            text = " ".join(path.read_text().split())
            assert not re.search(rf"\bno {words}\b|nothing on {words}|anything on {words}", text), (
                f"{path.name} denies {words}, which the chart grants"
            )
