"""Specs the API server refuses at admission, with the message (issue 25, items 5 and 6), and a full podTemplate it
keeps as it is. The same specs are refused by the CLI (tests/unit/test_admission_release.py, test_podtemplate.py)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import yaml

from specdec_operator.errors import InputError
from specdec_operator.resource import parse_spec
from tests.support.platform import PLATFORM

pytestmark = pytest.mark.cluster

SPEC: dict[str, Any] = {
    "image": "lmsysorg/sglang:v0.5.23-cu129",
    "model": {"volume": {"persistentVolumeClaim": {"claimName": "weights"}}},
    "target": {"path": "llama"},
    "drafter": {"path": "eagle3/llama"},
    "resources": {"gpus": 1, "gpuFamily": "hopper"},
}


def spec_with(**fields: Any) -> dict[str, Any]:
    spec = copy.deepcopy(SPEC)
    spec.update(copy.deepcopy(fields))
    return spec


def _cr(name: str, spec: dict[str, Any]) -> str:
    return yaml.safe_dump({"apiVersion": "specdec.io/v1alpha1", "kind": "SpeculativeServer", "metadata": {"name": name}, "spec": spec})


REFUSED = {
    "disagreeing release": (
        spec_with(image="lmsysorg/sglang:v0.5.23-cu129", sglangVersion="0.5.22"),
        "spec.sglangVersion: Invalid value: sglangVersion 0.5.22 disagrees with image lmsysorg/sglang:v0.5.23-cu129 (SGLang 0.5.23)",
    ),
    "unknown tag release": (spec_with(image="lmsysorg/sglang:v0.5.10-cu129"), "image lmsysorg/sglang:v0.5.10-cu129: its tag names an SGLang release"),
    "unknown sglangVersion": (
        spec_with(image="mirror.example/sglang:prod", sglangVersion="0.5.10"),
        'spec.sglangVersion: Unsupported value: "0.5.10"',
    ),
    "nextn with a path": (spec_with(drafter={"algorithm": "NEXTN", "path": "mtp"}), "drafter.path must not be set with algorithm NEXTN"),
    # Issue 34: an image whose name says no release is refused unless sglangVersion says it.
    "image naming no release": (
        spec_with(image="mirror.example/inference:v0.5.23"),
        "spec.image: Invalid value: image mirror.example/inference:v0.5.23 names no SGLang release",
    ),
    "volume named model": (spec_with(podTemplate={"volumes": [{"name": "model", "emptyDir": {}}]}), "podTemplate.volumes[].name must not be model"),
    "mount at the model path": (
        spec_with(podTemplate={"volumes": [{"name": "x", "emptyDir": {}}], "volumeMounts": [{"name": "x", "mountPath": "/models"}]}),
        "podTemplate.volumeMounts[].mountPath must not be model.mountPath",
    ),
    "mount above /dev/shm": (
        spec_with(podTemplate={"volumes": [{"name": "x", "emptyDir": {}}], "volumeMounts": [{"name": "x", "mountPath": "/dev"}]}),
        "a directory above one of them",
    ),
    "mount of no volume": (
        spec_with(podTemplate={"volumeMounts": [{"name": "x", "mountPath": "/data"}]}),
        "must name a volume of podTemplate.volumes",
    ),
    "root without runAsNonRoot false": (
        spec_with(podTemplate={"containerSecurityContext": {"runAsUser": 0}}),
        "runAsUser 0 also needs runAsNonRoot: false",
    ),
    "old and new place": (
        spec_with(nodeSelector={"pool": "a"}, podTemplate={"nodeSelector": {"pool": "b"}}),
        "nodeSelector and podTemplate.nodeSelector are both set",
    ),
    # spec.engine (docs/engines.md): one engine's settings are refused with the other.
    "vllm with sglang settings": (
        spec_with(engine="vLLM", image="vllm/vllm-openai:v0.32.0", sglang={"extraArgs": ["--enable-torch-compile"]}),
        "sglang settings apply to engine SGLang only",
    ),
    "vllm with sglangVersion": (
        spec_with(engine="vLLM", image="vllm/vllm-openai:v0.32.0", sglangVersion="0.5.23"),
        "sglangVersion is an SGLang setting",
    ),
    "vllm with an sglang image": (spec_with(engine="vLLM"), "engine vLLM needs a vLLM image"),
    "sglang with vllm settings": (spec_with(vllm={"maxNumSeqs": 64}), "vllm settings apply to engine vLLM only"),
    "vllm on two nodes": (
        spec_with(engine="vLLM", image="vllm/vllm-openai:v0.32.0", resources={"gpus": 8, "nodes": 2, "gpuFamily": "hopper"}),
        "resources.nodes above 1 needs engine SGLang",
    ),
    "vllm managed flag": (
        spec_with(engine="vLLM", image="vllm/vllm-openai:v0.32.0", vllm={"extraArgs": ["--speculative-config.method", "ngram"]}),
        "vllm.extraArgs must not set flags the operator manages",
    ),
}


def test_the_api_server_admits_a_vllm_spec_as_the_cli_parses_it(kubectl: Any) -> None:
    spec = spec_with(engine="vLLM", image="vllm/vllm-openai:v0.32.0", vllm={"maxNumSeqs": 64, "extraArgs": ["--enforce-eager"]})
    parse_spec(spec, check_rules=True)
    kubectl("apply", "-f", "-", input=_cr("vllm-admitted", spec))
    stored = json.loads(kubectl("get", "speculativeserver", "vllm-admitted", "-o", "json").stdout)["spec"]
    assert stored["engine"] == "vLLM" and stored["vllm"]["maxNumSeqs"] == 64 and "sglangVersion" not in stored
    kubectl("delete", "speculativeserver", "vllm-admitted", "--wait=false")


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_the_api_server_refuses_with_the_message(kubectl: Any, case: str) -> None:
    spec, needle = REFUSED[case]
    # The CLI refuses it too, so a file checked by `specdec sglang-args -f` fails the same way.
    with pytest.raises(InputError):
        parse_spec(spec, check_rules=True)
    proc = kubectl("apply", "-f", "-", input=_cr("refused", spec), check=False)
    assert proc.returncode != 0, f"{case}: admitted"
    assert needle in proc.stderr, f"{case}: {proc.stderr}"


def test_the_api_server_admits_a_full_pod_template_and_keeps_every_field(kubectl: Any) -> None:
    spec = spec_with(image="lmsysorg/sglang:v0.5.22-cu129", podTemplate=PLATFORM)
    kubectl("apply", "--server-side", "--field-manager=test", "-f", "-", input=_cr("platform", spec))
    stored = json.loads(kubectl("get", "sps", "platform", "-o", "json").stdout)["spec"]
    assert stored["podTemplate"] == PLATFORM  # nothing pruned, nothing defaulted into it
    assert "sglangVersion" not in stored  # the release comes from the tag
    assert parse_spec(stored).sglang_version == "0.5.22"
    # The older place still admits, alone.
    kubectl("apply", "-f", "-", input=_cr("older", spec_with(nodeSelector={"pool": "a"}, podMetadata={"labels": {"team": "a"}})))
