"""specdec_progress_deadline_exceeded carries the side that waited (issue 34, 1c), read from the statuses the
operator's own reconcile writes past spec.progressDeadlineSeconds (tests/unit/test_gpus.py writes them by hand):
a speculative side given up while the base serves is not the base failing to serve, and the chart alerts them
apart (SpecdecProgressDeadlineExceeded on variant="base", SpecdecSpeculativeProgressDeadlineExceeded on
variant="speculative")."""

from __future__ import annotations

from datetime import timedelta

from prometheus_client import generate_latest

from specdec_operator import manifests as m
from specdec_operator.controller.metrics import OperatorMetrics
from tests.support.world import NOW, World, llama_spec

DEADLINE = 600


def exceeded(status: dict) -> dict[str, float]:
    """specdec_progress_deadline_exceeded by variant for one resource, from the operator's exposition."""
    metrics = OperatorMetrics()
    metrics.observe_status("ns", "llama", status)
    found = {}
    for line in generate_latest(metrics.registry).decode().splitlines():
        if line.startswith("specdec_progress_deadline_exceeded{"):
            variant = line.split('variant="', 1)[1].split('"', 1)[0]
            found[variant] = float(line.rsplit(" ", 1)[1])
    return found


def test_a_speculative_side_past_its_deadline_is_that_variants_while_the_base_serves():
    world = World(llama_spec(progressDeadlineSeconds=DEADLINE))
    world.step()
    world.add_pod("base", ready=True)
    pod = world.add_pod("speculative")
    pod["status"]["initContainerStatuses"] = [{"name": m.VALIDATOR_CONTAINER, "state": {"waiting": {"reason": "PodInitializing"}}}]
    world.step()
    expired = world.step(now=NOW + timedelta(seconds=DEADLINE + 1))
    assert (expired.status["phase"], expired.status["reason"], expired.status["activeVariant"]) == ("RolledBack", "ProgressDeadlineExceeded", "base")
    assert exceeded(expired.status) == {"base": 0.0, "speculative": 1.0}


def test_a_base_past_its_deadline_is_the_base_variants():
    world = World(llama_spec(progressDeadlineSeconds=DEADLINE))
    world.step()
    pod = world.add_pod("base")
    pod["status"]["conditions"][0] = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes are available"}
    world.step()
    before = world.step(now=NOW + timedelta(seconds=DEADLINE - 1))
    assert exceeded(before.status) == {"base": 0.0, "speculative": 0.0}
    failed = world.step(now=NOW + timedelta(seconds=DEADLINE + 1))
    assert (failed.status["phase"], failed.status["reason"]) == ("Failed", "ProgressDeadlineExceeded")
    assert exceeded(failed.status) == {"base": 1.0, "speculative": 0.0}
