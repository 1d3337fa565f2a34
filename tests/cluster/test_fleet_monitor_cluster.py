"""The fleet monitor on the real control plane: six Ready speculative pods, each behind its own SGLang simulator.

One pod's drafter accepts nothing: the operator names that pod in a SpeculativePodSick Warning (status.monitor.sickPods)
and keeps the fleet promoted, since the fleet's acceptance length (weighted by verify calls) stays above the floor.
Then every pod drifts: the aggregate goes below the floor and the fleet is rolled back (AcceptanceDrift).

The five extra speculative pods are made by the test (kwok pods from the speculative Deployment's own pod template,
owned by the SpeculativeServer so the garbage collector removes them and no ReplicaSet adopts them): the fleet walk
that makes spec.replicas pods is wired separately, and what is tested here is the monitor's view of N Ready pods.
Each pod is mapped to its simulator in the operator's --endpoints file (``namespace/pod/<pod>``), written after the
pods exist: the operator reads the file again when it changes.
"""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import yaml

from tests.support.kube import wait_until
from tests.support.operator_process import (
    GROUP,
    LLAMA_EAGLE3_SCRIPT,
    PLURAL,
    VERSION,
    Operator,
    compatible_annotations,
    events,
    example,
    get,
    status,
    variant_pods,
    wait_phase,
)

pytestmark = pytest.mark.cluster

MONITOR_TIME_SCALE = 4.0  # the extra pods' simulators: only the monitor's traffic, kept light for the shared machine


@contextmanager
def round_robin_traffic(urls: list[str], tokens: int = 64) -> Iterator[None]:
    """One client sending /generate to each URL in turn (as a Service spreads requests over its pods)."""
    stop = threading.Event()
    body = json.dumps({"text": "hello " * 16, "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True}}).encode()

    def send() -> None:
        while not stop.is_set():
            for url in urls:
                request = urllib.request.Request(url + "/generate", data=body, headers={"Content-Type": "application/json"})
                try:
                    urllib.request.urlopen(request, timeout=10).read()
                except (OSError, http.client.HTTPException):  # refused, reset or timed out (URLError is an OSError): next
                    time.sleep(0.2)
            time.sleep(0.05)

    worker = threading.Thread(target=send, name="traffic", daemon=True)
    worker.start()
    try:
        yield
    finally:
        stop.set()
        worker.join(15)


def write_endpoints(op: Operator) -> None:
    """Rewrite the operator's endpoints file in place (atomically: it is read again when it changes)."""
    path = op.workdir / "endpoints.yaml"
    tmp = op.workdir / "endpoints.yaml.tmp"
    tmp.write_text(yaml.safe_dump(op.endpoints))
    os.replace(tmp, path)


def make_speculative_pods(core_v1: Any, apps_v1: Any, owner: dict, namespace: str, name: str, count: int) -> list[str]:
    template = apps_v1.api_client.sanitize_for_serialization(apps_v1.read_namespaced_deployment(f"{name}-spec", namespace).spec.template)
    reference = {"apiVersion": f"{GROUP}/{VERSION}", "kind": owner["kind"], "name": name, "uid": owner["metadata"]["uid"], "controller": True}
    names = []
    for i in range(count):
        pod_name = f"{name}-spec-fleet-{i}"
        metadata = {**template["metadata"], "name": pod_name, "namespace": namespace, "ownerReferences": [reference]}
        core_v1.create_namespaced_pod(namespace, {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": template["spec"]})
        names.append(pod_name)
    return names


def sick_events(core_v1: Any, namespace: str, name: str) -> list:
    return [e for e in events(core_v1, namespace, name) if e.reason == "SpeculativePodSick"]


def test_one_sick_pod_among_six_is_named_in_an_event_and_the_aggregate_going_bad_rolls_back(
    operator: Operator, sims: Any, namespace: str, custom_objects: Any, core_v1: Any, apps_v1: Any
) -> None:
    name = "fleet"
    base = sims.start("llama31-8b-base")
    first = sims.start("llama31-8b-eagle3")
    operator.map(f"{name}-base", base.url)
    operator.map(f"{name}-spec", first.url)
    # The promotion is scripted (the profile's truth, about 2x): the test is about the monitor of a promoted fleet,
    # which reads the simulators' real /metrics; a measured promotion once came out Inconclusive on a busy machine.
    operator.script(name, **LLAMA_EAGLE3_SCRIPT)
    operator.start()
    cr = example(
        "llama31-8b-eagle3.yaml",
        name,
        namespace,
        annotations=compatible_annotations(),
        monitor__interval=5,
        monitor__window=2,
        monitor__acceptLengthFloor=1.5,
    )
    custom_objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, cr)
    st = wait_phase(custom_objects, namespace, name, {"Promoted", "RolledBack", "Invalid", "Failed"}, timeout=180)
    assert st["phase"] == "Promoted", st.get("message")

    # Five more Ready speculative pods, each with its own simulator; the fourth one's drafter accepts nothing.
    extra = make_speculative_pods(core_v1, apps_v1, get(custom_objects, namespace, name), namespace, name, 5)
    wait_until(
        lambda: (
            sum(
                1
                for p in variant_pods(core_v1, namespace, name, "speculative")
                if any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
            )
            == 6
        ),
        timeout=60,
        message="6 Ready speculative pods",
    )
    (deployment_pod,) = [p.metadata.name for p in variant_pods(core_v1, namespace, name, "speculative") if p.metadata.name not in extra]
    pod_sims = {deployment_pod: first}
    for pod_name in extra:
        pod_sims[pod_name] = sims.start("llama31-8b-eagle3", time_scale=MONITOR_TIME_SCALE, seed=len(pod_sims))
    sick = extra[3]
    pod_sims[sick].sim.engine.set_accept_length_mean(1.0)
    for pod_name, sim in pod_sims.items():
        operator.endpoints[f"{namespace}/pod/{pod_name}"] = sim.url
    write_endpoints(operator)

    with round_robin_traffic([s.url for s in pod_sims.values()]):
        wait_until(lambda: sick_events(core_v1, namespace, name), timeout=90, message="a SpeculativePodSick Event")
        (event,) = sick_events(core_v1, namespace, name)
        assert event.type == "Warning" and f"speculative pod {sick}:" in event.message
        monitor = status(custom_objects, namespace, name)["monitor"]
        assert [p["name"] for p in monitor["sickPods"]] == [sick] and monitor["pods"] == 6
        # The fleet stays promoted over more than monitor.window further scrapes: one pod does not roll it back.
        scraped = monitor["lastScrapeTime"]
        for _ in range(3):
            wait_until(lambda: status(custom_objects, namespace, name)["monitor"]["lastScrapeTime"] != scraped, timeout=30, message="a new scrape")
            st = status(custom_objects, namespace, name)
            scraped = st["monitor"]["lastScrapeTime"]
            assert st["phase"] == "Promoted", st.get("message")
            assert st["monitor"]["acceptLength"] > 1.5 and st["monitor"]["belowFloorCount"] == 0
        assert [p["name"] for p in st["monitor"]["sickPods"]] == [sick]
        assert len(sick_events(core_v1, namespace, name)) == 1 and (sick_events(core_v1, namespace, name)[0].count or 1) == 1

        # Every pod drifts: the aggregate goes below the floor and the fleet goes back to the base.
        for sim in pod_sims.values():
            sim.sim.engine.set_accept_length_mean(1.0)
        st = wait_phase(custom_objects, namespace, name, {"RolledBack"}, timeout=90)
    assert st["reason"] == "AcceptanceDrift" and st["activeVariant"] == "base"
    assert "over 6 pods" in st["probe"]["message"], st["probe"]["message"]
    assert st["monitor"]["belowFloorCount"] >= 2 and st["monitor"]["acceptLength"] < 1.5
    assert core_v1.read_namespaced_service(name, namespace).spec.selector["specdec.io/variant"] == "base"
