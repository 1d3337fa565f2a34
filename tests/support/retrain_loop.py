"""The pieces of the real-engine retraining loop (issue 36, item 5) that the benchmark (benchmarks/vllm_retrain.py) and
the tests share: the resource whose Job retrains the copy target's drafter, its training pod as the operator renders
it, run here through hack/job_pod.py, and the acceptance vLLM's own counters give for chat traffic.

Traffic is chat (`/v1/chat/completions`, greedy, fixed length): what the capture proxy records and the Job's gather
stage reads. Acceptance is vLLM's: 1 + accepted draft tokens / drafts, from the spec_decode counters of /metrics
before and after the requests (requests go one at a time, so nothing else moves them).
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

from hack.job_mapping import VolumeDirs
from hack.job_pod import Execute, LocalExecute, run_containers
from tests.support.retrain_models import DRAFTER, TARGET
from tests.support.vllm_servers import metrics

MOUNT = "/models"
SPEC_TOKENS = 3
MAX_TOKENS = 48
# The tiny drafter's recipe (the tier's: tests/support/copy_eagle.py), appended to the rendered stages' commands. The
# Job's own defaults are a real drafter's (lr 1e-4, batch 1): a 2-layer drafter of a 128-wide target learns four
# sequences in a few hundred steps at 3e-3 with batches of 4. regenerate and evaluate: answers as long as the probe's.
EXTRA_ARGS = {
    "regenerate": ["--max-new-tokens", str(MAX_TOKENS)],
    "evaluate": ["--max-new-tokens", str(MAX_TOKENS)],
    "train": ["--lr", "3e-3", "--batch-size", "4", "--ttt-steps", "3", "--max-length", "192"],
}


def resource_spec(name: str = "shift") -> dict[str, Any]:
    """The SpeculativeServer spec of the loop: the copy target on vLLM, the free-trained drafter, retraining on CPU."""
    return {
        "engine": "vLLM",
        "image": "vllm/vllm-openai:v0.32.0",
        "vllm": {"servedModelName": "default", "maxNumSeqs": 8},
        "model": {"volume": {"emptyDir": {}}, "mountPath": MOUNT},
        "target": {"path": TARGET, "contextLength": 512},
        "drafter": {"path": DRAFTER, "numSteps": SPEC_TOKENS},
    }


def training_job(
    name: str, namespace: str, max_steps: int, spec: dict[str, Any] | None = None, uid: str = "uid", priority_class: str = ""
) -> dict[str, Any]:
    """Job 1 of resource `name` as the operator applies it (trainjob.training_job with the operator's claims)."""
    from specdec_operator import trainjob as t
    from specdec_operator.api_retraining_job import RetrainingTraining
    from specdec_operator.reconcile.capture_objects import capture_name
    from specdec_operator.reconcile.training import revisions_claim
    from specdec_operator.resource import parse_spec

    training = RetrainingTraining.model_validate({"budget": {"gpus": 0, "maxSteps": max_steps, "regenerateConcurrency": 1}})
    data = t.TrainingData(capture_name(name), revisions_claim(name))
    settings = t.TrainingJobSettings(priority_class_name=priority_class)
    return t.training_job(name, namespace, uid, parse_spec(spec or resource_spec(name)), training, data, 1, "Drift", settings)


def training_pod(name: str, namespace: str, max_steps: int) -> dict[str, Any]:
    """The pod the Job controller makes of Job 1 (its template, with the job-name label)."""
    job = training_job(name, namespace, max_steps)
    labels = {**job["spec"]["template"]["metadata"]["labels"], "job-name": job["metadata"]["name"]}
    return {"metadata": {"name": f"{job['metadata']['name']}-pod", "namespace": namespace, "labels": labels}, "spec": job["spec"]["template"]["spec"]}


def base_url_of(pod_spec: dict[str, Any]) -> str:
    """The base Service's URL in the regenerate stage's command (a pod's spec, or a Job's template's)."""
    command = next(c["command"] for c in pod_spec["initContainers"] if c["name"] == "regenerate")
    return str(command[command.index("--base-url") + 1])


def run_training_pod(
    pod: dict[str, Any], work: Path, models: Path, capture: Path, revisions: Path, base_url: str, execute: Execute | None = None
) -> dict[str, Any]:
    """Run the pod's containers here: /models the loop's models, the claims the capture and revisions directories,
    the base Service the server given (greedy speculative decoding answers what the base does)."""
    dirs = VolumeDirs(work, named={"model": models, "captured": capture, "revisions": revisions})
    return run_containers(pod, work / "pod", dirs, execute or LocalExecute(nice=10, extra_args=EXTRA_ARGS), {base_url_of(pod["spec"]): base_url})


def chat(url: str, messages: list[dict[str, str]], max_tokens: int = MAX_TOKENS) -> dict[str, Any]:
    body = {"model": "default", "messages": messages, "max_tokens": max_tokens, "temperature": 0}
    req = urllib.request.Request(f"{url}/v1/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        out: dict[str, Any] = json.loads(r.read())
    return out


def chat_acceptance(send_url: str, server_url: str, prompts: list[dict[str, Any]]) -> dict[str, Any]:
    """Send `prompts` one at a time to `send_url` (the server, or the capture proxy in front of it); what the server's
    counters moved by: acceptance length, drafts, tokens, seconds."""
    before = metrics(server_url)
    t0 = time.monotonic()
    tokens = sum(int(chat(send_url, p["messages"])["usage"]["completion_tokens"]) for p in prompts)
    seconds = time.monotonic() - t0
    after = metrics(server_url)
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    drafts = delta.get("vllm:spec_decode_num_drafts_total", 0.0)
    accepted = delta.get("vllm:spec_decode_num_accepted_tokens_total", 0.0)
    return {
        "requests": len(prompts),
        "acceptance_length": round(1 + accepted / drafts, 3) if drafts else None,
        "drafts": drafts,
        "accepted_tokens": accepted,
        "generated_tokens": tokens,
        "seconds": round(seconds, 1),
        "tokens_per_second": round(tokens / seconds, 1) if seconds else None,
    }
