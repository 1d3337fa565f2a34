"""Issue 36, item 5 on the real engine: the operator drives the retraining loop by itself on vLLM's CPU build.

The operator's loop (`specdec run` on the local control plane; tests/support/vllm_flywheel.py puts the real parts
behind its names):

    the copy target on vLLM: the base (core 0) and the free-trained drafter's server (core 1; tests/support/retrain_models.py)
      users' chat through the capture proxy (`specdec capture`) to the side the stable Service selects: free, then copy
    the operator probes and promotes the drafter on the team's free prompts (a ConfigMap dataset); its monitor reads
      vLLM's counters on the users' traffic, and after the shift to copy rolls back (AcceptanceDrift)
    the drift starts the training Job <name>-train-1; hack/job_runner.py runs its stages as processes (the real Job
      controller completes it); the operator reads publish's message and judges the revision offline
    a vLLM server of the published revision starts (core 1: three servers at once) and the operator races it against
      the base and the serving drafter on the spec's workload and the revision's held-out slice of the copy traffic;
      it wins, is promoted, and the monitor reads its acceptance on the copy traffic

Every decision is the operator's, on what vLLM measures; the test asserts the loop's outcome and reports its figures
(acceptance before, after the shift and after the revision; shift to drift, drift to promotion; the Job's CPU-seconds).

And the other way, without the operator: a Job on traffic the serving drafter already knows (no shift) publishes a
valid revision that the operator's offline gate refuses (OfflineGainBelowMargin), so it is never raced or promoted.
One vLLM server there.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hack import demo_flywheel as df
from hack.job_mapping import VolumeDirs
from hack.job_runner import JobRunner, LocalExecute
from specdec_operator.reconcile.revision import BELOW_MARGIN, Report, candidate_name, offline_gate, read_report
from tests.support.copy_workloads import copy_workload
from tests.support.kube import wait_until
from tests.support.operator_process import GROUP, PLURAL, VERSION, Operator, compatible_annotations, example, settled_event_reasons, settled_variant
from tests.support.retrain_loop import EXTRA_ARGS, SPEC_TOKENS, base_url_of, chat_acceptance, resource_spec, training_job
from tests.support.retrain_models import DRAFTER, TARGET, free_prompts, retrain_models
from tests.support.vllm_flywheel import SPEC_HOLD, EngineLoop
from tests.support.vllm_servers import VllmServer, start_servers, vllm_env

pytestmark = [pytest.mark.cluster, pytest.mark.realengine, pytest.mark.slow, pytest.mark.timeout(2400)]

NAME = "shift"
MAX_STEPS = 200
# The operator's loop: one stream of fixed-length requests within the target's 512 positions, on the team's own dataset
# of its traffic before the shift (free chat: the probe's default prompt set is not text this tiny target was trained to
# answer, and its drafter accepts 1.7 there); the race adds the revision's held-out slice in the same shape.
PROMPTS_CONFIGMAP, PROMPTS_KEY = "loop-prompts", "free.jsonl"
LOOP_WORKLOADS = [
    {
        "name": "single-stream",
        "concurrency": 1,
        "inputTokens": 64,  # the dataset's prompts have their own lengths; this only has to fit contextLength with the output
        "outputTokens": 48,
        "requests": 8,
        "prompts": {"source": "ConfigMap", "configMap": {"name": PROMPTS_CONFIGMAP, "key": PROMPTS_KEY}, "format": "Chat", "outputLength": "Fixed"},
    }
]
RESULTS: dict[str, Any] = {}


@pytest.fixture(scope="module")
def models() -> Path:
    vllm_env("0")  # fails at once, saying how to install, before minutes of building models for nothing
    return retrain_models()


def serve(name: str, models: Path, drafter: Path, logs: Path) -> VllmServer:
    server = VllmServer(name, models / TARGET, logs / f"{name}.log", drafter=drafter, core="0", num_speculative_tokens=SPEC_TOKENS)
    start_servers([server])
    return server


@pytest.fixture
def serving(models: Path, tmp_path: Path) -> Iterator[VllmServer]:
    """The free-trained drafter's server, for the test that retrains without the operator."""
    server = serve("old", models, models / DRAFTER, tmp_path / "logs")
    try:
        yield server
    finally:
        server.stop()


def owner(custom_objects: Any, namespace: str) -> dict[str, Any]:
    """The SpeculativeServer the Job belongs to (its uid in the Job's ownerReference; no operator runs)."""
    workloads = [{"name": "single-stream", "concurrency": 1, "inputTokens": 64, "outputTokens": 48, "requests": 8}]  # within 512
    cr = example("llama31-8b-eagle3.yaml", NAME, namespace, annotations=compatible_annotations(), workloads=workloads)
    cr["spec"].pop("sglang", None)
    cr["spec"].update({k: v for k, v in resource_spec(NAME).items() if k != "model"})
    cr["spec"]["model"]["mountPath"] = resource_spec(NAME)["model"]["mountPath"]
    return dict(custom_objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, cr))


def run_job(
    kube_client: Any, batch_v1: Any, core_v1: Any, namespace: str, job: dict[str, Any], dirs: VolumeDirs, base: str
) -> tuple[Any, list[dict]]:
    """Apply the Job, let the runner run its pod, wait for the Job controller's verdict; (condition, pods as dicts)."""
    urls = {base_url_of(job["spec"]["template"]["spec"]): base}
    runner = JobRunner(kube_client, dirs.root, dirs, LocalExecute(nice=10, extra_args=EXTRA_ARGS), urls, namespaces={namespace}).start()
    name = job["metadata"]["name"]
    try:
        batch_v1.create_namespaced_job(namespace, job)

        def ended() -> Any:
            conditions = batch_v1.read_namespaced_job(name, namespace).status.conditions or []
            return next((c for c in conditions if c.type in ("Complete", "Failed") and c.status == "True"), None)

        condition = wait_until(ended, timeout=1800, interval=2, message=f"Job {name} complete or failed")
    finally:
        runner.stop()
    RESULTS["job"] = runner.jobs.get(f"{namespace}/{name}")
    pods = core_v1.list_namespaced_pod(namespace, label_selector=f"job-name={name}").items
    return condition, [kube_client.sanitize_for_serialization(p) for p in pods]


@dataclass
class Retrained:
    job: dict[str, Any]
    condition: Any
    pods: list[dict[str, Any]]
    revision: Path
    report: Report | str


def capture_and_retrain(
    traffic: list[list[dict[str, Any]]], serving: VllmServer, models: Path, cluster: tuple[Any, Any, Any, Any], namespace: str, root: Path
) -> Retrained:
    """Send `traffic` (lists of prompts, in order) through the capture proxy to `serving`, then run the operator's
    training Job on what was captured through the Job controller and the runner; what it published and reported."""
    from kubernetes import client

    from benchmarks.capture_latency import CaptureProcess

    kube_client, custom_objects, batch_v1, core_v1 = cluster
    dirs = VolumeDirs(root, named={"model": models})
    capture = dirs.root / "claims" / namespace / f"{NAME}-capture"  # the capture claim's directory, as the Job sees it
    capture.mkdir(parents=True)
    with CaptureProcess(serving.url, str(capture), 1.0, False) as proxy:
        RESULTS.setdefault(namespace, {})["captured"] = [chat_acceptance(proxy, serving.url, prompts) for prompts in traffic]
    uid = owner(custom_objects, namespace)["metadata"]["uid"]
    priority = f"specdec-training-{namespace}"  # cluster-scoped: one per test, as the chart makes one per release
    scheduling = client.SchedulingV1Api(kube_client)
    scheduling.create_priority_class(client.V1PriorityClass(metadata=client.V1ObjectMeta(name=priority), value=-100, preemption_policy="Never"))
    try:
        job = training_job(NAME, namespace, MAX_STEPS, uid=uid, priority_class=priority)
        condition, pods = run_job(kube_client, batch_v1, core_v1, namespace, job, dirs, serving.url)
    finally:
        scheduling.delete_priority_class(priority)
    revision = dirs.root / "claims" / namespace / f"{NAME}-revisions" / job["metadata"]["name"]
    RESULTS[namespace]["job"] = RESULTS.pop("job", None)
    return Retrained(job, condition, pods, revision, read_report(pods, job["metadata"]["name"]))


def test_a_drafter_retrained_on_the_traffic_it_already_knows_is_not_better_and_not_raced(
    serving: VllmServer, models: Path, kube_client: Any, custom_objects: Any, batch_v1: Any, core_v1: Any, namespace: str, tmp_path: Path
) -> None:
    """No shift: the Job retrains on free traffic, which the serving drafter already accepts fully. The revision is
    published and valid, but the operator's offline gate refuses it (OfflineGainBelowMargin): it is never raced."""
    cluster = (kube_client, custom_objects, batch_v1, core_v1)
    done = capture_and_retrain([free_prompts(40, seed=200)], serving, models, cluster, namespace, tmp_path)
    print(json.dumps(RESULTS[namespace], indent=1))
    assert done.condition.type == "Complete" and (done.revision / "COMPLETE").is_file()
    assert isinstance(done.report, Report) and done.report.valid is True, done.report
    gate, why = offline_gate(done.report, 0.05)
    assert gate == BELOW_MARGIN, why  # 4.0 vs 4.0 on the held-out free conversations: no gain


# ---------------------------------------------------------------------------------------------------------------------
# The operator drives the loop by itself


def loop_resource(name: str, namespace: str) -> dict[str, Any]:
    """The copy target on vLLM serving the free-trained drafter; the monitor every 5 s (floor 2.0, 2 scrapes); capture of
    every request; a training Job on drift once 40 conversations are captured (CPU, 200 steps, at most 128 conversations: all of them here, the traffic before the shift too, or the drafter forgets it)."""
    annotations = {
        **compatible_annotations(ready_after=SPEC_HOLD),
        "specdec.test/when-label": "specdec.io/variant=speculative",  # the base, capture and reader pods: Ready at once
    }
    cr = example("llama31-8b-eagle3.yaml", name, namespace, annotations=annotations, workloads=LOOP_WORKLOADS)
    spec = cr["spec"]
    spec.pop("sglang", None)
    spec.update({k: v for k, v in resource_spec(name).items() if k != "model"})
    spec["model"]["mountPath"] = resource_spec(name)["model"]["mountPath"]
    spec["rollout"].update(maxRounds=8, policy="AllWorkloads", acceptLengthFloor=1.05)
    spec["monitor"] = {"interval": 5, "window": 2, "acceptLengthFloor": 2.0}
    capture = {"enabled": True, "sampleShare": 1.0, "maxBytes": 16 << 20, "retentionHours": 24, "storageClassName": f"{namespace}-loop"}
    budget = {"gpus": 0, "maxSteps": MAX_STEPS, "maxMinutes": 20, "maxSamples": 128, "regenerateConcurrency": 1}
    training = {"budget": budget, "minSamples": 40, "cooldownMinutes": 1, "triggers": {"onDrift": True}}
    spec["retraining"] = {"capture": capture, "training": training}
    return cr


def monitor_accept(st: dict[str, Any]) -> float | None:
    value = (st.get("monitor") or {}).get("acceptLength")
    return float(value) if isinstance(value, int | float) else None


def until(loop: EngineLoop, what: str, check: Any, timeout: float, settled: Any = None) -> float:
    """Wait until ``check(status)`` (the router reads the status every 0.3 s); the time it held. Fails naming ``what``,
    the phase, the reason and the router's last error; at once where ``settled(status)`` says the wait cannot end well
    (a string: why), rather than after the whole timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check(loop.status):
            return time.monotonic()
        if settled is not None and (why := settled(loop.status)):
            raise AssertionError(f"{what}: never, {why}; {loop.errors[-3:]}")
        time.sleep(0.3)
    st = loop.status
    raise AssertionError(f"{what}: not within {timeout:.0f}s: phase {st.get('phase')} ({st.get('reason')}: {st.get('message')}); {loop.errors[-3:]}")


def revision_lost(st: dict[str, Any]) -> str | None:
    """Why no revision will be promoted: a trained revision decided Lost (RetrainedDrafterLost holds the next Job for
    minSamples new conversations, which the paused users never send), with its row's reason and message."""
    for row in (st.get("retraining") or {}).get("revisions") or []:
        if row.get("outcome") == "Lost":
            return f"revision {row.get('name')} Lost ({row.get('reason')}: {row.get('message')}); the race: {st.get('message')}"
    return None


def save(out: dict[str, Any]) -> None:
    """The raw figures for docs/benchmarks/ (vllm-retrain.md, "The operator's loop", says how) when asked."""
    if os.environ.get("SPECDEC_RETRAIN_LOOP_JSON"):
        Path(os.environ["SPECDEC_RETRAIN_LOOP_JSON"]).write_text(json.dumps(out, indent=1, default=str) + "\n")


def test_the_operator_retrains_a_drifted_drafter_proves_the_revision_and_acceptance_recovers(
    operator: Operator, models: Path, kube_client: Any, namespace: str, core_v1: Any, tmp_path: Path
) -> None:
    """Free traffic, then copy traffic: the monitor rolls back on drift, the Job retrains from the capture, the revision
    passes offline, races the base and the serving drafter on the spec's workload and its held-out slice, wins and
    serves; acceptance recovers. Every decision is the operator's, on vLLM's own figures."""
    name = "loop"
    logs = tmp_path / "logs"
    logs.mkdir()
    loop = EngineLoop(operator, kube_client, namespace, name, models, logs)
    out: dict[str, Any] = {}
    started = time.monotonic()  # again once the resource is applied: the loop's figures count from then
    try:
        loop.start_servers()
        operator.start()
        loop.start(MAX_STEPS)
        dataset = "".join(json.dumps(p) + "\n" for p in free_prompts(32, seed=500))
        core_v1.create_namespaced_config_map(namespace, {"metadata": {"name": PROMPTS_CONFIGMAP}, "data": {PROMPTS_KEY: dataset}})
        loop.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, loop_resource(name, namespace))
        started = time.monotonic()
        until(loop, "the free-trained drafter promoted", lambda st: st.get("phase") == "Promoted" and st.get("activeVariant") == "speculative", 900)
        out["promoted_s"] = round(time.monotonic() - started, 1)
        out["first_probe"] = {k: (loop.status.get("probe") or {}).get(k) for k in ("reason", "speedup", "acceptLength", "rounds")}
        loop.users.kind = "free"
        until(loop, "the monitor's acceptance on free traffic", lambda st: (monitor_accept(st) or 0) >= 3.0, 300)
        out["before"] = monitor_accept(loop.status)
        out["before_direct"] = chat_acceptance(loop.servers["drafter"].url, loop.servers["drafter"].url, free_prompts(8, seed=400))
        loop.users.kind, shifted = "copy", time.monotonic()
        lowest: list[float] = []

        def drifted(st: dict[str, Any]) -> bool:
            if (value := monitor_accept(st)) is not None:
                lowest.append(value)
            return st.get("reason") == "AcceptanceDrift"

        drift_at = until(loop, "the drift rollback", drifted, 300)
        out["after_shift"] = min(lowest) if lowest else None
        job_at = until(loop, "the training Job", lambda st: ((st.get("retraining") or {}).get("training") or {}).get("job"), 600)
        loop.users.kind = None  # users pause while the Job trains and the revision races (2 cores; the base serves them)
        out["captured_at_job"] = dict(loop.users.sent)
        out["after_shift_direct"] = chat_acceptance(loop.servers["drafter"].url, loop.servers["drafter"].url, copy_workload(8, seed=2))
        promoted_at = until(loop, "the revision promoted", lambda st: df.promoted_revision(st) is not None, 1800, settled=revision_lost)
        revision = str(df.promoted_revision(loop.status))
        status = dict(loop.status)
        loop.users.kind = "copy"
        until(loop, "acceptance back over the floor", lambda st: st.get("activeVariant") == "speculative" and (monitor_accept(st) or 0) >= 3.0, 300)
        loop.users.kind = None
        out["recovered"] = monitor_accept(loop.status)
        out["recovered_direct"] = chat_acceptance(loop.servers[revision].url, loop.servers[revision].url, copy_workload(8, seed=2))
        out["seconds"] = {
            "shift_to_drift": round(drift_at - shifted, 1),
            "drift_to_job": round(job_at - drift_at, 1),
            "drift_to_promotion": round(promoted_at - drift_at, 1),
            "whole": round(time.monotonic() - started, 1),
        }
    finally:
        out["job"] = next(iter(loop.runner.jobs.values()), None) if loop.runner is not None else None
        out.update(
            users=loop.users.sent, slot=loop.slot_switches and [s for _, s in loop.slot_switches], errors=loop.errors[-5:], load=os.getloadavg()
        )
        out["ready_s"] = {n: s.ready_s for n, s in loop.servers.items()}
        out["pods_ready_s"] = [(round(t - started, 1), pod) for t, pod in loop.ready_marked]
        loop.stop()
        RESULTS["operator_loop"] = out
        print(json.dumps(RESULTS, indent=1, default=str))
        save(out)
    retraining = status["retraining"]
    rows = {r["name"]: r for r in retraining["revisions"]}
    row = rows[revision]
    table = {c["name"]: c for c in loop.race_table}
    out["revision_row"], out["race"] = row, table
    print(json.dumps({"revision_row": row, "race": table}, indent=1, default=str))
    save(out)
    assert out["before"] >= 3.0 and out["after_shift"] is not None and out["after_shift"] <= 1.5, out  # 4.0 -> 1.0 on this tier
    assert row["outcome"] == "Promoted" and row["reason"] == "RaceWon" and row["offlineAcceptLength"] > row["servingOfflineAcceptLength"], row
    # With capture on, the stable Service selects the capture proxies, and <name>-serving the side they forward to.
    assert (
        retraining["serving"] == revision
        and status["phase"] == "Promoted"
        and settled_variant(core_v1, namespace, f"{name}-serving", "speculative") == "speculative"
    )
    # The race measured both drafters on the spec's workload and the revision's held-out slice of the shifted traffic.
    assert set(table) == {"eagle3", candidate_name(revision)} and table[candidate_name(revision)]["state"] in ("Passed", "Serving"), table
    measured = [w["name"] for w in table[candidate_name(revision)].get("workloads") or []]
    assert measured == ["single-stream", "held-out-traffic"], measured
    # The speculative pods turned Ready by the router's readiness probe (kwok held them): the first promotion's, and the
    # race's slot for the revision at least.
    assert len(out["pods_ready_s"]) >= 2, out["pods_ready_s"]
    assert table["eagle3"]["state"] != "Serving"
    assert out["recovered"] >= 3.0 and out["recovered_direct"]["acceptance_length"] >= 3.0, out
    job = out["job"]
    assert job["cpuSeconds"] > 0 and [c["exitCode"] for c in job["containers"]] == [0] * len(job["containers"])
    assert "RevisionPromoted" in settled_event_reasons(core_v1, namespace, name, lambda r: "RevisionPromoted" in r)
