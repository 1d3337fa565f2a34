"""reconcile/gpus.py: the GPUs each variant holds and the idle ones (status.gpus, specdec_idle_gpus)."""

from specdec_operator import manifests as m
from specdec_operator.api import Variant
from specdec_operator.reconcile.gpus import gpu_status, pod_gpus


def pod(variant: str, gpus: int | str | None = 8, going: bool = False) -> dict:
    limits = {} if gpus is None else {m.GPU_RESOURCE: str(gpus)}
    meta: dict = {"name": f"{variant}-x", "labels": {m.LABEL_VARIANT: variant}}
    if going:
        meta["deletionTimestamp"] = "2026-12-04T10:00:00Z"
    return {
        "metadata": meta,
        "spec": {"initContainers": [{"resources": {"limits": {m.GPU_RESOURCE: "1"}}}], "containers": [{"resources": {"limits": limits}}]},
    }


def test_gpus_of_a_pod_are_its_containers_limits():
    assert pod_gpus(pod("base", 8)) == 8
    assert pod_gpus(pod("base", None)) == 0
    assert pod_gpus(pod("base", "eight")) == 0


def test_while_probing_nothing_is_idle():
    status = gpu_status([pod("base"), pod("speculative")], serving={Variant.BASE}, probing=True)
    assert (status.base, status.speculative, status.idle) == (8, 8, 0)


def test_a_warm_base_after_a_promotion_is_idle():
    status = gpu_status([pod("base"), pod("speculative")], serving={Variant.SPECULATIVE}, probing=False)
    assert (status.base, status.speculative, status.idle) == (8, 8, 8)


def test_a_fleet_walking_serves_with_both_and_terminating_pods_are_idle():
    pods = [pod("base"), pod("base", going=True), pod("speculative"), {"metadata": {"labels": {}}}]
    status = gpu_status(pods, serving={Variant.BASE, Variant.SPECULATIVE}, probing=False)
    assert (status.base, status.speculative, status.idle) == (16, 8, 8)


def test_only_the_base_left_holds_nothing_idle():
    status = gpu_status([pod("base")], serving={Variant.BASE}, probing=False)
    assert status.idle == 0 and status.speculative == 0


def test_idle_gpus_and_the_progress_deadline_are_exported() -> None:
    from prometheus_client import generate_latest

    from specdec_operator.controller.metrics import OperatorMetrics

    metrics = OperatorMetrics()
    metrics.observe_status("ns", "kimi", {"phase": "Promoted", "reason": "SpeedupConfirmed", "gpus": {"base": 8, "speculative": 8, "idle": 8}})
    metrics.observe_status("ns", "stuck", {"phase": "Failed", "reason": "ProgressDeadlineExceeded"})
    # The speculative side given up past its deadline while the base serves: not the base failing to serve.
    metrics.observe_status(
        "ns", "slowdrafter", {"phase": "RolledBack", "reason": "ProgressDeadlineExceeded", "probe": {"reason": "ProgressDeadlineExceeded"}}
    )
    text = generate_latest(metrics.registry).decode()
    assert 'specdec_idle_gpus{name="kimi",namespace="ns"} 8.0' in text
    assert 'specdec_gpus{name="kimi",namespace="ns",variant="speculative"} 8.0' in text
    assert 'specdec_progress_deadline_exceeded{name="stuck",namespace="ns",variant="base"} 1.0' in text
    assert 'specdec_progress_deadline_exceeded{name="stuck",namespace="ns",variant="speculative"} 0.0' in text
    assert 'specdec_progress_deadline_exceeded{name="slowdrafter",namespace="ns",variant="base"} 0.0' in text
    assert 'specdec_progress_deadline_exceeded{name="slowdrafter",namespace="ns",variant="speculative"} 1.0' in text
    assert 'specdec_progress_deadline_exceeded{name="kimi",namespace="ns",variant="base"} 0.0' in text
    assert 'specdec_idle_gpus{name="stuck"' not in text  # no status.gpus yet: no series rather than a false 0
