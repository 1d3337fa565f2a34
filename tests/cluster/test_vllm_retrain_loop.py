"""Issue 36, item 5 on the real engine: a traffic shift makes a drafter's acceptance fall, the training Job retrains it
from the captured traffic, and the published revision's acceptance recovers, all measured on vLLM's CPU build.

    the copy target on vLLM (core 0), its EAGLE-3 drafter trained on free traffic only (tests/support/retrain_models.py)
      <- the capture proxy (`specdec capture`, every request) <- free requests, then copy requests (the shift)
    the operator's training Job (trainjob.training_job, applied to the local control plane, owned by the resource)
      -> the real Job controller makes its pod; hack/job_runner.py binds it and runs its stages as processes
         (/capture the proxy's directory, /models the cached models, the base Service the serving server)
      -> publish's termination message in the pod's status, read by the operator's own reader and offline gate
    a vLLM server of the published revision: the same copy requests again

And the other way: a Job on traffic the serving drafter already knows (no shift) publishes a valid revision that the
operator's offline gate refuses (OfflineGainBelowMargin), so it is never raced or promoted.

What the operator itself does around this (the monitor's drift rollback that creates the Job, the race of the
revision and its promotion) is not run here: the Job is applied as training.finish applies it, and the revision is
served by the test. Acceptance is vLLM's own counters on greedy requests sent one at a time: it does not depend on how
busy the machine is. One vLLM server at a time.
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

from hack.job_mapping import VolumeDirs
from hack.job_runner import NODE, JobRunner, LocalExecute
from specdec_operator.reconcile.revision import BELOW_MARGIN, Report, offline_gate, read_report
from tests.support.copy_workloads import copy_workload
from tests.support.kube import wait_until
from tests.support.operator_process import GROUP, PLURAL, VERSION, compatible_annotations, example
from tests.support.retrain_loop import EXTRA_ARGS, SPEC_TOKENS, base_url_of, chat_acceptance, resource_spec, training_job
from tests.support.retrain_models import DRAFTER, TARGET, free_prompts, retrain_models
from tests.support.vllm_servers import VllmServer, start_servers, vllm_env

pytestmark = [pytest.mark.cluster, pytest.mark.realengine, pytest.mark.slow, pytest.mark.timeout(2400)]

NAME = "shift"
MAX_STEPS = 200
RESULTS: dict[str, Any] = {}


@pytest.fixture(scope="module")
def models() -> Path:
    vllm_env("0")  # fails at once, saying how to install, before minutes of building models for nothing
    return retrain_models()


def serve(name: str, models: Path, drafter: Path, logs: Path) -> VllmServer:
    server = VllmServer(name, models / TARGET, logs / f"{name}.log", drafter=drafter, core="0", num_speculative_tokens=SPEC_TOKENS)
    start_servers([server])
    return server


@pytest.fixture(scope="module")
def serving(models: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """The free-trained drafter's server, once for the module (stopped before the revision's starts: one at a time)."""
    server = serve("old", models, models / DRAFTER, tmp_path_factory.mktemp("vllm-retrain-logs"))
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


def test_a_traffic_shift_drops_acceptance_and_the_retrained_revision_recovers_it(
    serving: VllmServer, models: Path, kube_client: Any, custom_objects: Any, batch_v1: Any, core_v1: Any, namespace: str, tmp_path: Path
) -> None:
    started = time.monotonic()
    cluster = (kube_client, custom_objects, batch_v1, core_v1)
    # Free traffic first (its kind), then the shift to copy prompts: the Job's training data is what was captured.
    done = capture_and_retrain([free_prompts(8, seed=100), copy_workload(40, seed=1)], serving, models, cluster, namespace, tmp_path)
    before = RESULTS[namespace]["captured"][0]
    after = chat_acceptance(serving.url, serving.url, copy_workload(8, seed=2))  # an evaluation set, not captured
    serving.stop()  # one vLLM server at a time (the module's last test)
    assert done.condition.type == "Complete", (done.condition.reason, done.condition.message, RESULTS[namespace]["job"])
    assert done.pods[0]["spec"]["nodeName"] == NODE and (done.revision / "COMPLETE").is_file()
    assert isinstance(done.report, Report), done.report
    gate, why = offline_gate(done.report, 0.05)  # the operator's reading of publish's termination message
    report = done.report
    RESULTS[namespace]["offline"] = {
        "revision": report.offline,
        "serving": report.serving_offline,
        "heldout": report.heldout,
        "gate": gate,
        "why": why,
    }
    new = serve("new", models, done.revision, tmp_path / "logs")
    try:
        recovered = chat_acceptance(new.url, new.url, copy_workload(8, seed=2))
    finally:
        new.stop()
    RESULTS[namespace].update(after_shift=after, new_drafter=recovered, seconds=round(time.monotonic() - started, 1), load=os.getloadavg())
    print(json.dumps(RESULTS[namespace], indent=1))
    assert before["acceptance_length"] >= 3.0 and after["acceptance_length"] <= 1.5, RESULTS  # the shift: 4.0 -> 1.0 measured
    assert gate is None and report.offline is not None and report.serving_offline is not None and report.offline > report.serving_offline, why
    assert recovered["acceptance_length"] >= 3.0, RESULTS  # 4.0 measured: every draft token accepted again
    job = RESULTS[namespace]["job"]
    assert job["cpuSeconds"] > 0 and [c["exitCode"] for c in job["containers"]] == [0] * len(job["containers"])
