"""Crashes: the real `specdec run` SIGKILLed at every phase, then restarted; two replicas with leader election.

Complements tests/cluster/test_operator_e2e.py, which kills the operator mid-probe. Here it is killed while the drafter is
being validated, while the servers load, right after a decision was recorded, and in the middle of a drift
rollback's window; and with two replicas under Kopf peering the leader is killed mid-probe. Each time the
operator must resume from the cluster's state alone:

- no duplicate objects (exactly two Deployments, three Services, one ReplicaSet and one pod per server);
- no second probe of a decided revision (ProbeStarted and the decision's Event counted on the resource);
- no flip-flop of the stable Service: a watcher records every selector the Service ever had, and the history
  must be exactly the transitions the story requires (base, then speculative, then base for a rollback).

The pods are kwok pods whose outcomes are scripted with specdec.test/* annotations (docs/development.md); the
servers are in-process SGLang simulators reached through the operator's --endpoints mapping.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.kube import wait_until
from tests.support.operator_process import (
    LLAMA_EAGLE3_SCRIPT,
    compatible_annotations,
    event_reasons,
    example,
    logged_events,
    settled_event_reasons,
    status,
    step_after_now,
    wait_phase,
)
from tests.support.operator_replicas import DECIDED, PEERING_LIFETIME, Cluster, watch_selector
from tests.support.simulators import generate_traffic

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
# Decided on scripted evidence (the llama31-8b-eagle3 profile's truth, about 2x; probe/scripted.py): these tests are
# about what a killed and restarted operator does with a probe and its decision, not about measuring, so a busy
# machine cannot turn their decisions Inconclusive (LLAMA_EAGLE3_SCRIPT). The drift monitor still reads the
# simulators' real /metrics.

# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("phase", "annotations"),
    [
        # The validator (init container) takes 4 s: the resource sits in Validating.
        ("Validating", {**compatible_annotations(), "specdec.test/init-after": "4s"}),
        # The servers take 5 s to load after validation: the resource sits in Deploying ("loading weights").
        ("Deploying", compatible_annotations(ready_after="5s")),
    ],
)
def test_killed_while_validating_or_deploying_resumes_without_duplicates(phase: str, annotations: dict, cluster: Cluster) -> None:
    name = "crash"
    cluster.serve(name)
    cluster.script(name, **LLAMA_EAGLE3_SCRIPT)
    op = cluster.replica()
    op.start()
    cluster.create(example("llama31-8b-eagle3.yaml", name, cluster.namespace, annotations=annotations))
    history = watch_selector(cluster, name)
    wait_phase(cluster.custom, cluster.namespace, name, {phase}, timeout=30)
    op.kill()
    assert status(cluster.custom, cluster.namespace, name)["phase"] == phase

    op.start()
    st = wait_phase(cluster.custom, cluster.namespace, name, DECIDED, timeout=120)
    history.stop_at("speculative")
    assert st["phase"] == "Promoted", st.get("message")
    cluster.assert_no_duplicates(name)
    # Kopf posts Events in the background: the decision's Event can trail the status patch by a moment.
    wait_until(lambda: "SpeedupConfirmed" in event_reasons(cluster.core, cluster.namespace, name), timeout=20, message="the decision's Event")
    reasons = event_reasons(cluster.core, cluster.namespace, name)
    assert reasons.count("ProbeStarted") == 1 and reasons.count("SpeedupConfirmed") == 1, reasons
    assert reasons.count("DrafterCompatible") <= 1, reasons
    assert history.history == ["base", "speculative"]


def test_killed_right_after_a_decision_reads_it_back_and_probes_nothing(cluster: Cluster) -> None:
    name = "decided"
    cluster.serve(name)
    cluster.script(name, **LLAMA_EAGLE3_SCRIPT)
    op = cluster.replica()
    op.start()
    cluster.create(example("llama31-8b-eagle3.yaml", name, cluster.namespace, annotations=compatible_annotations()))
    history = watch_selector(cluster, name)
    deadline = time.monotonic() + 120
    while status(cluster.custom, cluster.namespace, name).get("phase") not in DECIDED:  # poll fast: kill at once
        assert time.monotonic() < deadline, "no decision in 120 s"
        time.sleep(0.02)
    op.kill()
    decided = status(cluster.custom, cluster.namespace, name)
    assert decided["phase"] == "Promoted", decided.get("message")

    op.start()
    # Steps of the restarted operator (seen: step_after_now), and a restart of it once more for good measure.
    st = step_after_now(cluster.custom, cluster.namespace, name)
    assert st["phase"] == "Promoted" and st["probe"]["revision"] == decided["probe"]["revision"], st.get("message")
    op.kill()
    op.start()
    step_after_now(cluster.custom, cluster.namespace, name)
    history.stop_at("speculative")
    st = status(cluster.custom, cluster.namespace, name)
    assert st["phase"] == "Promoted" and st["probe"]["revision"] == decided["probe"]["revision"]
    # The same probe, not a second one (a scripted probe sends no requests: ProbeStarted is counted below).
    assert st["probe"]["finishedAt"] == decided["probe"]["finishedAt"], "a decided revision was probed again"
    # The decision lives in status; its Event is best-effort (Kopf posts Events from a queue after the status patch,
    # and Kubernetes does not promise Event delivery). A SIGKILL within milliseconds of the patch - which is what this
    # test does - can drop it (CI at d223958 saw that once), so the check is that no decision is announced twice.
    assert st["reason"] == "SpeedupConfirmed", st
    reasons = event_reasons(cluster.core, cluster.namespace, name)
    assert reasons.count("ProbeStarted") == 1 and reasons.count("SpeedupConfirmed") <= 1, reasons
    restarted = "\n".join(op.log_of(start) for start in range(2, op.starts + 1))
    assert logged_events(restarted, name, "ProbeStarted") == 0 and logged_events(restarted, name, "SpeedupConfirmed") == 0
    cluster.assert_no_duplicates(name)
    assert history.history == ["base", "speculative"]


def test_killed_during_a_drift_rollback_rolls_back_once_and_never_flaps(cluster: Cluster) -> None:
    name = "drift"
    _base, spec = cluster.serve(name)
    cluster.script(name, **LLAMA_EAGLE3_SCRIPT)
    op = cluster.replica()
    op.start()
    cluster.create(
        example("llama31-8b-eagle3.yaml", name, cluster.namespace, annotations=compatible_annotations(), monitor__interval=5, monitor__window=3)
    )
    history = watch_selector(cluster, name)
    st = wait_phase(cluster.custom, cluster.namespace, name, DECIDED, timeout=120)
    assert st["phase"] == "Promoted", st.get("message")

    # Acceptance collapses under production traffic; kill the operator once the drift window has started.
    healthy_accept_length = spec.sim.profile.speculative.accept_length_mean
    spec.sim.engine.set_accept_length_mean(1.0)  # nothing accepted any more
    with generate_traffic(spec.url, tokens=16):
        wait_until(
            lambda: ((status(cluster.custom, cluster.namespace, name).get("monitor") or {}).get("belowFloorCount") or 0) >= 1,
            timeout=60,
            interval=0.1,
            message="the first scrape below the floor",
        )
        op.kill()
        mid = status(cluster.custom, cluster.namespace, name)
        assert mid["phase"] == "Promoted" and 1 <= mid["monitor"]["belowFloorCount"] < 3
        op.start()
        st = wait_phase(cluster.custom, cluster.namespace, name, {"RolledBack"}, timeout=90)
    assert st["reason"] == "AcceptanceDrift" and st["activeVariant"] == "base"
    # Acceptance recovers: the rolled-back revision stays rolled back (no flapping) in the steps after that, and
    # nothing is probed again.
    spec.sim.engine.set_accept_length_mean(healthy_accept_length)
    st = step_after_now(cluster.custom, cluster.namespace, name)
    history.stop_at("base")
    assert st["phase"] == "RolledBack" and st["reason"] == "AcceptanceDrift", st.get("message")
    assert logged_events(op.logs(), name, "AcceptanceDrift") == 1 and logged_events(op.logs(), name, "ProbeStarted") == 1, op.logs()[-3000:]
    reasons = event_reasons(cluster.core, cluster.namespace, name)
    assert reasons.count("AcceptanceDrift") == 1 and reasons.count("ProbeStarted") == 1, reasons
    cluster.assert_no_duplicates(name)
    assert history.history == ["base", "speculative", "base"]


def test_two_replicas_the_leader_killed_mid_probe_the_other_takes_over_and_decides_once(cluster: Cluster, kube_cluster: Any) -> None:
    from kubernetes import client

    crds = REPO / "charts" / "specdec-operator" / "crds" / "kopf.dev_kopfpeerings.yaml"
    if not crds.exists():
        pytest.fail(f"{crds} missing: the chart ships Kopf's peering CRDs", pytrace=False)
    kube_cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crds), check=True)
    kube_cluster.kubectl("wait", "--for=condition=Established", "crd/kopfpeerings.kopf.dev", "--timeout=60s", check=True)
    wait_until(
        lambda: client.CustomObjectsApi(cluster.custom.api_client).create_namespaced_custom_object(
            "kopf.dev",
            "v1",
            cluster.namespace,
            "kopfpeerings",
            {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": "specdec-test"}},
        ),
        timeout=30,
        message="KopfPeering created",
    )

    name = "peered"
    cluster.serve(name)
    # 10 s a scripted round (2 rounds decide it): the probe is still running at the kill.
    cluster.script(name, **LLAMA_EAGLE3_SCRIPT, secondsPerRound=10)
    args = ("--peering", "specdec-test", "--peering-lifetime", str(PEERING_LIFETIME))
    leader, follower = cluster.replica(*args), cluster.replica(*args)

    def peers() -> dict:
        return cluster.custom.get_namespaced_custom_object("kopf.dev", "v1", cluster.namespace, "kopfpeerings", "specdec-test").get("status") or {}

    # Both start paused (the peering is mandatory) and act only once the peering shows no older live peer: the leader
    # resumes alone, then the follower (younger: the lower priority) announces itself and stays paused.
    leader.start()
    wait_until(lambda: "Resuming operations" in leader.logs(), timeout=60, message="the leader resuming, alone in the peering")
    follower.start()
    wait_until(lambda: len(peers()) == 2, timeout=60, message="the follower's keep-alive in the peering")
    cluster.create(example("llama31-8b-eagle3.yaml", name, cluster.namespace, annotations=compatible_annotations()))
    history = watch_selector(cluster, name)
    probe_revision = wait_phase(cluster.custom, cluster.namespace, name, {"Probing"}, timeout=60)["probe"]["revision"]
    wait_until(lambda: logged_events(leader.logs(), name, "ProbeStarted") == 1, timeout=30, message="the leader probing")
    assert "Resuming operations" not in follower.logs() and logged_events(follower.logs(), name, "ProbeStarted") == 0  # paused
    leader.kill()
    killed = time.monotonic()

    # The follower's own log line of its ProbeStarted (written in the step that starts the probe), not the Event, which
    # Kopf posts from a queue after the step: the takeover measured is the peering's, not the Event queue's (make test
    # at 6d5683a timed out here once on a loaded machine, waiting on the Event).
    wait_until(
        lambda: logged_events(follower.logs(), name, "ProbeStarted") == 1,
        timeout=PEERING_LIFETIME + 30,
        message="the follower resuming the probe",
    )
    takeover = time.monotonic() - killed
    st = wait_phase(cluster.custom, cluster.namespace, name, DECIDED, timeout=180)
    history.stop_at("speculative")
    print(f"\nleader killed mid-probe: the follower resumed after {takeover:.1f}s (peering lifetime {PEERING_LIFETIME}s)")
    assert takeover <= PEERING_LIFETIME + 15
    assert st["phase"] == "Promoted", st.get("message")
    # Kopf posts Events in the background: the decision's Event can trail the status patch by a moment.
    wait_until(lambda: "SpeedupConfirmed" in event_reasons(cluster.core, cluster.namespace, name), timeout=20, message="the decision's Event")
    # Steps after the decision decide nothing again; the follower resumed once, after the kill, before its probe.
    st = step_after_now(cluster.custom, cluster.namespace, name)
    assert st["phase"] == "Promoted" and st["probe"]["revision"] == probe_revision, st.get("message")
    assert logged_events(follower.logs(), name, "SpeedupConfirmed") == 1 and logged_events(leader.logs(), name, "SpeedupConfirmed") == 0
    followed = follower.logs()
    assert followed.count("Resuming operations") == 1 and followed.index("Resuming operations") < followed.index("ProbeStarted"), followed[-3000:]
    reasons = settled_event_reasons(cluster.core, cluster.namespace, name, lambda r: r.count("ProbeStarted") >= 2)
    assert reasons.count("SpeedupConfirmed") == 1 and reasons.count("ProbeStarted") == 2, reasons
    assert follower.proc.poll() is None
    cluster.assert_no_duplicates(name)
    assert history.history == ["base", "speculative"]
