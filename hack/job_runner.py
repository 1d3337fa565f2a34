"""Plays the kubelet for the operator's training Jobs on the local control plane (issue 36, item 5).

The local control plane's kwok nodes run no containers (kwok ends a Job's pod after a second, having run nothing),
so a training Job there would never train. This runner registers a node of its own, `specdec-job-runner` (tainted
NoSchedule: the scheduler never places a pod there; the runner binds the pods it takes), watches the pods of the
operator's training Jobs (label `app.kubernetes.io/component=retraining`) that no node holds yet, binds each to its
node, runs the pod's init containers in order and then its containers as local processes, and writes the pod's
status as a kubelet does (hack/job_status.py): Pending while init containers run, Running, then Succeeded or Failed
with each container's terminated state and its termination message (read from the file that stands in for the
container's `/dev/termination-log`). The real Job controller then completes or fails the Job, podFailurePolicy and
backoffLimit included.

Where a container's paths go: hack/job_mapping.py (each volume a local directory: a claim's shared by every pod of
the namespace that mounts it, an emptyDir the pod's own). A pod the scheduler placed on a kwok node first is left to
kwok: on the local control plane (no storage provisioner) a training pod stays unschedulable while its claims have
no PersistentVolume, which is what gives the runner its pods.

How a container runs is pluggable (`Execute`): `LocalExecute` starts the command as a process (`specdec-train` as
this Python's `-m drafter_training.cli`), at a nice level, and records its CPU-seconds from `os.wait4`'s rusage (the
process and the children it waited for); `make demo` plugs in a simulated one. Each Job's record (containers, exit
codes, CPU-seconds, wall seconds) is kept in `JobRunner.jobs` and written to `<root>/jobs/<namespace>/<job>.json`.

    python -m hack.job_runner --kubeconfig K --root DIR [--map VOLUME=DIR] [--claim CLAIM=DIR] [--url PREFIX=URL]
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from hack.job_mapping import VolumeDirs
from hack.job_pod import PROGRAMS, ContainerRun, Execute, LocalExecute, Ran, run_containers
from hack.job_status import now

__all__ = ["NODE", "PROGRAMS", "ContainerRun", "Execute", "JobRunner", "LocalExecute", "Ran", "run_containers"]

NODE = "specdec-job-runner"
TAINT_KEY = "specdec.io/job-runner"
SELECTOR = "app.kubernetes.io/component=retraining"
HEARTBEAT_S = 10.0


def _as_dict(api_client: Any, obj: Any) -> dict[str, Any]:
    out: dict[str, Any] = api_client.sanitize_for_serialization(obj)
    return out


class JobRunner:
    """The kubelet of the training pods it binds (one pod at a time, in the order the API server lists them)."""

    def __init__(
        self,
        api_client: Any,
        root: Path,
        dirs: VolumeDirs | None = None,
        execute: Execute | None = None,
        urls: dict[str, str] | None = None,
        namespaces: set[str] | None = None,
    ) -> None:
        from kubernetes import client

        self.api_client, self.core = api_client, client.CoreV1Api(api_client)
        self.root = root
        self.dirs = dirs or VolumeDirs(root)
        self.execute: Execute = execute or LocalExecute()
        self.urls = urls or {}
        self.namespaces = namespaces  # None: every namespace (a test's runner takes only its own namespace's pods)
        self.jobs: dict[str, dict[str, Any]] = {}  # "<namespace>/<job>": the Job's record
        self._done: set[str] = set()  # pod uids run
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # ---- the node -------------------------------------------------------------------------------------------

    def register_node(self) -> None:
        """Create (or keep) the node, Ready, tainted NoSchedule, not kwok's."""
        from kubernetes.client.exceptions import ApiException

        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE, "specdec.io/job-runner": "true"}},
            "spec": {"taints": [{"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}]},
        }
        try:
            self.core.create_node(node)  # type: ignore[arg-type]  # the client takes the manifest's dict
        except ApiException as e:
            if e.status != 409:
                raise
        self._heartbeat()

    def _heartbeat(self) -> None:
        t = now()
        ready = {
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "message": "hack/job_runner.py",
            "lastHeartbeatTime": t,
            "lastTransitionTime": t,
        }
        status = {
            "status": {
                "conditions": [ready],
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                "capacity": {"cpu": "2", "pods": "8"},
                "allocatable": {"cpu": "2", "pods": "8"},
            }
        }
        self.core.patch_node_status(NODE, status)
        # No Lease: without one the node lifecycle controller reads the Ready condition's heartbeat.

    # ---- the pods -------------------------------------------------------------------------------------------

    def waiting_pods(self) -> list[dict[str, Any]]:
        """Training pods for this runner: bound to its node, or unscheduled, not ended, not being deleted."""
        pods = self.core.list_pod_for_all_namespaces(label_selector=SELECTOR).items
        out = []
        for pod in pods:
            p = _as_dict(self.api_client, pod)
            node = p["spec"].get("nodeName")
            if self.namespaces is not None and p["metadata"]["namespace"] not in self.namespaces:
                continue
            if p["metadata"]["uid"] in self._done or p["metadata"].get("deletionTimestamp") or (node and node != NODE):
                continue
            if p.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                continue
            out.append(p)
        return out

    def bind(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        if pod["spec"].get("nodeName"):
            return
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": meta["name"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": NODE},
        }
        self.core.create_namespaced_pod_binding(meta["name"], meta["namespace"], body, _preload_content=False)  # type: ignore[arg-type]

    def _gone(self, namespace: str, name: str, uid: str) -> bool:
        from kubernetes.client.exceptions import ApiException

        try:
            pod = self.core.read_namespaced_pod(name, namespace)
        except ApiException as e:
            return e.status == 404
        meta = _as_dict(self.api_client, pod)["metadata"]
        return bool(meta.get("uid") != uid or meta.get("deletionTimestamp"))

    def _write_status(self, pod: dict[str, Any], status: dict[str, Any]) -> None:
        meta = pod["metadata"]
        self.core.patch_namespaced_pod_status(meta["name"], meta["namespace"], {"status": status}, _content_type="application/merge-patch+json")

    def run_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        """Bind `pod`, run its containers in order, write its status; the Job's record."""
        meta = pod["metadata"]
        self._done.add(meta["uid"])
        self.bind(pod)
        work = self.root / "pods" / meta["namespace"] / meta["name"]
        record = run_containers(
            pod,
            work,
            self.dirs,
            self.execute,
            self.urls,
            write_status=lambda status: self._write_status(pod, status),
            gone=lambda: self._gone(meta["namespace"], meta["name"], meta["uid"]),
        )
        record["node"] = NODE
        self.jobs[f"{meta['namespace']}/{record['job']}"] = record
        out = self.root / "jobs" / meta["namespace"] / f"{record['job']}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(record, indent=1) + "\n")
        return record

    # ---- the loop -------------------------------------------------------------------------------------------

    def run_once(self) -> list[dict[str, Any]]:
        return [self.run_pod(p) for p in self.waiting_pods()]

    def start(self, interval: float = 1.0) -> JobRunner:
        """Register the node and run pods in a background thread (and a heartbeat thread) until stop()."""
        self.register_node()

        def beat() -> None:
            while not self._stop.wait(HEARTBEAT_S):
                try:
                    self._heartbeat()
                except Exception as e:  # a missed heartbeat is retried; the node goes NotReady only after 40 s
                    print(f"job-runner: heartbeat failed: {e}", file=sys.stderr)

        def loop() -> None:
            while not self._stop.is_set():
                try:
                    self.run_once()
                except Exception as e:  # an API error is logged and the next pass retries
                    print(f"job-runner: {type(e).__name__}: {e}", file=sys.stderr)
                self._stop.wait(interval)

        self._threads = [threading.Thread(target=f, daemon=True, name=f"job-runner-{f.__name__}") for f in (beat, loop)]
        for t in self._threads:
            t.start()
        return self

    def stop(self, remove_node: bool = True) -> None:
        """Stop the threads (a container running is let finish) and remove the node, so that it never lingers
        NotReady among the cluster's nodes."""
        from kubernetes.client.exceptions import ApiException

        self._stop.set()
        for t in self._threads:
            t.join(timeout=600)
        if remove_node:
            try:
                self.core.delete_node(NODE)
            except ApiException as e:
                if e.status != 404:
                    raise


def _pairs(values: list[str], flag: str) -> dict[str, str]:
    out = {}
    for v in values:
        key, sep, value = v.partition("=")
        if not sep:
            raise SystemExit(f"job-runner: {flag} {v!r}: expected KEY=VALUE")
        out[key] = value
    return out


def main(argv: list[str] | None = None) -> int:
    from kubernetes import config

    parser = argparse.ArgumentParser(prog="python -m hack.job_runner", description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--root", required=True, type=Path, help="where volumes, logs and the Jobs' records go")
    parser.add_argument("--map", action="append", default=[], metavar="VOLUME=DIR", help="a volume (by its name in the pod) onto a directory")
    parser.add_argument("--claim", action="append", default=[], metavar="CLAIM=DIR", help="a claim onto a directory")
    parser.add_argument("--url", action="append", default=[], metavar="PREFIX=URL", help="an in-cluster address onto a local one")
    parser.add_argument("--nice", type=int, default=10)
    args = parser.parse_args(argv)
    api = config.new_client_from_config(config_file=args.kubeconfig)
    dirs = VolumeDirs(
        args.root,
        claims={k: Path(v) for k, v in _pairs(args.claim, "--claim").items()},
        named={k: Path(v) for k, v in _pairs(args.map, "--map").items()},
    )
    runner = JobRunner(api, args.root, dirs, LocalExecute(nice=args.nice), _pairs(args.url, "--url")).start()
    try:
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        runner.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
