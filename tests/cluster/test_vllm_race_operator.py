"""Issue 35 (2-3, 5): the operator races three candidates on the real engine.

`specdec run` on the local control plane decides a SpeculativeServer with candidates, and everything its decisions
rest on comes from vLLM's CPU build: tokens/s, acceptance (vLLM's spec_decode counters) and greedy outputs. The
speculative slot's Service follows the candidate in the slot (tests/support/slot_router.py re-points the operator's
--endpoints entry when the Deployment's pod template carries another candidate's revision); the base stays warm.

    base         target a                                          core 0
    eagle3       target a + its EAGLE-3 drafter (export --engine vllm)  core 1
    ngram        target a + vLLM's n-gram prompt lookup                core 1
    draft-model  target a + target b as vLLM's draft_model             core 1   (same tokenizer and size: the tier
                                                                                 has no smaller model of a's; it
                                                                                 costs a target's step per draft)

Each candidate's --speculative-config is what the operator renders for it (api.spec_for_candidate and the vLLM
engine's render_argv), its paths moved from the pod's /models mount to the tier's cached models. The servers start
once for the module, after the other real-engine module's are gone (make test runs the `realengine` tests one module
after another in one process).

This test asserts what the race does, not which candidate a loaded 2-core machine finds fastest: every candidate is
measured in the slot against the same base with its acceptance read from vLLM, the race is decided, and what is
served agrees with the table (the winner in the slot and behind the stable Service, or the base). The figures go to
docs/benchmarks/ through the RESULTS printout.
"""

from __future__ import annotations

import json
import posixpath
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from specdec_operator import manifests as m
from specdec_operator.api import spec_for_candidate
from specdec_operator.engines import engine_for
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
from tests.support.real_engine import RealEngineModels, real_engine_models
from tests.support.slot_router import SlotRouter, deployment_revisions
from tests.support.vllm_servers import VllmServer, start_servers, vllm_env

pytestmark = [pytest.mark.cluster, pytest.mark.realengine, pytest.mark.slow, pytest.mark.timeout(2400)]

SPEC_TOKENS = 3
MOUNT = "/models"
CANDIDATES = ["eagle3", "ngram", "draft-model"]
# One stream, fixed-length requests within the targets' 512 positions (as the tier's other operator tests); four rounds
# at most per candidate keep the race within a few minutes of the real-engine phase.
WORKLOADS = [{"name": "single-stream", "concurrency": 1, "inputTokens": 64, "outputTokens": 48, "requests": 8}]
RESULTS: dict[str, Any] = {}


def race_resource(name: str, namespace: str) -> dict[str, Any]:
    cr = example("llama31-8b-eagle3.yaml", name, namespace, annotations=compatible_annotations(), workloads=WORKLOADS)
    spec = cr["spec"]
    spec.pop("sglang")
    spec.update(engine="vLLM", image="vllm/vllm-openai:v0.32.0", vllm={"maxNumSeqs": 8, "servedModelName": "default"})
    spec["model"]["mountPath"] = MOUNT
    spec["target"] = {"path": "tiny/target-a", "contextLength": 512}
    spec["drafter"] = {"path": "tiny/drafter-a-vllm", "numSteps": SPEC_TOKENS}
    spec["candidates"] = [
        {"name": "ngram", "algorithm": "NGRAM", "numSteps": SPEC_TOKENS, "ngram": {"minMatch": 2, "maxMatch": 4}},
        {"name": "draft-model", "algorithm": "STANDALONE", "path": "tiny/target-b", "numSteps": SPEC_TOKENS},
    ]
    spec["rollout"].update(maxRounds=4, policy="AllWorkloads", acceptLengthFloor=1.05)
    return cr


def local_config(spec: dict[str, Any], name: str, models: RealEngineModels) -> dict[str, Any]:
    """Candidate `name`'s --speculative-config as the operator renders it, its model moved from /models to the cache."""
    candidate = spec_for_candidate(parse_spec(spec, check_rules=True), name)
    argv = engine_for(candidate).render_argv(candidate, "speculative")
    config: dict[str, Any] = json.loads(argv[argv.index("--speculative-config") + 1])
    local = {"tiny/drafter-a-vllm": models.drafter("a", "vllm"), "tiny/target-b": models.target("b")}
    if "model" in config:
        config["model"] = str(local[posixpath.relpath(config["model"], MOUNT)])
    return config


@pytest.fixture(scope="module")
def models() -> RealEngineModels:
    vllm_env("0")  # fails at once, saying how to install, before minutes of building models for nothing
    return real_engine_models()


@pytest.fixture(scope="module")
def servers(models: RealEngineModels, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, VllmServer]]:
    logs = tmp_path_factory.mktemp("vllm-race")
    spec = race_resource("race", "ns")["spec"]
    target = models.target("a")
    wanted = {"base": VllmServer("base", target, logs / "base.log", core="0")}
    for name in CANDIDATES:
        wanted[name] = VllmServer(name, target, logs / f"{name}.log", core="1", speculative=local_config(spec, name, models))
    try:
        yield {s.name: s for s in start_servers(list(wanted.values()))}
    finally:
        for server in wanted.values():
            server.stop()
        print(json.dumps({n: {"ready_s": s.ready_s} for n, s in wanted.items()}))


def test_the_operator_races_three_candidates_on_vllm_and_serves_what_its_table_says(
    operator: Operator, servers: dict[str, VllmServer], namespace: str, custom_objects: Any, core_v1: Any, apps_v1: Any, tmp_path: Path
) -> None:
    name = "race"
    cr = race_resource(name, namespace)
    operator.map(f"{name}-base", servers["base"].url)
    operator.start()
    router = SlotRouter(operator.workdir / "endpoints.yaml", namespace, deployment_revisions(apps_v1))
    router.fixed = {k: v for k, v in operator.endpoints.items()}
    revs = router.add_race(name, cr["spec"], {c: servers[c].url for c in CANDIDATES})
    router.start()
    started = time.monotonic()
    try:
        custom_objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, cr)
        st = wait_phase(custom_objects, namespace, name, {"Promoted", "RolledBack", "Invalid", "Failed"}, timeout=1500)
    finally:
        router.stop()
    elapsed = time.monotonic() - started
    race, table = st.get("race") or {}, {c["name"]: c for c in st.get("candidates") or []}
    RESULTS["race"] = {
        "apply_to_decision_s": round(elapsed, 1),
        "phase": st.get("phase"),
        "reason": st.get("reason"),
        "race": race,
        "candidates": table,
    }
    RESULTS["slot"] = [(round(t - started, 1), cand) for t, _, cand in router.switches]
    print(json.dumps(RESULTS, indent=1))
    assert st["phase"] in ("Promoted", "RolledBack"), f"{st.get('reason')}: {st.get('message')}"
    assert race["state"] == "Decided" and list(table) == CANDIDATES
    # Every candidate had its turn in the slot, in order, against the same warm base, measured on vLLM's own counters
    # (the router points at the first candidate until the operator renders another; once decided, the slot holds the
    # winner, or the best measured candidate at 0 replicas).
    assert [cand for _, cand in RESULTS["slot"]][: len(CANDIDATES) - 1] == CANDIDATES[1:], RESULTS["slot"]
    for cand in CANDIDATES:
        row = table[cand]
        assert row["revision"] == revs[cand] and row["finishedAt"], row
        assert row["state"] in ("Passed", "Serving", "Lost", "Eliminated"), row
        # A drafter that accepts nothing ends at its first measurement, before a paired round (the acceptance floor).
        assert (row["rounds"] >= 1 or row["reason"] == "DrafterNotAccepting") and row.get("gpuSeconds") is not None, row
    assert table["eagle3"]["acceptLength"] > 1.5, table["eagle3"]  # the matched drafter accepts (2.4-3.5 measured)
    assert table["draft-model"]["state"] != "Serving" or table["draft-model"]["speedup"] > 1.0
    reasons = settled_event_reasons(core_v1, namespace, name, lambda r: r.count("CandidateMeasured") >= len(CANDIDATES))
    assert reasons.count("CandidateMeasured") >= len(CANDIDATES), reasons
    # What is served is what the table says.
    slot = apps_v1.read_namespaced_deployment(m.child_name(name, "speculative"), namespace)
    winner = race.get("winner")
    if winner:
        assert st["phase"] == "Promoted" and table[winner]["state"] == "Serving"
        assert slot.spec.template.metadata.annotations[m.ANNOTATION_REVISION] == revs[winner]
        assert settled_variant(core_v1, namespace, name, "speculative") == "speculative"
    else:
        assert st["phase"] == "RolledBack" and not any(r["state"] == "Serving" for r in table.values())
        assert settled_variant(core_v1, namespace, name, "base") == "base"
