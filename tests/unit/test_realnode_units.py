"""Fast checks of the pieces the real-node end-to-end test relies on (no cluster, no containers)."""

from __future__ import annotations

import hashlib
import json
import tarfile
from pathlib import Path

import pytest

from hack.devcluster import realnode
from specdec_operator import manifests as m
from specdec_operator.api import SpeculativeServerSpec
from specdec_operator.controller.runner import build_parser
from specdec_operator.errors import InputError
from specdec_operator.reconcile import validation_from_pods

REPO = Path(__file__).resolve().parents[2]


def _spec() -> SpeculativeServerSpec:
    return SpeculativeServerSpec.model_validate(
        {
            "image": "img:1",
            "model": {"volume": {"hostPath": {"path": "/m"}}},
            "target": {"path": "t"},
            "drafter": {"path": "d"},
            "resources": {"gpus": 1},
        }
    )


def test_an_oom_killed_validator_is_reported_as_such_not_as_exit_code_137():
    pod = {
        "metadata": {"annotations": {m.ANNOTATION_REVISION: "r1"}, "labels": {m.LABEL_VARIANT: "speculative"}},
        "status": {
            "initContainerStatuses": [
                {
                    "name": m.VALIDATOR_CONTAINER,
                    "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                    "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}},
                }
            ]
        },
    }
    report = validation_from_pods([pod], "r1")
    assert report is not None and report.compatible is False
    (finding,) = report.findings
    assert finding.code == "ValidatorOOMKilled" and "--validator-memory-limit" in finding.message


def test_the_validator_memory_limit_is_a_setting_and_its_request_never_exceeds_it():
    default = m.validator_container(_spec(), m.ManifestSettings())
    assert default["resources"]["limits"]["memory"] == "512Mi" and default["resources"]["requests"]["memory"] == "128Mi"
    tight = m.validator_container(_spec(), m.ManifestSettings(validator_memory_limit="24Mi"))
    assert tight["resources"]["limits"]["memory"] == tight["resources"]["requests"]["memory"] == "24Mi"
    assert build_parser().parse_args(["--validator-memory-limit", "1Gi"]).validator_memory_limit == "1Gi"
    with pytest.raises(InputError, match="not a memory quantity"):
        build_parser().parse_args(["--validator-memory-limit", "lots"])


def test_the_pause_image_archive_is_a_reproducible_oci_layout(tmp_path):
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "pause").write_bytes(b"\x7fELF not really")
    first = realnode.pause_archive(tools, tmp_path / "a.tar").read_bytes()
    assert realnode.pause_archive(tools, tmp_path / "b.tar").read_bytes() == first
    with tarfile.open(tmp_path / "a.tar") as tar:
        names = tar.getnames()
        index = json.load(tar.extractfile("index.json"))
        (entry,) = index["manifests"]
        assert entry["annotations"]["org.opencontainers.image.ref.name"] == realnode.PAUSE_IMAGE
        manifest_blob = tar.extractfile(f"blobs/sha256/{entry['digest'].split(':')[1]}").read()
        assert hashlib.sha256(manifest_blob).hexdigest() == entry["digest"].split(":")[1]
        manifest = json.loads(manifest_blob)
        for blob in (manifest["config"], *manifest["layers"]):
            assert f"blobs/sha256/{blob['digest'].split(':')[1]}" in names
    assert "oci-layout" in names


def test_node_configuration_files_say_what_this_machine_needs(tmp_path):
    kubelet = json.loads(realnode._kubelet_config(tmp_path, tmp_path, dict.fromkeys(realnode.PORT_NAMES, 1), "192.0.2.2"))
    assert kubelet["failCgroupV1"] is False and kubelet["cgroupDriver"] == "cgroupfs"
    assert kubelet["protectKernelDefaults"] is False  # `down` restores the sysctls it sets (realnode.SYSCTLS)
    assert {"kernel/panic", "kernel/panic_on_oops", "vm/overcommit_memory"} <= set(realnode.SYSCTLS)
    containerd = realnode._containerd_config(tmp_path)
    assert "restrict_oom_score_adj = true" in containerd and "netns_mounts_under_state_dir = true" in containerd
    assert f'Root = "{tmp_path}/runc"' in containerd  # runc's state stays out of /run/runc
    proxy = json.loads(realnode._kube_proxy_config("x", tmp_path, dict.fromkeys(realnode.PORT_NAMES, 1)))
    assert proxy["mode"] == "iptables" and proxy["conntrack"]["maxPerCore"] == 0
    cni = json.loads(realnode._cni_config("x", tmp_path))
    assert cni["plugins"][0]["ipam"]["dataDir"].startswith(str(tmp_path))
    assert len(realnode.bridge_name("a-very-long-cluster-name-indeed")) <= 15  # Linux interface names
    assert realnode.pod_subnet("x").startswith("10.88.") and realnode.pod_subnet("x").endswith(".0/24")
