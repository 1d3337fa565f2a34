"""The operator as a process on the local control plane: `specdec run` (the `operator` fixture), in-process SGLang
simulators it reaches through --endpoints (the `sims` fixture), and helpers to create SpeculativeServers from
examples/ and read their status and Events. Fixtures registered from tests/conftest.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.simulators import Simulators

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
GROUP, VERSION, PLURAL = "specdec.io", "v1alpha1", "speculativeservers"


# ---------------------------------------------------------------------------------------------------------
# Simulators on a background event loop (tests/support/simulators.py)


@pytest.fixture
def sims() -> Any:
    pool = Simulators()
    yield pool
    pool.close()


# ---------------------------------------------------------------------------------------------------------
# The operator process


class Operator:
    """`specdec run` as a subprocess, scoped to one namespace, with an endpoints mapping file."""

    def __init__(self, kubeconfig: str, namespace: str, workdir: Path) -> None:
        self.kubeconfig = kubeconfig
        self.namespace = namespace
        self.workdir = workdir
        self.endpoints: dict[str, str] = {}
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.extra_args: list[str] = []
        self.peering: str | None = None  # --peering NAME instead of --standalone
        self.all_procs: list[subprocess.Popen] = []
        self.scripts: dict[str, dict[str, Any]] = {}  # --probe-script: scripted probes by resource name

    def map(self, service: str, url: str) -> None:
        self.endpoints[f"{self.namespace}/{service}"] = url

    def script(self, name: str, speedup: float | dict[str, float], **entry: Any) -> None:
        """Resource ``name``'s probes decide on scripted rounds (probe/scripted.py: speedup, noise, acceptLength,
        secondsPerRound) instead of measuring the simulators: for tests of what the operator does with a decision, which
        must not depend on how busy the machine is. Read when each probe starts, so it may be set while running."""
        self.scripts[f"{self.namespace}/{name}"] = {"speedup": speedup, **entry}
        (self.workdir / "probe-script.yaml").write_text(yaml.safe_dump(self.scripts))

    def start(self) -> subprocess.Popen:
        self.starts += 1
        path = self.workdir / "endpoints.yaml"
        path.write_text(yaml.safe_dump(self.endpoints))
        script = self.workdir / "probe-script.yaml"
        script.write_text(yaml.safe_dump(self.scripts))
        log = open(self.workdir / f"operator-{self.starts}.log", "w")
        env = {**os.environ, "KUBECONFIG": self.kubeconfig}
        peering = ["--peering", self.peering] if self.peering else ["--standalone"]
        cmd = [
            sys.executable,
            "-m",
            "specdec_operator.cli",
            "run",
            "--namespace",
            self.namespace,
            *peering,
            "--endpoints",
            str(path),
            "--metrics-port",
            "0",
            "--reconcile-interval",
            "1",
            "--probe-script",
            str(script),
            *self.extra_args,
        ]
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.workdir)
        self.all_procs.append(self.proc)
        return self.proc

    def log_of(self, start: int) -> str:
        return (self.workdir / f"operator-{start}.log").read_text()

    def kill(self) -> None:
        """SIGKILL: no cleanup, no goodbye, as a node failure or an OOM kill."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        for proc in self.all_procs:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)

    def logs(self) -> str:
        return "\n".join(p.read_text() for p in sorted(self.workdir.glob("operator-*.log")))


@pytest.fixture
def operator(kubeconfig_path: str, namespace: str, tmp_path: Path, custom_objects: Any, core_v1: Any) -> Any:
    op = Operator(kubeconfig_path, namespace, tmp_path)
    yield op
    # Delete the resources while the operator runs (it owns the finalizer), and wait until the garbage collector
    # removed the pods: the next test's servers need the GPUs of the simulated nodes.
    try:
        if op.proc is None or op.proc.poll() is not None:
            op.start()
        for item in custom_objects.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]:
            custom_objects.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, item["metadata"]["name"])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            left = custom_objects.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]
            if not left and not core_v1.list_namespaced_pod(namespace).items:
                break
            time.sleep(0.5)
    finally:
        op.stop()
        if os.environ.get("SPECDEC_E2E_LOGS"):
            print(op.logs())


# ---------------------------------------------------------------------------------------------------------
# Helpers


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The scripted probe (Operator.script, Cluster.script) of examples/llama31-8b-eagle3.yaml on the simulators'
# llama31-8b-eagle3 profile: its truth, about 2x at one stream and less at 32 (the example's two workloads), and the
# profile's acceptance length. For tests of what the operator does with a promotion, not of measuring it.
LLAMA_EAGLE3_SCRIPT: dict[str, Any] = {"speedup": {"chat": 2.0, "batch-32": 1.6}, "acceptLength": 2.8}


def example(
    file: str, name: str, namespace: str, *, annotations: dict[str, str] | None = None, workloads: list | None = None, **spec_changes: Any
) -> dict:
    cr = yaml.safe_load((EXAMPLES / file).read_text())
    cr["metadata"] = {"name": name, "namespace": namespace}
    cr["spec"]["podMetadata"] = {"annotations": dict(annotations or {})}
    # The API's default round budget (6): the tests that assert a decision about what follows it decide on scripted
    # evidence (Operator.script), and the few that measure in real time (the probe, load-aware curves, datasets'
    # acceptance) set rollout__maxRounds themselves where a busy machine's jitter needs more rounds.
    if workloads is not None:
        cr["spec"].setdefault("rollout", {})["workloads"] = workloads
    for dotted, value in spec_changes.items():
        node = cr["spec"]
        *path, last = dotted.split("__")
        for key in path:
            node = node.setdefault(key, {})
        node[last] = value
    return cr


def compatible_annotations(findings: list | None = None, ready_after: str = "1s") -> dict[str, str]:
    return {
        "specdec.test/init-exit-code": "0",
        "specdec.test/init-message": json.dumps({"compatible": True, "findings": findings or []}),
        "specdec.test/ready-after": ready_after,
    }


def get(custom_objects: Any, namespace: str, name: str) -> dict:
    return custom_objects.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)


def status(custom_objects: Any, namespace: str, name: str) -> dict:
    return get(custom_objects, namespace, name).get("status") or {}


def wait_phase(custom_objects: Any, namespace: str, name: str, phases: set[str], timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        st = status(custom_objects, namespace, name)
        if st.get("phase") in phases:
            return st
        if time.monotonic() > deadline:
            pytest.fail(
                f"{namespace}/{name} not in {sorted(phases)} after {timeout:.0f}s: phase {st.get('phase')}, {st.get('message')}", pytrace=False
            )
        time.sleep(0.1)


def step_after_now(custom_objects: Any, namespace: str, name: str, timeout: float = 60.0) -> dict:
    """The status of an operator step that began after everything before this call had reached the operator: the
    positive evidence a test needs before asserting that something did NOT happen (no second probe, no write, no
    flapping). A fixed sleep instead passes when the operator stalls.

    Two edits that change neither the speculative revision nor any decision (spec.monitor.window + 1, each) bump
    metadata.generation; status.observedGeneration reaching each is a step that saw it. A step reads the generation
    after it has listed the children, so the step of the first edit may have begun just before it; the step of the
    second began after that one had finished (one resource's steps run one after another), with the first edit, and
    so whatever was in place before this call, already in the operator's hands. Everything a step does (its status,
    its children, the Events it logs, the probe it starts) is done when the next step's status is there. Fails,
    naming the generation it waited for, when the operator takes no step."""
    st: dict = {}
    for _ in range(2):
        window = int(((get(custom_objects, namespace, name).get("spec") or {}).get("monitor") or {}).get("window") or 5)
        patch = {"spec": {"monitor": {"window": window + 1 if window < 1000 else window - 1}}}
        generation = custom_objects.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, patch)["metadata"]["generation"]
        deadline = time.monotonic() + timeout
        while ((st := status(custom_objects, namespace, name)).get("observedGeneration") or 0) < generation:
            if time.monotonic() > deadline:
                pytest.fail(
                    f"{namespace}/{name}: no operator step saw generation {generation} within {timeout:.0f}s "
                    f"(observedGeneration {st.get('observedGeneration')}, phase {st.get('phase')})",
                    pytrace=False,
                )
            time.sleep(0.1)
    return st


def logged_events(log: str, name: str, reason: str) -> int:
    """How many `reason` Events the operator logged for the resource `name` (it logs each Event it posts, in the
    step that makes it: controller/execute.py). Unlike the Events themselves, which Kopf posts from a queue after
    the step, a line is in the log when the step is over."""
    return sum(1 for line in log.splitlines() if f"/{name}: {reason}: " in line)


def events(core_v1: Any, namespace: str, name: str) -> list:
    return [
        e for e in core_v1.list_namespaced_event(namespace).items if e.involved_object.kind == "SpeculativeServer" and e.involved_object.name == name
    ]


def event_reasons(core_v1: Any, namespace: str, name: str) -> list[str]:
    out = []
    for e in events(core_v1, namespace, name):
        out += [e.reason] * max(1, e.count or 1)
    return out


def variant_pods(core_v1: Any, namespace: str, name: str, variant: str) -> list:
    selector = f"app.kubernetes.io/instance={name},specdec.io/variant={variant}"
    return core_v1.list_namespaced_pod(namespace, label_selector=selector).items


def stable_variant(core_v1: Any, namespace: str, name: str) -> str:
    return core_v1.read_namespaced_service(name, namespace).spec.selector["specdec.io/variant"]


def settled_variant(core_v1: Any, namespace: str, name: str, want: str, timeout: float = 15.0) -> str:
    """The variant Service ``name`` selects once it is ``want``, or what it selects after ``timeout`` (for the
    assertion's message). A step patches its status and its children at once (controller/execute.py: one round trip),
    so a test that saw the status may read the Service a moment before its patch lands (seen once on a loaded fresh
    machine); a Service that never follows still fails."""
    deadline = time.monotonic() + timeout
    while True:
        seen = stable_variant(core_v1, namespace, name)
        if seen == want or time.monotonic() >= deadline:
            return seen
        time.sleep(0.2)


def settled_event_reasons(core_v1: Any, namespace: str, name: str, done: Callable[[list[str]], bool], timeout: float = 15.0) -> list[str]:
    """The reasons of ``name``'s Events once ``done`` holds for them, or what they are after ``timeout`` (for the
    assertion's message). A step posts its Events after its status patch (controller/execute.py), so a test that saw
    the status may list the Events before the step's last ones are posted (CI at stop 40 saw 2 of 3 CandidateMeasured
    right after the race's decision); an Event that never comes still fails."""
    deadline = time.monotonic() + timeout
    while True:
        reasons = event_reasons(core_v1, namespace, name)
        if done(reasons) or time.monotonic() >= deadline:
            return reasons
        time.sleep(0.2)


def validator_verdict(tmp_path: Path) -> tuple[int, str]:
    """What the real `specdec validate` writes for a Kimi-K2 drafter put on a Llama-3.1-8B target."""
    from tests.support import model_dirs as md

    target = md.make_target(tmp_path / "models" / "llama", md.LLAMA_31_8B, tokenizer_config=md.LLAMA_31_TOKENIZER)
    drafter = md.make_drafter(tmp_path / "models" / "drafter", md.kimi_drafter_config())
    log = tmp_path / "termination-log"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "specdec_operator.cli",
            "validate",
            "--target",
            str(target),
            "--drafter",
            str(drafter),
            "--json",
            "--termination-log",
            str(log),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return proc.returncode, log.read_text()
