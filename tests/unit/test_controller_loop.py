"""The loop of one resource without Kopf: how long it waits between steps (controller.runtime.next_delay)."""

from __future__ import annotations

from specdec_operator.api import SpeculativeServerStatus
from specdec_operator.controller.runtime import MAX_BACKOFF_S, MIN_SCRAPE_WAIT_S, next_delay
from specdec_operator.reconcile import Plan

RECONCILE, RESYNC = 10.0, 300.0


def plan(*, settled: bool = False, next_scrape_in: float | None = None) -> Plan:
    return Plan(revision="r", apply=[], new_status=SpeculativeServerStatus(), events=[], settled=settled, next_scrape_in=next_scrape_in)


def test_an_unsettled_resource_is_stepped_every_reconcile_interval() -> None:
    assert next_delay(0, plan(), RECONCILE, RESYNC) == RECONCILE


def test_a_refused_step_has_no_plan_and_is_looked_at_again_every_reconcile_interval() -> None:
    assert next_delay(0, None, RECONCILE, RESYNC) == RECONCILE


def test_a_settled_resource_waits_for_the_resync() -> None:
    assert next_delay(0, plan(settled=True), RECONCILE, RESYNC) == RESYNC


def test_failures_back_off_doubling_up_to_a_minute() -> None:
    delays = [next_delay(n, None, RECONCILE, RESYNC) for n in range(1, 10)]
    assert delays[:5] == [1.0, 2.0, 4.0, 8.0, 16.0]
    assert delays == sorted(delays) and max(delays) == MAX_BACKOFF_S == delays[-1]


def test_a_due_drift_scrape_comes_sooner_but_never_at_once() -> None:
    assert next_delay(0, plan(settled=True, next_scrape_in=30.0), RECONCILE, RESYNC) == 30.0
    assert next_delay(0, plan(next_scrape_in=0.0), RECONCILE, RESYNC) == MIN_SCRAPE_WAIT_S
    assert next_delay(0, plan(next_scrape_in=45.0), RECONCILE, RESYNC) == RECONCILE  # the interval comes first
