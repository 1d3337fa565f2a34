"""The operator's Runtime against a fake writer and a fake probe scheduler: `Cluster` holds one SpeculativeServer
and its children as the indexes would show them to a step, and records every write, Event and probe."""

from __future__ import annotations

import asyncio
import copy
import json
import logging
from pathlib import Path
from typing import Any

import yaml
from kubernetes.client.exceptions import ApiException

from specdec_operator import manifests as m
from specdec_operator.api import ProbeStatus
from specdec_operator.controller.config import OperatorConfig
from specdec_operator.controller.metrics import OperatorMetrics
from specdec_operator.controller.runtime import Runtime
from specdec_operator.reconcile import Event

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "llama31-8b-eagle3.yaml"
COMPATIBLE = json.dumps({"compatible": True, "findings": []})
LOG = logging.getLogger("test")


def merge(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """Apply a JSON merge patch (RFC 7386), as the API server does."""
    result = dict(target)
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = merge(result[key], value)
        else:
            result[key] = value
    return result


class FakeWriter:
    """Records every write; plays a cluster that accepts them (a name can be held by someone else)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.children: dict[tuple[str, str], dict[str, Any]] = {}  # by (kind, name)
        self.status: dict[str, Any] = {}
        self.events: list[Event] = []
        self.taken: dict[str, dict[str, Any]] = {}  # names held by objects someone else owns
        self.beside_the_step: list[str] = []  # children applied by the stable Service's creation task
        self.pod_events: list[dict[str, Any]] = []  # Warning Events about pods the kubelet would have posted
        self.pod_event_reads: list[str] = []
        self.rejected: set[str] = set()  # names whose apply the API server refuses (422 Invalid)
        self.refuse_delete: set[str] = set()  # kinds whose delete the API server refuses (403 Forbidden)

    async def read_config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        raise AssertionError("no prompt dataset in these specs")

    async def read_probe_evidence(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None  # no probe here keeps evidence (the probes are FakeProbes)

    async def pod_warnings(self, namespace: str, pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
        self.pod_event_reads.append(namespace)  # a read, not a write: kept out of `calls`
        return list(self.pod_events)

    async def apply(self, obj: dict[str, Any], owner: Any, uid: str, *, known: bool) -> dict[str, Any] | None:
        name = obj["metadata"]["name"]
        if name in self.taken:
            self.calls.append(("refused", name))
            return self.taken[name]
        await asyncio.sleep(0)
        if name in self.rejected:
            self.calls.append(("rejected", name))
            refused = ApiException(status=422, reason="Unprocessable Entity")
            refused.body = json.dumps(
                {"kind": "Status", "status": "Failure", "reason": "Invalid", "code": 422, "message": f"{obj['kind']} {name!r} is invalid"}
            )
            raise refused
        self.calls.append((obj["kind"], name))
        task = asyncio.current_task()
        self.beside_the_step += [name] if task is not None and task.get_name().startswith("create ") else []
        applied = copy.deepcopy(obj)
        applied["metadata"]["ownerReferences"] = [{"uid": uid}]
        self.children[(obj["kind"], name)] = applied
        return None

    async def patch_status(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        self.calls.append(("status", sorted(patch)))
        self.status = merge(self.status, patch)

    async def post_event(self, owner: Any, event: Event) -> None:
        self.calls.append(("event", event.reason))
        self.events.append(event)

    async def delete(self, obj: dict[str, Any]) -> None:
        self.calls.append(("delete", obj["kind"], obj["metadata"]["name"]))
        if obj["kind"] in self.refuse_delete:  # an RBAC without delete on that kind
            raise ApiException(status=403, reason="Forbidden")
        self.children.pop((obj["kind"], obj["metadata"]["name"]), None)


class FakeProbes:
    """The probe scheduler's interface, with results the test hands in."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.cancelled = 0
        self.settled = 0
        self.result: ProbeStatus | None = None
        self.revision: str | None = None
        self.read_config_map = None  # set by the Operator (a ConfigMap prompt source, read through the API)
        self.read_evidence = None  # set by the Operator (ConfigMap <name>-probe-evidence, read when a probe starts)

        async def no_file_dataset(*args, **kwargs):
            raise AssertionError("no File prompt source expected")

        self.read_file_dataset = no_file_dataset  # a File source would start a reader pod: none of these specs has one

    def running(self, key):
        return self.revision if self.result is None else None

    def finished(self, key):
        return self.result

    def progress(self, key):
        return None

    def settle(self, key):
        self.settled += 1
        self.result = self.revision = None

    def start(
        self,
        key,
        spec,
        revision,
        on_done,
        *,
        probe_id=None,
        load_aware_probe=None,
        race=(1, None, None),
        owner_uid=None,
        generation=None,
        write_evidence=None,
    ):
        self.started.append(revision)
        self.revision = probe_id or revision

    def cancel(self, key):
        self.cancelled += 1

    def forget(self, key):
        self.cancel(key)

    async def scrape(self, key, pods):
        raise AssertionError("no scrape expected")

    async def close(self):
        pass


class Cluster:
    """One SpeculativeServer and its children as the indexes would show them to a step."""

    def __init__(self, spec: dict[str, Any], name: str = "llama") -> None:
        self.writer, self.probes, self.metrics = FakeWriter(), FakeProbes(), OperatorMetrics()
        self.runtime = self.new_process()
        self.name = name
        self.body = {"metadata": {"name": name, "namespace": "ns", "uid": "uid-1", "generation": 1}, "spec": spec}
        self.pods: list[dict[str, Any]] = []

    def new_process(self) -> Runtime:
        self.probes = FakeProbes()
        return Runtime(OperatorConfig(), self.metrics, writer=self.writer, probes=self.probes)  # type: ignore[arg-type]

    def step(self):
        async def run():
            body = {**self.body, "status": copy.deepcopy(self.writer.status)}
            deployments = [c for c in self.writer.children.values() if c["kind"] == "Deployment"]
            services = [c for c in self.writer.children.values() if c["kind"] == "Service"]
            try:
                plan = await self.runtime.step(body, copy.deepcopy(self.pods), copy.deepcopy(deployments), copy.deepcopy(services), LOG)
            except ApiException as exc:  # as the daemon's guarded step hands it on
                plan = None
                await self.runtime.executor.api_failure(body, exc, LOG, self.runtime.resources.get(("ns", self.name)))
            state = self.runtime.resources[("ns", self.name)]
            if state.creating is not None:
                await state.creating  # the stable Service's creation beside the step
            return plan

        return asyncio.run(run())

    def ready_pods(self, *variants: str) -> None:
        self.pods = []
        for variant in variants:
            template = self.writer.children[("Deployment", m.child_name("llama", variant))]["spec"]["template"]
            status: dict[str, Any] = {"conditions": [{"type": "Ready", "status": "True"}]}
            if variant == "speculative":
                status["initContainerStatuses"] = [{"name": m.VALIDATOR_CONTAINER, "state": {"terminated": {"exitCode": 0, "message": COMPATIBLE}}}]
            self.pods.append(
                {
                    "metadata": {
                        "name": f"llama-{variant}-0",
                        "labels": dict(template["metadata"]["labels"]),
                        "annotations": dict(template["metadata"]["annotations"]),
                        "creationTimestamp": "2026-12-02T09:00:00Z",
                    },
                    "status": status,
                }
            )


def llama_spec(**rollout: Any) -> dict[str, Any]:
    spec = yaml.safe_load(EXAMPLE.read_text())["spec"]
    spec["rollout"].update(rollout)
    return spec


def decision(revision: str, verdict: str, reason: str) -> ProbeStatus:
    return ProbeStatus(
        decision=verdict,
        reason=reason,
        message="measured",
        rounds=3,
        speedup=1.8 if verdict == "promote" else 0.9,
        revision=revision,
        started_at="2026-12-02T09:59:00Z",
        finished_at="2026-12-02T10:00:00Z",
    )
