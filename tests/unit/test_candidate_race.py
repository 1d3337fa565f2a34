"""The race of candidates inside the operator (issue 35, items 2-3): reconcile/candidate_race.py, step by step through
reconcile() on the in-memory World, with each candidate's probe result scripted (the decision, not a timing)."""

from __future__ import annotations

import json
from datetime import timedelta

from specdec_operator import manifests as m
from specdec_operator.api import spec_for_candidate
from specdec_operator.engines import engine_for
from specdec_operator.monitor import Sample
from specdec_operator.reconcile import Settings, StartProbe
from specdec_operator.reconcile.candidate_race import race_confidence, revisions
from specdec_operator.reconcile.status import STATUS_BYTES_BUDGET
from specdec_operator.resource import speculative_revision
from tests.support.world import COMPATIBLE, INCOMPATIBLE, NOW, World, llama_spec, reasons

CANDIDATES = [
    {"name": "ngram", "algorithm": "NGRAM", "numDraftTokens": 10},
    {"name": "small", "algorithm": "STANDALONE", "path": "llama-3.2-1b"},
]


def race_world(**changes) -> World:
    raw = llama_spec(**changes)
    raw["candidates"] = [dict(c) for c in CANDIDATES]
    return World(raw)


def result(rev: str, decision: str, reason: str, speedup: float, low: float, high: float, gpu_seconds: float = 120.0) -> dict:
    return {
        "decision": decision,
        "reason": reason,
        "message": f"{reason}: chat {speedup}x [{low}, {high}]",
        "rounds": 3,
        "speedup": speedup,
        "acceptLength": 2.5,
        "revision": rev,
        "startedAt": "2026-12-02T09:59:00Z",
        "finishedAt": "2026-12-02T10:00:00Z",
        "gpuSeconds": gpu_seconds,
        "workloads": [
            {"name": "chat", "concurrency": 1, "speedup": speedup, "speedupLow": low, "speedupHigh": high},
            {"name": "batch", "concurrency": 32, "speedup": speedup + 0.1, "speedupLow": low + 0.1, "speedupHigh": high + 0.1},
        ],
    }


def passed(rev: str, speedup: float, low: float, high: float, **kw) -> dict:
    return result(rev, "promote", "SpeedupConfirmed", speedup, low, high, **kw)


def lost(rev: str, reason: str = "SpeedupBelowThreshold", speedup: float = 0.8, **kw) -> dict:
    return result(rev, "rollback", reason, speedup, speedup - 0.1, speedup + 0.1, **kw)


def table(world: World) -> list[tuple[str, str]]:
    return [(c["name"], c["state"]) for c in world.status["candidates"]]


def spec_command(world: World) -> list[str]:
    return world.deployments["llama-spec"]["spec"]["template"]["spec"]["containers"][0]["command"]


def rendered_for(world: World, name: str) -> list[str]:
    spec = world.spec
    return engine_for(spec).render_argv(spec_for_candidate(spec, name), "speculative")


def serve_candidate(world: World, validator: str = COMPATIBLE) -> StartProbe:
    """The slot's server (of its current template) and the base are Ready: the step starts the candidate's probe."""
    world.set_pods(base={"ready": True}, speculative={"ready": True, "init": (0, validator)})
    world.probe_running = None  # the last candidate's probe ended
    plan = world.step()
    assert isinstance(plan.probe, StartProbe), (plan.status["phase"], plan.status["message"])
    world.probe_running = plan.probe.probe_id
    return plan.probe


def test_candidates_take_the_slot_one_after_another_and_the_best_confirmed_one_is_served() -> None:
    world = race_world()
    revs = revisions(world.spec)
    plan = world.step()
    assert table(world) == [("eagle3", "Measuring"), ("ngram", "Waiting"), ("small", "Waiting")]
    assert world.status["race"]["state"] == "Running" and world.status["race"]["current"] == "eagle3"
    assert sorted(world.deployments) == ["llama-base", "llama-spec"]  # one speculative slot, whatever the number of candidates
    assert spec_command(world) == rendered_for(world, "eagle3")
    base_template = json.dumps(world.template("base"), sort_keys=True)

    # eagle3's probe decides at the race's share of the error budget, and nothing is to beat yet.
    probe = serve_candidate(world)
    assert probe.revision == revs["eagle3"] and probe.family == 3 and probe.bar is None
    assert world.status["race"]["confidence"] == race_confidence(0.998, 3)
    plan = world.step(probe_result=passed(revs["eagle3"], 1.9, 1.5, 2.4))
    # Recorded, not acted on: the next candidate takes the slot in the same step, and the base keeps the traffic.
    assert table(world) == [("eagle3", "Passed"), ("ngram", "Measuring"), ("small", "Waiting")]
    assert world.status["phase"] != "Promoted" and world.services["llama"]["spec"]["selector"]["specdec.io/variant"] == "base"
    assert spec_command(world) == rendered_for(world, "ngram")
    assert "CandidateMeasured" in reasons(plan) and "Promoted" not in reasons(plan)
    assert plan.measured == (revs["eagle3"],)
    assert json.dumps(world.template("base"), sort_keys=True) == base_template  # the warm base is not restarted

    # ngram must beat eagle3's lowest workload low end (1.5) or stop: CannotWin eliminates it.
    probe = serve_candidate(world)
    assert probe.revision == revs["ngram"] and probe.family == 3 and probe.bar == 1.5
    world.step(probe_result=lost(revs["ngram"], reason="CannotWin", speedup=1.1))
    assert table(world) == [("eagle3", "Passed"), ("ngram", "Eliminated"), ("small", "Measuring")]
    assert spec_command(world) == rendered_for(world, "small")

    serve_candidate(world)
    plan = world.step(probe_result=lost(revs["small"]))
    # Every candidate decided: eagle3 wins and is deployed in the slot again; the base serves until it is Ready.
    assert table(world) == [("eagle3", "Serving"), ("ngram", "Eliminated"), ("small", "Lost")]
    race = world.status["race"]
    assert race["state"] == "Decided" and race["winner"] == "eagle3" and race["gpuSeconds"] == 360.0
    assert spec_command(world) == rendered_for(world, "eagle3")
    assert world.services["llama"]["spec"]["selector"]["specdec.io/variant"] == "base"  # small's pod is no server of eagle3
    assert "RaceWon" in reasons(plan)
    world.set_pods(base={"ready": True}, speculative={"ready": True, "init": (0, COMPATIBLE)})
    plan = world.step()
    assert world.status["phase"] == "Promoted" and world.services["llama"]["spec"]["selector"]["specdec.io/variant"] == "speculative"
    assert world.status["probe"]["revision"] == revs["eagle3"] and world.status["probe"]["speedup"] == 1.9
    assert world.status["probe"]["message"].startswith("race of 3 candidates: eagle3 wins")
    assert not plan.starts_probe  # a decided candidate is never probed again
    again = world.step()
    assert again.events == [] and table(world)[0] == ("eagle3", "Serving")


def test_the_winner_is_the_fastest_passing_candidate_not_the_first() -> None:
    world = race_world()
    revs = revisions(world.spec)
    world.step()
    serve_candidate(world)
    world.step(probe_result=passed(revs["eagle3"], 1.4, 1.2, 1.7))
    serve_candidate(world)
    world.step(probe_result=passed(revs["ngram"], 2.6, 2.0, 3.2))
    probe = serve_candidate(world)
    assert probe.bar == 2.0  # the best passing candidate's lowest workload low end
    world.step(probe_result=lost(revs["small"], reason="CannotWin", speedup=1.6))
    assert table(world) == [("eagle3", "Passed"), ("ngram", "Serving"), ("small", "Eliminated")]
    # ngram was measured last but one: it is rendered in the slot again.
    assert spec_command(world) == rendered_for(world, "ngram")


def test_no_candidate_faster_rolls_back_to_the_base_with_the_best_ones_reason() -> None:
    world = race_world(**{"rollout.keepBaseWarm": True})
    revs = revisions(world.spec)
    world.step()
    serve_candidate(world)
    world.step(probe_result=lost(revs["eagle3"], speedup=0.9))
    serve_candidate(world)
    world.step(probe_result=lost(revs["ngram"], reason="Inconclusive", speedup=1.02))
    serve_candidate(world)
    plan = world.step(probe_result=lost(revs["small"], speedup=0.7))
    assert world.status["race"]["state"] == "Decided" and world.status["race"].get("winner") is None
    assert world.status["phase"] == "RolledBack" and world.status["reason"] == "Inconclusive"  # ngram's: the fastest measured
    assert "none was faster" in world.status["probe"]["message"]
    assert world.deployments["llama-spec"]["spec"]["replicas"] == 0
    assert world.services["llama"]["spec"]["selector"]["specdec.io/variant"] == "base"
    assert any(e.reason == "RaceWon" and e.type == "Warning" for e in plan.events)


def test_a_candidate_the_validator_refuses_is_invalid_and_the_race_goes_on() -> None:
    world = race_world()
    revs = revisions(world.spec)
    world.step()
    serve_candidate(world)
    world.step(probe_result=passed(revs["eagle3"], 1.9, 1.5, 2.4))
    serve_candidate(world)  # ngram has no drafter to validate
    world.step(probe_result=lost(revs["ngram"]))
    world.set_pods(base={"ready": True}, speculative={"ready": False, "init": (1, INCOMPATIBLE)})
    world.step()
    assert table(world) == [("eagle3", "Serving"), ("ngram", "Lost"), ("small", "Invalid")]
    assert world.status["candidates"][2]["reason"] == "DrafterIncompatible"
    assert spec_command(world) == rendered_for(world, "eagle3")


def test_the_gpu_budget_skips_the_candidates_it_does_not_reach() -> None:
    world = race_world(**{"race.gpuSecondsBudget": 100})
    revs = revisions(world.spec)
    world.step()
    serve_candidate(world)
    world.step(probe_result=passed(revs["eagle3"], 1.9, 1.5, 2.4, gpu_seconds=150.0))
    assert table(world) == [("eagle3", "Serving"), ("ngram", "Skipped"), ("small", "Skipped")]
    assert world.status["candidates"][1]["reason"] == "GpuBudgetSpent"
    assert world.status["race"]["winner"] == "eagle3" and world.status["race"]["gpuSeconds"] == 150.0


def test_a_race_waits_queued_for_a_slot_with_the_base_serving_and_no_speculative_server() -> None:
    world = race_world()
    limit = Settings(max_concurrent_races=2)
    plan = world.step(settings=limit, races_elsewhere=2)
    assert world.status["race"]["state"] == "Queued" and world.status["phase"] == "Pending" and world.status["reason"] == "RaceQueued"
    assert world.deployments["llama-spec"]["spec"]["replicas"] == 0 and world.deployments["llama-base"]["spec"]["replicas"] == 1
    assert reasons(plan) == ["RaceQueued"] and plan.events[0].type == "Normal" and not plan.starts_probe  # not a rollback
    assert world.step(settings=limit, races_elsewhere=2).events == []  # said once
    world.step(settings=limit, races_elsewhere=1)  # a slot frees
    assert world.status["race"]["state"] == "Running" and world.deployments["llama-spec"]["spec"]["replicas"] == 1
    # A running race keeps running whatever the others do.
    world.step(settings=limit, races_elsewhere=5)
    assert world.status["race"]["state"] == "Running"


def test_a_drifting_winner_gives_way_to_the_runner_up_measured_again() -> None:
    world = race_world(**{"monitor.window": 1})
    revs = revisions(world.spec)
    world.step()
    serve_candidate(world)
    world.step(probe_result=passed(revs["eagle3"], 2.2, 1.8, 2.7))
    serve_candidate(world)
    world.step(probe_result=lost(revs["ngram"]))
    serve_candidate(world)
    world.step(probe_result=passed(revs["small"], 1.5, 1.2, 1.9))
    world.set_pods(base={"ready": True}, speculative={"ready": True, "init": (0, COMPATIBLE)})
    world.step()
    assert world.status["phase"] == "Promoted" and table(world)[0] == ("eagle3", "Serving")
    t = NOW + timedelta(seconds=30)
    world.step(now=t, scrape=Sample(time=t.isoformat(), accept_length=1.0, verify_calls=40.0), previous_scrape=Sample(time="", verify_calls=30.0))
    assert world.status["reason"] == "AcceptanceDrift"
    world.step(now=t + timedelta(seconds=1))
    assert table(world) == [("eagle3", "Drifted"), ("ngram", "Lost"), ("small", "Measuring")]
    assert spec_command(world) == rendered_for(world, "small")
    assert world.services["llama"]["spec"]["selector"]["specdec.io/variant"] == "base"
    serve_candidate(world)
    world.step(probe_result=passed(revs["small"], 1.4, 1.15, 1.8))
    assert table(world) == [("eagle3", "Drifted"), ("ngram", "Lost"), ("small", "Serving")]


def test_a_new_race_starts_when_a_candidate_changes_and_a_promoted_drafter_is_measured_again() -> None:
    single = World(llama_spec())
    rev = speculative_revision(single.spec)
    world = race_world()
    assert revisions(world.spec)["eagle3"] == rev  # spec.drafter keeps its revision inside a race
    # A decision stored before the race (spec.drafter promoted alone at the whole confidence) is not taken over.
    world.status = {"probe": passed(rev, 1.9, 1.5, 2.4)}
    world.step()
    assert table(world)[0] == ("eagle3", "Measuring") and world.status["probe"] is None
    first = world.status["race"]["revision"]
    world.spec_dict["candidates"][0]["numDraftTokens"] = 8
    world.step()
    assert world.status["race"]["revision"] != first and table(world)[1] == ("ngram", "Waiting")


def test_the_race_table_of_the_most_candidates_fits_the_status_budget() -> None:
    raw = llama_spec()
    raw["candidates"] = [{"name": f"candidate-{i:02d}-long", "algorithm": "NGRAM", "numDraftTokens": 4 + i} for i in range(8)]
    raw["includeDrafterFree"] = True
    world = World(raw)
    world.step()
    revs = revisions(world.spec)
    long = "x" * 2000
    for name in revs:
        if world.status["race"]["state"] != "Running":
            break
        serve_candidate(world)
        world.step(probe_result={**lost(revs[name], reason="Inconclusive", speedup=1.01), "message": long})
    assert all(c["state"] in ("Lost", "Eliminated") for c in world.status["candidates"])
    # 10 candidates, each with two workloads and its message cut short: within the status's byte budget with room
    # for the rest of the status (about 2.2 KiB at 1,000 resources, docs/scale.md).
    size = len(json.dumps(world.status))
    assert size < STATUS_BYTES_BUDGET * 0.6, size
    assert m.child_name("llama", "speculative") in world.deployments


def test_kubectl_specdec_and_the_metric_show_the_race() -> None:
    from prometheus_client import generate_latest

    from specdec_operator.cli.kubectl_specdec import describe
    from specdec_operator.controller.metrics import OperatorMetrics
    from specdec_operator.reconcile import read_status

    world = race_world()
    revs = revisions(world.spec)
    world.step()
    serve_candidate(world)
    world.step(probe_result=passed(revs["eagle3"], 1.9, 1.5, 2.4))
    serve_candidate(world)
    world.step(probe_result=lost(revs["ngram"], reason="CannotWin", speedup=1.1))
    text = describe("llama", read_status(world.status), {})
    assert "race of 3 candidates: Running, in the slot small, 240 GPU-seconds" in text
    lines = text.splitlines()
    eagle3 = next(i for i, line in enumerate(lines) if line.strip().startswith("eagle3"))
    assert lines[eagle3].split()[:6] == ["eagle3", "EAGLE3", "Passed", "2.50", "chat", "1.90x"] and "SpeedupConfirmed" in lines[eagle3]
    assert lines[eagle3 + 1].split()[:2] == ["batch", "2.00x"] and "[1.60, 2.50]" in lines[eagle3 + 1]
    assert any(line.split()[:3] == ["ngram", "NGRAM", "Eliminated"] and line.rstrip().endswith("CannotWin") for line in lines)
    assert any(line.split()[:3] == ["small", "STANDALONE", "Measuring"] for line in lines)
    metrics = OperatorMetrics()
    metrics.observe_status("ns", "llama", world.status)
    exposition = generate_latest(metrics.registry).decode()
    for state, count in (("Passed", 1), ("Eliminated", 1), ("Measuring", 1), ("Waiting", 0)):
        assert f'specdec_race_candidates{{name="llama",namespace="ns",state="{state}"}} {count:.1f}' in exposition
    # A resource without a race has no series.
    single = World(llama_spec())
    single.step()
    metrics.observe_status("ns", "plain", single.status)
    assert 'name="plain",namespace="ns",state=' not in generate_latest(metrics.registry).decode()


def test_a_fleet_races_on_its_canary_and_walks_the_winner_through_the_fleet() -> None:
    world = race_world(replicas=3)
    revs = revisions(world.spec)
    world.step()
    assert world.deployments["llama-spec"]["spec"]["replicas"] == 1  # the canary: one speculative server per candidate
    for name, res in (("eagle3", lost(revs["eagle3"])), ("ngram", passed(revs["ngram"], 2.1, 1.7, 2.6)), ("small", lost(revs["small"]))):
        world.set_pods(base={"ready": True}, speculative={"ready": True, "init": (0, COMPATIBLE)})
        world.add_pod("base", ready=True)
        world.add_pod("base", ready=True)
        world.probe_running = None
        plan = world.step()
        assert isinstance(plan.probe, StartProbe) and plan.probe.revision == revs[name], (name, world.status["message"])
        assert world.deployments["llama-spec"]["spec"]["replicas"] == 1 and spec_command(world) == rendered_for(world, name)
        world.step(probe_result=res)
    assert table(world) == [("eagle3", "Lost"), ("ngram", "Serving"), ("small", "Lost")]
    # The winner walks through the fleet as any promotion does, its servers Ready as the Deployments ask for them.
    for _ in range(8):
        world.pods = []
        for variant in ("base", "speculative"):
            for _ in range(world.deployments[f"llama-{'spec' if variant == 'speculative' else 'base'}"]["spec"]["replicas"]):
                world.add_pod(variant, ready=True, init=(0, COMPATIBLE) if variant == "speculative" else None)
        world.step()
    assert spec_command(world) == rendered_for(world, "ngram")
    assert world.deployments["llama-spec"]["spec"]["replicas"] == 3 and world.deployments["llama-base"]["spec"]["replicas"] == 0
    assert world.status["rolloutProgress"] == "3/3 speculative" and world.status["phase"] == "Promoted"


def test_an_engine_image_change_starts_a_new_race_and_losers_hold_no_gpus() -> None:
    world = race_world()
    revs = revisions(world.spec)
    world.step()
    for res in (passed(revs["eagle3"], 1.9, 1.5, 2.4), lost(revs["ngram"]), lost(revs["small"])):
        serve_candidate(world)
        world.step(probe_result=res)
    world.set_pods(base={"ready": True}, speculative={"ready": True, "init": (0, COMPATIBLE)})
    world.step()
    assert world.status["phase"] == "Promoted"
    # After the race only the winner's server holds speculative GPUs (the slot), whatever the losers were.
    assert world.status["gpus"]["speculative"] == world.spec.resources.gpus
    first = world.status["race"]["revision"]
    world.spec_dict["image"] = "lmsysorg/sglang:v0.5.22-cu129"
    world.step()
    assert world.status["race"]["revision"] != first and world.status["race"]["state"] == "Running"
    assert table(world) == [("eagle3", "Measuring"), ("ngram", "Waiting"), ("small", "Waiting")]


def test_candidates_are_measured_plainly_and_load_aware_speculation_is_the_served_ones() -> None:
    world = race_world()  # rollout.loadAware Auto
    revs = revisions(world.spec)
    world.step()
    # eagle3 wins at one stream and loses at 32: alone, this curve would open a load-aware trial; in a race its plain
    # decision is its row, and the next candidate takes the slot.
    curve = {
        **lost(revs["eagle3"], speedup=0.5),
        "workloads": [
            {"name": "chat", "concurrency": 1, "speedup": 1.8, "speedupLow": 1.3, "speedupHigh": 2.4},
            {"name": "batch", "concurrency": 32, "speedup": 0.5, "speedupLow": 0.4, "speedupHigh": 0.6},
        ],
        "breakEven": {"concurrency": 8.0, "low": 6.0, "high": 11.0, "summary": "8 [6, 11]"},
    }
    serve_candidate(world)
    plan = world.step(probe_result=curve)
    assert table(world)[:2] == [("eagle3", "Lost"), ("ngram", "Measuring")] and "LoadAwareTrial" not in reasons(plan)
    for name in ("ngram", "small"):
        serve_candidate(world)
        world.step(probe_result=lost(revs[name], speedup=0.3))
    # None passed: eagle3 was the best measured, and its plain curve asks for a trial, as it would for it alone.
    assert world.status["race"]["state"] == "Decided" and world.status["race"].get("winner") is None
    assert world.status["probe"]["loadAware"]["reason"] == "LoadAwareTrial" and spec_command(world)[:1]
    assert "--speculative-adaptive" in spec_command(world) and world.status["probe"]["revision"] == revs["eagle3"]


def test_an_abort_or_a_promotion_by_hand_ends_the_race_at_the_candidate_in_the_slot() -> None:
    from specdec_operator import steering

    aborted = race_world()
    revs = revisions(aborted.spec)
    aborted.step()
    serve_candidate(aborted)
    aborted.step(probe_result=passed(revs["eagle3"], 1.9, 1.5, 2.4))
    serve_candidate(aborted)
    aborted.step(annotations={steering.ABORT: "too slow for us"})
    assert table(aborted) == [("eagle3", "Passed"), ("ngram", "Lost"), ("small", "Skipped")]
    assert aborted.status["candidates"][1]["reason"] == "Aborted" and aborted.status["candidates"][2]["reason"] == "Aborted"
    # The abort holds whatever candidate is served: the base serves.
    aborted.step(annotations={steering.ABORT: "too slow for us"})
    assert aborted.status["phase"] == "RolledBack" and aborted.status["reason"] == "Aborted"
    assert aborted.services["llama"]["spec"]["selector"]["specdec.io/variant"] == "base"

    promoted = race_world()
    promoted.step()
    serve_candidate(promoted)
    promoted.step(probe_result=passed(revs["eagle3"], 2.5, 2.0, 3.0))
    serve_candidate(promoted)
    promoted.step(annotations={steering.PROMOTE: "we know ngram"})
    assert table(promoted) == [("eagle3", "Passed"), ("ngram", "Serving"), ("small", "Skipped")]
    assert promoted.status["race"]["winner"] == "ngram" and spec_command(promoted) == rendered_for(promoted, "ngram")


def test_a_candidates_probe_runs_under_its_own_spec_and_a_drafter_free_method_has_no_acceptance_floor(tmp_path) -> None:
    from specdec_operator.controller.probescheduler import accept_length_floor
    from specdec_operator.probe.scripted import load_script

    world = race_world()
    revs = revisions(world.spec)
    world.step()
    probe = serve_candidate(world)
    assert probe.spec is not None and probe.spec.drafter.algorithm == "EAGLE3" and probe.spec.rollout.load_aware == "Off"
    assert accept_length_floor(probe.spec, adaptive=False) == world.spec.rollout.accept_length_floor
    world.step(probe_result=passed(revs["eagle3"], 1.9, 1.5, 2.4))
    probe = serve_candidate(world)
    assert probe.spec is not None and probe.spec.drafter.algorithm == "NGRAM" and probe.candidate == "ngram"
    # n-gram drafts only where the context repeats: on free chat its acceptance is 1.00 by design, not a broken drafter.
    assert accept_length_floor(probe.spec, adaptive=False) is None
    assert accept_length_floor(world.spec, adaptive=True) is None
    # A candidate's script entry may ask for the real output check, or take its probe's.
    path = tmp_path / "script.yaml"
    path.write_text(
        "race:\n  speedup: 1.0\n  checkOutputs: true\n  arms:\n    eagle3: {speedup: 2.0}\n    ngram: {speedup: 1.5, checkOutputs: false}\n"
    )
    script = load_script(path)["race"]
    assert script.for_arm("eagle3").check_outputs is True and script.for_arm("ngram").check_outputs is False
