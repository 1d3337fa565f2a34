"""Prompt datasets from ConfigMaps, end to end: the real `specdec run` process on the local control plane reads a
workload's ConfigMap through the API server when its probe starts (docs/probe.md, "Prompts").

A bad dataset (a malformed line, a missing key) ends with DatasetInvalid, a condition message naming the ConfigMap,
the key and the line, and no request sent to either server; a good one is what the probe sends (status.probe.traffic
names it, and no SyntheticTraffic warning is given).

The greedy output check through the operator: a fast speculative server that corrupts a share of its tokens
(the profile's ``errors.corrupt_token_share``) is rolled back with OutputMismatch, a correct one is promoted on its
speed with outputMatchRate 1.0. And the prompts decide: a drafter whose acceptance depends on the prompt kind
(the profile's ``accept_length_by_kind``, simulator/promptkind.py) is promoted on random ids and rolled back on the
user's code prompts from a ConfigMap, and the reverse drafter the other way round.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from specdec_operator.simulator import Profile, profile_from_dict
from tests.support.kube import wait_until
from tests.support.operator_process import (
    GROUP,
    PLURAL,
    VERSION,
    Operator,
    compatible_annotations,
    event_reasons,
    example,
    settled_variant,
    wait_phase,
)

pytestmark = pytest.mark.cluster

DECIDED = {"Promoted", "RolledBack", "Invalid", "Failed"}


def dataset_workload(config_map: str, key: str) -> list[dict[str, Any]]:
    return [
        {
            "name": "team-chat",
            "concurrency": 4,
            "requests": 8,
            "inputTokens": 128,
            "outputTokens": 48,
            "prompts": {"source": "ConfigMap", "configMap": {"name": config_map, "key": key}, "format": "Chat", "outputLength": "Fixed"},
        }
    ]


def chat_lines(n: int) -> str:
    return "".join(
        json.dumps({"messages": [{"role": "user", "content": f"Write a Python function number {i} that sorts a list."}]}) + "\n" for i in range(n)
    )


def test_config_map_datasets_bad_line_and_missing_key_are_refused_before_any_request_and_a_good_one_is_sent(
    operator: Operator, sims: Any, namespace: str, custom_objects: Any, core_v1: Any
) -> None:
    servers = {}
    for name in ("bad-line", "no-key", "good"):
        servers[name] = (sims.start("llama31-8b-base"), sims.start("llama31-8b-eagle3"))
        operator.map(f"{name}-base", servers[name][0].url)
        operator.map(f"{name}-spec", servers[name][1].url)
    operator.start()
    good = chat_lines(12)
    core_v1.create_namespaced_config_map(
        namespace,
        {"metadata": {"name": "team-prompts"}, "data": {"good.jsonl": good, "bad.jsonl": chat_lines(1) + '{"messages": "not a list"}\n'}},
    )
    for name, key in (("bad-line", "bad.jsonl"), ("no-key", "absent.jsonl"), ("good", "good.jsonl")):
        cr = example("llama31-8b-eagle3.yaml", name, namespace, annotations=compatible_annotations(), workloads=dataset_workload("team-prompts", key))
        cr["spec"]["rollout"]["outputCheck"] = {"enabled": False}
        custom_objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, cr)

    for name, expected in (("bad-line", ["team-prompts", "bad.jsonl", "line 2"]), ("no-key", ["team-prompts", "absent.jsonl", "good.jsonl"])):
        st = wait_phase(custom_objects, namespace, name, DECIDED, timeout=120)
        assert st["phase"] == "RolledBack" and st["probe"]["reason"] == "DatasetInvalid", st.get("message")
        assert st["activeVariant"] == "base" and st["probe"]["rounds"] == 0
        message = {c["type"]: c for c in st["conditions"]}["SpeedupVerified"]["message"]
        assert all(part in message for part in expected), message
        assert "\n" not in message and "Traceback" not in message
        base, spec = servers[name]
        # Nothing was sent: the dataset is read and parsed before the first request (the probe's readiness checks
        # are GETs, never counted as requests).
        assert base.sim.engine.requests_total == 0 and spec.sim.engine.requests_total == 0

    st = wait_phase(custom_objects, namespace, "good", DECIDED, timeout=180)
    assert st["probe"]["reason"] != "DatasetInvalid", st.get("message")
    assert "team-prompts" in (st["probe"].get("traffic") or ""), st["probe"]
    assert not st["probe"].get("syntheticTraffic")
    base, spec = servers["good"]
    assert base.sim.engine.requests_total > 0 and spec.sim.engine.requests_total > 0
    reasons = [e.reason for e in core_v1.list_namespaced_event(namespace).items if e.involved_object.name == "good"]
    assert "SyntheticTraffic" not in reasons


# Simulated servers for the output check and the reversal: a base and speculative profiles whose speed is set by
# the acceptance length (step 14 ms against the base's 10 ms: 1.4 tokens per step break even). Small workloads at
# time scale 5 keep each probe to seconds.
TIME_SCALE = 5.0


def small_profile(name: str, accept: float | None = None, by_kind: dict[str, float] | None = None, **errors: float) -> Profile:
    speculative = None
    if accept is not None:
        speculative = {"algorithm": "EAGLE3", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4, "accept_length_mean": accept}
        if by_kind:
            speculative["accept_length_by_kind"] = by_kind
    return profile_from_dict(
        {
            "name": name,
            "load_seconds": 0,
            "max_running_requests": 64,
            "prefill_tokens_per_s": 200000,
            "step_ms": [[1, 10.0], [16, 20.0]] if accept is None else [[1, 14.0], [16, 28.0]],
            "speculative": speculative,
            "jitter": 0.01,
            "errors": errors,
            "stream_interval": 8,
        }
    )


def small_workload(prompts: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"name": "w", "concurrency": 2, "requests": 4, "inputTokens": 32, "outputTokens": 64, "prompts": prompts}]


def start_pair(operator: Operator, sims: Any, name: str, speculative: Profile) -> tuple[Any, Any]:
    base = sims.start(small_profile("base"), time_scale=TIME_SCALE, seed=1)
    spec = sims.start(speculative, time_scale=TIME_SCALE, seed=2)
    operator.map(f"{name}-base", base.url)
    operator.map(f"{name}-spec", spec.url)
    return base, spec


def server(name: str, namespace: str, workloads: list[dict[str, Any]], output_check: dict[str, Any]) -> dict[str, Any]:
    # Blackwell nodes (the example asks for Hopper, of which the test cluster has one 8-GPU node): room for all pairs.
    cr = example("llama31-8b-eagle3.yaml", name, namespace, annotations=compatible_annotations(), workloads=workloads)
    cr["spec"]["resources"]["gpuFamily"] = "blackwell"
    cr["spec"]["rollout"]["policy"] = "AllWorkloads"
    cr["spec"]["rollout"]["outputCheck"] = output_check
    cr["spec"]["monitor"] = {"enabled": False}  # the subject is the probe's decision, not what follows it
    return cr


def test_a_fast_server_with_corrupted_tokens_is_rolled_back_with_output_mismatch_and_a_correct_one_is_promoted(
    operator: Operator, sims: Any, namespace: str, custom_objects: Any, core_v1: Any
) -> None:
    start_pair(operator, sims, "corrupt", small_profile("corrupt", 3.0, corrupt_token_share=0.05))
    start_pair(operator, sims, "correct", small_profile("correct", 3.0))
    # The speed is scripted (both 3x: a decision that must not depend on the machine's speed), the outputs are the
    # simulators' own, compared for real (checkOutputs): the check, not the speed, decides between the two.
    for name in ("corrupt", "correct"):
        operator.script(name, speedup=3.0, acceptLength=2.5, checkOutputs=True)
    operator.start()
    check = {"enabled": True, "prompts": 8, "maxTokens": 64, "minMatchRate": 0.9}
    for name in ("corrupt", "correct"):
        custom_objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, server(name, namespace, small_workload({}), check))

    st = wait_phase(custom_objects, namespace, "corrupt", DECIDED, timeout=180)
    probe = st["probe"]
    assert st["phase"] == "RolledBack" and st["reason"] == "OutputMismatch" and probe["reason"] == "OutputMismatch", st.get("message")
    assert probe["outputsCompared"] == 8 and probe["outputMatchRate"] < 0.9, probe
    # Its speed alone would have promoted it: the check, not the speed, rolled it back.
    assert "would have promoted" in probe["message"] and probe["workloads"][0]["speedupLow"] > 1.0, probe
    assert st["activeVariant"] == "base" and settled_variant(core_v1, namespace, "corrupt", "base") == "base"
    conditions = {c["type"]: c for c in st["conditions"]}
    assert conditions["SpeedupVerified"]["status"] == "False" and conditions["SpeedupVerified"]["reason"] == "OutputMismatch"
    wait_until(lambda: "OutputMismatch" in event_reasons(core_v1, namespace, "corrupt"), timeout=20, message="the OutputMismatch Event")

    st = wait_phase(custom_objects, namespace, "correct", DECIDED, timeout=180)
    probe = st["probe"]
    assert st["phase"] == "Promoted" and probe["reason"] == "SpeedupConfirmed", st.get("message")
    assert probe["outputMatchRate"] == 1.0 and probe["outputsCompared"] == 8, probe
    assert st["activeVariant"] == "speculative" and settled_variant(core_v1, namespace, "correct", "speculative") == "speculative"
    assert "OutputMismatch" not in event_reasons(core_v1, namespace, "correct")


def code_lines(n: int) -> str:
    # Code prompts by simulator/promptkind.py's rule ("Python", "def "): the kind the drafters below disagree on.
    return "".join(json.dumps({"prompt": f"Write a Python function number {i}: def sort_{i}(items)"}) + "\n" for i in range(n))


def test_random_ids_and_the_users_code_dataset_reach_the_servers_and_reverse_the_drafters_acceptance_both_ways(
    operator: Operator, sims: Any, namespace: str, custom_objects: Any, core_v1: Any
) -> None:
    # What the operator's probe sends (random ids, or a ConfigMap's code prompts through the generate and the chat
    # endpoints) and what it measures of the drafter on them: the acceptance, counted from the streamed tokens, which
    # no busy machine changes. One round each, whatever it decides (one round never promotes): the decision a reversed
    # acceptance leads to is tests/unit/test_datasets.py's, on recorded rounds, and what the operator does with a
    # decision is the scripted tests'.
    random_lover = small_profile("random-lover", 2.0, {"random": 3.5, "code": 1.2})
    code_lover = small_profile("code-lover", 2.0, {"random": 1.2, "code": 3.5})
    dataset = {"source": "ConfigMap", "configMap": {"name": "team-code", "key": "code.jsonl"}, "format": "Prompt", "outputLength": "Fixed"}
    cases = {
        # name: (drafter, prompts)
        "rl-random": (random_lover, {"source": "Random"}),
        "rl-code": (random_lover, {**dataset, "endpoint": "Generate"}),
        "cl-random": (code_lover, {"source": "Random"}),
        "cl-code": (code_lover, {**dataset, "endpoint": "Chat"}),
    }
    servers = {name: start_pair(operator, sims, name, drafter) for name, (drafter, _) in cases.items()}
    operator.start()
    core_v1.create_namespaced_config_map(namespace, {"metadata": {"name": "team-code"}, "data": {"code.jsonl": code_lines(16)}})
    for name, (_, prompts) in cases.items():
        cr = server(name, namespace, small_workload(prompts), {"enabled": False})
        cr["spec"]["rollout"]["maxRounds"] = 1
        custom_objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, cr)

    for name, (_, prompts) in cases.items():
        st = wait_phase(custom_objects, namespace, name, DECIDED, timeout=240)
        probe = st["probe"]
        assert st["phase"] == "RolledBack" and probe["rounds"] == 1, (name, st.get("message"))
        assert probe["reason"] in ("SpeedupBelowThreshold", "Inconclusive"), (name, probe["message"])
        # The acceptance the probe measured is the drafter's on that kind of prompt.
        kind = "random" if prompts["source"] == "Random" else "code"
        drafter = cases[name][0].speculative
        assert drafter is not None
        assert abs(probe["acceptLength"] - drafter.accept_length_for(kind)) < 0.3, (name, probe["acceptLength"])
        synthetic = prompts["source"] == "Random"
        assert bool(probe.get("syntheticTraffic")) == synthetic, (name, probe)
        assert ("team-code" in (probe.get("traffic") or "")) != synthetic, (name, probe.get("traffic"))
        _, spec = servers[name]
        assert spec.sim.engine.requests_total > 0
    # The Events are posted after the status is written: wait for the random-ids ones, then the datasets' have none.
    for name in ("rl-random", "cl-random"):
        wait_until(lambda: "SyntheticTraffic" in event_reasons(core_v1, namespace, name), timeout=20, message=f"{name}'s SyntheticTraffic Event")
    for name in ("rl-code", "cl-code"):
        assert "SyntheticTraffic" not in event_reasons(core_v1, namespace, name), name
