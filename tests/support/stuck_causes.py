"""Each stuck cause on the real node: the SpeculativeServers that meet them, the cluster and operators that run
them, and a recorder of when each cause's reason reaches status.

Used by tests/cluster/test_realnode_stuck.py (asserts) and benchmarks/stuck_causes.py (times). The node is
hack/devcluster's real node (containerd 1.6 + runc + kubelet v1.35 on this machine), so the kubelet, not a kwok
Stage, decides what a pod shows: a hostPath `type: Directory` that does not exist is refused by the kubelet's
mount (FailedMount Events), an image from a registry that does not resolve fails in containerd's pull, a server
whose process exits at start is restarted with CrashLoopBackOff and its last log lines as termination message.
The servers run the sglang-simulator image (`make images-local IMAGES=simulator`, imported into the node's
containerd); it also carries `specdec validate`, so the validator init container runs it too. The operators run
as `specdec run` processes on this machine (tests/support/operator_process.py), one per namespace:

- namespace STUCK: the validator image is the simulator image;
- namespace STUCK_VALIDATOR: the validator image is one no registry serves, so only the speculative pod waits
  (ImageNotPulled of its init container) while the base serves.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hack import devcluster
from hack.devcluster import realnode
from specdec_operator import SGLANG_VERSION
from tests.support import model_dirs as md

REPO = Path(__file__).resolve().parents[2]
GROUP, VERSION, PLURAL = "specdec.io", "v1alpha1", "speculativeservers"
STUCK, STUCK_VALIDATOR = "stuck", "stuck-validator"
ON_NODE = {"specdec.io/real-node": "true"}
DEADLINE_S = 60  # spec.progressDeadlineSeconds: the API's minimum
UNPULLABLE = "registry.invalid/specdec/sglang-simulator:0.1.0"  # .invalid never resolves (RFC 6761)
UNPULLABLE_VALIDATOR = "registry.invalid/specdec/validator:0.1.0"
MISSING_PROFILE = "no-such-profile"  # SIMULATOR_(SPECULATIVE_)PROFILE: that simulator exits at start
# Two servers per cause side by side (Unschedulable asks for 16): the node advertises 12 simulated GPUs, not 8.
NODE_GPUS = "12"


def _images_env() -> dict[str, str]:
    env = {}
    for line in (REPO / "images" / "images.env").read_text().splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            key, value = line.strip().split("=", 1)
            env[key] = value
    return env


SIMULATOR_REF = "{SIMULATOR_IMAGE}:{SIMULATOR_TAG}".format(**_images_env())


class SetupError(Exception):
    """The real node cannot be had here; the message says why and what to do."""


@dataclass(frozen=True)
class Cause:
    """One stuck cause: the SpeculativeServer that meets it, where status names it, and how the wait ends."""

    reason: str  # the Reason status names (condition reason, and in parentheses in waitingFor)
    name: str
    namespace: str
    condition: str  # BaseReady or SpeculativeReady
    waiting_for: str  # status.waitingFor while it waits
    phase: str  # the phase it ends in: Failed (the base waits) or RolledBack (the base serves)
    says: tuple[str, ...]  # what the condition's message names
    base_serves: bool
    changes: dict[str, Any] = field(default_factory=dict)


CAUSES = (
    Cause(
        "VolumeNotMounted",
        "novolume",
        STUCK,
        "BaseReady",
        "the base server (VolumeNotMounted)",
        "Failed",
        ("volume model", "FailedMount", "not a directory"),
        False,
        {"model": "absent"},
    ),
    Cause(
        "ImageNotPulled",
        "nopull",
        STUCK,
        "BaseReady",
        "the base server (ImageNotPulled)",
        "Failed",
        (UNPULLABLE, "cannot be pulled"),
        False,
        {"image": UNPULLABLE},
    ),
    Cause(
        "Unschedulable",
        "toobig",
        STUCK,
        "BaseReady",
        "the base server (Unschedulable)",
        "Failed",
        ("not enough nvidia.com/gpu", "Insufficient nvidia.com/gpu", "hopper"),
        False,
        {"gpus": 16},
    ),
    Cause(
        "CrashLoop",
        "crash",
        STUCK,
        "SpeculativeReady",
        "the speculative server (CrashLoop)",
        "RolledBack",
        ("crash-looping", "exit code 1", MISSING_PROFILE),
        True,
        {"env": {"SIMULATOR_SPECULATIVE_PROFILE": MISSING_PROFILE}},
    ),
    Cause(
        "CrashLoop",
        "basecrash",
        STUCK,
        "BaseReady",
        "the base server (CrashLoop)",
        "Failed",
        ("crash-looping", "exit code 1", MISSING_PROFILE),
        False,
        {"env": {"SIMULATOR_PROFILE": MISSING_PROFILE}},
    ),
    Cause(
        "ImageNotPulled",
        "novalidator",
        STUCK_VALIDATOR,
        "SpeculativeReady",
        "the drafter validator (ImageNotPulled)",
        "RolledBack",
        (UNPULLABLE_VALIDATOR, "cannot be pulled"),
        True,
    ),
)


def server_cr(cause: Cause, models: Path, absent: Path) -> dict[str, Any]:
    """A one-server SpeculativeServer on the real node (1 simulated H200 per server, small CPU and memory so that
    every cause's pods fit beside each other), changed to meet ``cause``."""
    env = {"SIMULATOR_TIME_SCALE": "5", "SIMULATOR_LOAD_SECONDS": "2", **cause.changes.get("env", {})}
    spec: dict[str, Any] = {
        "image": cause.changes.get("image", SIMULATOR_REF),
        # The simulator's image names no SGLang release (issue 34): the spec says which command line it takes.
        "sglangVersion": SGLANG_VERSION,
        "progressDeadlineSeconds": DEADLINE_S,
        "model": {"volume": {"hostPath": {"path": str(absent if cause.changes.get("model") == "absent" else models), "type": "Directory"}}},
        "target": {"path": "llama", "contextLength": 8192},
        "drafter": {"path": "llama-eagle3", "numSteps": 3, "eagleTopk": 1},
        "resources": {"gpus": cause.changes.get("gpus", 1), "gpuFamily": "hopper", "shmSize": "64Mi", "cpu": "150m", "memory": "384Mi"},
        "nodeSelector": dict(ON_NODE),
        "sglang": {"maxRunningRequests": 64, "env": [{"name": k, "value": v} for k, v in env.items()]},
    }
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SpeculativeServer",
        "metadata": {"name": cause.name, "namespace": cause.namespace},
        "spec": spec,
    }


def models_dir() -> tuple[Path, Path]:
    """Tiny model directories the validator accepts (a Llama-3.1-8B target and its EAGLE-3 drafter), and a path
    next to them that does not exist."""
    models = Path(tempfile.mkdtemp(prefix="specdec-stuck-models-"))
    models.chmod(0o755)  # the validator runs as UID 65532
    md.make_target(models / "llama", md.LLAMA_31_8B, tokenizer_config=md.LLAMA_31_TOKENIZER)
    md.make_drafter(models / "llama-eagle3", md.llama31_8b_drafter_config())
    return models, models.parent / f"{models.name}-absent"


def start_real_node(name: str, log: Any = print) -> tuple[Any, dict[str, float]]:
    """The simulator image (built, or a cache hit), a cluster with the real node, the image in its containerd.
    Raises SetupError with the reason where this machine cannot run it."""
    why = realnode.can_run_containers()
    if why:
        raise SetupError(f"this machine cannot run the real node: {why}")
    tools = devcluster.tools_dir()
    missing = devcluster.missing_tools(tools) + realnode.missing_node_tools(tools)
    if missing:
        raise SetupError(f"tools missing in {tools} ({', '.join(missing)}): run `make tools REAL_NODE=1`")
    timings: dict[str, float] = {}
    started = time.monotonic()
    build = subprocess.run(
        ["make", "--no-print-directory", "images-local", "IMAGES=simulator"], cwd=REPO, capture_output=True, text=True, timeout=1800
    )
    if build.returncode != 0:
        raise SetupError(f"make images-local IMAGES=simulator failed:\n{(build.stdout + build.stderr)[-3000:]}")
    timings["make images-local (simulator)"] = time.monotonic() - started
    devcluster.reap_orphans()
    started = time.monotonic()
    try:
        cluster = devcluster.up(name, tie_to_parent=True, real_node=True, log=lambda m: log(f"devcluster: {m}"))
    except devcluster.ClusterError as error:
        devcluster.down(name, purge=True)
        raise SetupError(f"could not start the cluster with a real node: {error}") from error
    try:
        cluster.kubectl("apply", "--server-side", "-f", str(REPO / "crds"))
        for _ in range(120):  # `kubectl wait` fails while the new CRD has no status yet
            if cluster.kubectl("wait", "--for=condition=Established", f"crd/{PLURAL}.{GROUP}", "--timeout=30s", check=False).returncode == 0:
                break
            time.sleep(0.5)
        capacity = json.dumps({"status": {"capacity": {"nvidia.com/gpu": NODE_GPUS}}})
        cluster.kubectl("patch", "node", realnode.NODE_NAME, "--subresource=status", "--type=merge", "-p", capacity)
        for _ in range(60):
            node = json.loads(cluster.kubectl("get", "node", realnode.NODE_NAME, "-o", "json").stdout)
            if node["status"].get("allocatable", {}).get("nvidia.com/gpu") == NODE_GPUS:
                break
            time.sleep(0.5)
        timings["cluster up with the real node, CRD installed"] = time.monotonic() - started
        started = time.monotonic()
        archive = subprocess.run(
            [str(REPO / "hack" / "build-image.sh"), "--archive-of", SIMULATOR_REF], capture_output=True, text=True, check=True
        ).stdout.strip()
        devcluster.load_images(cluster, [Path(archive)])
    except (devcluster.ClusterError, subprocess.CalledProcessError) as error:
        devcluster.down(name, purge=True)
        raise SetupError(f"could not install the CRD or import the simulator image: {error}") from error
    timings["ctr images import (simulator)"] = time.monotonic() - started
    return cluster, timings


def operators(kubeconfig: str, workdir: Path, suffix: str = "") -> dict[str, Any]:
    """One `specdec run` per namespace (not started): the validator image differs between them."""
    from tests.support.operator_process import Operator

    out = {}
    for namespace, validator in ((STUCK + suffix, SIMULATOR_REF), (STUCK_VALIDATOR + suffix, UNPULLABLE_VALIDATOR)):
        directory = workdir / namespace
        directory.mkdir(parents=True, exist_ok=True)
        op = Operator(kubeconfig, namespace, directory)
        op.extra_args = ["--validator-image", validator]
        out[namespace] = op
    return out


@dataclass
class Seen:
    """What the recorder saw of one cause, in seconds since its SpeculativeServer was created."""

    reason_at: float | None = None  # its condition's reason is the cause's
    waiting_at: float | None = None  # status.waitingFor names it
    ended_at: float | None = None  # the phase it ends in, with ProgressDeadlineExceeded or (a crash) ProbeFailed
    condition: dict[str, Any] = field(default_factory=dict)  # the condition as first seen with the reason
    waiting_for: list[str] = field(default_factory=list)  # every distinct waitingFor, in order
    final: dict[str, Any] = field(default_factory=dict)  # the status that ended it


def in_namespace(cause: Cause, suffix: str) -> Cause:
    return dataclasses.replace(cause, namespace=cause.namespace + suffix)


def apply_and_record(custom: Any, causes: list[Cause], crs: list[dict[str, Any]], timeout: float = 240) -> dict[str, Seen]:
    """Create every SpeculativeServer at once and poll their status (every 0.2 s) until each has ended its wait
    or `timeout` passes; returns what was seen, by name."""
    created: dict[str, float] = {}
    for cause, cr in zip(causes, crs, strict=True):
        custom.create_namespaced_custom_object(GROUP, VERSION, cause.namespace, PLURAL, copy.deepcopy(cr))
        created[cause.name] = time.monotonic()
    seen = {c.name: Seen() for c in causes}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(s.ended_at is None for s in seen.values()):
        for cause in causes:
            record = seen[cause.name]
            if record.ended_at is not None:
                continue
            st = custom.get_namespaced_custom_object(GROUP, VERSION, cause.namespace, PLURAL, cause.name).get("status") or {}
            now = time.monotonic() - created[cause.name]
            cond = next((c for c in st.get("conditions") or [] if c["type"] == cause.condition), {})
            if record.reason_at is None and cond.get("reason") == cause.reason:
                record.reason_at, record.condition = now, dict(cond)
            waiting = st.get("waitingFor")
            if waiting and (not record.waiting_for or record.waiting_for[-1] != waiting):
                record.waiting_for.append(waiting)
            if record.waiting_at is None and waiting == cause.waiting_for:
                record.waiting_at = now
            if st.get("phase") == cause.phase and st.get("reason") in ("ProgressDeadlineExceeded", "ProbeFailed"):
                record.ended_at, record.final = now, st
        time.sleep(0.2)
    return seen


CLIENT = r"""
import json, sys, urllib.request
out = {}
for url in json.loads(sys.argv[1]):
    try:
        with urllib.request.urlopen(url, timeout=20) as resp:
            out[url] = resp.status
    except Exception as exc:
        out[url] = f"{type(exc).__name__}: {exc}"
open("/dev/termination-log", "w").write(json.dumps(out))
"""


def http_status_from_the_node(core: Any, namespace: str, urls: list[str], name: str = "client") -> dict[str, Any]:
    """A pod on the real node GETs each URL (through cluster DNS and the Services' kube-proxy rules) and reports the
    HTTP status or the error, by URL."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": dict(ON_NODE),
            "automountServiceAccountToken": False,
            "containers": [
                {
                    "name": "client",
                    "image": SIMULATOR_REF,
                    "imagePullPolicy": "Never",
                    "command": ["python3", "-c", CLIENT, json.dumps(urls)],
                    "resources": {"limits": {"cpu": "200m", "memory": "128Mi"}},
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": 65532,
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
        },
    }
    core.create_namespaced_pod(namespace, pod)
    deadline = time.monotonic() + 120
    while True:
        done = core.read_namespaced_pod(name, namespace)
        if done.status.phase in ("Succeeded", "Failed"):
            break
        if time.monotonic() > deadline:
            raise AssertionError(f"client pod {namespace}/{name} not done in 120 s: {done.status.phase}")
        time.sleep(0.5)
    term = done.status.container_statuses[0].state.terminated
    core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    return json.loads(term.message or "{}")
