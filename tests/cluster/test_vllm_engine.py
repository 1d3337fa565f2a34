"""The real engine: vLLM's CPU build serving a tiny Llama target with EAGLE-3 drafters made by `specdec-train`
(issue 26), and the operator deciding on it.

Nothing here is simulated: the drafters are trained by the pipeline (tests/support/real_engine.py, cached per machine),
the servers are `python -m vllm.entrypoints.openai.api_server` on 127.0.0.1 (tests/support/vllm_servers.py), the
acceptance is read from vLLM's own /metrics counters and the outputs are vLLM's greedy completions.

The servers start once for this module (each costs from half a minute on an idle machine to several minutes on a
loaded one), so the tests that need no control plane live here beside the operator's, sharing them; the module is
marked `cluster` for the operator's tests and `realengine` for all (make test runs them; make test-unit does not).

    base           target a, no drafter                                        core 0
    matched        target a + its drafter exported --engine vllm               core 1
    other-engine   target a + the same drafter exported --engine sglang        core 0   (aux layer ids one too low)
    other-target   target a + the drafter trained for target b (--engine vllm) core 1
    speculators    target a + target a's drafter exported --engine vllm        core 0
                   --format speculators (made here from the cached training run: seconds)
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.operator_process import GROUP, PLURAL, VERSION, Operator, compatible_annotations, example, settled_variant, status, wait_phase
from tests.support.real_engine import BUILD, TRAIN, RealEngineModels, real_engine_models
from tests.support.vllm_servers import VllmServer, greedy_completion, served_acceptance, start_servers, vllm_env

# The timeout covers the module's set-up in its first test: the drafter build (once per machine) and the servers' start.
pytestmark = [pytest.mark.cluster, pytest.mark.realengine, pytest.mark.slow, pytest.mark.timeout(2400)]

SPEC_TOKENS = 3
RESULTS: dict[str, Any] = {}


@pytest.fixture(scope="module")
def models() -> RealEngineModels:
    vllm_env("0")  # fails at once, saying how to install, before minutes of building models for nothing
    return real_engine_models()


@pytest.fixture(scope="module")
def servers(models: RealEngineModels, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, VllmServer]]:
    logs = tmp_path_factory.mktemp("vllm")
    target = models.target("a")
    speculators = logs / "drafter-a-speculators"
    export = ["export", "--run", str(models.run("a")), "--target", str(target), "--out", str(speculators), "--engine", "vllm"]
    export += ["--format", "speculators", "--speculative-tokens", str(SPEC_TOKENS)]
    subprocess.run(TRAIN + export, check=True, capture_output=True, text=True)
    wanted = {
        "base": VllmServer("base", target, logs / "base.log", core="0"),
        "matched": VllmServer("matched", target, logs / "matched.log", drafter=models.drafter("a", "vllm"), core="1"),
        "other-engine": VllmServer("other-engine", target, logs / "other-engine.log", drafter=models.drafter("a", "sglang"), core="0"),
        "other-target": VllmServer("other-target", target, logs / "other-target.log", drafter=models.drafter("b", "vllm"), core="1"),
        "speculators": VllmServer("speculators", target, logs / "speculators.log", drafter=speculators, core="0"),
    }
    for server in wanted.values():
        server.num_speculative_tokens = SPEC_TOKENS
    try:
        yield {s.name: s for s in start_servers(list(wanted.values()))}
    finally:
        for server in wanted.values():
            server.stop()
        print(json.dumps({n: {"ready_s": s.ready_s} for n, s in wanted.items()}))


@pytest.fixture(scope="module")
def served(models: RealEngineModels, servers: dict[str, VllmServer]) -> dict[str, dict[str, Any]]:
    """Every server's greedy completions of the held-out prompts, and what its counters moved by meanwhile."""
    prompts = models.heldout_prompt_ids()
    return {name: served_acceptance(server.url, prompts, BUILD["max_new_tokens"]) for name, server in servers.items()}


def test_vllm_counts_what_it_drafted_and_accepted(served: dict[str, dict[str, Any]]) -> None:
    base = served["base"]
    assert base["drafts"] == 0 and base["acceptance_length"] is None, "the server without a drafter drafted"
    for name in ("matched", "other-engine", "other-target", "speculators"):
        s = served[name]
        assert s["drafts"] > 0, f"{name}: vLLM counted no drafts"
        assert s["draft_tokens"] == SPEC_TOKENS * s["drafts"], f"{name}: {s['counters']}"
        assert len(s["acceptance_rate_per_position"]) == SPEC_TOKENS, f"{name}: {s['counters']}"
        per_pos = [rate * s["drafts"] for rate in s["acceptance_rate_per_position"]]
        assert sum(per_pos) == pytest.approx(s["accepted_tokens"]), f"{name}: per-position counts do not add up: {s['counters']}"
        # A token at position i+1 is accepted only after position i was.
        assert all(a >= b for a, b in itertools.pairwise(per_pos)), f"{name}: {per_pos}"


def test_the_matched_drafter_accepts_more_than_the_other_engines_ids_and_another_targets_drafter(served: dict[str, dict[str, Any]]) -> None:
    length = {name: served[name]["acceptance_length"] for name in ("matched", "other-engine", "other-target")}
    RESULTS["served"] = {n: {k: v for k, v in served[n].items() if k not in ("texts", "counters")} for n in served}
    assert length["matched"] >= 2.5, f"the matched drafter barely accepts: {length}"
    # Measured 3.46 against 2.98 (these targets' next token depends mostly on the current one, so the high layer
    # matters less than it may on a real model; the run in issue 26 measured 2.71 against 2.15).
    assert length["matched"] >= length["other-engine"] + 0.25, f"ids one layer too early accepted as much: {length}"
    assert length["matched"] >= length["other-target"] + 0.5, f"another target's drafter accepted as much: {length}"


def test_a_speculators_export_is_served_by_vllm_as_the_plain_export_is(served: dict[str, dict[str, Any]]) -> None:
    """The same weights and layer ids in the speculators format (Eagle3Speculator, transformer_layer_config,
    speculators_config): vLLM loads it through its own speculators path and accepts what the plain export accepts."""
    plain, speculators = served["matched"], served["speculators"]
    assert speculators["drafts"] > 0, "vLLM loaded the speculators export but drafted nothing"
    assert speculators["acceptance_length"] == pytest.approx(plain["acceptance_length"], abs=0.1), (speculators, plain)
    for position, (a, b) in enumerate(zip(speculators["acceptance_rate_per_position"], plain["acceptance_rate_per_position"])):
        assert a == pytest.approx(b, abs=0.1), f"position {position}: speculators {a:.3f}, plain {b:.3f}"


def test_speculative_greedy_completions_equal_the_base_servers(served: dict[str, dict[str, Any]]) -> None:
    """Greedy verification keeps the target's output whatever the drafter proposes: the texts are vLLM's own."""
    base = served["base"]["texts"]
    assert len(set(base)) > 1, f"the target says the same thing to every prompt: {base[:2]}"
    for name in ("matched", "other-engine", "other-target", "speculators"):
        differing = [i for i, (a, b) in enumerate(zip(base, served[name]["texts"])) if a != b]
        assert not differing, (
            f"{name}: greedy completions differ from the base server's on prompts {differing}: {base[differing[0]]!r} vs {served[name]['texts'][differing[0]]!r}"
        )


# ---------------------------------------------------------------------------------------------------------
# The operator on the real engine: `specdec run` against the local control plane, its probe and monitor reaching the
# vLLM servers above through --endpoints (as an operator outside a cluster reaches Services). The pods are kwok pods
# (nothing runs in them; the validator's verdict is scripted, tests/support/operator_process.py); everything the
# decision rests on, tokens/s, acceptance and greedy outputs, comes from vLLM.

# Short, fixed-length requests (ignore_eos) within the targets' 512 positions, one stream: each server has one core,
# and four streams at once on it measured 1.18x [0.56, 2.49] after 6 rounds where one stream measured 1.55x [1.02, 2.35]
# (the machine shared with other work); 16 requests a round narrowed the interval (1.31x [1.03, 1.66] after 3 rounds,
# where 8 once ended Inconclusive at 1.27x [0.67, 2.39] after 9).
WORKLOADS = [{"name": "single-stream", "concurrency": 1, "inputTokens": 64, "outputTokens": 48, "requests": 16}]
DECIDED = {"Promoted", "RolledBack", "Invalid", "Failed"}


def vllm_resource(name: str, namespace: str) -> dict[str, Any]:
    cr = example("llama31-8b-eagle3.yaml", name, namespace, annotations=compatible_annotations(), workloads=WORKLOADS)
    spec = cr["spec"]
    spec.pop("sglang")
    spec.update(engine="vLLM", image="vllm/vllm-openai:v0.32.0", vllm={"maxNumSeqs": 8, "servedModelName": "default"})
    spec["target"] = {"path": "tiny/target-a", "contextLength": 512}
    spec["drafter"] = {"path": "tiny/drafter-a-vllm", "numSteps": SPEC_TOKENS, "eagleTopk": 1}
    spec["monitor"] = {"interval": 5, "window": 2, "acceptLengthFloor": 1.5}
    # The probe rejects at once below this acceptance length (read from vLLM's counters after the first round): on
    # the probe's random prompts the matched drafter accepted 2.65, the other engine's layer ids 2.44, another
    # target's drafter 1.03.
    spec["rollout"].update(acceptLengthFloor=2.0, maxRounds=10, policy="AllWorkloads")
    return cr


def decide(operator: Operator, custom_objects: Any, namespace: str, name: str, base: VllmServer, speculative: VllmServer) -> dict[str, Any]:
    operator.map(f"{name}-base", base.url)
    operator.map(f"{name}-spec", speculative.url)
    operator.start()
    started = time.monotonic()
    custom_objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, vllm_resource(name, namespace))
    st = wait_phase(custom_objects, namespace, name, DECIDED, timeout=600)
    probe = st.get("probe") or {}
    RESULTS.setdefault("operator", {})[f"{base.name} vs {speculative.name}"] = {
        "apply_to_decision_s": round(time.monotonic() - started, 1),
        "phase": st.get("phase"),
        "reason": st.get("reason"),
        "probe": probe,
    }
    return st


def test_the_operator_promotes_the_matched_drafter_on_real_speedup(
    operator: Operator, servers: dict[str, VllmServer], models: RealEngineModels, namespace: str, custom_objects: Any, core_v1: Any
) -> None:
    st = decide(operator, custom_objects, namespace, "matched", servers["base"], servers["matched"])
    assert st["phase"] == "Promoted", f"{st.get('reason')}: {st.get('message')}"
    assert st["activeVariant"] == "speculative" and settled_variant(core_v1, namespace, "matched", "speculative") == "speculative"
    assert st["probe"]["acceptLength"] > 1.5 and st["speedup"] > 1.0, st["probe"]

    # The monitor on the promoted server: production traffic (greedy completions of the held-out prompts) moves vLLM's
    # spec_decode counters, and the monitor's window over them is the acceptance it reports, above the floor (1.5).
    stop = threading.Event()

    def traffic() -> None:
        for prompt in itertools.cycle(models.heldout_prompt_ids()):
            if stop.is_set():
                return
            greedy_completion(servers["matched"].url, prompt, BUILD["max_new_tokens"])

    sender = threading.Thread(target=traffic, daemon=True)
    sender.start()
    try:
        deadline = time.monotonic() + 120
        while not ((st := status(custom_objects, namespace, "matched")).get("monitor") or {}).get("acceptLength"):
            assert time.monotonic() < deadline, f"the monitor reported no acceptance from vLLM's counters: {st.get('monitor')}"
            time.sleep(1)
    finally:
        stop.set()
        sender.join(timeout=120)
    monitor = st["monitor"]
    RESULTS.setdefault("operator", {})["monitor on the promoted matched drafter"] = monitor
    assert st["phase"] == "Promoted" and monitor["acceptLength"] > 2.0, monitor
    assert len(monitor["acceptRateByPosition"]) == SPEC_TOKENS and monitor["acceptRateByPosition"][0] > 0.5, monitor


def test_the_operator_rolls_back_another_targets_drafter(
    operator: Operator, servers: dict[str, VllmServer], namespace: str, custom_objects: Any, core_v1: Any
) -> None:
    st = decide(operator, custom_objects, namespace, "other-target", servers["base"], servers["other-target"])
    assert st["phase"] == "RolledBack", f"{st.get('phase')} {st.get('reason')}: {st.get('message')}"
    assert st["activeVariant"] == "base" and settled_variant(core_v1, namespace, "other-target", "base") == "base"
    assert st["reason"] in ("DrafterNotAccepting", "SpeedupBelowThreshold"), st.get("message")


def test_the_operator_never_promotes_the_same_engine_twice(
    operator: Operator, servers: dict[str, VllmServer], namespace: str, custom_objects: Any, core_v1: Any
) -> None:
    """Base against base (one server measured as both variants): real noise only, which must never promote."""
    st = decide(operator, custom_objects, namespace, "base-twice", servers["base"], servers["base"])
    assert st["phase"] != "Promoted", st.get("message")
    assert st["activeVariant"] == "base" and settled_variant(core_v1, namespace, "base-twice", "base") == "base"


@pytest.fixture(scope="module", autouse=True)
def _write_results() -> Iterator[None]:
    """SPECDEC_REAL_ENGINE_RESULTS=FILE: what this module measured, for benchmarks/vllm_cpu_acceptance.py --decisions."""
    yield
    if RESULTS:
        print(json.dumps(RESULTS, indent=1))
        if out := os.environ.get("SPECDEC_REAL_ENGINE_RESULTS"):
            Path(out).write_text(json.dumps(RESULTS, indent=1) + "\n")
