"""docs/install.md's Prerequisites (issue 34, item 5) say what the rendered pods and the chart do today: the UID
the validator and the reader pod run as, HF_HUB_OFFLINE in the server's environment, the ports the operator must
reach, the access modes a shared model volume needs, the pull secrets and the NetworkPolicy switch."""

from __future__ import annotations

from pathlib import Path

import yaml

from specdec_operator import manifests as m
from tests.support.world import World, llama_spec

ROOT = Path(__file__).resolve().parents[2]


def prerequisites() -> str:
    text = (ROOT / "docs" / "install.md").read_text()
    start = text.index("\n## Prerequisites\n")
    return " ".join(text[start : text.index("\n## ", start + 1)].split())


def speculative_pod_spec() -> dict:
    world = World(llama_spec())
    world.step()
    return world.template("speculative")["spec"]


def test_the_uids_and_the_offline_switch_are_the_rendered_pods():
    section = prerequisites()
    spec = speculative_pod_spec()
    (validator,) = [c for c in spec["initContainers"] if c["name"] == m.VALIDATOR_CONTAINER]
    uid = validator["securityContext"]["runAsUser"]
    assert f"UID and GID {uid}" in section and f"readable by UID {uid}" in section
    assert uid == m.READER_UID and f"runs as {uid} too" in section, "the File dataset's reader pod"
    server = next(c for c in spec["containers"] if any(e["name"] == "HF_HUB_OFFLINE" for e in c.get("env", [])))
    assert {"name": "HF_HUB_OFFLINE", "value": "1"} in server["env"] and "`HF_HUB_OFFLINE=1`" in section
    (port,) = [p["containerPort"] for p in server["ports"]]
    assert f"server's port ({port})" in section
    assert f"on port {m.READER_PORT}" in section


def test_the_volume_modes_pull_secrets_and_network_policy_are_named():
    section = prerequisites()
    for words in ("`ReadOnlyMany`", "`ReadWriteMany`", "`ReadWriteOncePod` never does", "`spec.podTemplate.imagePullSecrets`"):
        assert words in section, words
    values = yaml.safe_load((ROOT / "charts" / "specdec-operator" / "values.yaml").read_text())
    assert values["networkPolicy"]["enabled"] is False and "`networkPolicy.enabled=true` (off by default)" in section
    assert "imagePullSecrets" in values["operator"]["serverPodDefaults"]
    assert "`operator.serverPodDefaults.imagePullSecrets`" in section
    assert "`operator.validatorImage`" in section and "validatorImage" in values["operator"]
