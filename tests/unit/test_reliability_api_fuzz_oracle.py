"""The API fuzz's generator and oracle, checked without a cluster: the fuzz (tests/cluster/test_reliability_api_fuzz.py)
is only as good as these."""

from __future__ import annotations

import json
from collections import Counter

from hypothesis import HealthCheck, given, settings

from tests.support.api_fuzz import (
    SPEC_SCHEMA,
    mutated_specs,
    names_a_field,
    oracle,
    pruned,
)

# --------------------------------------------------------------------------------------------------
# Pure checks of the generator and the oracle (no cluster): the fuzz is only as good as these.


def test_generator_produces_both_kinds_and_every_mutation():
    seen, verdicts = Counter(), Counter()

    @settings(
        max_examples=300,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
    )
    @given(mutated_specs())
    def sample(case):
        spec, done = case
        json.dumps(spec, allow_nan=False)  # every generated object is sendable JSON
        seen.update(d.split("@")[0] for d in done)
        verdicts[oracle(spec).valid] += 1

    sample()
    assert verdicts[True] >= 30 and verdicts[False] >= 30, verdicts
    assert {"wrong-type", "out-of-range", "delete", "unknown", "null", "absurd", "long-string", "unicode"} <= set(seen), seen


def test_pruning_keeps_free_form_objects_and_drops_unknown_fields():
    spec = {
        "image": "i",
        "extra": 1,
        "model": {"volume": {"hostPath": {"path": "/m", "zzz": 1}}, "bogus": 2},
        "target": {"path": "t"},
        "tolerations": [{"key": "k", "whatever": 1}],
    }
    out = pruned(spec, SPEC_SCHEMA)
    assert "extra" not in out and "bogus" not in out["model"]
    assert out["model"]["volume"]["hostPath"]["zzz"] == 1 and out["tolerations"][0]["whatever"] == 1


def test_field_matching():
    assert names_a_field(["spec.drafter.numSteps"], "", ["spec.drafter.numSteps"])
    assert names_a_field([], 'strict decoding error: unknown field "spec.rollout.workloads[0].foo"', ["spec.rollout.workloads.0.foo"])
    assert not names_a_field(["spec.image"], "", ["spec.drafter.numSteps"])
    assert not names_a_field([], "Internal error occurred", ["spec.drafter"])
