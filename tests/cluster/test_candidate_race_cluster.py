"""Issue 35 (2-3): a race of three candidates end to end on the real control plane: `specdec run` against the local
kube-apiserver, kwok pods for the servers (the validator's verdict scripted by their annotations), each candidate in
turn in the one speculative slot, and the winner served. The decisions rest on scripted rounds per candidate
(probe/scripted.py, an `arms` entry named after each candidate): this test is about what the operator does with a race,
not about measuring (tests/unit/test_probe*.py and the `timing` tests measure)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from specdec_operator import manifests as m
from specdec_operator.reconcile.candidate_race import revisions
from specdec_operator.resource import parse_spec
from tests.support.operator_process import (
    GROUP,
    PLURAL,
    VERSION,
    Operator,
    compatible_annotations,
    example,
    settled_event_reasons,
    settled_variant,
    wait_phase,
)

pytestmark = pytest.mark.cluster

CANDIDATES = [
    {"name": "ngram", "algorithm": "NGRAM", "numDraftTokens": 10},
    {"name": "small", "algorithm": "STANDALONE", "path": "llama-3.2-1b", "numSteps": 4},
]
# eagle3 passes, ngram passes faster (the winner though it is not first), small is slower than the base.
SCRIPT = {
    "eagle3": {"speedup": {"chat": 1.7, "batch-32": 1.4}, "acceptLength": 2.8},
    "ngram": {"speedup": {"chat": 2.6, "batch-32": 2.2}, "acceptLength": 3.4},
    "small": {"speedup": 0.8, "acceptLength": 1.9},
}


def test_a_race_of_three_candidates_serves_the_fastest_one(
    operator: Operator, namespace: str, custom_objects: Any, core_v1: Any, apps_v1: Any
) -> None:
    name = "race"
    operator.script(name, speedup=1.0, arms=SCRIPT)  # every candidate has its own entry: the entry's own speed is unused
    operator.start()
    cr = example("llama31-8b-eagle3.yaml", name, namespace, annotations=compatible_annotations())
    cr["spec"]["candidates"] = CANDIDATES
    revs = revisions(parse_spec(cr["spec"]))
    started = time.monotonic()
    custom_objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, cr)
    st = wait_phase(custom_objects, namespace, name, {"Promoted", "RolledBack", "Invalid", "Failed"}, timeout=240)
    elapsed = time.monotonic() - started
    assert st["phase"] == "Promoted", f"{st.get('reason')}: {st.get('message')}"
    race = st["race"]
    assert race["state"] == "Decided" and race["winner"] == "ngram", race
    states = {c["name"]: c for c in st["candidates"]}
    assert states["eagle3"]["state"] == "Passed" and states["ngram"]["state"] == "Serving"
    # small is slower than the base: lost for speed, or stopped early below ngram's interval (it was measured last).
    assert states["small"]["state"] in ("Lost", "Eliminated") and states["small"]["reason"] in ("SpeedupBelowThreshold", "CannotWin")
    assert all(states[c]["revision"] == revs[c] and states[c]["rounds"] >= 1 for c in revs)
    assert race["gpuSeconds"] == pytest.approx(sum(states[c]["gpuSeconds"] for c in revs), rel=1e-3)
    assert st["probe"]["revision"] == revs["ngram"] and st["probe"]["message"].startswith("race of 3 candidates: ngram wins")
    # One speculative slot, now running the winner; the stable Service selects it.
    deployment = apps_v1.read_namespaced_deployment(m.child_name(name, "speculative"), namespace)
    assert deployment.spec.template.metadata.annotations[m.ANNOTATION_REVISION] == revs["ngram"]
    assert sorted(d.metadata.name for d in apps_v1.list_namespaced_deployment(namespace).items) == [f"{name}-base", f"{name}-spec"]
    assert settled_variant(core_v1, namespace, name, "speculative") == "speculative"
    reasons = settled_event_reasons(core_v1, namespace, name, lambda r: r.count("CandidateMeasured") >= 3 and "RaceWon" in r)
    assert reasons.count("CandidateMeasured") == 3 and "RaceWon" in reasons, reasons
    print(f"race of 3 candidates: apply -> promoted {elapsed:.1f} s")
