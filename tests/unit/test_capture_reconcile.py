"""spec.retraining.capture in reconcile (docs/capture.md): turning it on renders the claim, ``<name>-serving`` and the
capture proxies without touching a server; the stable Service selects the proxies only while one is Ready (capture
fails open); promotion re-points ``<name>-serving``; turning it off re-points the stable Service and deletes the
claim, the Service and the proxies; status.retraining.capture and its Events say so, naming no prompt."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from specdec_operator import manifests as m
from specdec_operator.api_retraining import CaptureSettings, Retraining
from specdec_operator.reconcile import Plan
from specdec_operator.reconcile.capture_objects import ANNOTATION_CAPTURE, CAPTURE_APP, claim_size, proxy_deployment, routing_service
from specdec_operator.resource import parse_spec
from tests.support.world import World, llama_spec, reasons, to_promoted

CAPTURE = {"sampleShare": 0.05, "maxBytes": 2 << 30, "retentionHours": 24, "redaction": {"patterns": ["[0-9]{4}"]}}


class CaptureWorld(World):
    """The World, with the claims the plans applied."""

    def __init__(self, spec: dict) -> None:
        super().__init__(spec)
        self.claims: dict = {}


def step(world: CaptureWorld, **observed) -> Plan:
    """world.step(), keeping claims apart from Services (the World files unknown kinds as Services) and carrying out
    the plan's deletions."""
    plan = world.step(**observed)
    for name, obj in list(world.services.items()):
        if obj["kind"] == "PersistentVolumeClaim":
            world.claims[name] = world.services.pop(name)
    for obj in plan.delete:
        store = {"Deployment": world.deployments, "PersistentVolumeClaim": world.claims}.get(obj["kind"], world.services)
        store.pop(obj["metadata"]["name"], None)
    return plan


def server_templates(world: CaptureWorld) -> dict[str, str]:
    return {
        n: d["spec"]["template"]["metadata"]["annotations"][m.ANNOTATION_TEMPLATE_HASH] for n, d in world.deployments.items() if n != "llama-capture"
    }


def proxy_ready(world: CaptureWorld, ready: int) -> None:
    world.deployments["llama-capture"]["status"] = {"readyReplicas": ready}


def capture_state(plan: Plan) -> str | None:
    return ((plan.status.get("retraining") or {}).get("capture") or {}).get("state")


def test_off_by_default_nothing_more_is_rendered() -> None:
    world = CaptureWorld(llama_spec())
    plan = step(world)
    assert parse_spec(llama_spec()).retraining is None
    assert {o["metadata"]["name"] for o in plan.apply} == {"llama", "llama-base", "llama-spec"}
    assert plan.status["retraining"] is None and plan.delete == []


def test_turning_capture_on_then_off_restarts_no_server_and_deletes_the_data() -> None:
    world = CaptureWorld(llama_spec())
    to_promoted(world)
    step(world)
    before = server_templates(world)
    stable_selector = dict(world.services["llama"]["spec"]["selector"])
    assert stable_selector[m.LABEL_VARIANT] == "speculative"

    world.spec_dict = llama_spec(**{"retraining.capture": CAPTURE})
    world.generation += 1
    plan = step(world)
    kinds = [(o["kind"], o["metadata"]["name"]) for o in plan.apply]
    assert ("PersistentVolumeClaim", "llama-capture") in kinds and ("Deployment", "llama-capture") in kinds and ("Service", "llama-serving") in kinds
    assert ("Deployment", "llama-base") not in kinds and ("Deployment", "llama-spec") not in kinds  # no server changes
    assert world.services["llama"]["spec"]["selector"] == stable_selector  # not re-pointed before a proxy is Ready
    assert world.services["llama-serving"]["spec"]["selector"] == stable_selector
    assert world.claims["llama-capture"]["spec"]["resources"]["requests"]["storage"] == "3Gi"
    assert capture_state(plan) == "Starting" and "CaptureStarting" in reasons(plan)
    assert "not restarted" in next(e.message for e in plan.events if e.reason == "CaptureStarting")

    proxy_ready(world, 1)
    plan = step(world)
    stable = world.services["llama"]
    assert stable["spec"]["selector"] == {m.LABEL_NAME: CAPTURE_APP, m.LABEL_INSTANCE: "llama"}
    assert stable["metadata"]["annotations"][ANNOTATION_CAPTURE] == "llama-capture"
    assert stable["metadata"]["annotations"][m.ANNOTATION_ACTIVE_VARIANT] == "speculative"
    assert capture_state(plan) == "On" and "CaptureStarted" in reasons(plan)
    assert not any(o["kind"] == "PersistentVolumeClaim" for o in plan.apply)  # applied with its Deployment only
    assert step(world).apply == []  # settles
    assert server_templates(world) == before
    # The routing is read from <name>-serving while the stable Service selects the proxies.
    assert routing_service(world.services, "llama") is world.services["llama-serving"]

    proxy_ready(world, 0)  # every proxy down: the servers serve directly
    plan = step(world)
    assert world.services["llama"]["spec"]["selector"] == stable_selector
    assert capture_state(plan) == "Bypassed" and [e.type for e in plan.events if e.reason == "CaptureBypassed"] == ["Warning"]
    proxy_ready(world, 1)
    assert capture_state(step(world)) == "On"

    world.spec_dict = llama_spec(**{"retraining.capture": {**CAPTURE, "enabled": False}})
    world.generation += 1
    plan = step(world)
    assert [(o["kind"], o["metadata"]["name"]) for o in plan.delete] == [
        ("PersistentVolumeClaim", "llama-capture"),
        ("Service", "llama-serving"),
        ("Deployment", "llama-capture"),
    ]
    assert world.services["llama"]["spec"]["selector"] == stable_selector  # re-pointed in the same step, before the deletions
    assert ANNOTATION_CAPTURE not in (world.services["llama"]["metadata"].get("annotations") or {})
    assert capture_state(plan) == "Off" and "CaptureStopped" in reasons(plan)
    assert not plan.settled
    again = step(world)
    assert again.status["retraining"] is None and again.events == [] and again.delete == [] and again.apply == []
    assert server_templates(world) == before
    assert not world.claims and "llama-capture" not in world.deployments and "llama-serving" not in world.services


def test_a_promotion_while_capturing_re_points_the_serving_service() -> None:
    world = CaptureWorld(llama_spec(**{"retraining.capture": CAPTURE}))
    step(world)
    proxy_ready(world, 1)
    step(world)
    assert world.services["llama"]["spec"]["selector"][m.LABEL_NAME] == CAPTURE_APP
    assert world.services["llama-serving"]["spec"]["selector"][m.LABEL_VARIANT] == "base"
    plan = to_promoted(world)
    assert plan.status["phase"] == "Promoted"
    step(world)
    assert world.services["llama-serving"]["spec"]["selector"][m.LABEL_VARIANT] == "speculative"
    assert world.services["llama"]["spec"]["selector"][m.LABEL_NAME] == CAPTURE_APP


def test_the_proxy_deployment_renders_the_settings() -> None:
    spec = parse_spec(llama_spec(**{"retraining.capture": {**CAPTURE, "includeResponses": True, "redaction": {"url": "http://r.ns.svc/x"}}}))
    assert spec.retraining is not None and spec.retraining.capture is not None
    capture = spec.retraining.capture
    deployment = proxy_deployment("llama", "ns", spec, capture, m.ManifestSettings())
    pod = deployment["spec"]["template"]["spec"]
    command = pod["containers"][0]["command"]
    assert command[:2] == ["specdec", "capture"] and command[command.index("--upstream") + 1] == "http://llama-serving.ns.svc:30000"
    assert command[command.index("--sample-share") + 1] == "0.05" and "--include-responses" in command
    assert command[command.index("--redaction-url") + 1] == "http://r.ns.svc/x"
    assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == "llama-capture"
    assert "podAffinity" in pod["affinity"]  # ReadWriteOnce: every proxy on the claim's node
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    assert pod["automountServiceAccountToken"] is False and pod["containers"][0]["securityContext"]["runAsNonRoot"] is True
    assert claim_size(1 << 30) == "2Gi" and claim_size(1 << 20) == "1Gi"


def test_bad_capture_settings_are_refused_naming_the_field() -> None:
    with pytest.raises(ValidationError, match="not a Python regular expression"):
        Retraining.model_validate({"capture": {"redaction": {"patterns": ["(unclosed"]}}})
    with pytest.raises(ValidationError, match="sampleShare"):
        CaptureSettings.model_validate({"sampleShare": 0})
    with pytest.raises(ValidationError, match="sampleShare"):
        CaptureSettings.model_validate({"sampleShare": 1.5})
    with pytest.raises(ValidationError, match="unknown"):
        CaptureSettings.model_validate({"unknown": 1})
    assert CaptureSettings().model_dump(by_alias=True)["sampleShare"] == 0.01


def test_the_capture_objects_validate_against_the_kubernetes_schemas() -> None:
    """What the API server is sent (server-side apply): the claim, the proxies' Deployment, <name>-serving and the
    fronted stable Service, against the control plane's own schemas (strict: no unknown field)."""
    import kubernetes_validate

    from tests.unit.test_chart import kubernetes_version

    world = CaptureWorld(llama_spec(**{"retraining.capture": {**CAPTURE, "storageClassName": "encrypted", "accessMode": "ReadWriteMany"}}))
    step(world)
    proxy_ready(world, 1)
    step(world)
    objects = [world.claims["llama-capture"], world.deployments["llama-capture"], world.services["llama-serving"], world.services["llama"]]
    for obj in objects:
        body = {**obj, "metadata": {k: v for k, v in obj["metadata"].items() if k != "ownerReferences"}}
        kubernetes_validate.validate(body, kubernetes_version(), strict=True)
    assert world.claims["llama-capture"]["spec"]["storageClassName"] == "encrypted"
    assert "affinity" not in world.deployments["llama-capture"]["spec"]["template"]["spec"]  # ReadWriteMany: pods may spread


def test_the_claim_keeps_the_shape_it_was_created_with_and_is_made_again_while_no_proxy_is_ready() -> None:
    """A claim's class and access mode cannot change and a larger request needs an expanding class: a spec that
    changes them must not make the API server refuse the claim (phase Failed), so the claim keeps its first shape,
    and status says how to change it."""
    world = CaptureWorld(llama_spec(**{"retraining.capture": CAPTURE}))
    plan = step(world)
    assert plan.status["retraining"]["capture"]["claimSize"] == "3Gi"
    proxy_ready(world, 1)
    step(world)
    world.spec_dict = llama_spec(
        **{"retraining.capture": {**CAPTURE, "maxBytes": 8 << 30, "storageClassName": "other", "accessMode": "ReadWriteMany"}}
    )
    world.generation += 1
    plan = step(world)
    claims = [o for o in plan.apply if o["kind"] == "PersistentVolumeClaim"]
    assert len(claims) == 1 and claims[0]["spec"] == {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "3Gi"}}}
    command = world.deployments["llama-capture"]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--max-bytes") + 1] == str(8 << 30)  # the proxy takes the new cap (and the volume's free space)
    assert "podAffinity" in world.deployments["llama-capture"]["spec"]["template"]["spec"]["affinity"]  # still ReadWriteOnce
    capture = plan.status["retraining"]["capture"]
    assert capture["state"] == "On" and "keeps the size, class and access mode" in capture["message"]
    # A claim deleted behind the operator's back is made again while no proxy is Ready (claims are not watched).
    proxy_ready(world, 0)
    assert any(o["kind"] == "PersistentVolumeClaim" for o in step(world).apply)


def test_kubectl_specdec_status_says_the_capture_state_and_claim() -> None:
    from specdec_operator.cli.kubectl_specdec import describe
    from specdec_operator.reconcile import read_status

    world = CaptureWorld(llama_spec(**{"retraining.capture": CAPTURE}))
    step(world)
    proxy_ready(world, 1)
    plan = step(world)
    text = describe("llama", read_status(plan.status), {})
    assert "  capture: On, claim llama-capture (3Gi)" in text.splitlines()
    assert "capture" not in describe("llama", read_status(step(CaptureWorld(llama_spec())).status), {})
