"""The in-memory World for reconcile(): children applied by plans, pods scripted by the test, and the specs,
validator reports and probe results the reconcile tests (lifecycle, fleet, load-aware, monitor) start from."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml

from specdec_operator import manifests as m
from specdec_operator.controller.kopf_tuning import slim_pod
from specdec_operator.reconcile import Observed, Plan, Settings, reconcile
from specdec_operator.resource import parse_spec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NOW = datetime(2026, 12, 2, 10, 0, 0, tzinfo=UTC)
UID = "uid-1"


def llama_spec(**changes) -> dict:
    spec = yaml.safe_load((EXAMPLES / "llama31-8b-eagle3.yaml").read_text())["spec"]
    for dotted, value in changes.items():
        node = spec
        *path, last = dotted.split(".")
        for key in path:
            node = node.setdefault(key, {})
        node[last] = value
    return spec


class World:
    """A tiny in-memory cluster: children applied by plans, pods scripted by the test."""

    def __init__(self, spec: dict, name: str = "llama") -> None:
        self.spec_dict = spec
        self.name = name
        self.generation = 1
        self.status: dict = {}
        self.deployments: dict = {}
        self.services: dict = {}
        self.config_maps: dict = {}
        self.pods: list = []
        self.probe_running: str | None = None
        self.jobs: dict = {}  # training Jobs applied by plans (spec.retraining.training), by name

    @property
    def spec(self):
        return parse_spec(self.spec_dict)

    def step(self, now: datetime = NOW, settings: Settings | None = None, **observed) -> Plan:
        obs = Observed(
            name=self.name,
            namespace="ns",
            uid=UID,
            generation=self.generation,
            deployments=copy.deepcopy(self.deployments),
            services=copy.deepcopy(self.services),
            config_maps=copy.deepcopy(self.config_maps),
            pods=copy.deepcopy(self.pods),
            probe_running=observed.pop("probe_running", self.probe_running),
            training_jobs=observed.pop("training_jobs", copy.deepcopy(self.jobs)),
            **observed,
        )
        plan = reconcile(self.spec, obs, copy.deepcopy(self.status), now, settings or Settings())
        for obj in plan.apply:
            obj = copy.deepcopy(obj)
            if m.is_replicas_only(obj):  # a merge patch of spec.replicas (kubewriter): the template stays
                self.deployments[obj["metadata"]["name"]]["spec"]["replicas"] = obj["spec"]["replicas"]
                continue
            obj["metadata"]["ownerReferences"] = [{"uid": UID, "kind": "SpeculativeServer", "name": self.name}]
            kinds = {"Deployment": self.deployments, "ConfigMap": self.config_maps, "Job": self.jobs}
            kinds.get(obj["kind"], self.services)[obj["metadata"]["name"]] = obj
        self.status = plan.status
        return plan

    def template(self, variant: str) -> dict:
        return self.deployments[m.child_name(self.name, variant)]["spec"]["template"]

    def add_pod(self, variant: str, *, ready=False, init=None, running_since: datetime | None = None, crash_restarts=0) -> dict:
        tmpl = self.template(variant)
        status: dict = {"conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True" if ready else "False"}]}
        if init is not None:
            code, message = init
            status["initContainerStatuses"] = [
                {
                    "name": m.VALIDATOR_CONTAINER,
                    "state": {"waiting": {"reason": "CrashLoopBackOff"}} if code else {"terminated": {"exitCode": 0, "message": message}},
                    "lastState": {"terminated": {"exitCode": code, "message": message}} if code else {},
                }
            ]
        if crash_restarts:
            status["containerStatuses"] = [
                {
                    "name": "sglang",
                    "restartCount": crash_restarts,
                    "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                    "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137}},
                }
            ]
        elif running_since is not None or ready:
            started = running_since or NOW - timedelta(minutes=20)
            status["containerStatuses"] = [
                {"name": "sglang", "restartCount": 0, "state": {"running": {"startedAt": started.strftime("%Y-%m-%dT%H:%M:%SZ")}}}
            ]
        # What the operator keeps of a pod of this template (its Kopf index copy), as reconcile sees it.
        pod = slim_pod(
            {
                "metadata": {
                    "name": f"{self.name}-{variant}-{len(self.pods)}",
                    "labels": dict(tmpl["metadata"]["labels"]),
                    "annotations": dict(tmpl["metadata"]["annotations"]),
                    "creationTimestamp": "2026-12-02T09:00:00Z",
                },
                "spec": copy.deepcopy(tmpl["spec"]),
                "status": status,
            }
        )
        self.pods.append(pod)
        return pod

    def set_pods(self, **kinds) -> None:
        self.pods = []
        for variant, kw in kinds.items():
            self.add_pod(variant, **kw)


COMPATIBLE = json.dumps(
    {
        "compatible": True,
        "findings": [
            {"severity": "warning", "code": "HiddenStateSourceMismatch", "message": "drafter trained on bf16 hidden states, target served int4"}
        ],
    }
)
INCOMPATIBLE = json.dumps(
    {
        "compatible": False,
        "findings": [
            {"severity": "error", "code": "HiddenSizeMismatch", "message": "drafter hidden_size 4096 != target 7168"},
            {"severity": "error", "code": "VocabSizeMismatch", "message": "vocab"},
        ],
    }
)


def conditions(status: dict) -> dict:
    return {c["type"]: c for c in status["conditions"]}


def reasons(plan: Plan) -> list[str]:
    return [e.reason for e in plan.events]


def promote_result(rev: str, speedup=1.9, accept=2.9) -> dict:
    return {
        "decision": "promote",
        "reason": "SpeedupConfirmed",
        "message": f"speedup {speedup}x",
        "rounds": 3,
        "speedup": speedup,
        "acceptLength": accept,
        "revision": rev,
        "startedAt": "2026-12-02T09:59:00Z",
        "finishedAt": "2026-12-02T10:00:00Z",
        "workloads": [],
    }


def to_promoted(world: World) -> Plan:
    world.step()
    world.set_pods(base={"ready": True}, speculative={"ready": True, "init": (0, COMPATIBLE)})
    plan = world.step()
    assert plan.starts_probe
    world.probe_running = plan.revision
    return world.step(probe_result=promote_result(plan.revision))
