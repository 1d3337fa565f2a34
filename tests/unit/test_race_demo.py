"""The demo's race (issue 35, item 4): its traffic, the slot router that puts each candidate's simulator behind the
speculative slot, and the closing check (hack/demo_race.py, tests/support/race_workloads.py, slot_router.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from hack import demo_race
from specdec_operator.controller.config import Endpoints
from specdec_operator.probe.datasets import parse_dataset
from specdec_operator.simulator.model import load_profile
from specdec_operator.simulator.promptkind import text_repetition_share
from tests.support import race_workloads as rw
from tests.support.slot_router import SlotRouter, candidate_revisions, template_revisions

REPO = Path(__file__).resolve().parents[2]

NS = "specdec-demo"


def _shares(prompts: list) -> list[float]:
    return [text_repetition_share(p.text) for p in prompts]


def test_each_kind_of_traffic_makes_the_expected_candidate_the_fastest_profile() -> None:
    repetitive = parse_dataset("\n".join(json.dumps(p) for p in rw.repetitive_prompts()), source="test", fmt="Chat")
    shipped = (REPO / "operator/specdec_operator/probe/data/default-prompts.jsonl").read_text()
    chat = parse_dataset(shipped, source="shipped", fmt="Auto")
    share = {"repetitive": sum(_shares(repetitive)) / len(repetitive), "chat": sum(_shares(chat)) / len(chat)}
    assert min(_shares(repetitive)) > 0.7 and share["chat"] < 0.02
    base = load_profile(rw.BASE_PROFILE)
    for kind, want in rw.EXPECTED_WINNER.items():
        speedups = {
            cand: load_profile(profile).analytic_throughput(1, 128, 64, share[kind]) / base.analytic_throughput(1, 128, 64)
            for cand, profile in rw.CANDIDATE_PROFILES.items()
        }
        ranked = sorted(speedups, key=speedups.__getitem__, reverse=True)
        assert ranked[0] == want, (kind, speedups)
        assert speedups[ranked[0]] > 1.3 * speedups[ranked[1]], (kind, speedups)  # a clear margin, not a coin toss


def test_the_router_points_each_slot_at_the_candidate_its_deployment_carries(tmp_path: Path) -> None:
    path = tmp_path / "endpoints.yaml"
    templates: dict[str, str] = {}
    router = SlotRouter(path, NS, lambda namespace: dict(templates))
    router.fixed = {f"{NS}/race-base": "http://127.0.0.1:1000", f"{NS}/other-spec": "http://127.0.0.1:1001"}
    spec = rw.race_resource("race", NS, "chat", "prompts", {})["spec"]
    urls = {"eagle3": "http://127.0.0.1:2001", "ngram": "http://127.0.0.1:2002", "standalone": "http://127.0.0.1:2003"}
    revs = router.add_race("race", spec, urls)
    assert revs == candidate_revisions(spec) and len(set(revs.values())) == 3
    operator_view = Endpoints.from_file(str(path))  # the operator's reader of --endpoints, re-read on change
    assert operator_view.url(NS, "race-spec") == urls["eagle3"]  # before the slot is rendered: the first candidate

    for cand in ("ngram", "standalone", "eagle3"):  # the race's order, then the winner re-deployed
        templates["race-spec"] = revs[cand]
        assert router.poll() == [("race-spec", cand)]
        assert operator_view.url(NS, "race-spec") == urls[cand]
        assert operator_view.url(NS, "race-base") == "http://127.0.0.1:1000"
        assert operator_view.url(NS, "other-spec") == "http://127.0.0.1:1001"
    assert router.poll() == []  # unchanged: the file is not rewritten
    templates["race-spec"] = "f" * 16  # a revision of no candidate (the spec changed): the mapping stays
    assert router.poll() == [] and operator_view.url(NS, "race-spec") == urls["eagle3"]
    assert [c for _, _, c in router.switches] == ["ngram", "standalone", "eagle3"]
    assert yaml.safe_load(path.read_text())[f"{NS}/race-spec"] == urls["eagle3"]


def test_a_race_needs_a_simulator_for_every_candidate(tmp_path: Path) -> None:
    router = SlotRouter(tmp_path / "e.yaml", NS, lambda namespace: {})
    with pytest.raises(ValueError, match="no simulator for candidate.*standalone"):
        router.add_race("race", rw.race_resource("race", NS, "chat", "p", {})["spec"], {"eagle3": "http://a:1", "ngram": "http://b:1"})


def test_template_revisions_reads_the_pod_templates_annotation() -> None:
    deployments = [
        {"metadata": {"name": "a-spec"}, "spec": {"template": {"metadata": {"annotations": {"specdec.io/revision": "abc"}}}}},
        {"metadata": {"name": "a-base"}, "spec": {"template": {"metadata": {}}}},
    ]
    assert template_revisions(deployments) == {"a-spec": "abc"}


def _item(name: str, winner: str | None, state: str = "Decided", phase: str = "Promoted", active: str = "speculative") -> dict:
    rows = [
        {"name": "eagle3", "algorithm": "EAGLE3", "state": "Passed", "workloads": [{"speedup": 2.1, "speedupLow": 1.9, "speedupHigh": 2.3}]},
        {"name": "ngram", "algorithm": "NGRAM", "state": "Lost", "reason": "SpeedupBelowThreshold", "gpuSeconds": 3.5},
    ]
    race = {"state": state, "winner": winner, "confidence": 0.99933, "gpuSeconds": 7.25}
    return {"metadata": {"name": name}, "status": {"phase": phase, "activeVariant": active, "candidates": rows, "race": race}}


def test_the_closing_check_fails_when_the_wrong_candidate_wins_or_is_not_served() -> None:
    chat, repetitive = "llama31-8b-race-chat", "llama31-8b-race-repetitive"
    assert demo_race.race_verdict(_item(chat, "eagle3")) is None
    assert "ngram won the race on chat traffic; the profiles say eagle3 must" in (demo_race.race_verdict(_item(chat, "ngram")) or "")
    assert "no candidate won" in (demo_race.race_verdict(_item(repetitive, None, phase="RolledBack", active="base")) or "")
    assert "not decided" in (demo_race.race_verdict(_item(chat, None, state="Running", phase="Probing")) or "")
    assert "not served" in (demo_race.race_verdict(_item(chat, "eagle3", phase="Deploying", active="base")) or "")
    said: list[str] = []
    assert demo_race.show_and_check([_item(chat, "eagle3"), _item(repetitive, "ngram")], said.append)
    assert not demo_race.show_and_check([_item(chat, "eagle3"), _item(repetitive, "eagle3")], said.append)
    assert not demo_race.show_and_check([_item(chat, "eagle3")], said.append)  # a race missing
    table = "\n".join(said)
    assert "2.10x [1.90, 2.30]" in table and "winner eagle3" in table and f"{7.25 * demo_race.TIME_SCALE:.0f} in simulated GPU time" in table


def test_the_scripted_races_carry_each_profiles_truth_and_parse_as_a_probe_script(tmp_path: Path) -> None:
    from specdec_operator.probe.scripted import load_script

    path = tmp_path / "script.yaml"
    path.write_text(yaml.safe_dump(rw.probe_script({f"{NS}/rep": "repetitive", f"{NS}/chat": "chat"})))
    scripts = load_script(path)
    for key, kind in ((f"{NS}/rep", "repetitive"), (f"{NS}/chat", "chat")):
        truth = rw.profile_truth(kind)
        arms = {cand: scripts[key].for_arm(cand) for cand in rw.CANDIDATE_PROFILES}
        assert {c: (a.speedup, a.accept_length) for c, a in arms.items()} == truth
        assert max(truth, key=lambda c: truth[c][0]) == rw.EXPECTED_WINNER[kind]
    assert rw.profile_truth("chat")["ngram"][1] < 1.1  # n-gram drafts nothing on chat: DrafterNotAccepting, as measured
