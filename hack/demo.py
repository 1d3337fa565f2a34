#!/usr/bin/env python3
"""`make demo`: the operator deciding, on this machine, what the seed found out by hand over a day of GPU time.

1. Start a local Kubernetes control plane (hack/devcluster: real kube-apiserver, scheduler, controller-manager;
   kwok plays the kubelets of simulated 8-GPU Blackwell and Hopper nodes) and install the CRD.
2. Start SGLang simulators (specdec simulate) for every server: the Kimi-K2.5 base and the two drafters from the
   seed's table, and a Llama-3.1-8B-like pair whose drafter pays off.
3. Run the operator (specdec run) with an endpoints file that maps each Service to its simulator.
4. Apply examples/ (plus one drafter built for the wrong target) and show the lifecycle live; with them two races of
   the same three candidates (EAGLE-3, n-gram, a draft model), one on repetitive traffic and one on chat
   (hack/demo_race.py: each candidate's simulator behind the speculative slot while it is in it).
5. Print the seed-style table (variant, tok/s per workload, acceptance, decision) and each race's table; n-gram
   must win the repetitive traffic and EAGLE-3 the chat (exit status 1 otherwise).
6. A fleet: 4 Llama servers on Blackwell nodes, rollout.maxSurge 0, walked onto the drafter one server at a time
   and back again when its drafter drifts (the simulator restarted with a drafter that accepts nothing), printing
   the walk; then print the GPUs each resource holds and the idle ones, and check them against what its spec
   implies (a promoted server with rollout.keepBaseWarm keeps its base's GPUs, idle; a loser holds none), in
   status.gpus and in the operator's specdec_gpus / specdec_idle_gpus: exit status 1 otherwise.
7. The drafter flywheel (issue 36; hack/demo_flywheel.py says what runs where): a Llama drafter trained on chat
   serves chat that users send through a real capture proxy; the traffic shifts to code, acceptance falls, and the
   loop runs by itself: the monitor's drift rollback, a training Job (hack/job_runner.py runs it with a simulated
   execute: hack/flywheel_job.py), the retrained revision raced and promoted by the operator, acceptance back over
   the floor; then `kubectl specdec revisions`. Exit status 1 otherwise. Clean up.

Nothing runs in the simulated pods: their validator verdicts (produced here by the real `specdec validate` on
metadata-only model directories) and their readiness are scripted with specdec.test/* pod annotations.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

HACK = Path(__file__).resolve().parent
REPO = HACK.parent
sys.path.insert(0, str(HACK))
sys.path.insert(0, str(REPO))  # tests.support.model_dirs: metadata-only model directories for the validator

import demo_race
import devcluster

from hack import demo_flywheel, flywheel_loop

NAMESPACE = "specdec-demo"
CLUSTER = "specdec-demo"
# Workloads shortened for simulators that share a laptop's CPU with everything else: the seed's shapes (one
# stream, 128 concurrent streams), 128-token prompts, 64 generated tokens.
KIMI_WORKLOADS = [
    {"name": "single-stream", "concurrency": 1, "inputTokens": 128, "outputTokens": 64, "requests": 2},
    {"name": "concurrent-128", "concurrency": 128, "inputTokens": 128, "outputTokens": 64, "requests": 128},
]
# The load-aware case: one stream and 128 streams, judged on every workload (the plain probe rolls it back).
LOAD_AWARE_WORKLOADS = [
    {"name": "single-stream", "concurrency": 1, "inputTokens": 128, "outputTokens": 64, "requests": 8},
    {"name": "concurrent-128", "concurrency": 128, "inputTokens": 128, "outputTokens": 64, "requests": 128},
]
# The flywheel's one workload (step 7): one stream, its probes decided on scripted rounds.
FLYWHEEL_WORKLOADS = [{"name": "chat", "concurrency": 1, "inputTokens": 128, "outputTokens": 64, "requests": 4}]
LLAMA_WORKLOADS = [
    {"name": "chat", "concurrency": 1, "inputTokens": 128, "outputTokens": 64, "requests": 4, "weight": 3},
    {"name": "batch-32", "concurrency": 32, "inputTokens": 128, "outputTokens": 64, "requests": 64, "weight": 1},
]


def say(text: str = "") -> None:
    print(text, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def specdec(*args: str) -> list[str]:
    return [sys.executable, "-m", "specdec_operator.cli", *args]


# ---------------------------------------------------------------------------------------------------------
# What the demo deploys


class Case:
    def __init__(
        self,
        file: str | None,
        name: str,
        base_profile: str | None,
        spec_profile: str | None,
        time_scale: float,
        story: str,
        load: str,
        workloads: list[dict] | None = None,
    ) -> None:
        self.file, self.name, self.time_scale, self.story, self.load = file, name, time_scale, story, load
        self.base_profile, self.spec_profile, self.workloads = base_profile, spec_profile, workloads
        self.verdict: tuple[int, str] = (0, "")


CASES = [
    Case(
        "kimi-k25-int4-eagle3.yaml",
        "kimi-k25",
        "sglang-base-kimi-k25",
        "kimi-k25-custom-eagle3",
        5.0,
        "Kimi-K2.5 INT4 + the custom EAGLE-3 drafter trained on bf16 hidden states (seed: accept len 1.00)",
        "12s",
        KIMI_WORKLOADS,
    ),
    Case(
        "kimi-k25-int4-public-eagle3.yaml",
        "kimi-k25-public-drafter",
        "sglang-base-kimi-k25",
        "kimi-k2-public-eagle3",
        5.0,
        "Kimi-K2.5 INT4 + the public Kimi-K2 EAGLE-3 drafter (seed: accepts ~2.26 tokens, no faster)",
        "12s",
        KIMI_WORKLOADS,
    ),
    Case(
        "llama31-8b-eagle3.yaml",
        "llama31-8b",
        "llama31-8b-base",
        "llama31-8b-eagle3",
        10.0,
        "Llama-3.1-8B-Instruct + its EAGLE-3 drafter (a drafter that pays off)",
        "8s",
        LLAMA_WORKLOADS,
    ),
    Case(
        "llama31-8b-eagle3.yaml",
        "llama31-8b-wide-drafter",
        "llama31-8b-base",
        "llama31-8b-eagle3-wide",
        5.0,
        "Llama-3.1-8B-Instruct + a drafter that wins at one stream and loses at 128 (promoted load-aware)",
        "6s",
        LOAD_AWARE_WORKLOADS,
    ),
    Case(
        None,
        "llama31-8b-wrong-drafter",
        None,
        None,
        20.0,
        "Llama-3.1-8B-Instruct + a Kimi drafter by mistake (caught from metadata, before any GPU time)",
        "8s",
    ),
]


FLEET = "llama31-8b-fleet"
FLEET_REPLICAS = 4


def fleet_resource(verdict: tuple[int, str]) -> dict:
    """The fleet case: 4 servers of 8 Blackwell GPUs, maxSurge 0 (no spare GPUs), the drift monitor every 5 s."""
    cr = yaml.safe_load((REPO / "examples" / "llama31-8b-eagle3.yaml").read_text())
    cr["metadata"] = {"name": FLEET, "namespace": NAMESPACE}
    spec = cr["spec"]
    spec["replicas"] = FLEET_REPLICAS
    spec["model"]["volume"] = {"hostPath": {"path": "/data/models", "type": "Directory"}}
    spec["resources"].update(gpus=8, gpuFamily="blackwell")
    spec.setdefault("rollout", {}).update(workloads=LLAMA_WORKLOADS, keepBaseWarm=False, maxSurge=0, maxUnavailable=1)
    spec["monitor"] = {**spec.get("monitor", {}), "interval": 5, "window": 2}
    code, message = verdict
    annotations = {"specdec.test/init-exit-code": str(code), "specdec.test/init-message": message, "specdec.test/ready-after": "3s"}
    spec["podMetadata"] = {"annotations": annotations}
    return cr


def traffic(url: str, stop: Any) -> None:
    """Production traffic to one server: back-to-back /generate requests until `stop` is set."""
    import urllib.request

    body = json.dumps({"text": "hello " * 32, "sampling_params": {"max_new_tokens": 32, "ignore_eos": True}}).encode()
    while not stop.is_set():
        try:
            urllib.request.urlopen(
                urllib.request.Request(url + "/generate", data=body, headers={"Content-Type": "application/json"}), timeout=10
            ).read()
        except Exception:
            time.sleep(0.2)


def follow_walk(kubectl: Any, started: float, until: Any, timeout: float) -> dict:
    """Print the fleet's phase, rolloutProgress and Deployment counts whenever they change, until `until(status)`."""
    shown = ""
    deadline = time.monotonic() + timeout
    while True:
        st = (json.loads(kubectl("get", "sps", FLEET, "-n", NAMESPACE, "-o", "json").stdout).get("status")) or {}
        rolled: dict[str, Any] = next((c for c in st.get("conditions") or [] if c["type"] == "RolledOut"), {})
        pods = kubectl("get", "pods", "-n", NAMESPACE, "-l", f"app.kubernetes.io/instance={FLEET}", "-L", "specdec.io/variant", "--no-headers").stdout
        counts = {v: sum(1 for line in pods.splitlines() if line.split()[-1] == v) for v in ("base", "speculative")}
        line = (
            f"{st.get('phase') or 'Pending':<10} {st.get('rolloutProgress') or '':<16} pods base {counts['base']} speculative "
            f"{counts['speculative']}  {rolled.get('reason') or ''}"
        )
        if line != shown:
            shown = line
            say(f"      {time.monotonic() - started:5.1f}s  {line}")
        if until(st, rolled):
            return st
        if time.monotonic() > deadline:
            say("      timed out; see the operator log")
            return st
        time.sleep(0.5)


FLEET_CASE = Case(None, FLEET, "llama31-8b-base", "llama31-8b-eagle3", 10.0, "a 4-server Llama fleet", "3s")


def validator_verdicts(workdir: Path) -> None:
    """Run the real `specdec validate` on metadata-only model directories shaped like each case's models."""
    from tests.support import model_dirs as md

    models = workdir / "models"
    kimi = md.make_target(models / "kimi-k2.5-int4", md.kimi_k25(), tokenizer_config=md.KIMI_TOKENIZER, shards=2)
    llama = md.make_target(models / "Llama-3.1-8B-Instruct", md.LLAMA_31_8B, tokenizer_config=md.LLAMA_31_TOKENIZER)
    custom = md.make_drafter(
        models / "kimi-k2.5-custom-10k",
        md.kimi_drafter_config(),
        tokenizer_config=md.KIMI_TOKENIZER,
        provenance=md.provenance(target_quantization="bf16", hidden_state_source="HF transformers bf16", num_samples=10_000),
    )
    public = md.make_drafter(
        models / "kimi-k2-public",
        md.kimi_drafter_config(),
        tokenizer_config=md.KIMI_TOKENIZER,
        provenance=md.provenance(target_model="moonshotai/Kimi-K2-Instruct"),
    )
    llama_draft = md.make_drafter(models / "sglang-EAGLE3-LLaMA3.1-Instruct-8B", md.llama31_8b_drafter_config())
    pairs = {
        "kimi-k25": (kimi, custom, "int4"),
        "kimi-k25-public-drafter": (kimi, public, "int4"),
        "llama31-8b": (llama, llama_draft, "auto"),
        "llama31-8b-wide-drafter": (llama, llama_draft, "auto"),
        "llama31-8b-wrong-drafter": (llama, custom, "auto"),
    }
    for case in CASES:
        target, drafter, quant = pairs[case.name]
        log = workdir / f"{case.name}.termination-log"
        proc = subprocess.run(
            specdec("validate", "--target", str(target), "--drafter", str(drafter), "--quantization", quant, "--json", "--termination-log", str(log)),
            capture_output=True,
            text=True,
            timeout=120,
        )
        case.verdict = (proc.returncode, log.read_text() if log.exists() else proc.stderr.strip())


def start_simulator(workdir: Path, case: Case, suffix: str, profile: str, port: int, *extra: str) -> subprocess.Popen:
    log = open(workdir / f"sim-{case.name}-{suffix}.log", "a")
    argv = specdec("simulate", "--profile", profile, "--port", str(port), "--time-scale", str(case.time_scale), "--load-seconds", "0", "--seed", "1")
    return subprocess.Popen([*argv, *extra], stdout=log, stderr=subprocess.STDOUT)


def follow_adaptive_table(kubectl: Any, workdir: Path, case: Case, port: int | None, procs: list[subprocess.Popen]) -> subprocess.Popen | None:
    """Stand in for the kubelet: once the operator has written <name>-adaptive (load-aware speculation), the new
    speculative pod runs SGLang with --speculative-adaptive and that table; restart the simulator the same way."""
    if port is None or case.spec_profile is None:
        return None
    found = kubectl("get", "configmap", f"{case.name}-adaptive", "-n", NAMESPACE, "-o", "json", check=False)
    if found.returncode != 0:
        return None
    table = workdir / f"{case.name}-adaptive.json"
    table.write_text(json.loads(found.stdout)["data"]["config.json"])
    for proc in procs:  # the plain speculative server's simulator: the only one listening on its port
        if isinstance(proc.args, list) and str(port) in proc.args and proc.poll() is None:
            proc.terminate()
            proc.wait(10)
    return start_simulator(workdir, case, "spec", case.spec_profile, port, "--speculative-adaptive", "--speculative-adaptive-config", str(table))


def custom_resource(case: Case) -> dict:
    cr = yaml.safe_load((REPO / "examples" / (case.file or "llama31-8b-eagle3.yaml")).read_text())
    cr["metadata"] = {"name": case.name, "namespace": NAMESPACE}
    spec = cr["spec"]
    if case.file is None:
        spec["drafter"]["path"] = "eagle3/kimi-k2.5-custom-10k"
    # The local control plane has no storage provisioner: a hostPath volume stands in for the PVC.
    spec["model"]["volume"] = {"hostPath": {"path": "/data/models", "type": "Directory"}}
    if case.workloads:
        spec.setdefault("rollout", {})["workloads"] = case.workloads
    if case.name == "llama31-8b-wide-drafter":
        spec["rollout"]["policy"] = "AllWorkloads"  # every load must win, so the plain probe rolls it back
    # rollout.keepBaseWarm as the examples ship it (the default, true): a promoted server keeps its base warm, and
    # the closing check (check_gpus) expects that base's GPUs held and idle.
    code, message = case.verdict
    spec["podMetadata"] = {
        "annotations": {
            "specdec.test/init-exit-code": str(code),
            "specdec.test/init-message": message,
            "specdec.test/init-after": "2s",
            "specdec.test/ready-after": case.load,
        }
    }
    return cr


def expected_gpus(item: dict) -> dict[str, int] | None:
    """The GPUs a settled SpeculativeServer's spec implies its pods hold once the loser is gone: status.gpus's
    {base, speculative, idle}, or None while its phase settles nothing (no decision yet, Failed).

    A server holds resources.gpus x resources.nodes GPUs. One server (replicas 1): the winner serves; a promoted
    resource keeps its base, idle, where rollout.keepBaseWarm (default true), and a rolled-back one its speculative
    server, idle, where rollout.keepSpeculativeWarm. An Invalid drafter never runs. A fleet (replicas above 1) walks
    every server to the winner whatever the two say. Pure: the object as the API server returns it."""
    spec, st = item.get("spec") or {}, item.get("status") or {}
    resources, rollout = spec.get("resources") or {}, spec.get("rollout") or {}
    replicas = int(spec.get("replicas", 1))
    held = replicas * int(resources.get("gpus", 1)) * int(resources.get("nodes", 1))
    phase = st.get("phase")
    if phase == "Promoted":
        warm = held if replicas == 1 and rollout.get("keepBaseWarm", True) else 0
        return {"base": warm, "speculative": held, "idle": warm}
    if phase == "RolledBack":
        warm = held if replicas == 1 and rollout.get("keepSpeculativeWarm", False) else 0
        return {"base": held, "speculative": warm, "idle": warm}
    if phase == "Invalid":
        return {"base": held, "speculative": 0, "idle": 0}
    return None


def gpu_metrics(text: str, namespace: str = NAMESPACE) -> dict[str, dict[str, int]]:
    """specdec_gpus (by variant) and specdec_idle_gpus ("idle") of each SpeculativeServer in ``namespace``, from the
    operator's /metrics text."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, dict[str, int]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("namespace") != namespace:
                continue
            if sample.name == "specdec_gpus":
                out.setdefault(sample.labels["name"], {})[sample.labels["variant"]] = int(sample.value)
            elif sample.name == "specdec_idle_gpus":
                out.setdefault(sample.labels["name"], {})["idle"] = int(sample.value)
    return out


def gpu_report(items: list[dict], metrics: dict[str, dict[str, int]] | None) -> tuple[list[str], list[str]]:
    """Per resource a line with the GPUs held and idle (status.gpus) against what its spec implies
    (expected_gpus), and the mismatches: status or the operator's metrics not what the spec implies, or a resource
    whose phase settles nothing. ``metrics`` None: the operator's /metrics did not answer (a mismatch too). Pure."""
    lines, wrong = [], []
    if metrics is None:
        wrong.append("the operator's /metrics did not answer")
    for item in sorted(items, key=lambda i: i["metadata"]["name"]):
        name, st = item["metadata"]["name"], item.get("status") or {}
        got = {k: int(v) for k, v in (st.get("gpus") or {}).items()}
        want = expected_gpus(item)
        lines.append(
            f"{name:<26} held base {got.get('base', '-')}, speculative {got.get('speculative', '-')}, idle {got.get('idle', '-')}"
            + (f"  (spec implies base {want['base']}, speculative {want['speculative']}, idle {want['idle']})" if want else "")
        )
        if want is None:
            wrong.append(f"{name}: phase {st.get('phase')} settles no GPU count")
            continue
        if got != want:
            wrong.append(f"{name}: status.gpus {got or 'missing'}, the spec implies {want}")
        if metrics is not None and metrics.get(name) != want:
            wrong.append(f"{name}: specdec_gpus/specdec_idle_gpus {metrics.get(name) or 'missing'}, the spec implies {want}")
    return lines, wrong


def check_gpus(kubectl: Any, metrics_url: str, timeout: float = 120) -> bool:
    """The demo's last check: every resource holds the GPUs its spec and rollout.keepBaseWarm imply (gpu_report),
    in status and in the operator's metrics. Losers are scaled to 0 a few steps after a decision and their pods take
    a moment to go: it waits up to ``timeout`` for that."""
    import urllib.request

    deadline = time.monotonic() + timeout
    while True:
        items = json.loads(kubectl("get", "sps", "-n", NAMESPACE, "-o", "json").stdout)["items"]
        try:
            with urllib.request.urlopen(metrics_url, timeout=10) as resp:
                metrics: dict[str, dict[str, int]] | None = gpu_metrics(resp.read().decode())
        except OSError:
            metrics = None
        lines, wrong = gpu_report(items, metrics)
        if not wrong or time.monotonic() > deadline:
            say(f"\nGPUs held and idle (status.gpus; specdec_gpus and specdec_idle_gpus on {metrics_url} say the same):")
            say("\n".join("      " + line for line in lines))
            if wrong:
                say(f"GPU check FAILED after {timeout:.0f}s:")
                say("\n".join("      " + w for w in wrong))
                return False
            idle = sum(int(((i.get("status") or {}).get("gpus") or {}).get("idle") or 0) for i in items)
            say(f"GPU check: all {len(items)} SpeculativeServers hold what their specs imply; {idle} idle GPU(s), each kept warm by the spec")
            return True
        time.sleep(2)


# ---------------------------------------------------------------------------------------------------------
# Output


def _shape(message: str) -> str:
    return re.sub(r"\d+m\d+s|\d+h\d+m|\d+s\b", "…", message or "")


def show_table(items: list[dict]) -> None:
    say("\nWhat the operator measured (tok/s in simulated GPU time; the seed's numbers in the simulator profiles):\n")
    scale = {c.name: c.time_scale for c in CASES}
    for item in items:
        name, st = item["metadata"]["name"], item.get("status") or {}
        probe = st.get("probe") or {}
        workloads = probe.get("workloads") or []
        decision = f"{st.get('phase')} ({st.get('reason')})"
        say(f"  {name}: {decision}")
        if not workloads:
            findings = (st.get("validation") or {}).get("findings") or []
            errors = [f"{f['code']}: {f.get('message', '')}" for f in findings if f.get("severity") == "error"]
            say(f"    never started: {errors[0] if errors else st.get('message')}\n")
            continue
        findings = (st.get("validation") or {}).get("findings") or []
        warned = [f["code"] for f in findings if f.get("severity") == "warning"]
        if warned:
            say(f"    validator: compatible, with warnings {', '.join(warned)} (metadata cannot tell; the measurement decides)")
        s = scale.get(name, 1.0)
        header = f"    {'variant':<13}" + "".join(f"{w['name'] + ' tok/s':>24}" for w in workloads) + f"{'accept':>9}  decision"
        say(header)
        base = "".join(f"{w['baseTokensPerSecond'] / s:>24.1f}" if w.get("baseTokensPerSecond") else f"{'-':>24}" for w in workloads)
        say(f"    {'base':<13}{base}{'-':>9}  {'serves' if st.get('activeVariant') == 'base' else ''}")
        spec = "".join(
            f"{(w.get('speculativeTokensPerSecond') or 0) / s:>16.1f} ({w['speedup']:.2f}x)" if w.get("speedup") else f"{'-':>24}" for w in workloads
        )
        accept = probe.get("acceptLength")
        verdict = "promoted, serves" if st.get("activeVariant") == "speculative" else f"rolled back: {probe.get('reason')}"
        say(f"    {'speculative':<13}{spec}{(f'{accept:.2f}' if accept else '-'):>9}  {verdict}")
        if probe.get("gpuSeconds") is not None:  # status.probe.gpuSeconds: declared GPUs x the probe's (compressed) time
            cost = probe["gpuSeconds"]
            say(f"    cost: {cost:,.0f} GPU-seconds of the two servers' declared GPUs ({cost * s:,.0f} in simulated GPU time, x{s:g})")
        say(f"    why: {probe.get('message', '')}\n")


# ---------------------------------------------------------------------------------------------------------


def bring_up(say_step: str) -> tuple[Any, Any, bool]:
    """Step 1: the local control plane (started unless up), its nodes printed, the CRD and the namespace."""
    say(say_step)
    we_started_cluster = devcluster.status(CLUSTER).get("state") != "up"
    cluster = devcluster.up(CLUSTER, log=lambda m: say(f"      {m}"))
    kubectl = lambda *a, **kw: cluster.kubectl(*a, **kw)  # noqa: E731
    nodes = kubectl("get", "nodes", "-L", "nvidia.com/gpu.family", "-L", "nvidia.com/gpu.count", "--no-headers").stdout
    for line in nodes.strip().splitlines():
        parts = line.split()
        say(f"      node {parts[0]:<14} gpu family {parts[-2] if len(parts) >= 7 else '-':<10} gpus {parts[-1] if len(parts) >= 7 else '-'}")
    kubectl("apply", "--server-side", "-f", str(REPO / "crds"))
    cluster.wait_established(["speculativeservers.specdec.io"])
    kubectl("create", "namespace", NAMESPACE, check=False)
    say("      CRD speculativeservers.specdec.io installed; namespace specdec-demo")
    return cluster, kubectl, we_started_cluster


def start_simulators(workdir: Path, procs: list[subprocess.Popen], endpoints: dict[str, str]) -> tuple[dict[str, int], dict[str, int]]:
    """Step 2: a simulator for each case's servers and the fleet's; their Services in ``endpoints``. Returns each
    case's speculative port and the fleet's ports."""
    ports: dict[str, int] = {}  # each case's speculative simulator
    for case in CASES:
        for suffix, profile in (("base", case.base_profile), ("spec", case.spec_profile)):
            if profile is None:
                continue
            port = free_port()
            procs.append(start_simulator(workdir, case, suffix, profile, port))
            if suffix == "spec":
                ports[case.name] = port
            endpoints[f"{NAMESPACE}/{case.name}-{suffix}"] = f"http://127.0.0.1:{port}"
            say(f"      {case.name}-{suffix:<4} -> {profile:<24} on :{port} ({case.time_scale:g}x time)")
    fleet_ports = {}
    for suffix, profile in (("base", "llama31-8b-base"), ("spec", "llama31-8b-eagle3")):
        fleet_ports[suffix] = free_port()
        procs.append(start_simulator(workdir, FLEET_CASE, suffix, profile, fleet_ports[suffix]))
        endpoints[f"{NAMESPACE}/{FLEET}-{suffix}"] = f"http://127.0.0.1:{fleet_ports[suffix]}"
        say(f"      {FLEET}-{suffix:<4} -> {profile:<24} on :{fleet_ports[suffix]} (the fleet case, step 6)")
    return ports, fleet_ports


def start_operator(workdir: Path, cluster: Any, procs: list[subprocess.Popen], probe_script: Path) -> int:
    """Step 3: `specdec run` on the namespace with the endpoints file and the probe script; its metrics port."""
    say("\n[3/7] The operator: specdec run --namespace specdec-demo --endpoints endpoints.yaml")
    metrics_port = free_port()
    oplog = open(workdir / "operator.log", "w")
    argv = ["run", "--namespace", NAMESPACE, "--standalone", "--endpoints", str(workdir / "endpoints.yaml")]
    argv += ["--metrics-port", str(metrics_port), "--reconcile-interval", "2", "--probe-script", str(probe_script)]
    procs.append(subprocess.Popen(specdec(*argv), stdout=oplog, stderr=subprocess.STDOUT, env=cluster.env()))
    say(f"      log {workdir / 'operator.log'}, metrics http://127.0.0.1:{metrics_port}/metrics")
    return metrics_port


def watch_decisions(kubectl: Any, workdir: Path, ports: dict[str, int], procs: list[subprocess.Popen], race: Any, timeout: float) -> list[dict]:
    """Step 4's live view: a line per change of phase or message, until every resource settled (or ``timeout``)."""
    say("\n      Live (each line is a change of phase or message):")
    started = time.monotonic()
    shown: dict[str, str] = {}
    done = {"Promoted", "RolledBack", "Invalid", "Failed"}
    adaptive_started: set[str] = set()
    while True:
        items = json.loads(kubectl("get", "sps", "-n", NAMESPACE, "-o", "json").stdout)["items"]
        race.new_switches(started, say)
        for case in CASES:
            if case.name not in adaptive_started and (proc := follow_adaptive_table(kubectl, workdir, case, ports.get(case.name), procs)):
                adaptive_started.add(case.name)
                procs.append(proc)
                say(f"      {time.monotonic() - started:5.1f}s  {case.name:<26} (simulator restarted with the operator's adaptive table)")
        for item in items:
            st = item.get("status") or {}
            name = item["metadata"]["name"]
            line = f"{st.get('phase') or 'Pending':<11} {st.get('message') or ''}"
            if _shape(line) != _shape(shown.get(name, "")):
                shown[name] = line
                say(f"      {time.monotonic() - started:5.1f}s  {name:<26} {line[:190]}")
        settled = [race.settled(i, done) if race.owns(i) else (i.get("status") or {}).get("phase") in done for i in items]
        if len(items) == len(CASES) + len(demo_race.RACES) + 1 and all(settled):  # + 1: the flywheel's resource
            return items
        if time.monotonic() - started > timeout:
            say("      timed out waiting for the decisions; see the operator log")
            return items
        time.sleep(1)


def show_results(kubectl: Any, items: list[dict]) -> bool:
    """Step 5: kubectl get, the seed-style table, the races' tables and check, the Events."""
    say("\n[5/7] kubectl get sps -o wide:")
    say("\n".join("      " + line for line in kubectl("get", "sps", "-n", NAMESPACE, "-o", "wide").stdout.rstrip().splitlines()))
    show_table([i for i in items if i["metadata"]["name"] in {c.name for c in CASES}])
    say("The races (status.candidates and status.race; intervals at each probe's confidence, GPU-s its GPUs x its wall time):")
    races_ok = demo_race.show_and_check(items, say)
    columns = "custom-columns=OBJECT:.involvedObject.name,TYPE:.type,REASON:.reason"
    selector = "involvedObject.kind=SpeculativeServer"
    events = kubectl("get", "events", "-n", NAMESPACE, "--field-selector", selector, "--sort-by=.lastTimestamp", "-o", columns).stdout
    say("Events posted by the operator:")
    say("\n".join("      " + line for line in events.rstrip().splitlines()))
    say("\nThe base servers kept serving throughout: the stable Service <name> selects the speculative pods only where they were promoted.")
    return races_ok


def run_fleet(kubectl: Any, workdir: Path, procs: list[subprocess.Popen], fleet_ports: dict[str, int], timeout: float) -> None:
    """Step 6: the fleet walked onto its drafter one server at a time, and back when the drafter drifts."""
    import threading

    say(f"\n[6/7] A fleet: {FLEET} with {FLEET_REPLICAS} servers of 8 Blackwell GPUs, rollout.maxSurge 0, maxUnavailable 1")
    say("      (one speculative canary replaces a base server while probed; after the promotion one base server goes,")
    say("       its GPUs free, one speculative server comes, and the next goes only when it is Ready)")
    kubectl("apply", "-f", "-", input=yaml.safe_dump(fleet_resource(next(c.verdict for c in CASES if c.name == "llama31-8b"))))
    fleet_started = time.monotonic()
    st = follow_walk(kubectl, fleet_started, lambda st, rolled: rolled.get("status") == "True" or st.get("phase") == "RolledBack", timeout)
    say(f"      promoted at {st.get('speedup')}x and rolled out: {st.get('rolloutProgress')}")
    say("      Now the drafter drifts: the speculative simulator restarts with a drafter that accepts nothing, under traffic.")
    for proc in procs:
        if isinstance(proc.args, list) and str(fleet_ports["spec"]) in proc.args and proc.poll() is None:
            proc.terminate()
            proc.wait(10)
    procs.append(start_simulator(workdir, FLEET_CASE, "spec", "kimi-k25-custom-eagle3", fleet_ports["spec"]))
    stop = threading.Event()
    sender = threading.Thread(target=traffic, args=(f"http://127.0.0.1:{fleet_ports['spec']}", stop), daemon=True)
    sender.start()
    try:
        st = follow_walk(kubectl, fleet_started, lambda st, rolled: st.get("phase") == "RolledBack" and rolled.get("status") == "True", timeout)
    finally:
        stop.set()
    say(f"      {st.get('phase')} ({st.get('reason')}): {st.get('rolloutProgress')}")
    columns = "custom-columns=REASON:.reason,MESSAGE:.message"
    walk_events = kubectl(
        "get", "events", "-n", NAMESPACE, "--field-selector", f"involvedObject.name={FLEET}", "--sort-by=.lastTimestamp", "-o", columns
    ).stdout
    say("      Events of the fleet:")
    say("\n".join("        " + line[:170] for line in walk_events.rstrip().splitlines()))


def clean_up(keep: bool, workdir: Path, procs: list[subprocess.Popen], stoppers: list[Any], we_started_cluster: bool) -> None:
    """Delete the SpeculativeServers, stop what the demo started (``stoppers``: objects with stop()), and the cluster
    if the demo started it; with --keep, say how to stop it all later."""
    if keep:
        say(f"\n--keep: left running (workdir {workdir}); stop with `python -m hack.devcluster down --name {CLUSTER}`")
        return
    say("\nCleaning up: deleting the SpeculativeServers (children are garbage-collected), stopping everything.")
    try:
        cluster = devcluster.up(CLUSTER) if devcluster.status(CLUSTER).get("state") == "up" else None
        if cluster is not None:
            cluster.kubectl("delete", "sps", "--all", "-n", NAMESPACE, "--wait=true", "--timeout=60s", check=False, timeout=90)
    except Exception:
        pass
    for stopper in stoppers:
        stopper.stop()
    for proc in reversed(procs):
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
    if we_started_cluster:
        devcluster.down(CLUSTER)
    shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hack/demo.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", action="store_true", help="leave the cluster, simulators and operator running at the end")
    parser.add_argument("--timeout", type=float, default=300, help="seconds to wait for every decision (default 300)")
    parser.add_argument(
        "--measure-races",
        action="store_true",
        help="measure the two races against their simulators in real time (default: scripted rounds of the profiles' speedups)",
    )
    args = parser.parse_args(argv)

    say("specdec-operator demo: validate drafters from metadata, measure them against their base, promote only when faster.\n")
    workdir = Path(tempfile.mkdtemp(prefix="specdec-demo-"))
    procs: list[subprocess.Popen] = []
    race = demo_race.RaceDemo(NAMESPACE, workdir / "endpoints.yaml", scripted=not args.measure_races)
    endpoints: dict[str, str] = {}
    script = race.script_file or workdir / "probe-script.yaml"  # the flywheel's probes are scripted either way
    flywheel = flywheel_loop.Flywheel(NAMESPACE, workdir, endpoints, lambda: race.router.write() if race.router else None, script)
    we_started_cluster = False
    try:
        cluster, kubectl, we_started_cluster = bring_up(
            f"[1/7] Local control plane '{CLUSTER}' (kube-apiserver, scheduler, controller-manager, kwok GPU nodes)"
        )
        say("\n[2/7] SGLang simulators (same HTTP API and /metrics as SGLang 0.5.23; throughput from a batching model)")
        ports, fleet_ports = start_simulators(workdir, procs, endpoints)
        flywheel.start(say)
        (workdir / "endpoints.yaml").write_text(yaml.safe_dump(endpoints))
        race.start(endpoints, str(cluster.kubeconfig), say)
        flywheel.write_script()  # after the races' script (race.start writes the file whole)
        metrics_port = start_operator(workdir, cluster, procs, script)

        say("\n[4/7] Applying the SpeculativeServers:")
        validator_verdicts(workdir)
        for case in CASES:
            say(f"      {case.name:<26} {case.story}")
            kubectl("apply", "-f", "-", input=yaml.safe_dump(custom_resource(case)))
        race.apply(kubectl, say)
        flywheel.apply(kubectl, str(cluster.kubeconfig), demo_race.ANNOTATIONS, FLYWHEEL_WORKLOADS, say)
        say("      (rollout.keepBaseWarm as shipped, true: a promoted server keeps its base warm, GPUs held for an instant")
        say("       rollback that serve no traffic; the demo ends by counting them)")
        items = watch_decisions(kubectl, workdir, ports, procs, race, args.timeout)
        races_ok = show_results(kubectl, items)
        run_fleet(kubectl, workdir, procs, fleet_ports, args.timeout)
        say(f"\n[7/7] The drafter flywheel: {demo_flywheel.NAME} retrains its drafter on the traffic it sees (issue 36)")
        flywheel_ok = flywheel_loop.run(flywheel, say, args.timeout)
        gpus_ok = check_gpus(kubectl, f"http://127.0.0.1:{metrics_port}/metrics")
        return 0 if gpus_ok and races_ok and flywheel_ok else 1
    except devcluster.ClusterError as exc:
        say(f"demo: {exc}")
        return 1
    finally:
        clean_up(args.keep, workdir, procs, [race, flywheel], we_started_cluster)


if __name__ == "__main__":
    sys.exit(main())
