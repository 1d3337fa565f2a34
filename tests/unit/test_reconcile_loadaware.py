"""Load-aware speculation in the reconcile pipeline (pure): the trial after a plain probe that wins at low load and
loses at high, the adaptive server's decision, SGLang's unsupported configurations, loadAware Off, and restarts; the
same curve as vLLM's per-batch-size schedule for spec.engine vLLM."""

from __future__ import annotations

import json

from specdec_operator import manifests as m
from specdec_operator.api import LoadAwareStatus
from specdec_operator.reconcile import StartProbe
from tests.support.world import COMPATIBLE, World, conditions, llama_spec, reasons


def workload(name: str, concurrency: int, speedup: float, low: float, high: float) -> dict:
    return {"name": name, "concurrency": concurrency, "speedup": speedup, "speedupLow": low, "speedupHigh": high}


def plain_rollback(rev: str) -> dict:
    """The seed's public drafter: 1.8x at one stream, 0.4x at 128 streams."""
    return {
        "decision": "rollback",
        "reason": "SpeedupBelowThreshold",
        "message": "c128 (c=128) 0.4x [0.3, 0.5] vs min speedup 1",
        "rounds": 3,
        "speedup": 0.4,
        "acceptLength": 2.4,
        "revision": rev,
        "startedAt": "2026-12-02T09:58:00Z",
        "finishedAt": "2026-12-02T09:59:00Z",
        "workloads": [workload("c1", 1, 1.8, 1.3, 2.4), workload("c128", 128, 0.4, 0.3, 0.5)],
        "breakEven": {"concurrency": 20.0, "low": 12.4, "high": 31.0, "summary": "20 [12.4, 31]"},
    }


def adaptive_result(rev: str, high_low: float, high_high: float, status: dict) -> dict:
    """What the probe scheduler returns for the adaptive server: its measurements, tagged with the trial."""
    return {
        "decision": "rollback",  # the probe's own policy verdict; reconcile judges by never-slower instead
        "reason": "Inconclusive",
        "message": "inconclusive",
        "rounds": 6,
        "speedup": 1.0,
        "revision": rev,
        "workloads": [workload("c1", 1, 1.75, 1.3, 2.3), workload("c128", 128, (high_low + high_high) / 2, high_low, high_high)],
        "breakEven": {"summary": "none in 1-128 (faster at every measured concurrency)"},
        "loadAware": status["probe"]["loadAware"],
    }


def spec_command(world: World) -> list[str]:
    return world.template("speculative")["spec"]["containers"][0]["command"]


def to_trial(world: World):
    """Deploy, validate, probe plainly: the plain result opens the trial."""
    world.step()
    world.set_pods(base={"ready": True}, speculative={"ready": True, "init": (0, COMPATIBLE)})
    plan = world.step()
    assert isinstance(plan.probe, StartProbe) and plan.probe.probe_id == plan.revision and plan.probe.load_aware_probe is None
    world.probe_running = plan.probe.probe_id
    world.probe_running = None
    return world.step(probe_result=plain_rollback(plan.revision))


def test_a_curve_that_wins_low_and_loses_high_restarts_only_the_speculative_server_adaptive() -> None:
    world = World(llama_spec(**{"rollout.keepBaseWarm": False}))
    base_before = world.template("base") if world.deployments else None
    plan = to_trial(world)
    status = plan.status
    # Nothing decided, nothing rolled back or scaled down: the adaptive server is measured next.
    assert status["probe"]["decision"] is None if "decision" in status["probe"] else True
    assert status["phase"] == "Deploying" and "load-aware trial (drafts below batch 13)" in status["message"]
    assert "Warning" not in [e.type for e in plan.events] and "LoadAwareTrial" in reasons(plan)
    trial = status["probe"]["loadAware"]
    assert trial["reason"] == "LoadAwareTrial" and trial["noDraftFrom"] == 13  # ceil of the break-even's low end
    assert json.loads(trial["config"]) == {"1": {"candidate_steps": [3]}, "13": {"candidate_steps": [0]}}
    assert trial["plainProbe"]["decision"] == "rollback" and trial["plainProbe"]["breakEven"]["summary"] == "20 [12.4, 31]"
    # The table is a ConfigMap the speculative pod mounts; its command line turns SGLang's adaptive mode on.
    config_map = world.config_maps[m.adaptive_config_map_name("llama")]
    assert config_map["data"][m.ADAPTIVE_CONFIG_KEY] == trial["config"]
    command = spec_command(world)
    assert command[command.index("--speculative-adaptive-config") + 1] == m.ADAPTIVE_CONFIG_PATH and "--speculative-adaptive" in command
    template = world.template("speculative")
    assert {"name": m.ADAPTIVE_VOLUME, "configMap": {"name": "llama-adaptive"}} in template["spec"]["volumes"]
    assert template["metadata"]["annotations"][m.ANNOTATION_ADAPTIVE_CONFIG]
    assert world.deployments["llama-spec"]["spec"]["replicas"] == 1 and world.deployments["llama-base"]["spec"]["replicas"] == 1
    assert base_before is None or world.template("base") == base_before
    assert "--speculative-adaptive" not in world.template("base")["spec"]["containers"][0]["command"]


def ready_adaptive(world: World) -> None:
    world.set_pods(base={"ready": True}, speculative={"ready": True, "init": (0, COMPATIBLE)})


def test_the_adaptive_server_never_slower_is_promoted_load_aware() -> None:
    world = World(llama_spec())
    to_trial(world)
    ready_adaptive(world)
    plan = world.step()
    assert (
        isinstance(plan.probe, StartProbe)
        and plan.probe.load_aware_probe is not None
        and plan.probe.probe_id.startswith(f"{plan.revision}/adaptive-")
    )
    assert world.status["phase"] == "Probing" and "load-aware trial" in world.status["message"]
    world.probe_running = plan.probe.probe_id
    again = world.step()
    assert not again.starts_probe and not again.stops_probe  # the running adaptive probe is the one wanted
    world.probe_running = None
    plan = world.step(probe_result=adaptive_result(plan.revision, 0.97, 1.03, world.status))
    status = plan.status
    assert status["phase"] == "Promoted" and status["reason"] == "LoadAwareSpeedup" and status["activeVariant"] == "speculative"
    assert status["probe"]["loadAware"]["reason"] == "LoadAwareSpeedup" and status["probe"]["loadAware"]["summary"] == "drafts below batch 13"
    assert status["probe"]["breakEven"]["summary"] == "20 [12.4, 31]"  # where plain speculation stops paying
    assert status["probe"]["workloads"][1]["speedupHigh"] == 1.03  # the adaptive server's own measurements
    assert conditions(status)["SpeedupVerified"]["status"] == "True"
    assert "LoadAwareSpeedup" in reasons(plan) and "--speculative-adaptive" in spec_command(world)
    # Settled: a restarted operator reads it back and repeats nothing.
    restarted = world.step()
    assert restarted.events == [] and not restarted.starts_probe and restarted.status["phase"] == "Promoted"


def test_an_adaptive_server_still_slower_somewhere_is_rolled_back_with_no_load_with_speedup() -> None:
    world = World(llama_spec())
    to_trial(world)
    ready_adaptive(world)
    plan = world.step()
    world.probe_running = None
    plan = world.step(probe_result=adaptive_result(plan.revision, 0.80, 0.95, world.status))
    assert plan.status["phase"] == "RolledBack" and plan.status["reason"] == "NoLoadWithSpeedup"
    assert plan.status["activeVariant"] == "base" and [e.reason for e in plan.events if e.rollback] == ["NoLoadWithSpeedup"]
    assert "slower than the base at c128" in plan.status["probe"]["message"]


def test_an_operator_restart_during_the_second_probe_resumes_it_without_a_second_decision() -> None:
    world = World(llama_spec())
    first = to_trial(world)
    ready_adaptive(world)
    plan = world.step()
    world.probe_running = None  # the operator died: the stored status says a trial is under way
    restarted = world.step()
    assert (
        isinstance(restarted.probe, StartProbe) and restarted.probe.load_aware_probe is not None and restarted.probe.probe_id == plan.probe.probe_id
    )  # the adaptive probe, not the plain
    assert [e.reason for e in restarted.events] == ["ProbeStarted"]  # no decision, no second LoadAwareTrial
    assert restarted.status["probe"]["loadAware"]["plainProbe"] == first.status["probe"]["loadAware"]["plainProbe"]
    assert "decision" not in restarted.status["probe"] or restarted.status["probe"]["decision"] is None


def test_an_adaptive_server_whose_outputs_differ_from_the_base_is_rolled_back_whatever_its_speed() -> None:
    """The curve alone would promote it (never slower, faster at c1), but its greedy outputs differ: OutputMismatch
    stands (reconcile/loadaware.adaptive_verdict); never-slower judges only a probe that ended on speed."""
    world = World(llama_spec())
    to_trial(world)
    ready_adaptive(world)
    plan = world.step()
    world.probe_running = None
    mismatch = {"reason": "OutputMismatch", "message": "greedy outputs match the base's on 41% of tokens at c1 (minimum 90%)"}
    plan = world.step(probe_result=adaptive_result(plan.revision, 0.97, 1.03, world.status) | mismatch)
    status = plan.status
    assert status["phase"] == "RolledBack" and status["reason"] == "OutputMismatch" and status["activeVariant"] == "base"
    assert status["probe"]["loadAware"]["reason"] == "OutputMismatch" and "41% of tokens" in status["probe"]["message"]


def test_a_configuration_sglang_cannot_run_adaptive_keeps_the_plain_decision_and_says_why() -> None:
    world = World(llama_spec(**{"drafter.eagleTopk": 4, "drafter.numDraftTokens": 8}))
    plan = to_trial(world)
    status = plan.status
    assert status["phase"] == "RolledBack" and status["reason"] == "SpeedupBelowThreshold"
    note = LoadAwareStatus.model_validate(status["probe"]["loadAware"])
    assert note.reason == "LoadAwareUnsupported" and "speculative_eagle_topk=4 (only topk=1 is supported)" in (note.message or "")
    assert "load-aware speculation not tried: speculative_eagle_topk=4" in conditions(status)["SpeedupVerified"]["message"]
    assert "--speculative-adaptive" not in spec_command(world) and not world.config_maps


def test_load_aware_off_decides_on_the_plain_probe() -> None:
    world = World(llama_spec(**{"rollout.loadAware": "Off"}))
    plan = to_trial(world)
    assert plan.status["phase"] == "RolledBack" and plan.status["probe"].get("loadAware") is None and not world.config_maps


def test_turning_load_aware_off_restores_the_plain_speculative_server_and_its_decision() -> None:
    world = World(llama_spec())
    to_trial(world)
    ready_adaptive(world)
    plan = world.step()
    world.probe_running = None
    world.step(probe_result=adaptive_result(plan.revision, 0.97, 1.03, world.status))
    assert world.status["phase"] == "Promoted"
    world.spec_dict["rollout"]["loadAware"] = "Off"
    world.generation += 1
    off = world.step()
    assert off.status["phase"] == "RolledBack" and off.status["reason"] == "SpeedupBelowThreshold"  # the plain decision
    assert off.status["activeVariant"] == "base" and "--speculative-adaptive" in spec_command(world)  # traffic leaves it first
    off = world.step()  # the stable Service selects the base: the speculative template changes
    assert "--speculative-adaptive" not in spec_command(world)  # the plain speculative server
    assert m.ANNOTATION_ADAPTIVE_CONFIG not in world.template("speculative")["metadata"]["annotations"]
    assert off.status["activeVariant"] == "base" and not off.starts_probe
    # And back on: the plain decision asks for the trial again (an explicit edit, so new GPU time is fine).
    ready_adaptive(world)  # the plain speculative server's pods, restarted by the Off edit
    world.spec_dict["rollout"]["loadAware"] = "Auto"
    world.generation += 1
    on = world.step()
    assert on.status["phase"] == "Deploying" and "--speculative-adaptive" in spec_command(world)


def test_a_plain_win_everywhere_needs_no_trial() -> None:
    world = World(llama_spec())
    world.step()
    world.set_pods(base={"ready": True}, speculative={"ready": True, "init": (0, COMPATIBLE)})
    plan = world.step()
    result = plain_rollback(plan.revision) | {"decision": "promote", "reason": "SpeedupConfirmed", "speedup": 1.4}
    promoted = world.step(probe_result=result)
    assert promoted.status["phase"] == "Promoted" and promoted.status["probe"].get("loadAware") is None and not world.config_maps


def test_a_point_estimate_above_one_at_one_stream_is_no_win_to_try_for() -> None:
    """The seed's public drafter: 1.005x at one stream is within noise of 1, so load-aware has nothing to keep."""
    world = World(llama_spec())
    world.step()
    world.set_pods(base={"ready": True}, speculative={"ready": True, "init": (0, COMPATIBLE)})
    plan = world.step()
    result = plain_rollback(plan.revision)
    result["workloads"][0] = workload("c1", 1, 1.005, 0.96, 1.05)
    decided = world.step(probe_result=result)
    assert decided.status["phase"] == "RolledBack" and decided.status["reason"] == "SpeedupBelowThreshold" and not world.config_maps


def vllm_world() -> World:
    spec = llama_spec(engine="vLLM", image="vllm/vllm-openai:v0.32.0", **{"rollout.keepBaseWarm": False})
    spec.pop("sglang")
    spec["vllm"] = {"maxNumSeqs": 64}
    return World(spec)


def test_a_vllm_trial_runs_vllms_per_batch_size_schedule_from_the_same_curve() -> None:
    world = vllm_world()
    plan = to_trial(world)
    trial = plan.status["probe"]["loadAware"]
    assert trial["reason"] == "LoadAwareTrial" and trial["noDraftFrom"] == 13
    assert "vLLM's adaptive speculation" in trial["message"]
    # The same break-even as SGLang's table above, written as vLLM's num_speculative_tokens_per_batch_size ...
    assert json.loads(trial["config"]) == [[1, 12, 3], [13, 64, 0]]
    # ... inline in the speculative server's --speculative-config (vLLM reads no file for it).
    command = spec_command(world)
    speculative_config = json.loads(command[command.index("--speculative-config") + 1])
    assert speculative_config["num_speculative_tokens_per_batch_size"] == [[1, 12, 3], [13, 64, 0]]
    assert "--speculative-adaptive" not in command and world.template("speculative")["spec"]["containers"][0]["name"] == "vllm"
    # So there is no ConfigMap to make, mount or wait for; the template still records which table it serves.
    template = world.template("speculative")
    assert not world.config_maps and not [v for v in template["spec"]["volumes"] if v["name"] == m.ADAPTIVE_VOLUME]
    assert not [v for v in template["spec"]["containers"][0]["volumeMounts"] if v["name"] == m.ADAPTIVE_VOLUME]
    assert template["metadata"]["annotations"][m.ANNOTATION_ADAPTIVE_CONFIG]


def test_vllm_under_data_parallelism_says_why_load_aware_is_not_tried() -> None:
    world = vllm_world()
    world.spec_dict["vllm"]["extraArgs"] = ["--data-parallel-size", "2"]
    plan = to_trial(world)
    note = plan.status["probe"]["loadAware"]
    assert note["reason"] == "LoadAwareUnsupported" and "data_parallel_size > 1" in note["summary"]
    assert "vLLM's adaptive speculation does not run" in note["message"] and plan.status["phase"] == "RolledBack"
