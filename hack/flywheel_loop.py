"""The moving parts of `make demo`'s retraining loop beside the operator (hack/demo_flywheel.py says what runs where):
the simulators, the capture proxy, the users' traffic, hack/job_runner.py, the speculative slot's router and the
probe script's entry; then following the loop until the retrained drafter serves and acceptance recovers."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hack import demo_flywheel as df
from hack import flywheel_job as fj
from specdec_operator.cli import kubectl_revisions
from specdec_operator.simulator import revisions as rv
from specdec_operator.simulator.model import Profile

Say = Callable[[str], None]


class Flywheel:
    def __init__(self, namespace: str, workdir: Path, endpoints: dict[str, str], write_endpoints: Callable[[], None], script_file: Path) -> None:
        self.namespace, self.workdir, self.script_file = namespace, workdir, script_file
        self.endpoints, self.write_endpoints = endpoints, write_endpoints
        self.root = workdir / "job-runner"
        self.claims = self.root / "claims" / namespace
        self.storage_class = f"{namespace}-flywheel"
        self.kind = df.TRAINED_ON
        self.sims: dict[str, str] = {}  # label -> URL
        self.procs: list[subprocess.Popen] = []
        self.proxy: subprocess.Popen | None = None
        self.proxy_port, self.admin_port = df.free_port(), df.free_port()
        self.upstream: str | None = None
        self.sent: dict[str, int] = {}
        self.stop_event = threading.Event()
        self.threads: list[threading.Thread] = []
        self.runner: Any = None
        self.readers: Any = None
        self.lock = threading.Lock()  # around the endpoints' changes and the file's writes (the router, the readers)
        self.core: Any = None
        self.custom: Any = None
        self.apps: Any = None
        self.volumes: list[str] = []
        self.status: dict[str, Any] = {}
        self.slot = "drafter"  # what <name>-spec points at: "drafter" or a revision's name
        self.entry: dict[str, Any] | None = None
        self.errors: list[str] = []
        self.shown = ""  # the last line follow() printed

    @property
    def key(self) -> str:
        return f"{self.namespace}/{df.NAME}"

    def _service(self, suffix: str) -> str:
        return f"{self.namespace}/{df.NAME}-{suffix}"

    def simulator(self, label: str, *args: str) -> str:
        port = df.free_port()
        log = (self.workdir / f"sim-{df.NAME}-{label}.log").open("a")
        argv = ["simulate", *args, "--port", str(port), "--time-scale", str(df.TIME_SCALE), "--load-seconds", "0", "--seed", "1"]
        self.procs.append(subprocess.Popen([sys.executable, "-m", "specdec_operator.cli", *argv], stdout=log, stderr=subprocess.STDOUT))
        self.sims[label] = f"http://127.0.0.1:{port}"
        return self.sims[label]

    def start(self, say: Say) -> None:
        """The base and the chat drafter's simulators, the capture proxy's address in the endpoints, the probe script."""
        self.endpoints[self._service("base")] = self.simulator("base", "--profile", fj.BASE_PROFILE)
        self.endpoints[self._service("spec")] = self.simulator("drafter", "--profile", fj.DRAFTER_PROFILE, "--trained-on", df.TRAINED_ON)
        self.endpoints[self._service("capture")] = f"http://127.0.0.1:{self.admin_port}"
        self.script()
        say(f"      {df.NAME}: base {self.sims['base']}, the drafter trained on chat {self.sims['drafter']} (--trained-on chat), ")
        say(f"        capture proxy :{self.proxy_port} (admin :{self.admin_port}) into {self.claims / (df.NAME + '-capture')}")

    # ---- the cluster side ------------------------------------------------------------------------------------

    def apply(self, kubectl: Callable[..., Any], kubeconfig: str, annotations: dict[str, str], workloads: list[dict], say: Say) -> None:
        """The capture claim's volume, the resource, the job runner and the threads (users, router)."""
        import yaml
        from kubernetes import client, config

        from hack.job_mapping import VolumeDirs
        from hack.job_runner import JobRunner
        from hack.reader_kubelet import ReaderKubelet

        api = config.new_client_from_config(config_file=kubeconfig)
        self.core, self.custom, self.apps = client.CoreV1Api(api), client.CustomObjectsApi(api), client.AppsV1Api(api)
        self.make_volume("capture")
        kubectl("apply", "-f", "-", input=yaml.safe_dump(df.priority_class()))
        kubectl("apply", "-f", "-", input=yaml.safe_dump(df.resource(self.namespace, self.storage_class, annotations, workloads)))
        dirs = VolumeDirs(self.root, named={"model": self.root / "models"})
        self.runner = JobRunner(api, self.root, dirs, fj.SimulatedExecute(), namespaces={self.namespace}).start()
        # A revision races on its held-out slice too (a File workload on the revisions claim): its reader pods' kubelet.
        self.readers = ReaderKubelet(
            self.core, self.namespace, self.endpoints, self.write_endpoints, self.workdir, self.root / "models", self.claims, self.lock
        )
        self.readers.start()
        self.threads = [
            threading.Thread(target=df.send_traffic, args=(self.traffic_url, lambda: self.kind, self.stop_event, self.sent), daemon=True),
            threading.Thread(target=self._route_loop, daemon=True, name="flywheel-router"),
        ]
        for t in self.threads:
            t.start()
        say(f"      {df.NAME:<26} the Llama drafter trained on chat, capture on, a training Job on drift (the loop, step 7)")

    def make_volume(self, which: str) -> None:
        from kubernetes.client.exceptions import ApiException

        name = f"{self.storage_class}-{which}"
        path = self.claims / f"{df.NAME}-{which}"
        try:
            self.core.create_persistent_volume(df.volume(name, self.storage_class, self.namespace, f"{df.NAME}-{which}", path))
            self.volumes.append(name)
        except ApiException as exc:
            self.errors.append(f"PersistentVolume {name}: {exc.status} {exc.reason} (left from an earlier demo? delete it)")

    def traffic_url(self) -> str | None:
        return f"http://127.0.0.1:{self.proxy_port}" if self.proxy is not None and self.proxy.poll() is None else None

    # ---- the router: what stands behind each name ------------------------------------------------------------

    def _route_loop(self) -> None:
        while not self.stop_event.wait(0.5):
            try:
                self.route()
            except Exception as exc:  # the API server busy for a moment: keep the mapping, try again
                self.errors.append(f"router: {type(exc).__name__}: {exc}"[:300])
                self.errors = self.errors[-20:]

    def read(self) -> tuple[dict[str, Any], dict[str, Any] | None]:
        from kubernetes.client.exceptions import ApiException

        obj = self.custom.get_namespaced_custom_object("specdec.io", "v1alpha1", self.namespace, "speculativeservers", df.NAME)
        try:
            deployment = self.apps.api_client.sanitize_for_serialization(self.apps.read_namespaced_deployment(f"{df.NAME}-spec", self.namespace))
        except ApiException:
            deployment = None
        return obj, deployment

    def route(self) -> None:
        """Point <name>-spec at the simulator of the drafter its pod template serves, the capture proxy at the side the
        stable Service selects, make the revisions claim's volume once the runner ran the Job, and keep the script."""
        obj, deployment = self.read()
        self.status = obj.get("status") or {}
        revision = df.template_revision(deployment)
        slot = revision or "drafter"
        url = self.revision_simulator(revision) if revision else self.sims["drafter"]
        if url is not None and self.endpoints.get(self._service("spec")) != url:
            with self.lock:
                self.endpoints[self._service("spec")] = url
                self.write_endpoints()
            self.slot = slot
        if self.runner is not None and self.runner.jobs and not any(v.endswith("-revisions") for v in self.volumes):
            self.make_volume("revisions")  # after the runner bound the Job's pod: else kwok would have taken it
        side = "spec" if self.status.get("activeVariant") == "speculative" else "base"
        upstream = self.endpoints[self._service(side)]
        if upstream != self.upstream:
            self.restart_proxy(upstream)
        self.script()

    def revision_simulator(self, revision: str) -> str | None:
        """The simulator of a published revision (started on first use, as its simulated-drafter.json says)."""
        if revision in self.sims:
            return self.sims[revision]
        path = self.claims / f"{df.NAME}-revisions" / revision / rv.REVISION_FILE
        if not path.is_file():
            return None
        doc = json.loads(path.read_text())
        return self.simulator(revision, "--profile", doc["profile"], "--trained-on", ",".join(doc["trainedOn"]))

    def restart_proxy(self, upstream: str) -> None:
        if self.proxy is not None:
            self.proxy.terminate()
            self.proxy.wait(10)
        capture = self.claims / f"{df.NAME}-capture"
        self.proxy = df.start_capture_proxy(capture, upstream, self.proxy_port, self.admin_port, self.workdir / "capture-proxy.log")
        self.upstream = upstream

    def published(self) -> dict[str, Profile]:
        """The revisions on the claim's directory: name -> the profile its simulated drafter serves."""
        folder = self.claims / f"{df.NAME}-revisions"
        return {p.parent.name: rv.read_revision(p.parent) for p in sorted(folder.glob(f"*/{rv.REVISION_FILE}"))} if folder.is_dir() else {}

    def write_script(self) -> None:
        """Write the probe script's entry now (the races' script was written whole meanwhile)."""
        self.entry = None
        self.script()

    def script(self) -> None:
        """The probe script's entry for the traffic of the moment: the serving drafter's figures and each other
        published revision's as its candidate's arm (rewritten only when it changes)."""
        revisions = self.published()
        serving_name = str((self.status.get("retraining") or {}).get("serving") or "")
        serving = revisions.get(serving_name) or fj.drafter((df.TRAINED_ON,))
        entry = df.script_entry(serving, {n: p for n, p in revisions.items() if n != serving_name}, self.kind)
        if entry != self.entry:
            df.write_script_entry(self.script_file, self.key, entry)
            self.entry = entry

    # ---- the story -------------------------------------------------------------------------------------------

    def follow(self, say: Say, started: float, until: Callable[[dict[str, Any]], bool], timeout: float) -> bool:
        """Print the loop's state whenever it changes, until ``until(status)``; False on timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = df.loop_line(self.status, self.slot)
            if line != self.shown:
                self.shown = line
                say(f"      {time.monotonic() - started:5.1f}s  {line[:200]}")
            if until(self.status):
                return True
            time.sleep(0.5)
        say(f"      timed out after {timeout:.0f}s; see the operator log" + (f" (router: {self.errors[-1]})" if self.errors else ""))
        return False

    def stop(self) -> None:
        self.stop_event.set()
        for t in self.threads:
            t.join(5)
        if self.runner is not None:
            self.runner.stop()
        if self.readers is not None:
            try:
                self.readers.stop()
            except AssertionError as exc:  # a reader pod it could not run: said, the rest still stopped
                self.errors.append(str(exc)[:300])
        for proc in [*self.procs, *([self.proxy] if self.proxy else [])]:
            proc.terminate()
        for proc in [*self.procs, *([self.proxy] if self.proxy else [])]:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        for name in self.volumes:  # cluster-scoped: they would outlive the namespace on a cluster the demo did not start
            try:
                self.core.delete_persistent_volume(name)
            except Exception:
                pass

    def revisions_table(self) -> str:
        obj, _ = self.read()
        return kubectl_revisions.revisions_table(df.NAME, obj.get("spec") or {}, obj.get("status") or {})


def accept_of(st: dict[str, Any]) -> float | None:
    value = (st.get("monitor") or {}).get("acceptLength")
    return float(value) if isinstance(value, int | float) else None


def run(fw: Flywheel, say: Say, timeout: float) -> bool:
    """Serve on chat, shift the traffic to code, and follow the loop until the retrained drafter serves and the
    monitor's acceptance is back over the floor; print the figures and `kubectl specdec revisions`. False if not."""
    started = time.monotonic()
    say("      Users send chat through the capture proxy; the drafter (trained on chat) serves once promoted:")
    ok = fw.follow(say, started, lambda st: st.get("activeVariant") == "speculative" and (accept_of(st) or 0) >= df.ACCEPT_FLOOR, timeout)
    before = accept_of(fw.status)
    say(f"      The traffic shifts to code ({fw.sent.get(df.TRAINED_ON, 0)} chat requests sent so far): the loop runs by itself from here")
    fw.kind, shifted = df.SHIFTED_TO, time.monotonic()
    lowest: list[float] = []

    def drifted(st: dict[str, Any]) -> bool:
        if (value := accept_of(st)) is not None:
            lowest.append(value)
        return st.get("reason") == "AcceptanceDrift"

    ok = ok and fw.follow(say, started, drifted, timeout)
    drift_at = time.monotonic()
    ok = ok and fw.follow(say, started, lambda st: df.promoted_revision(st) is not None, timeout)
    promoted_at = time.monotonic()
    ok = ok and fw.follow(say, started, lambda st: (accept_of(st) or 0) >= df.ACCEPT_FLOOR, timeout)
    after = accept_of(fw.status)
    jobs = list(fw.runner.jobs.values()) if fw.runner is not None else []
    say("\n      kubectl specdec revisions " + df.NAME + ":")
    say("\n".join("        " + line for line in fw.revisions_table().splitlines()))
    if not ok:
        say(
            "Flywheel check FAILED: the retrained drafter did not come to serve with acceptance over the floor"
            + (f" ({fw.errors[-1]})" if fw.errors else "")
        )
        return False
    low = min(lowest) if lowest else None
    shown = [f"{v:.2f}" if v is not None else "-" for v in (before, low, after)]
    say(
        f"\n      acceptance (status.monitor): {shown[0]} on chat before the shift, {shown[1]} on code after it, {shown[2]} with the retrained drafter"
    )
    say(
        f"      drift detected {drift_at - shifted:.1f}s after the shift; drift to promotion {promoted_at - drift_at:.1f}s; recovered {time.monotonic() - promoted_at:.1f}s later"
    )
    for job in jobs:
        say(
            f"      Job {job['job']}: {job.get('outcome')}, {job.get('seconds')}s wall, {job.get('cpuSeconds')} CPU-seconds (simulated stages, hack/flywheel_job.py)"
        )
    say(
        f"Flywheel check: {df.promoted_revision(fw.status)} trained on the shifted traffic, raced, promoted; acceptance recovered (loop {time.monotonic() - shifted:.0f}s)"
    )
    return True
