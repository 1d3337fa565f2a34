"""Replicas of the operator process for the crash and reliability tests: `specdec run` subprocesses that can be
SIGKILLed and restarted, sharing in-process simulators; a watcher of the stable Service's selector; the
`cluster` fixture (replicas, simulators and the API of one namespace). Registered from tests/conftest.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import urllib3
import yaml

from tests.support.kube import wait_until
from tests.support.operator_process import GROUP, PLURAL, VERSION
from tests.support.simulators import Simulators

DECIDED = {"Promoted", "RolledBack", "Invalid", "Failed"}
PEERING_LIFETIME = 15  # seconds; Kopf's minimum that does not flap (it refreshes 5-10 s before expiry)


class OperatorProcess:
    """One `specdec run` subprocess (a replica); restartable; SIGKILL on demand."""

    def __init__(self, kubeconfig: str, namespace: str, workdir: Path, endpoints: dict[str, str], label: str, extra: list[str], script: Path) -> None:
        self.kubeconfig, self.namespace, self.workdir = kubeconfig, namespace, workdir
        self.endpoints, self.label, self.extra, self.script = endpoints, label, extra, script
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        path = self.workdir / f"endpoints-{self.label}.yaml"
        path.write_text(yaml.safe_dump(self.endpoints))
        log = open(self.workdir / f"operator-{self.label}-{self.starts}.log", "w")
        cmd = [
            sys.executable,
            "-m",
            "specdec_operator.cli",
            "run",
            "--namespace",
            self.namespace,
            "--endpoints",
            str(path),
            "--metrics-port",
            "0",
            "--reconcile-interval",
            "1",
            "--probe-script",
            str(self.script),
            *self.extra,
        ]
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "KUBECONFIG": self.kubeconfig}, cwd=self.workdir)

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

    def log_of(self, start: int) -> str:
        """The log of one start (1: the first)."""
        return (self.workdir / f"operator-{self.label}-{start}.log").read_text()

    def logs(self) -> str:
        """Every start's log, in the order of the starts."""
        return "\n".join(self.log_of(start) for start in range(1, self.starts + 1))


class Cluster:
    """What a test needs: the replicas, the simulators, the API."""

    def __init__(self, kubeconfig: str, namespace: str, workdir: Path, custom: Any, core: Any, apps: Any) -> None:
        self.kubeconfig, self.namespace, self.workdir = kubeconfig, namespace, workdir
        self.custom, self.core, self.apps = custom, core, apps
        self.sims = Simulators()
        self.endpoints: dict[str, str] = {}
        self.replicas: list[OperatorProcess] = []
        self.scripts: dict[str, dict[str, Any]] = {}  # --probe-script of every replica: scripted probes by resource name
        self.script_path = workdir / "probe-script.yaml"
        self.script_path.write_text(yaml.safe_dump(self.scripts))

    def script(self, name: str, speedup: float | dict[str, float], **entry: Any) -> None:
        """Resource ``name``'s probes decide on scripted rounds (probe/scripted.py), as Operator.script: for tests of
        what the replicas do with a decision, which must not depend on how busy the machine is. Every replica reads
        the same file when each probe starts."""
        self.scripts[f"{self.namespace}/{name}"] = {"speedup": speedup, **entry}
        self.script_path.write_text(yaml.safe_dump(self.scripts))

    def serve(self, name: str, time_scale: float = 20.0) -> tuple[Any, Any]:
        base = self.sims.start("llama31-8b-base", time_scale=time_scale)
        spec = self.sims.start("llama31-8b-eagle3", time_scale=time_scale)
        self.endpoints[f"{self.namespace}/{name}-base"] = base.url
        self.endpoints[f"{self.namespace}/{name}-spec"] = spec.url
        return base, spec

    def replica(self, *extra: str) -> OperatorProcess:
        op = OperatorProcess(
            self.kubeconfig, self.namespace, self.workdir, self.endpoints, f"r{len(self.replicas)}", list(extra) or ["--standalone"], self.script_path
        )
        self.replicas.append(op)
        return op

    def create(self, cr: dict) -> None:
        self.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, cr)

    def assert_no_duplicates(self, name: str) -> None:
        ns = self.namespace
        deployments = self.apps.list_namespaced_deployment(ns).items
        assert sorted(d.metadata.name for d in deployments) == [f"{name}-base", f"{name}-spec"]
        assert sorted(s.metadata.name for s in self.core.list_namespaced_service(ns).items) == [name, f"{name}-base", f"{name}-spec"]
        assert len(self.apps.list_namespaced_replica_set(ns).items) == 2
        # One pod per replica asked for: a loser scaled to 0 (rollout.keepBaseWarm / keepSpeculativeWarm) has none.
        asked = sum(d.spec.replicas for d in deployments)
        assert asked >= 1, "no Deployment asks for a server"
        wait_until(lambda: len(self.core.list_namespaced_pod(ns).items) == asked, timeout=20, message=f"exactly {asked} pod(s), one per replica")


class SelectorHistory(threading.Thread):
    """Records every variant the stable Service `<name>` ever selected (polled every 50 ms)."""

    def __init__(self, core: Any, namespace: str, name: str) -> None:
        super().__init__(daemon=True)
        self.core, self.namespace, self.name = core, namespace, name
        self.history: list[str] = []
        self.stopped = threading.Event()
        self.error: Exception | None = None

    def run(self) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            while not self.stopped.is_set():
                try:
                    variant = self.core.read_namespaced_service(self.name, self.namespace).spec.selector.get("specdec.io/variant")
                except (ApiException, urllib3.exceptions.HTTPError):  # not created yet, or the API server briefly unreachable
                    variant = None
                if variant and (not self.history or self.history[-1] != variant):
                    self.history.append(variant)
                self.stopped.wait(0.05)
        except Exception as error:  # reported by stop_at: a watcher that died would leave the history short
            self.error = error

    def stop_at(self, variant: str, timeout: float = 20) -> None:
        """Stop once the stable Service selects `variant` (the switch can trail the status by a step)."""
        wait_until(lambda: self.history[-1:] == [variant] or self.error, timeout=timeout, message=f"the stable Service selecting {variant}")
        self.stopped.set()
        if self.error is not None:
            raise AssertionError(f"the stable Service's watcher failed: {type(self.error).__name__}: {self.error}") from self.error


@pytest.fixture
def cluster(kubeconfig_path: str, namespace: str, tmp_path: Path, custom_objects: Any, core_v1: Any, apps_v1: Any) -> Any:
    c = Cluster(kubeconfig_path, namespace, tmp_path, custom_objects, core_v1, apps_v1)
    yield c
    # Delete the resources with an operator running (it owns the finalizer) so that the pods' GPUs are freed.
    try:
        alive = [r for r in c.replicas if r.proc and r.proc.poll() is None]
        if not alive:
            r = c.replica("--standalone")
            r.start()
        for item in custom_objects.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]:
            custom_objects.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, item["metadata"]["name"])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if (
                not custom_objects.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]
                and not core_v1.list_namespaced_pod(namespace).items
            ):
                break
            time.sleep(0.5)
    finally:
        for r in c.replicas:
            r.stop()
        c.sims.close()
        if os.environ.get("SPECDEC_E2E_LOGS"):
            for r in c.replicas:
                print(r.logs())


def watch_selector(c: Cluster, name: str) -> SelectorHistory:
    history = SelectorHistory(c.core, c.namespace, name)
    history.start()
    return history
