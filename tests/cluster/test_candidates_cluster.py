"""Issue 35 (1): the real API server compiles the CRD's candidate rules (within its CEL cost budget), admits a spec of
candidates for each engine as the CLI parses it, and refuses a method the engine or release lacks with the same words
(tests/unit/test_candidates_api.py checks the same rules with cel-python)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import yaml

from specdec_operator.errors import InputError
from specdec_operator.resource import parse_spec

pytestmark = pytest.mark.cluster

SGLANG: dict[str, Any] = {
    "image": "lmsysorg/sglang:v0.5.23-cu129",
    "model": {"volume": {"persistentVolumeClaim": {"claimName": "weights"}}},
    "target": {"path": "llama"},
    "drafter": {"path": "eagle3/llama"},
    "resources": {"gpus": 1, "gpuFamily": "hopper"},
}
VLLM: dict[str, Any] = {**SGLANG, "engine": "vLLM", "image": "vllm/vllm-openai:v0.32.0"}
SGLANG_CANDIDATES = [
    {"name": "small", "algorithm": "STANDALONE", "path": "llama-3.2-1b", "numSteps": 4},
    {"name": "dflash", "algorithm": "DFLASH", "path": "dflash/llama", "numSteps": 15},
    {"name": "ngram-tree", "algorithm": "NGRAM", "numDraftTokens": 12, "ngram": {"maxTrieDepth": 12, "maxBfsBreadth": 6}},
]
VLLM_CANDIDATES = [
    {"name": "small", "algorithm": "STANDALONE", "path": "llama-3.2-1b"},
    {"name": "lookup", "algorithm": "NGRAM", "ngram": {"minMatch": 2, "maxMatch": 5}},
    {"name": "suffix", "algorithm": "SUFFIX", "numSteps": 16, "suffix": {"maxTreeDepth": 24}},
]


def spec_with(base: dict[str, Any], **fields: Any) -> dict[str, Any]:
    spec = copy.deepcopy(base)
    spec.update(copy.deepcopy(fields))
    return spec


def _cr(name: str, spec: dict[str, Any]) -> str:
    return yaml.safe_dump({"apiVersion": "specdec.io/v1alpha1", "kind": "SpeculativeServer", "metadata": {"name": name}, "spec": spec})


REFUSED = {
    "suffix on sglang": (
        spec_with(SGLANG, candidates=[{"name": "s", "algorithm": "SUFFIX"}]),
        "candidates[].algorithm SUFFIX (suffix decoding) needs engine vLLM",
    ),
    "dflash on 0.5.9": (
        spec_with(SGLANG, image="lmsysorg/sglang:v0.5.9-cu126", drafter={"algorithm": "DFLASH", "path": "d"}),
        "drafter.algorithm DFLASH needs SGLang 0.5.22 or later",
    ),
    "sglang n-gram settings on vllm": (
        spec_with(VLLM, candidates=[{"name": "lookup", "algorithm": "NGRAM", "ngram": {"maxTrieDepth": 8}}]),
        "ngram.maxTrieDepth, minBfsBreadth and maxBfsBreadth are SGLang's",
    ),
    "ngram with a path": (spec_with(SGLANG, drafter={"algorithm": "NGRAM", "path": "x"}), "must not be set with algorithm NGRAM or SUFFIX"),
    "standalone without a path": (spec_with(SGLANG, candidates=[{"name": "s", "algorithm": "STANDALONE"}]), "candidates[].path is required"),
    "the drafter's name": (
        spec_with(SGLANG, candidates=[{"name": "eagle3", "algorithm": "NGRAM"}]),
        "must not be the name of spec.drafter's candidate",
    ),
}


@pytest.mark.parametrize(("base", "candidates"), [(SGLANG, SGLANG_CANDIDATES), (VLLM, VLLM_CANDIDATES)], ids=["sglang", "vllm"])
def test_the_api_server_admits_candidates_as_the_cli_parses_them(kubectl: Any, base: dict, candidates: list) -> None:
    spec = spec_with(base, candidates=candidates, includeDrafterFree=True)
    parse_spec(spec, check_rules=True)
    name = f"candidates-{base.get('engine', 'sglang').lower()}"
    kubectl("apply", "-f", "-", input=_cr(name, spec))
    stored = json.loads(kubectl("get", "speculativeserver", name, "-o", "json").stdout)["spec"]
    assert [c["name"] for c in stored["candidates"]] == [c["name"] for c in candidates] and stored["includeDrafterFree"] is True
    assert stored["candidates"][0]["eagleTopk"] == 1  # defaulted like spec.drafter
    assert parse_spec(stored).candidates is not None
    kubectl("delete", "speculativeserver", name, "--wait=false")


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_the_api_server_refuses_a_method_the_engine_lacks_with_the_message(kubectl: Any, case: str) -> None:
    spec, needle = REFUSED[case]
    with pytest.raises(InputError, match="spec"):
        parse_spec(spec, check_rules=True)
    proc = kubectl("apply", "-f", "-", input=_cr("refused-candidate", spec), check=False)
    assert proc.returncode != 0, f"{case}: admitted"
    assert needle in proc.stderr, f"{case}: {proc.stderr}"
