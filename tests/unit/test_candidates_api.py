"""Issue 35 (1): candidates in the spec. spec.drafter stays what it was (one candidate); spec.candidates and
spec.includeDrafterFree add more. Admission (the CRD's CEL rules, evaluated with cel-python as the API server does:
parse_spec(check_rules=True)) refuses a method the engine or the SGLang release lacks, in one line naming the field and
the fix; the resolved list goes to status.candidates; reconcile serves and probes the first candidate only."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from specdec_operator import api
from specdec_operator.api import resolve_candidates, spec_for_candidate
from specdec_operator.crd import custom_resource_definition
from specdec_operator.errors import InputError
from specdec_operator.resource import dump, parse_spec, speculative_revision
from tests.support.world import World, llama_spec

ROOT = Path(__file__).resolve().parents[2]
SGLANG = {
    "image": "lmsysorg/sglang:v0.5.23-cu130",
    "model": {"volume": {"persistentVolumeClaim": {"claimName": "weights"}}},
    "target": {"path": "llama"},
    "drafter": {"path": "eagle3/llama"},
}
VLLM = {**SGLANG, "engine": "vLLM", "image": "vllm/vllm-openai:v0.32.0"}
OLD_SGLANG = {**SGLANG, "image": "lmsysorg/sglang:v0.5.9-cu126"}


def admit(raw: dict, **changes) -> api.SpeculativeServerSpec:
    return parse_spec({**copy.deepcopy(raw), **changes}, check_rules=True)


def refusal(raw: dict, **changes) -> str:
    with pytest.raises(InputError) as err:
        admit(raw, **changes)
    message = str(err.value)
    assert "\n" not in message
    return message


def test_a_single_drafter_spec_is_one_candidate_and_its_status_and_revision_do_not_change() -> None:
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        spec = parse_spec(doc["spec"], check_rules=True)
        if "candidates" in doc["spec"] or "includeDrafterFree" in doc["spec"]:
            continue
        assert [c.name for c in resolve_candidates(spec)] == [spec.drafter.algorithm.lower()]
        assert not api.names_more_than_the_drafter(spec)  # no race: status as before
        assert "candidates" not in dump(spec) and "includeDrafterFree" not in dump(spec)
        assert set(dump(spec)["drafter"]) <= {"algorithm", "path", "numSteps", "eagleTopk", "numDraftTokens"}
    # The revision is a hash of the dump: a spec of before issue 35 keeps its revision (no new probe on upgrade).
    assert speculative_revision(parse_spec(SGLANG)) == speculative_revision(
        parse_spec({**SGLANG, "drafter": {"path": "eagle3/llama", "algorithm": "EAGLE3"}})
    )
    schema = custom_resource_definition()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert "drafter" in schema["required"] and "candidates" not in schema.get("required", [])


def test_candidates_resolve_in_order_with_the_drafter_first_and_drafter_free_methods_last() -> None:
    spec = admit(
        SGLANG,
        candidates=[
            {"name": "small", "algorithm": "STANDALONE", "path": "llama-1b", "numSteps": 4},
            {"name": "ngram", "algorithm": "DFLASH", "path": "dflash", "numSteps": 15},
        ],
        includeDrafterFree=True,
    )
    resolved = resolve_candidates(spec)
    assert [(c.name, c.drafter.algorithm, c.source) for c in resolved] == [
        ("eagle3", "EAGLE3", "spec.drafter"),
        ("small", "STANDALONE", "spec.candidates[0]"),
        ("ngram", "DFLASH", "spec.candidates[1]"),
        ("ngram-auto", "NGRAM", "spec.includeDrafterFree"),  # its own name is taken
    ]
    # A method a candidate already uses is not added again.
    again = admit(VLLM, candidates=[{"name": "lookup", "algorithm": "NGRAM", "ngram": {"minMatch": 2, "maxMatch": 4}}], includeDrafterFree=True)
    assert [c.name for c in resolve_candidates(again)] == ["eagle3", "lookup"]
    # spec_for_candidate puts a candidate in spec.drafter's place: everything else renders from the same spec.
    small = spec_for_candidate(spec, "small")
    assert small.drafter.algorithm == "STANDALONE" and small.drafter.num_steps == 4 and small.candidates is None
    assert small.target == spec.target and small.resources == spec.resources
    with pytest.raises(ValueError, match="no candidate named 'medusa'; the candidates are eagle3, small, ngram, ngram-auto"):
        spec_for_candidate(spec, "medusa")


@pytest.mark.parametrize(
    ("raw", "changes", "where", "words"),
    [
        (SGLANG, {"drafter": {"algorithm": "SUFFIX"}}, "spec.drafter.algorithm", "drafter.algorithm SUFFIX (suffix decoding) needs engine vLLM"),
        (
            SGLANG,
            {"candidates": [{"name": "sfx", "algorithm": "SUFFIX"}]},
            "spec.candidates",
            "candidates[].algorithm SUFFIX (suffix decoding) needs engine vLLM",
        ),
        (OLD_SGLANG, {"candidates": [{"name": "df", "algorithm": "DFLASH", "path": "d"}]}, "spec.candidates", "DFLASH needs SGLang 0.5.22 or later"),
        (OLD_SGLANG, {"drafter": {"algorithm": "DFLASH", "path": "d"}}, "spec.drafter.algorithm", "(SGLang 0.5.9 lacks it)"),
        (
            {**OLD_SGLANG, "image": "registry.local/inference:1", "sglangVersion": "0.5.9"},
            {"drafter": {"algorithm": "NGRAM", "ngram": {"maxTrieDepth": 8}}},
            "spec.drafter.ngram",
            "ngram.maxTrieDepth needs SGLang 0.5.22 or later",
        ),
        (SGLANG, {"drafter": {"algorithm": "NGRAM", "ngram": {"minMatch": 2}}}, "spec.drafter.ngram", "minMatch and ngram.maxMatch are vLLM's"),
        (
            VLLM,
            {"candidates": [{"name": "n", "algorithm": "NGRAM", "ngram": {"maxBfsBreadth": 4}}]},
            "spec.candidates",
            "are SGLang's: with engine vLLM",
        ),
        (VLLM, {"drafter": {"algorithm": "NGRAM", "numDraftTokens": 9}}, "spec.drafter.numDraftTokens", "vLLM verifies a chain of numSteps"),
        (
            VLLM,
            {"candidates": [{"name": "t", "algorithm": "EAGLE", "path": "e", "eagleTopk": 2, "numDraftTokens": 6}]},
            "spec.candidates",
            "eagleTopk above 1 needs engine SGLang",
        ),
        (SGLANG, {"drafter": {"algorithm": "NGRAM", "path": "x"}}, "spec.drafter.path", "must not be set with algorithm NGRAM or SUFFIX"),
        (
            SGLANG,
            {"candidates": [{"name": "s", "algorithm": "STANDALONE"}]},
            "spec.candidates[0].path",
            "candidates[].path is required for EAGLE3, EAGLE, STANDALONE and DFLASH",
        ),
        (
            SGLANG,
            {"candidates": [{"name": "d", "algorithm": "DFLASH", "path": "d", "eagleTopk": 2, "numDraftTokens": 5}]},
            "spec.candidates[0].eagleTopk",
            "needs algorithm EAGLE3, EAGLE, NEXTN or STANDALONE",
        ),
        (
            SGLANG,
            {"candidates": [{"name": "n", "algorithm": "NEXTN", "path": "mtp"}]},
            "spec.candidates[0].path",
            "candidates[].path must not be set with algorithm NEXTN",
        ),
        (SGLANG, {"drafter": {"path": "e", "ngram": {"maxTrieDepth": 4}}}, "spec.drafter.ngram", "drafter.ngram applies to algorithm NGRAM only"),
        (
            VLLM,
            {"candidates": [{"name": "x", "algorithm": "NGRAM", "suffix": {"maxTreeDepth": 4}}]},
            "spec.candidates[0].suffix",
            "suffix applies to algorithm SUFFIX only",
        ),
        (
            VLLM,
            {"drafter": {"algorithm": "NGRAM", "ngram": {"minMatch": 5, "maxMatch": 3}}},
            "spec.drafter.ngram.minMatch",
            "ngram.minMatch must be at most ngram.maxMatch",
        ),
        (
            SGLANG,
            {"candidates": [{"name": "s", "algorithm": "STANDALONE", "path": "/elsewhere/s"}]},
            "spec.candidates",
            "relative to model.mountPath",
        ),
        (SGLANG, {"candidates": [{"name": "Bad_Name", "algorithm": "NGRAM"}]}, "spec.candidates.0.name", "String should match pattern"),
        (SGLANG, {"candidates": [{"name": "a", "algorithm": "NGRAM"}, {"name": "a", "algorithm": "NGRAM"}]}, "spec.candidates", "'a' is repeated"),
        (SGLANG, {"candidates": [{"name": "eagle3", "algorithm": "NGRAM"}]}, "spec.candidates", "is spec.drafter's"),
        (SGLANG, {"candidates": [{"name": f"c{i}", "algorithm": "NGRAM"} for i in range(9)]}, "spec.candidates", "at most 8 items"),
    ],
)
def test_admission_refuses_what_the_engine_or_release_lacks_in_one_line_naming_the_field(raw, changes, where, words) -> None:
    message = refusal(raw, **changes)
    assert message.startswith(f"spec: {where}: ") and words in message, message


def test_admission_takes_every_method_each_engine_serves() -> None:
    sglang = admit(
        SGLANG,
        candidates=[
            {"name": "tree", "algorithm": "EAGLE3", "path": "eagle3/llama", "numSteps": 5, "eagleTopk": 4, "numDraftTokens": 8},
            {"name": "eagle", "algorithm": "EAGLE", "path": "eagle/llama"},
            {"name": "small", "algorithm": "STANDALONE", "path": "llama-1b", "eagleTopk": 2, "numDraftTokens": 6},
            {"name": "dflash", "algorithm": "DFLASH", "path": "dflash", "numSteps": 15},
            {"name": "ngram", "algorithm": "NGRAM", "numDraftTokens": 12, "ngram": {"maxTrieDepth": 12, "minBfsBreadth": 1, "maxBfsBreadth": 8}},
            {"name": "mtp", "algorithm": "NEXTN"},
        ],
    )
    assert [c.drafter.algorithm for c in resolve_candidates(sglang)] == ["EAGLE3", "EAGLE3", "EAGLE", "STANDALONE", "DFLASH", "NGRAM", "NEXTN"]
    vllm = admit(
        VLLM,
        candidates=[
            {"name": "small", "algorithm": "STANDALONE", "path": "llama-1b"},
            {"name": "dflash", "algorithm": "DFLASH", "path": "dflash", "numSteps": 15},
            {"name": "ngram", "algorithm": "NGRAM", "ngram": {"minMatch": 2, "maxMatch": 4}},
            {"name": "suffix", "algorithm": "SUFFIX", "numSteps": 16, "suffix": {"maxTreeDepth": 24, "maxSpecFactor": 2.0, "minTokenProb": 0.2}},
            {"name": "mtp", "algorithm": "NEXTN"},
        ],
    )
    assert len(resolve_candidates(vllm)) == 6
    # SGLang 0.5.9 serves NGRAM (without maxTrieDepth) and STANDALONE.
    admit(
        OLD_SGLANG,
        candidates=[{"name": "ngram", "algorithm": "NGRAM", "ngram": {"maxBfsBreadth": 4}}, {"name": "s", "algorithm": "STANDALONE", "path": "s"}],
    )
    # A drafter-free spec.drafter: a team with no trained drafter measures n-gram speculation alone.
    assert admit(SGLANG, drafter={"algorithm": "NGRAM"}).drafter.path is None


def test_the_crd_carries_the_rules_the_api_server_evaluates() -> None:
    crd = json.dumps(custom_resource_definition())
    for words in ("SUFFIX (suffix decoding) needs engine vLLM", "DFLASH needs SGLang 0.5.22 or later", "candidates[].path is required"):
        assert words in crd


def test_a_single_drafter_resource_writes_no_race() -> None:
    # The single-drafter resource of before writes no status.candidates or status.race (its merge patch leaves them unset).
    plain = World(llama_spec())
    status = plain.step().status
    assert status["candidates"] is None and status["race"] is None
