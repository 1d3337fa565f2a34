"""The kubelet of the operator's dataset reader pods on the local control plane (docs/probe.md, "Prompts").

A File workload's prompts are read by a reader pod the operator creates when its probe starts (controller/
datasetreader.py). The local control plane's kwok pods run nothing, so :class:`ReaderKubelet` runs each reader pod the
scheduler placed as a local process (its own command, `specdec dataset-serve ...`), its mount (/dataset) standing for
a local directory (the model volume's, or the claim's under ``claims/<claim>``), and maps the pod in the operator's
--endpoints file (``<namespace>/pod/<pod>``), the way the simulators and vLLM servers stand for the server pods. A pod
the scheduler cannot place (a claim that does not exist) is never run, as on a real node.

Used by the tests (tests/cluster/test_datasets_volume_cluster.py, the real-engine retraining loop) and by `make
demo`'s retraining loop (a revision's race reads its held-out slice through a reader pod).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import urllib3
import yaml
from kubernetes import watch
from kubernetes.client.rest import ApiException

READER_SELECTOR = "app.kubernetes.io/name=specdec-dataset-reader"
MOUNT = "/dataset"


def write_endpoints_file(path: Path, endpoints: dict[str, str]) -> None:
    """Write an --endpoints file whole (the operator rereads it when it changes: never a half-written one). Callers
    that share the dict hold one lock around the change and the write."""
    staged = path.with_suffix(".new")
    staged.write_text(yaml.safe_dump(endpoints))
    os.replace(staged, path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ReaderKubelet:
    """Runs each scheduled reader pod's command locally, its volume a local directory, and maps it for the operator."""

    def __init__(
        self,
        core_v1: Any,
        namespace: str,
        endpoints: dict[str, str],
        write: Callable[[], None],
        workdir: Path,
        model_volume: Path,
        claims: Path,
        lock: threading.Lock | None = None,
    ) -> None:
        """``endpoints``: the operator's mapping, shared; ``write``: writes the --endpoints file from it (called with
        ``lock`` held, which whoever else changes the mapping holds too); ``workdir``: where the readers' logs go."""
        self.core_v1, self.namespace, self.endpoints, self.write, self.workdir = core_v1, namespace, endpoints, write, workdir
        self.lock = lock or threading.Lock()
        self.model_volume, self.claims = model_volume, claims
        self.procs: dict[str, subprocess.Popen] = {}  # pod uid -> the reader process
        self.commands: dict[str, list[str]] = {}  # pod name -> the pod's command, as the operator wrote it
        self.seen_pods: set[str] = set()
        self.volumes: list[str] = []  # PersistentVolumes the test created (cluster-scoped: deleted at the end)
        self.stopped = threading.Event()
        self.error: Exception | None = None  # what stopped the loop (an assertion on a reader pod): raised by stop()
        self.thread = threading.Thread(target=self._watch, name="reader-kubelet", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _local_root(self, pod: Any) -> Path:
        (volume,) = pod.spec.volumes
        if volume.persistent_volume_claim is not None:
            return self.claims / volume.persistent_volume_claim.claim_name
        assert volume.host_path is not None, volume  # the example's model volume
        return self.model_volume

    def _run(self, pod: Any) -> None:
        (container,) = pod.spec.containers
        command = list(container.command)
        self.commands[pod.metadata.name] = command
        assert command[:2] == ["specdec", "dataset-serve"], command
        assert container.volume_mounts[0].mount_path == MOUNT and container.volume_mounts[0].read_only
        args = command[2:]
        file = args[args.index("--file") + 1]
        assert file.startswith(MOUNT + "/"), file
        args[args.index("--file") + 1] = str(self._local_root(pod) / file[len(MOUNT) + 1 :])
        port = free_port()
        args[args.index("--port") + 1] = str(port)
        log = open(self.workdir / f"reader-{pod.metadata.name}.log", "w")
        self.procs[pod.metadata.uid] = subprocess.Popen(
            [sys.executable, "-m", "specdec_operator.cli", "dataset-serve", *args, "--host", "127.0.0.1"], stdout=log, stderr=subprocess.STDOUT
        )
        with self.lock:
            self.endpoints[f"{self.namespace}/pod/{pod.metadata.name}"] = f"http://127.0.0.1:{port}"
            self.write()

    def _watch(self) -> None:
        try:
            self._loop()
        except Exception as error:
            self.error = error

    def _loop(self) -> None:
        # A watch, not a poll: a pod the scheduler refuses (no claim) lives only until the operator reads its
        # condition and deletes it, which can be shorter than any poll interval. The watch resumes from the last
        # resourceVersion it saw, so no pod is missed between its streams.
        resource_version = None
        while not self.stopped.is_set():
            try:
                if resource_version is None:
                    listed = self.core_v1.list_namespaced_pod(self.namespace, label_selector=READER_SELECTOR)
                    resource_version = listed.metadata.resource_version
                    for pod in listed.items:
                        self._saw(pod)
                stream = watch.Watch().stream(
                    self.core_v1.list_namespaced_pod,
                    self.namespace,
                    label_selector=READER_SELECTOR,
                    resource_version=resource_version,
                    timeout_seconds=2,
                )
                for event in stream:
                    pod = event["object"]
                    resource_version = pod.metadata.resource_version
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self._saw(pod)
                    if self.stopped.is_set():
                        break
            except ApiException as e:
                if e.status == 410:  # the resourceVersion is too old: list again
                    resource_version = None
                self.stopped.wait(0.2)
            except urllib3.exceptions.HTTPError:  # the API server is busy (a dropped or timed-out stream): look again
                self.stopped.wait(0.2)

    def _saw(self, pod: Any) -> None:
        self.seen_pods.add(pod.metadata.name)
        if pod.metadata.uid not in self.procs and pod.spec.node_name and not pod.metadata.deletion_timestamp:
            self._run(pod)

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(10)
        for proc in self.procs.values():
            proc.terminate()
            proc.wait(10)
        for pv in self.volumes:
            try:
                self.core_v1.delete_persistent_volume(pv)
            except ApiException as error:
                if error.status != 404:  # 404: already gone
                    raise
        if self.error is not None:
            raise AssertionError(f"the reader kubelet stopped: {type(self.error).__name__}: {self.error}") from self.error
