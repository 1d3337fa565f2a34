"""GPU accounting in the running operator (issue 33): status.gpus and specdec_gpus / specdec_idle_gpus come from the
pods as the operator holds them (its Kopf index copies), on the real control plane with the real scheduler.

Both resources are promoted by hand (specdec.io/promote, as `kubectl specdec promote` writes it), so the state
under test needs no probe decision: nothing here depends on how fast the simulators answer. The simulators are
mapped all the same, as the drift monitor of a promoted resource scrapes its speculative server.
"""

from __future__ import annotations

import urllib.request
from typing import Any

import pytest

from hack import demo
from specdec_operator import steering
from tests.support.kube import wait_until
from tests.support.operator_process import (
    GROUP,
    PLURAL,
    VERSION,
    Operator,
    compatible_annotations,
    example,
    free_port,
    status,
    variant_pods,
)
from tests.support.simulators import Simulators

pytestmark = pytest.mark.cluster

# GPUs per server: unlike each other and above 1, so a count of pods or of the other resource's GPUs cannot pass.
WARM, COLD = ("warm", 2), ("cold", 4)


def test_a_promoted_server_counts_its_gpus_and_a_warm_base_as_idle_ones(
    operator: Operator, sims: Simulators, namespace: str, custom_objects: Any, core_v1: Any
) -> None:
    for name, _ in (WARM, COLD):
        operator.map(f"{name}-base", sims.start("llama31-8b-base").url)
        operator.map(f"{name}-spec", sims.start("llama31-8b-eagle3").url)
    metrics_port = free_port()
    operator.extra_args = ["--metrics-port", str(metrics_port), "--metrics-address", "127.0.0.1"]
    operator.start()
    for (name, gpus), keep_base_warm in ((WARM, True), (COLD, False)):
        # Blackwell: eleven 8-GPU nodes, room for both resources (the one Hopper node has 8 GPUs in all).
        cr = example(
            "llama31-8b-eagle3.yaml",
            name,
            namespace,
            annotations=compatible_annotations(),
            resources__gpus=gpus,
            resources__gpuFamily="blackwell",
            rollout__keepBaseWarm=keep_base_warm,
        )
        cr["metadata"]["annotations"] = {steering.PROMOTE: "GPU accounting test"}
        custom_objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, cr)

    def ready_pods(name: str, variant: str) -> int:
        pods = variant_pods(core_v1, namespace, name, variant)
        return sum(1 for p in pods if any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or []))

    # keepBaseWarm true: both servers up, the stable Service on the speculative one; the base's GPUs serve no
    # traffic and are not probed: idle.
    name, gpus = WARM
    wait_until(lambda: ready_pods(name, "base") == 1 and ready_pods(name, "speculative") == 1, timeout=90, message=f"{name}: both servers Ready")
    expected = {"base": gpus, "speculative": gpus, "idle": gpus}
    # Promoted by hand at creation: Deploying until a step has seen the speculative server Ready, then Promoted.
    st = wait_until(
        lambda: (s := status(custom_objects, namespace, name)).get("gpus") == expected and s.get("phase") == "Promoted" and s,
        timeout=30,
        message=f"{name}: Promoted with gpus {expected}",
    )
    assert st["activeVariant"] == "speculative", st

    # keepBaseWarm false: the base is scaled to 0; once its pod is gone nothing is held for nothing.
    name, gpus = COLD
    wait_until(
        lambda: ready_pods(name, "speculative") == 1 and not variant_pods(core_v1, namespace, name, "base"),
        timeout=90,
        message=f"{name}: the speculative server Ready and no base pod",
    )
    expected = {"base": 0, "speculative": gpus, "idle": 0}
    # Promoted by hand at creation: Deploying until a step has seen the speculative server Ready, then Promoted.
    st = wait_until(
        lambda: (s := status(custom_objects, namespace, name)).get("gpus") == expected and s.get("phase") == "Promoted" and s,
        timeout=30,
        message=f"{name}: Promoted with gpus {expected}",
    )
    assert st["activeVariant"] == "speculative", st

    # The operator's own metrics say the same (SpecdecIdleGpus fires on specdec_idle_gpus).
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    want = {
        WARM[0]: {"base": WARM[1], "speculative": WARM[1], "idle": WARM[1]},
        COLD[0]: {"base": 0, "speculative": COLD[1], "idle": 0},
    }

    def scraped() -> dict:
        return demo.gpu_metrics(urllib.request.urlopen(url, timeout=5).read().decode(), namespace)

    wait_until(lambda: scraped() == want, timeout=30, message=f"specdec_gpus / specdec_idle_gpus {want}")
    # make demo's closing check, on these objects as the API server returns them (CRD defaults applied): it
    # derives the same numbers from each spec and finds nothing wrong.
    items = custom_objects.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]
    assert {i["metadata"]["name"]: demo.expected_gpus(i) for i in items} == want
    lines, wrong = demo.gpu_report(items, scraped())
    assert wrong == [] and len(lines) == 2, (lines, wrong)
