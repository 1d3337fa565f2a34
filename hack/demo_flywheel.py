"""`make demo`'s retraining loop (issue 36, item 5, simulated): a drafter trained on chat, traffic that shifts to code,
and the loop that runs by itself on the local control plane until acceptance recovers.

``llama31-8b-flywheel`` serves an EAGLE-3 drafter trained on chat (the simulator's ``--trained-on chat``:
acceptance 2.8 on chat, 1.2 elsewhere; simulator/revisions.py) with spec.retraining on: the capture of what users
send, and a training Job on drift. What runs where:

* **Traffic**: a sender here posts OpenAI chat requests, chat first and code after the shift, through a real
  capture proxy (`specdec capture`, a local process) to whichever server the stable Service selects (the base, or the
  speculative slot once promoted). The proxy writes the records into the directory that stands in for the capture
  claim; the operator reads its count from the proxy's /metrics (the endpoints file maps ``<name>-capture``). The
  capture pod on the cluster is a kwok pod, Ready, bound to a PersistentVolume made here (no provisioner).
* **Drift**: the operator's monitor scrapes the speculative simulator; on code its acceptance falls under the floor
  (2.0) and the monitor rolls back (AcceptanceDrift), which triggers the training Job ``<name>-train-1``.
* **The Job**: its pod stays unschedulable (the revisions claim has no volume) and hack/job_runner.py, in this
  process, binds and runs it with :class:`SimulatedExecute`: gather reads the newest captured conversations and
  their held-out tenth, train "learns" the kinds of traffic there (revisions.learned_kinds), publish writes the
  revision (``simulated-drafter.json`` and a COMPLETE marker) and the termination message of the contract (schema 1,
  docs/retraining.md) with offline figures from the profiles on the held-out conversations.
* **The race and the promotion** are the operator's: the revision races the serving drafter (candidate
  ``train-<n>``); the speculative slot's Deployment names ``/revisions/<job>`` while the revision is in it, and
  :class:`Flywheel`'s router points ``<name>-spec`` at a simulator of that revision (then the volume for the
  revisions claim is made, so the kwok pod serving it can start). Its probes decide on scripted rounds of the
  profiles' speedups on the traffic of the moment (kind_figures), as the demo's races do: deterministic.
* **Recovery**: once the revision serves, the code traffic reaches its simulator and status.monitor.acceptLength
  climbs back over the floor.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from hack import flywheel_job as fj
from specdec_operator.simulator.model import Profile

NAME = "llama31-8b-flywheel"
TRAINED_ON, SHIFTED_TO = fj.TRAINED_ON, "code"
ACCEPT_FLOOR = 2.0  # monitor.acceptLengthFloor: 2.8 on chat is above it, 1.2 on code below
MIN_SAMPLES = 20  # spec.retraining.training.minSamples
TIME_SCALE = 10.0
PAUSE_S = 0.1  # between one user's requests: about 8 a second, a light load for the shared host  # the simulators' (as the demo's other Llama pair)
VOLUME_SIZE = "100Gi"  # the hostPath PersistentVolumes made here for the capture and revisions claims (nothing allocated)
REPO = Path(__file__).resolve().parent.parent
REVISION_RE = re.compile(r"/revisions/([a-z0-9][-a-z0-9.]*)")

CHAT_PROMPTS = [
    "Tell me about your favourite holiday and what made it memorable.",
    "What should I pack for a weekend hiking trip in the mountains?",
    "Recommend a novel for someone who loved reading about ancient history.",
    "How do I politely decline an invitation to a wedding?",
    "Describe a relaxing morning routine for a busy week.",
]
CODE_PROMPTS = [
    "Write a Python function that parses a CSV file and returns a dict of columns.",
    "Fix this Rust code so the borrow checker accepts it: fn main() { let v = vec![1]; }",
    "Write a SQL query that lists the ten customers with the most orders.",
    "Implement a TypeScript function that debounces another function.",
    "def merge(a, b): return sorted(a + b)  # make this run in linear time",
]
PROMPTS = {TRAINED_ON: CHAT_PROMPTS, SHIFTED_TO: CODE_PROMPTS}

Say = Callable[[str], None]


# ---------------------------------------------------------------------------------------------------------
# The resource, and where the cluster's names lead


def resource(namespace: str, capture_class: str, annotations: dict[str, str], workloads: list[dict]) -> dict[str, Any]:
    """The flywheel's SpeculativeServer: the Llama example (one Hopper GPU a server) on chat, the monitor every 5 s with a floor of 2.0, capture of
    every request and a training Job on drift (CPU, small budget)."""
    cr = yaml.safe_load((REPO / "examples" / "llama31-8b-eagle3.yaml").read_text())
    cr["metadata"] = {"name": NAME, "namespace": namespace}
    spec = cr["spec"]
    spec["model"]["volume"] = {"hostPath": {"path": "/data/models", "type": "Directory"}}
    spec["rollout"]["workloads"] = workloads
    spec["monitor"] = {"interval": 5, "window": 2, "acceptLengthFloor": ACCEPT_FLOOR}
    capture = {"sampleShare": 1.0, "maxBytes": 16 << 20, "retentionHours": 24, "storageClassName": capture_class}
    budget = {"gpus": 0, "maxSteps": 200, "maxMinutes": 10, "maxSamples": fj.MAX_SAMPLES}
    training = {"budget": budget, "minSamples": MIN_SAMPLES, "cooldownMinutes": 1, "triggers": {"onDrift": True}}
    spec["retraining"] = {"capture": capture, "training": training}
    spec["podMetadata"] = {"annotations": annotations}
    return cr


def priority_class() -> dict[str, Any]:
    """The training Jobs' PriorityClass as the chart makes it (templates/priorityclass.yaml): the operator's Jobs name
    it, and the API server refuses their pods where it is missing (the demo installs no chart)."""
    from specdec_operator.trainjob import DEFAULT_PRIORITY_CLASS

    meta = {"name": DEFAULT_PRIORITY_CLASS, "labels": {"specdec.io/demo": "flywheel"}}
    description = "specdec-operator's training Jobs: below serving, never preempting"
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": meta,
        "value": -100,
        "preemptionPolicy": "Never",
        "description": description,
    }


def template_revision(deployment: dict[str, Any] | None) -> str | None:
    """The trained revision a speculative Deployment's pod template serves (``/revisions/<job>`` in a container's
    command or args), or None (spec.drafter)."""
    if not deployment:
        return None
    pod = ((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}
    for container in pod.get("containers") or []:
        for arg in [*(container.get("command") or []), *(container.get("args") or [])]:
            found = REVISION_RE.search(str(arg))
            if found:
                return found.group(1)
    return None


def script_entry(serving: Profile, racing: dict[str, Profile], kind: str) -> dict[str, Any]:
    """The probe script's entry (probe/scripted.py) of the flywheel on ``kind`` traffic: the serving drafter's
    speedup and acceptance, and each racing revision's as the arm of its candidate (``train-<n>``)."""
    speedup, accept = fj.figures(serving, kind)
    entry: dict[str, Any] = {"speedup": speedup, "acceptLength": accept, "noise": 0.05, "secondsPerRound": 1.0}
    arms = {}
    for job, profile in racing.items():
        s, a = fj.figures(profile, kind)
        arms["train-" + job.rsplit("-", 1)[-1]] = {"speedup": s, "acceptLength": a, "noise": 0.05, "secondsPerRound": 1.0}
    if arms:
        entry["arms"] = arms
    return entry


def write_script_entry(path: Path, key: str, entry: dict[str, Any]) -> None:
    """Set one entry of the operator's --probe-script (read at each probe's start), keeping the others."""
    doc = yaml.safe_load(path.read_text()) if path.is_file() else None
    doc = doc if isinstance(doc, dict) else {}
    doc[key] = entry
    tmp = path.with_name(path.name + ".flywheel.tmp")
    tmp.write_text(yaml.safe_dump(doc))
    os.replace(tmp, path)


def send_traffic(url: Callable[[], str | None], kind: Callable[[], str], stop: threading.Event, sent: dict[str, int]) -> None:
    """A user: an OpenAI chat request to ``url()`` (the capture proxy) every PAUSE_S after the last answer, of the
    prompt kind ``kind()``."""
    for i in itertools.count():
        if stop.is_set():
            return
        target, now = url(), kind()
        if target is None:
            time.sleep(0.2)
            continue
        prompt = PROMPTS[now][i % len(PROMPTS[now])]
        body = {"model": "default", "messages": [{"role": "user", "content": prompt}], "max_tokens": 32}
        request = urllib.request.Request(
            target + "/v1/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        try:
            urllib.request.urlopen(request, timeout=10).read()
            sent[now] = sent.get(now, 0) + 1
            time.sleep(PAUSE_S)
        except OSError:
            time.sleep(0.2)


def start_capture_proxy(directory: Path, upstream: str, port: int, admin_port: int, log: Path) -> subprocess.Popen:
    """`specdec capture` in front of ``upstream``, every chat request kept, into ``directory`` (the capture claim)."""
    argv = ["capture", "--upstream", upstream, "--dir", str(directory), "--sample-share", "1", "--max-bytes", str(16 << 20)]
    argv += ["--retention-hours", "24", "--host", "127.0.0.1", "--port", str(port), "--admin-port", str(admin_port), "--writer", "demo"]
    directory.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([sys.executable, "-m", "specdec_operator.cli", *argv], stdout=log.open("a"), stderr=subprocess.STDOUT)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def volume(name: str, storage_class: str, namespace: str, claim: str, path: Path) -> dict[str, Any]:
    """A hostPath PersistentVolume reserved for one claim (claimRef): the local control plane has no provisioner."""
    spec = {
        "capacity": {"storage": VOLUME_SIZE},
        "accessModes": ["ReadWriteOnce", "ReadWriteMany"],
        "storageClassName": storage_class,
        "persistentVolumeReclaimPolicy": "Retain",
        "hostPath": {"path": str(path)},
        "claimRef": {"namespace": namespace, "name": claim},
    }
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name, "labels": {"specdec.io/demo": "flywheel"}}, "spec": spec}


def loop_line(st: dict[str, Any], slot: str) -> str:
    """One line of the loop's state: phase, what serves, the monitor's acceptance, the Job, the revisions. Pure."""
    monitor, retraining = st.get("monitor") or {}, st.get("retraining") or {}
    training, capture = retraining.get("training") or {}, retraining.get("capture") or {}
    accept = monitor.get("acceptLength")
    job = (
        f"{training.get('job')} {training.get('state')} ({training.get('reason')})"
        if training.get("job")
        else f"no Job ({training.get('waiting') or '-'})"
    )
    rows = ", ".join(f"{r.get('name')} {r.get('outcome')}" for r in retraining.get("revisions") or []) or "none"
    return (
        f"{st.get('phase') or 'Pending'} ({st.get('reason') or '-'}), serving {st.get('activeVariant') or '-'} [slot: {slot}]; "
        f"acceptance {accept if accept is None else round(accept, 1)}; captured {capture.get('conversations')}; {job}; revisions: {rows}"
    )


def promoted_revision(st: dict[str, Any]) -> str | None:
    """The trained revision that won, serves and is served by the stable Service, or None. Pure."""
    retraining = st.get("retraining") or {}
    won = [r["name"] for r in retraining.get("revisions") or [] if r.get("outcome") == "Promoted"]
    serving = retraining.get("serving")
    if won and serving == won[-1] and st.get("phase") == "Promoted" and st.get("activeVariant") == "speculative":
        return str(serving)
    return None
