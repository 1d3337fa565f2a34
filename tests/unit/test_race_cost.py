"""benchmarks/race_cost.py's race and separate probes on scripted rounds (the same run_probe and decisions, no
servers): the race shares the error budget (stricter per probe) and eliminates what cannot win; separate probes do
neither. The real-time figures are the benchmark's (docs/benchmarks/race-cost.md)."""

from __future__ import annotations

import asyncio

from specdec_operator.probe.scripted import ScriptedProbe
from tests.support.benchmarks import load_benchmark

TRUTH = {"dflash": 3.0, "eagle3": 2.0, "standalone": 1.5, "ngram": 0.9}
URLS = {"base": "http://127.0.0.1:9", **{c: "http://127.0.0.1:9" for c in TRUTH}}


def _tables(order: list[str]) -> dict[str, dict]:
    rc = load_benchmark("race_cost")
    scripts = {c: ScriptedProbe(f"test/{c}", s, noise=0.05, accept_length=2.5, seconds_per_round=0.0) for c, s in TRUTH.items()}
    return {mode: {r.name: r for r in asyncio.run(rc.run_mode(mode, URLS, 4, 1, scripts, order))} for mode in ("race", "separate")}


def test_the_race_eliminates_what_cannot_win_and_is_stricter_per_probe() -> None:
    rc = load_benchmark("race_cost")
    tables = _tables(["dflash", "eagle3", "standalone", "ngram"])
    race, separate = tables["race"], tables["separate"]
    for table in (race, separate):
        assert rc.candidate_race.winner(list(table.values())).name == "dflash"
    # n-gram's interval falls below DFlash's lowest workload low end: the race stops it (CannotWin); alone it runs on.
    assert race["ngram"].state == "Eliminated" and race["ngram"].reason == "CannotWin"
    assert separate["ngram"].state == "Lost" and separate["ngram"].rounds >= race["ngram"].rounds
    # The same seeded rounds at 1 - 0.002/4 instead of 1 - 0.002: never fewer rounds to pass.
    for name in ("dflash", "eagle3", "standalone"):
        assert race[name].state == separate[name].state == "Passed"
        assert race[name].rounds >= separate[name].rounds


def test_the_deploy_costs_come_from_the_profiles_load_times() -> None:
    rc = load_benchmark("race_cost")
    costs = rc.deploy_costs(4)
    loads = costs["load_seconds"]
    assert costs["race_slot_loads"] == sum(loads[c] for c in rc.CANDIDATES) == costs["separate_resources_slot_loads"]
    assert costs["separate_resources_own_base_loads"] == 4 * loads["base"] > 0
