"""Runtime.step / execute(plan) against a fake writer and a fake probe scheduler: what is written, in which
order, which Events are posted, and that a restarted process repeats none of them."""

from __future__ import annotations

from prometheus_client import generate_latest

from specdec_operator import manifests as m
from tests.support.runtime import Cluster, decision, llama_spec


def test_the_first_step_creates_the_servers_with_the_status_and_the_stable_service_beside_it() -> None:
    cluster = Cluster(llama_spec())
    cluster.step()
    calls = cluster.writer.calls
    assert sorted(c for c in calls if c[0] != "status") == [
        ("Deployment", "llama-base"),
        ("Deployment", "llama-spec"),
        ("Service", "llama"),
        ("Service", "llama-base"),
        ("Service", "llama-spec"),
    ]
    assert cluster.writer.beside_the_step == ["llama"]
    # The scale subresource's fields (replicas, selector) are written for every resource, one server or a fleet.
    fleet_fields = ["readyReplicas", "replicas", "rolloutProgress", "selector", "speculativeReplicas"]
    assert [c for c in calls if c[0] == "status"] == [
        (
            "status",
            sorted(
                [
                    "activeVariant",
                    "conditions",
                    "gpus",
                    "message",
                    "observedGeneration",
                    "phase",
                    "reason",
                    "waitingFor",
                    "waitingSince",
                    *fleet_fields,
                ]
            ),
        )
    ]
    assert cluster.writer.status["phase"] == "Pending" and cluster.writer.events == []


def test_a_promotion_posts_its_events_counts_the_probe_and_a_restart_repeats_nothing() -> None:
    cluster = Cluster(llama_spec())
    cluster.step()
    cluster.ready_pods("base", "speculative")
    plan = cluster.step()
    assert cluster.probes.started == [plan.revision]
    assert [e.reason for e in cluster.writer.events] == ["DrafterCompatible", "ProbeStarted"]
    cluster.probes.result = decision(plan.revision, "promote", "SpeedupConfirmed")
    cluster.writer.calls.clear()
    cluster.step()
    assert cluster.writer.status["phase"] == "Promoted" and cluster.probes.settled == 1
    # The probe's evidence is spent once its result is in status: deleted after the status write (a retry measures anew).
    deleted = ("delete", "ConfigMap", m.probe_evidence_config_map_name("llama"))
    assert cluster.writer.calls.count(deleted) == 1
    assert cluster.writer.calls.index(deleted) > max(i for i, c in enumerate(cluster.writer.calls) if c[0] == "status")
    assert [c for c in cluster.writer.calls if c[0] == "event"] == [("event", "SpeedupConfirmed"), ("event", "TrafficSwitched")]
    # The status is written before the Events are posted: an Event never announces what status does not say.
    assert cluster.writer.calls.index(("Service", "llama")) < cluster.writer.calls.index(("event", "SpeedupConfirmed"))
    text = generate_latest(cluster.metrics.registry).decode()
    assert 'specdec_probes_total{decision="promote",name="llama",namespace="ns",reason="SpeedupConfirmed"} 1.0' in text

    cluster.runtime = cluster.new_process()  # a restarted operator: only the stored status is left
    cluster.writer.calls.clear()
    cluster.step()
    assert cluster.writer.calls == [] and cluster.probes.started == []


def test_a_switch_that_scales_the_loser_applies_services_first_and_the_status_with_the_deployments() -> None:
    cluster = Cluster(llama_spec(keepBaseWarm=False))
    cluster.step()
    cluster.ready_pods("base", "speculative")
    plan = cluster.step()
    cluster.probes.result = decision(plan.revision, "promote", "SpeedupConfirmed")
    cluster.writer.calls.clear()
    cluster.step()
    writes = [c for c in cluster.writer.calls if c[0] not in ("event", "delete")]  # the spent evidence's deletion comes after
    # Two waves: the stable Service leaves the base first; the base's scale-down and the status patch go together.
    assert writes[0] == ("Service", "llama")
    assert sorted(w[0] for w in writes[1:]) == ["Deployment", "status"] and ("Deployment", "llama-base") in writes[1:]
    assert cluster.writer.children[("Deployment", "llama-base")]["spec"]["replicas"] == 0


def test_a_rollback_counts_in_the_rollback_metric_once() -> None:
    cluster = Cluster(llama_spec())
    cluster.step()
    cluster.ready_pods("base", "speculative")
    plan = cluster.step()
    cluster.probes.result = decision(plan.revision, "rollback", "SpeedupBelowThreshold")
    cluster.step()
    cluster.step()
    assert cluster.writer.status["phase"] == "RolledBack"
    rollbacks = [e for e in cluster.writer.events if e.rollback]
    assert [e.reason for e in rollbacks] == ["SpeedupBelowThreshold"] and "the base server keeps serving" in rollbacks[0].message
    text = generate_latest(cluster.metrics.registry).decode()
    assert 'specdec_rollbacks_total{name="llama",namespace="ns",reason="SpeedupBelowThreshold"} 1.0' in text


def test_a_name_held_by_someone_else_is_left_alone_and_reported_once() -> None:
    cluster = Cluster(llama_spec())
    foreign = m.service("llama", "ns", "base")
    foreign["metadata"]["ownerReferences"] = [{"uid": "someone-else"}]
    cluster.writer.taken["llama"] = foreign
    cluster.step()
    assert ("refused", "llama") in cluster.writer.calls and ("Service", "llama") not in cluster.writer.children
    cluster.step()  # the refusal is remembered: this step sees the conflict
    cluster.step()
    assert cluster.writer.status["phase"] == "Failed" and cluster.writer.status["reason"] == "NameConflict"
    assert [e.reason for e in cluster.writer.events] == ["NameConflict"]


def test_a_spec_the_operator_cannot_serve_fails_once_with_its_reason() -> None:
    spec = llama_spec()
    spec["sglangVersion"] = "0.5.9"  # disagrees with the image's tag: admitted by a CRD older than the rule, refused by the parser
    cluster = Cluster(spec)
    assert cluster.step() is None
    assert cluster.step() is None
    assert cluster.writer.status["phase"] == "Failed" and cluster.writer.status["reason"] == "InvalidSpec"
    assert "sglangVersion 0.5.9 disagrees with image" in cluster.writer.status["message"]
    assert [e.reason for e in cluster.writer.events] == ["InvalidSpec"]
    assert not any(c[0] in ("Deployment", "Service") for c in cluster.writer.calls)


def test_a_name_that_cannot_name_services_fails_once_and_creates_nothing() -> None:
    cluster = Cluster(llama_spec(), name="attacker.example.com")
    assert cluster.step() is None
    assert cluster.step() is None
    status = cluster.writer.status
    assert status["phase"] == "Failed" and status["reason"] == "InvalidSpec"
    assert "metadata.name 'attacker.example.com'" in status["message"] and "'attacker-example-com'" in status["message"]
    assert [e.reason for e in cluster.writer.events] == ["InvalidSpec"]
    assert not any(c[0] in ("Deployment", "Service") for c in cluster.writer.calls)


def test_a_child_the_api_server_refuses_keeps_the_phase_failed_until_it_is_accepted() -> None:
    cluster = Cluster(llama_spec())
    cluster.writer.rejected.add("llama-spec")
    cluster.step()
    assert cluster.writer.status["phase"] == "Failed" and cluster.writer.status["reason"] == "ApplyRejected"
    for _ in range(3):  # still refused: each step retries the children, and the status never leaves Failed
        cluster.writer.calls.clear()
        cluster.step()
        assert ("rejected", "llama-spec") in cluster.writer.calls
        assert cluster.writer.status["phase"] == "Failed", cluster.writer.status
    assert [e.reason for e in cluster.writer.events].count("ApplyRejected") == 1
    cluster.writer.rejected.clear()  # e.g. an admission webhook fixed
    cluster.step()
    assert cluster.writer.status["phase"] not in ("Failed", "Probing") and ("Service", "llama-spec") in cluster.writer.children
    cluster.ready_pods("base", "speculative")
    cluster.step()
    assert cluster.writer.status["phase"] == "Probing"


def test_a_refused_deletion_of_spent_evidence_does_not_fail_the_step() -> None:
    # A chart older than the operator grants no delete on ConfigMaps: the evidence stays, the decision stands.
    cluster = Cluster(llama_spec())
    cluster.writer.refuse_delete.add("ConfigMap")
    cluster.step()
    cluster.ready_pods("base", "speculative")
    plan = cluster.step()
    cluster.probes.result = decision(plan.revision, "promote", "SpeedupConfirmed")
    cluster.step()
    assert cluster.writer.status["phase"] == "Promoted" and cluster.probes.settled == 1
    assert ("delete", "ConfigMap", m.probe_evidence_config_map_name("llama")) in cluster.writer.calls
    assert [e.reason for e in cluster.writer.events if e.reason in ("SpeedupConfirmed", "TrafficSwitched")] == ["SpeedupConfirmed", "TrafficSwitched"]
