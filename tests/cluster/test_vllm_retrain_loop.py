"""Issue 36, item 5 on the real engine: a traffic shift makes a drafter's acceptance fall, the training Job retrains it
from the captured traffic, and the published revision's acceptance recovers, all measured on vLLM's CPU build.

    the copy target on vLLM (core 0), its EAGLE-3 drafter trained on free traffic only (tests/support/retrain_models.py)
      <- the capture proxy (`specdec capture`, every request) <- free requests, then copy requests (the shift)
    the operator's training Job (trainjob.training_job, applied to the local control plane, owned by the resource)
      -> the real Job controller makes its pod; hack/job_runner.py binds it and runs its stages as processes
         (/capture the proxy's directory, /models the cached models, the base Service the serving server)
      -> publish's termination message in the pod's status, read by the operator's own reader and offline gate
    a vLLM server of the published revision: the same copy requests again

What the operator itself does around this (the monitor's drift rollback that creates the Job, the race of the
revision and its promotion) is not run here: the Job is applied as training.finish applies it, and the revision is
served by the test. Acceptance is vLLM's own counters on greedy requests sent one at a time: it does not depend on how
busy the machine is. One vLLM server at a time.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from hack.job_mapping import VolumeDirs
from hack.job_runner import NODE, JobRunner, LocalExecute
from specdec_operator.reconcile.revision import Report, offline_gate, read_report
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


def test_a_traffic_shift_drops_acceptance_and_the_retrained_revision_recovers_it(
    models: Path, kube_client: Any, custom_objects: Any, batch_v1: Any, core_v1: Any, namespace: str, tmp_path: Path
) -> None:
    from kubernetes import client

    from benchmarks.capture_latency import CaptureProcess

    started = time.monotonic()
    dirs = VolumeDirs(tmp_path, named={"model": models})
    capture = dirs.root / "claims" / namespace / f"{NAME}-capture"  # the capture claim's directory, as the Job sees it
    capture.mkdir(parents=True)
    # The resource and the PriorityClass first: a refusal fails the test before minutes of vLLM.
    uid = owner(custom_objects, namespace)["metadata"]["uid"]
    priority = f"specdec-training-{namespace}"  # cluster-scoped: one per test, as the chart makes one per release
    scheduling = client.SchedulingV1Api(kube_client)
    scheduling.create_priority_class(client.V1PriorityClass(metadata=client.V1ObjectMeta(name=priority), value=-100, preemption_policy="Never"))
    job = training_job(NAME, namespace, MAX_STEPS, uid=uid, priority_class=priority)
    old: VllmServer | None = None
    try:
        old = serve("old", models, models / DRAFTER, tmp_path / "logs")
        with CaptureProcess(old.url, str(capture), 1.0, False) as proxy:
            before = chat_acceptance(proxy, old.url, free_prompts(8, seed=100))
            chat_acceptance(proxy, old.url, copy_workload(40, seed=1))  # the shifted traffic: the Job's training data
        after = chat_acceptance(old.url, old.url, copy_workload(8, seed=2))  # an evaluation set, not captured
        RESULTS.update(before_shift=before, after_shift=after)
        condition, pods = run_job(kube_client, batch_v1, core_v1, namespace, job, dirs, old.url)
    finally:
        if old is not None:
            old.stop()
        scheduling.delete_priority_class(priority)
    revision = dirs.root / "claims" / namespace / f"{NAME}-revisions" / job["metadata"]["name"]
    RESULTS["job_condition"] = condition.type
    assert condition.type == "Complete", (condition.reason, condition.message, RESULTS["job"])
    assert pods[0]["spec"]["nodeName"] == NODE and (revision / "COMPLETE").is_file()
    report = read_report(pods, job["metadata"]["name"])
    assert isinstance(report, Report), report
    gate, why = offline_gate(report, 0.05)  # the operator's reading of publish's termination message
    RESULTS["offline"] = {"revision": report.offline, "serving": report.serving_offline, "heldout": report.heldout, "gate": gate, "why": why}
    new = serve("new", models, revision, tmp_path / "logs")
    try:
        recovered = chat_acceptance(new.url, new.url, copy_workload(8, seed=2))
    finally:
        new.stop()
    RESULTS.update(new_drafter=recovered, seconds=round(time.monotonic() - started, 1), load=os.getloadavg())
    print(json.dumps(RESULTS, indent=1))
    assert before["acceptance_length"] >= 3.0 and after["acceptance_length"] <= 1.5, RESULTS  # the shift: 4.0 -> 1.0 measured
    assert gate is None and report.offline is not None and report.offline > report.serving_offline, why
    assert recovered["acceptance_length"] >= 3.0, RESULTS  # 4.0 measured: every draft token accepted again
    assert RESULTS["job"]["cpuSeconds"] > 0 and [c["exitCode"] for c in RESULTS["job"]["containers"]] == [0] * len(RESULTS["job"]["containers"])
