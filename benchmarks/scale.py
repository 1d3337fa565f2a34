#!/usr/bin/env python3
"""Scale: many SpeculativeServers on the local control plane, one operator (results: docs/scale.md).

Starts its own local control plane (hack/devcluster, cluster name `scale`, removed afterwards unless --keep),
adds enough simulated one-GPU-per-pod capacity (kwok nodes), starts a few SGLang simulators shared by every
object through the operator's --endpoints mapping, runs the real `specdec run` as a subprocess, creates the
objects across namespaces and waits until every one has settled in a terminal phase (Promoted, RolledBack,
Invalid) with its stable Service answering (condition Ready=True). Then it watches the settled system for --idle-seconds more (the steady-state cost).

Measured:
- time to steady state: from the first create to the moment every object is in a terminal phase and Ready;
- operator RSS (peak and at the end) and CPU (seconds used, average cores, while settling and while idle);
- reconcile step latency p50/p99 (the operator's own histogram specdec_reconcile_duration_seconds);
- API requests per object: the delta of kube-apiserver's apiserver_request_total over the run, all clients
  (operator, controller-manager, scheduler, kwok, this script), and the operator's own share estimated from the
  requests only it makes (status patches of speculativeservers, server-side applies of Deployments and Services,
  Events), and the API server's own latency for reads and writes (apiserver_request_duration_seconds);
- with --audit: which clients sent the requests (the API server's audit log; it costs the API server CPU).

    .venv/bin/python benchmarks/scale.py                           # 1,000 objects in 50 namespaces
    .venv/bin/python benchmarks/scale.py --objects 100 --namespaces 10 --json /tmp/scale.json
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "hack"))
from datetime import UTC

import devcluster

from specdec_operator.reconcile.status import STATUS_BYTES_BUDGET

GROUP, VERSION, PLURAL = "specdec.io", "v1alpha1", "speculativeservers"
TERMINAL = {"Promoted", "RolledBack", "Invalid", "Failed"}
# With its defaults the deployment controller syncs 5 Deployments at a time, each sync a few API round trips: on a
# saturated API server that is ~3.5 new ReplicaSets a second (runs 12-13), whatever its client QPS (20 or 50).
# Likewise kwok, standing in for 65 kubelets, plays pod stages 4 at a time (~11 pod status patches a second).
TUNED_CONTROLLER_MANAGER = ["--concurrent-deployment-syncs=25", "--concurrent-replicaset-syncs=25", "--kube-api-qps=50", "--kube-api-burst=100"]
# (A KwokConfiguration document replaces kwok's defaults, so the other parallelisms are spelled out at theirs.)
TUNED_KWOK = {"podPlayStageParallelism": 32, "nodePlayStageParallelism": 4, "nodeLeaseParallelism": 4, "podsOnNodeSyncParallelism": 1}
# Bigger simulated nodes than hack/kwok/nodes.yaml's 8-GPU ones: 2,000 one-GPU pods fit on 65 nodes instead of 252,
# whose kwok heartbeats (Lease updates) would otherwise be a large share of the API server's load.
GPUS_PER_NODE = 32
# Simulator pairs (base profile, speculative profile) shared round-robin by the objects.
PAIRS = [("llama31-8b-base", "llama31-8b-eagle3"), ("sglang-base-kimi-k25", "kimi-k2-public-eagle3")]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def bench_node(index: int) -> dict[str, Any]:
    """A kwok node with GPUS_PER_NODE simulated Hopper GPUs (labels and taint as hack/kwok/nodes.yaml's H200)."""
    name = f"scale-h200-{index}"
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.family": "hopper",
                "nvidia.com/gpu.product": "NVIDIA-H200",
                "nvidia.com/gpu.count": str(GPUS_PER_NODE),
            },
        },
        "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
        "status": {
            "capacity": {"cpu": "192", "memory": "2Ti", "pods": "110", "nvidia.com/gpu": str(GPUS_PER_NODE)},
            "allocatable": {"cpu": "190", "memory": "2000Gi", "pods": "110", "nvidia.com/gpu": str(GPUS_PER_NODE)},
        },
    }


def resource(name: str, namespace: str, incompatible: bool) -> dict[str, Any]:
    """A small SpeculativeServer: one GPU per server, a short probe; the pods' outcomes scripted for kwok."""
    verdict = (
        {"compatible": False, "findings": [{"severity": "error", "code": "HiddenSizeMismatch", "message": "scale benchmark: scripted"}]}
        if incompatible
        else {"compatible": True, "findings": []}
    )
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SpeculativeServer",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "image": "lmsysorg/sglang:v0.5.23-cu130",
            "model": {"volume": {"hostPath": {"path": "/data/models", "type": "Directory"}}},
            "target": {"path": "llama"},
            "drafter": {"path": "eagle3/llama", "numSteps": 3},
            "resources": {"gpus": 1, "gpuFamily": "hopper"},
            "podMetadata": {
                "annotations": {
                    "specdec.test/init-exit-code": "1" if incompatible else "0",
                    "specdec.test/init-message": json.dumps(verdict),
                    "specdec.test/ready-after": "1s",
                }
            },
            "rollout": {"workloads": [{"name": "quick", "concurrency": 2, "inputTokens": 32, "outputTokens": 16, "requests": 2}]},
        },
    }


# ---------------------------------------------------------------------------------------------------------
# Measurements


def prometheus_samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of every sample of metric `name` in Prometheus text exposition."""
    out = []
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        match = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)", line)
        if not match or match.group(1) != name:
            continue
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(3) or ""))
        out.append((labels, float(match.group(4))))
    return out


def histogram_quantile(buckets: list[tuple[float, float]], q: float) -> float:
    """Prometheus' histogram_quantile over cumulative (upper bound, count) buckets (linear within a bucket)."""
    buckets = sorted(buckets)
    total = buckets[-1][1]
    if total == 0:
        return float("nan")
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / max(count - lower_count, 1e-12)
        lower_bound, lower_count = bound, count
    return buckets[-1][0]


AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived", "ResponseStarted"],
    "rules": [{"level": "Metadata"}],
}


def audit_clients(log: Path, windows: dict[str, tuple[float, float]]) -> dict[str, list[str]]:
    """From an API server audit log (one JSON event per request): the most frequent (client, verb, resource) per window.

    The client is the authenticated user (the operator and this script share the admin certificate, so its user
    agent tells them apart; the controller-manager runs each controller under a service account of its own).
    """
    from datetime import datetime

    counts: dict[str, Counter] = {label: Counter() for label in windows}
    with open(log, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            try:
                event = json.loads(line)
                at = datetime.fromisoformat(event["stageTimestamp"].replace("Z", "+00:00")).timestamp()
            except (ValueError, KeyError):
                continue
            user = event.get("user", {}).get("username", "?")
            if user == "specdec-admin":
                user = "admin:" + (event.get("userAgent") or "?").split(" ")[0][:40]
            ref = event.get("objectRef") or {}
            what = ref.get("resource", event.get("requestURI", "?").split("?")[0]) + ("/" + ref["subresource"] if ref.get("subresource") else "")
            for label, (start, end) in windows.items():
                if start <= at < end:
                    counts[label][f"{user} {event.get('verb', '?')} {what}"] += 1
    return {label: [f"{n} {key}" for key, n in c.most_common(25)] for label, c in counts.items()}


def apiserver_requests(api_client: Any) -> Counter:
    """apiserver_request_total summed by (verb, resource, subresource), and the API server's own latency histogram
    (apiserver_request_duration_seconds) summed by ("latency", kind, upper bound): kind "read" (GET, LIST) or
    "write" (POST, PUT, PATCH, APPLY, DELETE); watches and other long-running requests are not in it."""
    # The client's connection pool carries the admin credentials (client certificate) of the kubeconfig.
    text = api_client.rest_client.pool_manager.request("GET", api_client.configuration.host + "/metrics").data.decode()
    counts: Counter = Counter()
    for labels, value in prometheus_samples(text, "apiserver_request_total"):
        counts[(labels.get("verb", ""), labels.get("resource", ""), labels.get("subresource", ""))] += value
    for labels, value in prometheus_samples(text, "apiserver_request_duration_seconds_bucket"):
        kind = (
            "read"
            if labels.get("verb") in ("GET", "LIST")
            else "write"
            if labels.get("verb") in ("POST", "PUT", "PATCH", "APPLY", "DELETE")
            else None
        )
        if kind:
            counts[("latency", kind, labels["le"])] += value
    return counts


def server_latency(before: Counter, after: Counter) -> dict[str, dict[str, Any]]:
    """p50/p99 of the API server's own request latency (reads and writes apart) between two apiserver_requests()."""
    out = {}
    for kind in ("read", "write"):
        buckets = sorted((float(key[2]), after[key] - before.get(key, 0.0)) for key in after if key[:2] == ("latency", kind))
        if buckets and buckets[-1][1]:
            out[kind] = {
                "requests": int(buckets[-1][1]),
                "p50_s": round(histogram_quantile(buckets, 0.5), 4),
                "p99_s": round(histogram_quantile(buckets, 0.99), 4),
                "share_over_1s": round(1 - dict(buckets).get(1.0, 0.0) / buckets[-1][1], 4),
            }
    return out


def request_counts(counts: Counter) -> Counter:
    """Only the request counts of an apiserver_requests() sample (the latency buckets left out)."""
    return Counter({key: value for key, value in counts.items() if key[0] != "latency"})


class Sampler(threading.Thread):
    """Samples the operator process' RSS and CPU time once a second."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.proc = psutil.Process(pid)
        self.samples: list[tuple[float, float, float]] = []  # (monotonic, rss bytes, cpu seconds)
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                times = self.proc.cpu_times()
                self.samples.append((time.monotonic(), float(self.proc.memory_info().rss), times.user + times.system))
            except psutil.Error:
                return
            self.stop.wait(1.0)

    def window(self, start: float, end: float) -> dict[str, float]:
        inside = [s for s in self.samples if start <= s[0] <= end]
        if len(inside) < 2:
            return {}
        cpu = inside[-1][2] - inside[0][2]
        return {
            "peak_rss_mb": max(s[1] for s in inside) / 2**20,
            "end_rss_mb": inside[-1][1] / 2**20,
            "cpu_seconds": cpu,
            "cores": cpu / (inside[-1][0] - inside[0][0]),
        }


class PhaseWatcher(threading.Thread):
    """Follows every SpeculativeServer's status.phase through one watch (re-listing after 410 Gone or an error).

    Polling with a LIST of all 1,000 objects every few seconds was the benchmark's own load on the API server it
    measures (several MB of JSON each time, and 504s under load); a watch costs one more watcher.
    """

    def __init__(self, api_client: Any) -> None:
        super().__init__(daemon=True)
        from kubernetes import client

        self.custom = client.CustomObjectsApi(api_client)
        self.phases: dict[tuple[str, str], str] = {}
        self.serving: set[tuple[str, str]] = set()  # Ready=True: the stable Service exists and its server is ready
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.relists = 0
        self.status_bytes: dict[tuple[str, str], int] = {}  # the latest status of each resource, compact JSON bytes
        self.peak_status_bytes = 0  # the largest status any resource had at any moment of the run

    def counts(self) -> Counter:
        with self.lock:
            return Counter(self.phases.values())

    def steady(self) -> int:
        """Resources in a terminal phase whose stable Service answers (status condition Ready=True)."""
        with self.lock:
            return sum(1 for key, phase in self.phases.items() if phase in TERMINAL and key in self.serving)

    def _record(self, obj: dict) -> None:
        meta, status = obj["metadata"], obj.get("status") or {}
        key = (meta["namespace"], meta["name"])
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
        size = len(json.dumps(status, separators=(",", ":")).encode())
        with self.lock:
            self.phases[key] = status.get("phase") or "none"
            (self.serving.add if ready else self.serving.discard)(key)
            self.status_bytes[key] = size
            self.peak_status_bytes = max(self.peak_status_bytes, size)

    def status_sizes(self) -> dict[str, Any]:
        """The resources' status sizes now (median, p99, largest) and the largest seen during the run, against the budget
        the operator states (reconcile/status.py STATUS_BYTES_BUDGET)."""
        with self.lock:
            sizes = sorted(self.status_bytes.values())
            peak = self.peak_status_bytes
        if not sizes:
            return {"resources": 0}
        return {
            "resources": len(sizes),
            "median_bytes": sizes[len(sizes) // 2],
            "p99_bytes": sizes[min(len(sizes) - 1, math.ceil(0.99 * len(sizes)) - 1)],
            "max_bytes": sizes[-1],
            "peak_during_run_bytes": peak,
            "total_bytes": sum(sizes),
            "budget_bytes": STATUS_BYTES_BUDGET,
            "within_budget": peak <= STATUS_BYTES_BUDGET,
        }

    def run(self) -> None:
        from kubernetes import watch

        while not self.stop.is_set():
            try:
                listed = self.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, _request_timeout=120)
                with self.lock:
                    self.phases.clear()
                    self.serving.clear()
                for obj in listed["items"]:
                    self._record(obj)
                version = listed["metadata"]["resourceVersion"]
                for event in watch.Watch().stream(
                    self.custom.list_cluster_custom_object,
                    GROUP,
                    VERSION,
                    PLURAL,
                    resource_version=version,
                    timeout_seconds=300,
                    _request_timeout=360,
                ):
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self._record(event["object"])
                    elif event["type"] == "DELETED":
                        key = (event["object"]["metadata"]["namespace"], event["object"]["metadata"]["name"])
                        with self.lock:
                            self.phases.pop(key, None)
                            self.serving.discard(key)
                    if self.stop.is_set():
                        return
            except Exception:  # 410 Gone, a timeout under load: list again
                self.relists += 1
                time.sleep(1)


class EvidenceSampler:
    """The probes' evidence ConfigMaps (<name>-probe-evidence, label specdec.io/probe-evidence=true), sampled every
    10 s while the resources settle: how many exist at once and how large they get, since evidence kept outside status
    is the price of keeping status small."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)
        self.samples: list[tuple[int, int]] = []  # (ConfigMaps, largest data in bytes)

    def sample(self) -> None:
        try:
            items = self.core.list_config_map_for_all_namespaces(label_selector="specdec.io/probe-evidence=true", _request_timeout=60).items
        except Exception:  # a timeout under load: this sample is skipped
            return
        sizes = [sum(len(v.encode()) for v in (cm.data or {}).values()) for cm in items]
        self.samples.append((len(sizes), max(sizes, default=0)))

    def summary(self) -> dict[str, Any]:
        return {
            "samples": len(self.samples),
            "most_at_once": max((n for n, _ in self.samples), default=0),
            "largest_bytes": max((b for _, b in self.samples), default=0),
            "at_end": self.samples[-1][0] if self.samples else None,
        }


def baseline_children(name: str, namespace: str, incompatible: bool) -> list[dict[str, Any]]:
    """The five children the operator's first step creates for this resource (its own reconcile, as the operator renders them)."""
    from datetime import datetime

    from specdec_operator.reconcile import Observed, reconcile
    from specdec_operator.resource import parse_spec

    spec = parse_spec(resource(name, namespace, incompatible)["spec"])
    plan = reconcile(
        spec,
        Observed(name=name, namespace=namespace, uid="baseline", generation=1, deployments={}, services={}, pods=[]),
        {},
        datetime.now(UTC),
    )
    return plan.apply


class ReadyWatcher(threading.Thread):
    """Baseline mode: follows the benchmark's Deployments (readyReplicas) and validator exits through watches.

    Raw JSON, no client models, and each watch resumed from its last resourceVersion every 30 s: with models and
    5-minute watches the counts lagged the cluster by minutes under load (one run's counts jumped at each re-list).
    """

    def __init__(self, api_client: Any, selector: str) -> None:
        super().__init__(daemon=True)
        self.api_client, self.selector = api_client, selector
        self.ready: set[str] = set()  # namespace/deployment with a ready replica
        self.verdicts: set[str] = set()  # namespace/deployment whose validator init container exited non-zero
        self.lock = threading.Lock()

    def _follow(self, path: str, record: Any) -> None:
        version = None
        while True:
            try:
                query = [("labelSelector", self.selector)]
                if version is None:  # (re)list
                    listed = self._get(path, query)
                    for obj in listed["items"]:
                        record(obj)
                    version = listed["metadata"]["resourceVersion"]
                method, url, headers, _, _ = self.api_client.param_serialize(
                    "GET",
                    path,
                    query_params=[*query, ("watch", "true"), ("resourceVersion", version), ("timeoutSeconds", "30"), ("allowWatchBookmarks", "true")],
                    header_params={"Accept": "application/json"},
                    auth_settings=["BearerToken"],
                )
                response = self.api_client.call_api(method, url, headers, _request_timeout=60)
                buffer = b""
                for chunk in response.response.stream(65536, decode_content=True):
                    buffer += chunk
                    *lines, buffer = buffer.split(b"\n")
                    for line in lines:
                        if not line.strip():
                            continue
                        event = json.loads(line)
                        if event["type"] == "ERROR":  # 410 Gone: list again
                            version = None
                            break
                        version = event["object"]["metadata"].get("resourceVersion") or version
                        if event["type"] in ("ADDED", "MODIFIED"):
                            record(event["object"])
            except Exception:  # a timeout under load: resume (or re-list when the version is gone)
                time.sleep(1)

    def _get(self, path: str, query: list[tuple[str, str]]) -> dict[str, Any]:
        method, url, headers, _, _ = self.api_client.param_serialize(
            "GET", path, query_params=query, header_params={"Accept": "application/json"}, auth_settings=["BearerToken"]
        )
        response = self.api_client.call_api(method, url, headers, _request_timeout=120)
        return json.loads(response.read())

    def run(self) -> None:
        def deployment(obj: dict[str, Any]) -> None:
            if ((obj.get("status") or {}).get("readyReplicas") or 0) >= 1:
                with self.lock:
                    self.ready.add(f"{obj['metadata']['namespace']}/{obj['metadata']['name']}")

        def pod(obj: dict[str, Any]) -> None:
            for init in (obj.get("status") or {}).get("initContainerStatuses") or []:
                terminated = ((init.get("lastState") or {}).get("terminated")) or ((init.get("state") or {}).get("terminated"))
                if terminated and terminated.get("exitCode"):
                    owner = (obj["metadata"].get("labels") or {}).get("app.kubernetes.io/instance")
                    with self.lock:
                        self.verdicts.add(f"{obj['metadata']['namespace']}/{owner}-spec")

        threading.Thread(target=self._follow, args=("/apis/apps/v1/deployments", deployment), daemon=True).start()
        self._follow("/api/v1/pods", pod)


def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds (user + system) used so far by each named process; absent when it is gone."""
    used = {}
    for label, pid in pids.items():
        try:
            times = psutil.Process(pid).cpu_times()
            used[label] = times.user + times.system
        except psutil.Error:
            pass
    return used


# ---------------------------------------------------------------------------------------------------------


def run_baseline(args: Any, cluster: Any, api_client: Any, result: dict[str, Any], say: Any) -> int:
    """The control plane alone: the operator's first-step children for every resource, applied as fast as possible."""
    from kubernetes import client

    from specdec_operator import manifests as m
    from specdec_operator.controller.execute import CREATIONS_AT_ONCE

    core = client.CoreV1Api(api_client)
    names = [
        (f"scale-{i % args.namespaces:02d}", f"sps-{i:04d}", args.incompatible_every > 0 and i % args.incompatible_every == 0)
        for i in range(args.objects)
    ]
    for ns in sorted({ns for ns, _, _ in names}):
        if not _exists(core.read_namespace, ns):
            core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    children = [(ns, obj) for ns, name, bad in names for obj in baseline_children(name, ns, bad)]
    expected = {f"{ns}/{name}-base" for ns, name, _ in names} | {f"{ns}/{name}-spec" for ns, name, bad in names if not bad}
    invalid = {f"{ns}/{name}-spec" for ns, name, bad in names if bad}
    watcher = ReadyWatcher(api_client, f"{m.LABEL_MANAGED_BY}={m.MANAGED_BY}")
    watcher.start()
    processes = {c: int(p) for c, p in devcluster._read_state(args.cluster)["pids"].items()}
    requests_before, cpu_before = apiserver_requests(api_client), cpu_seconds(processes)

    def apply(item: tuple[str, dict[str, Any]]) -> None:
        ns, obj = item
        path = (
            f"/apis/apps/v1/namespaces/{ns}/deployments/{obj['metadata']['name']}"
            if obj["kind"] == "Deployment"
            else f"/api/v1/namespaces/{ns}/services/{obj['metadata']['name']}"
        )
        method, url, headers, _, _ = api_client.param_serialize(
            "PATCH",
            path,
            query_params=[("fieldManager", "scale-baseline"), ("force", "true")],
            header_params={"Content-Type": "application/apply-patch+yaml", "Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        response = api_client.call_api(method, url, headers, body=json.dumps(obj).encode())
        response.read()
        if response.status >= 300:
            raise RuntimeError(f"apply {path}: HTTP {response.status}: {response.data[:200]!r}")

    say(f"baseline: applying {len(children)} children of {args.objects} resources (no operator)")
    started = time.monotonic()
    # As the operator does: the stable Services (each allocates a ClusterIP) beside the rest, CREATIONS_AT_ONCE at a time.
    stable = [c for c in children if c[1]["kind"] == "Service" and c[1]["spec"].get("clusterIP") != "None"]
    with concurrent.futures.ThreadPoolExecutor(16) as pool, concurrent.futures.ThreadPoolExecutor(CREATIONS_AT_ONCE) as beside:
        services = beside.map(apply, stable)
        list(pool.map(apply, [c for c in children if c not in stable]))
        say(f"Deployments and headless Services applied after {time.monotonic() - started:.1f}s")
        list(services)
    say(f"all applied after {time.monotonic() - started:.1f}s; waiting until every base and compatible speculative server is ready")
    done_at = None
    last_said = 0.0
    while time.monotonic() - started < args.timeout:
        with watcher.lock:
            ready, verdicts = len(expected & watcher.ready), len(invalid & watcher.verdicts)
        if ready >= len(expected) and verdicts >= len(invalid):
            done_at = time.monotonic()
            break
        if time.monotonic() - last_said >= 10:
            last_said = time.monotonic()
            say(f"  {time.monotonic() - started:5.0f}s  ready {ready}/{len(expected)}, validator verdicts {verdicts}/{len(invalid)}")
        time.sleep(0.5)
    elapsed = (done_at or time.monotonic()) - started
    cpu_after, requests_after = cpu_seconds(processes), apiserver_requests(api_client)
    delta = request_counts(requests_after - requests_before)
    result["server_latency_settling"] = server_latency(requests_before, requests_after)
    result.update(
        {
            "baseline": True,
            "settled": done_at is not None,
            "steady_state_seconds": round(elapsed, 1),
            "cores_settling": {c: round((cpu_after[c] - cpu_before[c]) / elapsed, 2) for c in cpu_before if c in cpu_after},
            "cpu_seconds_settling": {c: round(cpu_after[c] - cpu_before[c], 1) for c in cpu_before if c in cpu_after},
            "api_requests_settling": {
                "all_clients_total": int(sum(delta.values())),
                "all_clients_per_object": round(sum(delta.values()) / args.objects, 1),
                "top": [f"{int(v)} {verb} {res}{'/' + sub if sub else ''}" for (verb, res, sub), v in delta.most_common(8)],
            },
        }
    )
    say(f"baseline {'ready' if done_at else 'NOT ready'} after {elapsed:.1f}s; cores {result['cores_settling']}")
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0 if done_at else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=1000, help="SpeculativeServers (default 1000)")
    parser.add_argument("--namespaces", type=int, default=50, help="namespaces they are spread over (default 50)")
    parser.add_argument("--incompatible-every", type=int, default=10, help="every Nth object has an incompatible drafter (default 10)")
    parser.add_argument("--time-scale", type=float, default=200.0, help="simulator clock speed (default 200x)")
    parser.add_argument("--reconcile-interval", type=float, default=10.0, help="the operator's --reconcile-interval (default 10, its default)")
    parser.add_argument("--timeout", type=float, default=900.0, help="give up settling after this many seconds (default 900)")
    parser.add_argument("--idle-seconds", type=float, default=60.0, help="watch the settled system this long (default 60)")
    parser.add_argument("--cluster", default="scale", help="devcluster name (default scale)")
    parser.add_argument("--keep", action="store_true", help="leave the cluster running")
    parser.add_argument(
        "--baseline",
        action="store_true",
        help="no operator: apply the children its first step would create and time the "
        "control plane alone until every base server and every compatible speculative server is ready",
    )
    parser.add_argument(
        "--tuned-control-plane",
        action="store_true",
        help="run the controller-manager and kwok with more workers "
        f"for 2,000 Deployments ({' '.join(TUNED_CONTROLLER_MANAGER)}; kwok {TUNED_KWOK}); default: their own defaults",
    )
    parser.add_argument(
        "--operator-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="one more `specdec run` flag, e.g. --operator-arg=--max-concurrent-reconciles=32 (repeatable)",
    )
    parser.add_argument("--api-workers", type=int, help="pass --api-workers to the operator (default: its own default)")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument(
        "--audit",
        action="store_true",
        help="write the API server's audit log (metadata of every request) and report "
        "which clients sent the most requests while settling and idle (costs the API server CPU: not for the figures)",
    )
    parser.add_argument(
        "--memory-report",
        metavar="FILE",
        help="run the operator through benchmarks/traced_operator.py and append a census of its live objects to FILE when settled and at the end",
    )
    parser.add_argument(
        "--trace-allocations",
        action="store_true",
        help="with --memory-report: also trace allocation sites from the creates on (slows the operator several-fold: not for the figures)",
    )
    args = parser.parse_args(argv)

    from kubernetes import client, config

    def say(message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)

    workdir = Path(tempfile.mkdtemp(prefix="specdec-scale-"))
    apiserver_args: list[str] = []
    if args.audit:
        (workdir / "audit-policy.yaml").write_text(json.dumps(AUDIT_POLICY))
        apiserver_args = [
            f"--audit-policy-file={workdir / 'audit-policy.yaml'}",
            f"--audit-log-path={workdir / 'audit.log'}",
            "--audit-log-format=json",
            "--audit-log-maxsize=0",
            "--audit-log-mode=batch",
        ]
    say(f"cluster {args.cluster!r}: starting")
    cluster = devcluster.up(
        args.cluster,
        tie_to_parent=True,
        controller_manager_args=TUNED_CONTROLLER_MANAGER if args.tuned_control_plane else (),
        apiserver_args=apiserver_args,
        kwok_options=TUNED_KWOK if args.tuned_control_plane else None,
    )
    children: list[subprocess.Popen] = []
    result: dict[str, Any] = {
        "objects": args.objects,
        "namespaces": args.namespaces,
        "time_scale": args.time_scale,
        "reconcile_interval": args.reconcile_interval,
        "api_workers": args.api_workers,
        "operator_args": args.operator_arg,
        "controller_manager_args": TUNED_CONTROLLER_MANAGER if args.tuned_control_plane else [],
        "kwok_options": TUNED_KWOK if args.tuned_control_plane else {},
        "cpus": os.cpu_count(),
        "malloc_arena_max": os.environ.get("MALLOC_ARENA_MAX"),
        "load_average_at_start": os.getloadavg()[0],
    }
    try:
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"), check=True)
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{PLURAL}.{GROUP}", "--timeout=60s", check=True)
        api_client = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        api_client.configuration.connection_pool_maxsize = 32
        core, custom = client.CoreV1Api(api_client), client.CustomObjectsApi(api_client)
        # A CRD just Established may still answer 429 "storage is (re)initializing" for a moment; the operator
        # would back off for seconds and the clock below would count it.
        _until(lambda: custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, limit=1), 60)

        nodes = math.ceil(2 * args.objects / GPUS_PER_NODE) + 2
        say(f"adding {nodes} simulated {GPUS_PER_NODE}-GPU nodes")
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda i: core.create_node(bench_node(i)) if not _exists(core.read_node, f"scale-h200-{i}") else None, range(nodes)))

        if args.baseline:
            return run_baseline(args, cluster, api_client, result, say)

        # Shared simulators: one per profile, in their own processes (their CPU is not the operator's).
        urls: dict[str, str] = {}
        for profile in sorted({p for pair in PAIRS for p in pair}):
            port = free_port()
            log = open(workdir / f"sim-{profile}.log", "w")
            children.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "specdec_operator.cli",
                        "simulate",
                        "--profile",
                        profile,
                        "--port",
                        str(port),
                        "--time-scale",
                        str(args.time_scale),
                        "--load-seconds",
                        "0",
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
            urls[profile] = f"http://127.0.0.1:{port}"
        names = [(f"scale-{i % args.namespaces:02d}", f"sps-{i:04d}") for i in range(args.objects)]
        endpoints = {}
        for i, (ns, name) in enumerate(names):
            base, spec = PAIRS[i % len(PAIRS)]
            endpoints[f"{ns}/{name}-base"], endpoints[f"{ns}/{name}-spec"] = urls[base], urls[spec]
        (workdir / "endpoints.yaml").write_text(yaml.safe_dump(endpoints))
        for url in urls.values():
            _wait_http(url + "/health", 30)

        metrics_port = free_port()
        op_log = open(workdir / "operator.log", "w")
        operator = subprocess.Popen(
            [
                sys.executable,
                *([str(REPO / "benchmarks" / "traced_operator.py"), args.memory_report] if args.memory_report else ["-m", "specdec_operator.cli"]),
                "run",
                "--all-namespaces",
                "--standalone",
                "--endpoints",
                str(workdir / "endpoints.yaml"),
                "--metrics-port",
                str(metrics_port),
                "--metrics-address",
                "127.0.0.1",
                "--reconcile-interval",
                str(args.reconcile_interval),
                *(["--api-workers", str(args.api_workers)] if args.api_workers else []),
                *args.operator_arg,
            ],
            stdout=op_log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)},
        )
        children.append(operator)
        sampler = Sampler(operator.pid)
        sampler.start()
        _wait_http(f"http://127.0.0.1:{metrics_port}/metrics", 60)
        time.sleep(3)  # let Kopf list and start its watches

        for ns in sorted({ns for ns, _ in names}):
            if not _exists(core.read_namespace, ns):
                core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
        requests_before = apiserver_requests(api_client)
        # Who uses the two cores while the resources settle: each control-plane component, the simulators, the operator.
        processes = {
            **{c: int(p) for c, p in devcluster._read_state(args.cluster)["pids"].items()},
            **{f"simulator-{i}": c.pid for i, c in enumerate(children[:-1])},
            "operator": operator.pid,
        }
        cpu_before = cpu_seconds(processes)
        if args.memory_report and args.trace_allocations:
            operator.send_signal(signal.SIGUSR2)  # start tracing: what the resources cost, not the start-up
        say(f"creating {args.objects} SpeculativeServers in {args.namespaces} namespaces")
        started, started_wall = time.monotonic(), time.time()
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            list(
                pool.map(
                    lambda item: custom.create_namespaced_custom_object(
                        GROUP,
                        VERSION,
                        item[1][0],
                        PLURAL,
                        resource(item[1][1], item[1][0], args.incompatible_every > 0 and item[0] % args.incompatible_every == 0),
                    ),
                    enumerate(names),
                )
            )
        created = time.monotonic() - started
        say(f"created in {created:.1f}s; waiting for every object to settle")

        settled_at = None
        phases: Counter = Counter()
        watcher = PhaseWatcher(api_client)
        watcher.start()
        evidence = EvidenceSampler(api_client)
        last_said = 0.0
        while time.monotonic() - started < args.timeout:
            phases = watcher.counts()
            if operator.poll() is not None:
                raise RuntimeError(f"the operator exited with {operator.returncode}; see {workdir / 'operator.log'}")
            steady = watcher.steady()
            if steady >= args.objects:  # decided, and traffic to every stable Service is answered
                settled_at = time.monotonic()
                break
            if time.monotonic() - last_said >= 10:
                last_said = time.monotonic()
                evidence.sample()
                say(
                    f"  {time.monotonic() - started:5.0f}s  {dict(sorted(phases.items()))}  steady {steady}  rss {sampler.samples[-1][1] / 2**20:.0f} MB"
                )
            time.sleep(0.5)
        watcher.stop.set()
        result["watch_relists"] = watcher.relists
        evidence.sample()
        result["status_size"] = watcher.status_sizes()
        result["probe_evidence"] = evidence.summary()
        say(f"status sizes: {result['status_size']}; probe evidence ConfigMaps: {result['probe_evidence']}")
        settle = (settled_at or time.monotonic()) - started
        result.update(
            {"create_seconds": round(created, 1), "settled": settled_at is not None, "steady_state_seconds": round(settle, 1), "phases": dict(phases)}
        )
        say(f"{'settled' if settled_at else 'NOT settled'} after {settle:.1f}s: {dict(phases)}")
        reasons = Counter((o.get("status") or {}).get("reason") for o in custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)["items"])
        result["reasons"] = {str(k): v for k, v in reasons.items()}
        requests_settled = apiserver_requests(api_client)
        cpu_settled = cpu_seconds(processes)
        elapsed = time.monotonic() - started
        result["cores_settling"] = {
            label: round((cpu_settled[label] - cpu_before[label]) / elapsed, 2) for label in cpu_before if label in cpu_settled
        }
        say(f"cores used while settling: {result['cores_settling']}")
        if args.memory_report:
            operator.send_signal(signal.SIGUSR1)
        metrics_settled = _get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=120)

        say(f"watching the settled system for {args.idle_seconds:.0f}s")
        idle_start, idle_start_wall = time.monotonic(), time.time()
        time.sleep(args.idle_seconds)
        idle_end, idle_end_wall = time.monotonic(), time.time()
        requests_end = apiserver_requests(api_client)
        if args.memory_report:
            operator.send_signal(signal.SIGUSR1)
            time.sleep(5)
        metrics_end = _get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=120)
        sampler.stop.set()

        result["settling"] = {k: round(v, 2) for k, v in sampler.window(started, settled_at or idle_start).items()}
        result["idle"] = {k: round(v, 3) for k, v in sampler.window(idle_start, idle_end).items()}
        result["peak_rss_mb"] = round(max(s[1] for s in sampler.samples) / 2**20, 1)

        def buckets_of(text: str, histogram: str) -> dict[float, float]:
            return {float(lbl["le"]): v for lbl, v in prometheus_samples(text, f"{histogram}_bucket")}

        # A step's own duration, and (apart) how long a woken resource waited for a step slot before it.
        for prefix, histogram in (("reconcile", "specdec_reconcile_duration_seconds"), ("queue", "specdec_reconcile_queue_seconds")):
            settling_buckets, end_buckets = buckets_of(metrics_settled, histogram), buckets_of(metrics_end, histogram)
            if not end_buckets:
                continue
            idle_buckets = {le: end_buckets[le] - settling_buckets.get(le, 0.0) for le in end_buckets}
            for label, buckets in ((f"{prefix}_settling", settling_buckets), (f"{prefix}_idle", idle_buckets), (f"{prefix}_all", end_buckets)):
                pairs = sorted(buckets.items())
                if not pairs[-1][1]:  # e.g. idle with every resource settled: no step at all, no quantile
                    result[label] = {"steps": 0, "p50_s": None, "p99_s": None, "share_over_1s": None}
                    continue
                # Above the largest finite bucket the quantile is reported as that bucket's bound.
                result[label] = {
                    "steps": int(pairs[-1][1]),
                    "p50_s": round(histogram_quantile(pairs, 0.5), 4),
                    "p99_s": round(histogram_quantile(pairs, 0.99), 4),
                    "share_over_1s": round(1 - buckets.get(1.0, 0.0) / pairs[-1][1], 4),
                }
        # The operator's own API requests seen from the client (all of them, and each verb/resource apart), settling.
        api_buckets: dict[str, dict[float, float]] = {}
        for lbl, value in prometheus_samples(metrics_settled, "specdec_api_request_duration_seconds_bucket"):
            for label in ("all", f"{lbl['verb']} {lbl['resource']}"):
                per = api_buckets.setdefault(label, {})
                per[float(lbl["le"])] = per.get(float(lbl["le"]), 0.0) + value
        result["api_latency_settling"] = {
            label: {
                "requests": int(max(b.values())),
                "p50_s": round(histogram_quantile(sorted(b.items()), 0.5), 4),
                "p99_s": round(histogram_quantile(sorted(b.items()), 0.99), 4),
            }
            for label, b in sorted(api_buckets.items())
        }
        result["load_average_at_end"] = os.getloadavg()[0]
        result["reconcile_errors"] = {lbl.get("kind", ""): v for lbl, v in prometheus_samples(metrics_end, "specdec_reconcile_errors_total")}

        def per_object(delta: Counter) -> dict[str, Any]:
            total = sum(delta.values())
            # Writes only the operator makes: patches of the resources (finalizer, status) and server-side applies
            # of Deployments and Services. (Events come from every controller, so they are counted apart.)
            ops = sum(
                v
                for (verb, res, sub), v in delta.items()
                if (res == PLURAL and verb in ("PATCH", "UPDATE")) or (res in ("deployments", "services") and verb in ("PATCH", "APPLY") and not sub)
            )
            events = sum(v for (verb, res, sub), v in delta.items() if res == "events" and verb in ("POST", "PATCH"))
            top = sorted(((v, f"{verb} {res}{'/' + sub if sub else ''}") for (verb, res, sub), v in delta.items()), reverse=True)[:8]
            return {
                "all_clients_total": int(total),
                "all_clients_per_object": round(total / args.objects, 1),
                "operator_writes_per_object": round(ops / args.objects, 2),
                "events_all_clients_per_object": round(events / args.objects, 2),
                "top": [f"{int(v)} {k}" for v, k in top],
            }

        result["api_requests_settling"] = per_object(request_counts(requests_settled - requests_before))
        result["server_latency_settling"] = server_latency(requests_before, requests_settled)
        result["server_latency_idle"] = server_latency(requests_settled, requests_end)
        idle_delta = request_counts(requests_end - requests_settled)
        result["api_requests_idle"] = {**per_object(idle_delta), "per_second": round(sum(idle_delta.values()) / (idle_end - idle_start), 1)}
        if args.audit:
            time.sleep(2)  # the batch backend flushes about once a second
            result["audit_top_clients"] = audit_clients(
                workdir / "audit.log", {"settling": (started_wall, idle_start_wall), "idle": (idle_start_wall, idle_end_wall)}
            )
        print(json.dumps(result, indent=2))
        return 0 if settled_at else 1
    finally:
        # Written whatever happened after the objects were created (a partial result says what was measured).
        if args.json and result:
            Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        for child in reversed(children):
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
                try:
                    child.wait(20)
                except subprocess.TimeoutExpired:
                    child.kill()
        say(f"logs in {workdir}")
        if not args.keep:
            devcluster.down(args.cluster, purge=True)


def _exists(read: Any, name: str) -> bool:
    from kubernetes.client.exceptions import ApiException

    try:
        read(name)
        return True
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise


def _until(action: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            action()
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _get(url: str, timeout: float = 10) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read().decode()


def _wait_http(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            _get(url)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} did not answer within {timeout:.0f}s") from None
            time.sleep(0.3)


if __name__ == "__main__":
    sys.exit(main())
