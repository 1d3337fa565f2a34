"""What a platform team hits in its second week (issue 34, item 1), each through the operator's own reconcile
(tests/support/world.py): the cause named, not a silent wait."""

from __future__ import annotations

from pathlib import Path

import yaml

from specdec_operator.api import NEXTN_PATH_MESSAGE
from tests.support.world import COMPATIBLE, World, conditions, llama_spec

ROOT = Path(__file__).resolve().parents[2]


def _crd_messages() -> set[str]:
    crd = yaml.safe_load((ROOT / "crds" / "specdec.io_speculativeservers.yaml").read_text())
    found: set[str] = set()

    def walk(node):
        if isinstance(node, dict):
            for rule in node.get("x-kubernetes-validations") or []:
                found.add(rule["message"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(crd)
    return found


def test_a_nextn_drafter_with_a_path_admitted_under_an_older_crd_is_refused_in_the_admission_rules_words():
    world = World(llama_spec(**{"drafter.algorithm": "NEXTN"}))  # drafter.path stays: the older CRD let it in
    assert world.spec.drafter.path
    plan = world.step()
    assert plan.refused and not plan.apply
    assert plan.status["phase"] == "Failed" and plan.status["reason"] == "InvalidSpec", plan.status
    assert plan.status["message"] == NEXTN_PATH_MESSAGE
    assert NEXTN_PATH_MESSAGE in _crd_messages(), "the same words as admission"
    ready = conditions(plan.status)["Ready"]
    assert ready["status"] == "False" and ready["reason"] == "InvalidSpec"
    # Even where both servers were made and are Ready (admitted and served by an older operator): still refused.
    world = World(llama_spec(**{"drafter.algorithm": "NEXTN"}))
    world.spec_dict = llama_spec()
    world.step()
    world.set_pods(base={"ready": True}, speculative={"ready": True, "init": (0, COMPATIBLE)})
    world.spec_dict = llama_spec(**{"drafter.algorithm": "NEXTN"})
    world.generation = 2
    plan = world.step()
    assert plan.status["phase"] == "Failed" and plan.status["message"] == NEXTN_PATH_MESSAGE
