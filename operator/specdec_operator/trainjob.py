"""The retraining Job of one SpeculativeServer (issue 36, item 2), as a pure function of its spec.

``<name>-train-<n>``: the n-th training Job of the resource (n is reconcile/retrain's job_number, the count the
operator keeps in status). The name is the whole identity: an operator that restarts between creating the Job and
recording it renders the same name, and the API server answers AlreadyExists instead of starting a second Job.

One pod, its stages as init containers in order (each must succeed before the next starts, and a failed pod shows
which stage failed), every one the drafter-training image's ``specdec-train``:

1. gather: the captured traffic (the capture's claim, mounted read-only) as prompts and a held-out slice of the newest
   (budget.maxSamples at most, budget.recentShare of them the newest, the rest spread over the older ones);
2. regenerate: the prompts' answers from the serving base server, ``<name>-base`` (same engine, quantization and
   chat template as serving), at budget.regenerateConcurrency concurrent requests (the load budget);
3. capture: hidden states from the target's own checkpoint through transformers (both engines; SGLang's capture
   server is not started by the Job), of the layers the serving drafter was trained on (--capture-layers-of);
4. train: warm-started from the serving drafter, keeping its vocabulary map (--init-from-drafter), at most
   budget.maxSteps steps; ``torchrun`` over budget.gpus GPUs when there are several;
5. export: for the serving engine, in its layer-id convention;
6. validate: the validator's checks of the export against the target (what the speculative pod's init container
   runs), recorded in ``validation.json`` whatever the verdict;
7. evaluate: the export and the serving drafter, the same way, on the held-out slice (``heldout.jsonl``) against the
   target loaded as capture loads it: each one's offline acceptance length in ``evaluation.json``.

Then the container ``publish`` checks the export and renames it to ``/revisions/<job>`` with its COMPLETE marker and
figures, prunes the oldest revisions beyond maxRevisions (never a protected one: the serving and the pinned revision),
and writes its report, one JSON line, to /dev/termination-log (drafter_training/report.py: the contract the operator
reads).
Everything before lives in ``/revisions/.staging/<job>/``, where a retried pod resumes each stage; a Job that fails
or runs out of time (budget.maxMinutes as activeDeadlineSeconds) leaves no revision, only staging that nothing reads.

At a priority below serving: priorityClassName is the operator's (TrainingJobSettings, a chart value; default
``specdec-training``, a PriorityClass of value -100 that never preempts), below the servers' default of 0. A pod
preempted for serving does not count against budget.backoffLimit (podFailurePolicy Ignore on DisruptionTarget), and
bad input (exit 2, one line naming the file or flag) fails the Job at once (FailJob): a retry cannot fix it.
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass
from typing import Any

from . import API_GROUP, API_VERSION, KIND
from .api import SpeculativeServerSpec
from .api_retraining_job import DEFAULT_MAX_REVISIONS, RetrainingTraining
from .enginefacts import facts_for
from .engines import engine_for
from .engines.paths import draft_model_path, target_model_path
from .manifests import GPU_RESOURCE, MODEL_VOLUME, ManifestSettings, _container_security, _gpu_affinity, child_name

DEFAULT_TRAINING_IMAGE = "ghcr.io/specdec/drafter-training:0.1.0"  # images/images.env TRAINING_IMAGE:TRAINING_TAG
DEFAULT_PRIORITY_CLASS = "specdec-training"
PRIORITY_CLASS_VALUE = -100  # the chart's PriorityClass: below the 0 of server pods that name none
TRAINING_UID = 65532  # the image's own unprivileged user
BAD_INPUT_EXIT = 2  # specdec-train's exit status for input it cannot use

LABEL_NAME = "app.kubernetes.io/name"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_PART_OF = "app.kubernetes.io/part-of"
LABEL_TRAINING_FOR = "specdec.io/training-for"
LABEL_RETRAIN = "specdec.io/retrain"
ANNOTATION_TRIGGER = "specdec.io/trigger"
ANNOTATION_REVISION_DIR = "specdec.io/revision-dir"
APP = "drafter-training"
COMPONENT = "retraining"
PART_OF = "specdec-operator"

CAPTURE_VOLUME, CAPTURE_MOUNT = "captured", "/capture"
REVISIONS_VOLUME, REVISIONS_MOUNT = "revisions", "/revisions"
TMP_VOLUME, SHM_VOLUME = "tmp", "dshm"
STAGES = ("gather", "regenerate", "capture", "train", "export", "validate", "evaluate")
PUBLISH = "publish"
GPU_STAGES = ("capture", "train", "evaluate")  # the stages that run the target or the drafter
TERMINATION_LOG = "/dev/termination-log"  # publish's report (drafter_training/report.py), read by the operator
HELDOUT_LIMIT = 64  # held-out conversations evaluated per drafter (specdec-train evaluate --limit)
MAX_NAME = 63  # a Job's name is also its pods' job-name label value


@dataclass(frozen=True)
class TrainingJobSettings:
    """Operator-wide settings of training Jobs (chart values, not part of any resource)."""

    image: str = DEFAULT_TRAINING_IMAGE
    # budget.gpus 0: this image when set (the CPU variant built on the local base, where the CUDA base cannot be pulled).
    cpu_image: str = ""
    priority_class_name: str = DEFAULT_PRIORITY_CLASS  # "" leaves the pods at the cluster's default priority
    cluster_cap: int = 1  # training Jobs running at once in the whole cluster (reconcile/retrain.Cluster.cap)


@dataclass(frozen=True)
class RevisionsKept:
    """The storage cap publish applies: at most max_revisions complete revisions on the claim, never pruning those
    named in protect (the revision serving and the one spec.retraining.revision pins)."""

    max_revisions: int = DEFAULT_MAX_REVISIONS
    protect: tuple[str, ...] = ()


@dataclass(frozen=True)
class TrainingData:
    """Where the Job reads and writes: the capture's claim (item 1) and the claim of the resource's revisions."""

    capture_claim: str
    revisions_claim: str


def job_name(name: str, number: int) -> str:
    """``<name>-train-<number>``, a DNS label of at most 63 characters: a longer resource name is cut and a hash of it
    keeps two such names apart."""
    suffix = f"-train-{number}"
    base = name.replace(".", "-")
    if len(base) + len(suffix) > MAX_NAME:
        digest = hashlib.sha256(name.encode()).hexdigest()[:8]
        base = f"{base[: MAX_NAME - len(suffix) - 9].rstrip('-')}-{digest}"
    return base + suffix


def revision_dir(name: str, number: int) -> str:
    """Where Job `number` publishes its drafter, on the revisions claim (a revision only with its COMPLETE marker)."""
    return f"{REVISIONS_MOUNT}/{job_name(name, number)}"


def staging_dir(name: str, number: int) -> str:
    return f"{REVISIONS_MOUNT}/.staging/{job_name(name, number)}"


def capture_quantization(spec: SpeculativeServerSpec) -> str:
    """specdec-train capture's --quantization for the served one: the checkpoint as it is (its quantization_config),
    or none for a bf16 server. A server that quantizes a bf16 checkpoint itself is not reproduced (docs/retraining.md)."""
    return "none" if spec.target.quantization in ("none", "bf16") else "checkpoint"


def stage_commands(
    name: str,
    namespace: str,
    spec: SpeculativeServerSpec,
    training: RetrainingTraining,
    number: int,
    settings: ManifestSettings,
    revisions: RevisionsKept | None = None,
) -> dict[str, list[str]]:
    """Each stage's command line, in order, then publish's."""
    drafter = draft_model_path(spec)
    if drafter is None:
        raise ValueError(f"{name}: drafter {spec.drafter.algorithm} has no drafter model to retrain")
    budget, engine = training.budget, facts_for(spec.engine)
    target, staging = target_model_path(spec), staging_dir(name, number)
    work = f"{staging}/work"
    model = engine_for(spec).request_model_name(spec)
    base_url = f"http://{child_name(name, 'base')}.{namespace}.svc:{settings.port}"
    device = {"--device": "cuda" if budget.gpus else "cpu"}
    run = ["specdec-train"] if budget.gpus <= 1 else ["torchrun", f"--nproc-per-node={budget.gpus}", "-m", "drafter_training.cli"]
    regenerate = {
        "--prompts": f"{work}/prompts/prompts.jsonl",
        "--out": f"{work}/samples.jsonl",
        "--base-url": base_url,
        "--tokenizer": target,
        "--api": "chat",
        "--model": model,
        "--concurrency": str(budget.regenerate_concurrency),
        "--temperature": "0",
    }
    capture = {
        "--samples": f"{work}/samples.jsonl",
        "--target": target,
        "--out": f"{work}/hidden",
        "--source": "hf",
        "--quantization": capture_quantization(spec),
        "--capture-layers-of": drafter,
    }
    train = {"--capture": f"{work}/hidden", "--target": target, "--out": f"{work}/run", "--init-from-drafter": drafter}
    steps = {"--max-steps": str(budget.max_steps), "--checkpoint-every": "100"}
    export = {"--run": f"{work}/run", "--target": target, "--out": f"{staging}/export", "--engine": engine.cli_name}
    kept = revisions or RevisionsKept(training.max_revisions)
    publish = {"--staging": staging, "--out": revision_dir(name, number), "--job": job_name(name, number), "--keep": str(kept.max_revisions)}
    publish_args = [*_args(publish | {"--termination-log": TERMINATION_LOG}), *(["--protect", *kept.protect] if kept.protect else [])]
    return {
        "gather": [
            "specdec-train",
            "gather",
            *_args(
                {
                    "--capture": CAPTURE_MOUNT,
                    "--out": f"{work}/prompts",
                    "--max-samples": str(budget.max_samples),
                    "--recent-share": f"{budget.recent_share:g}",
                }
            ),
        ],
        "regenerate": ["specdec-train", "regenerate", *_args(regenerate)],
        "capture": ["specdec-train", "capture", *_args(capture | device)],
        # Under torchrun each rank takes its own GPU (LOCAL_RANK): no --device.
        "train": [*run, "train", *_args(train | steps | (device if budget.gpus <= 1 else {}))],
        "export": ["specdec-train", "export", *_args(export)],
        "validate": ["specdec-train", "validate", *_args(_validate_flags(spec, target, f"{staging}/export", f"{work}/validation.json"))],
        "evaluate": ["specdec-train", "evaluate", *_args(_evaluate_flags(spec, target, drafter, staging) | device)],
        PUBLISH: ["specdec-train", "publish", *publish_args],
    }


def _validate_flags(spec: SpeculativeServerSpec, target: str, export: str, out: str) -> dict[str, str]:
    """The flags of the speculative pod's `specdec validate` (manifests.validator_container), on the new export."""
    flags = {"--target": target, "--drafter": export, "--quantization": spec.target.quantization, "--algorithm": spec.drafter.algorithm}
    if spec.target.context_length:
        flags["--context-length"] = str(spec.target.context_length)
    return flags | {"--engine": facts_for(spec.engine).cli_name, "--out": out}


def _evaluate_flags(spec: SpeculativeServerSpec, target: str, drafter: str, staging: str) -> dict[str, str]:
    """Both drafters on the held-out slice, greedy, with the serving chain length, the target as capture loads it."""
    return {
        "--target": target,
        "--drafter": f"{staging}/export",
        "--serving": drafter,
        "--prompts": f"{staging}/work/prompts/heldout.jsonl",
        "--quantization": capture_quantization(spec),
        "--engine": facts_for(spec.engine).cli_name,
        "--num-steps": str(spec.drafter.num_steps),
        "--temperature": "0",
        "--limit": str(HELDOUT_LIMIT),
        "--out": f"{staging}/work/evaluation.json",
    }


def _args(flags: dict[str, str]) -> list[str]:
    return [part for flag, value in flags.items() for part in (flag, value)]


def _container(stage: str, command: list[str], image: str, gpus: int, mounts: list[dict[str, Any]]) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": stage,
        "image": image,
        "command": command,
        "env": [{"name": "HF_HOME", "value": "/tmp/huggingface"}, {"name": "TMPDIR", "value": "/tmp"}],
        "volumeMounts": copy.deepcopy(mounts),
        "securityContext": {**_container_security(), "runAsNonRoot": True, "runAsUser": TRAINING_UID, "runAsGroup": TRAINING_UID},
        "terminationMessagePolicy": "FallbackToLogsOnError",  # the stage's one-line error reaches the pod's status
    }
    if gpus and stage in GPU_STAGES:
        container["resources"] = {"limits": {GPU_RESOURCE: str(gpus)}}
    if stage == PUBLISH:  # its report: one JSON line the operator reads from the pod's status
        container["terminationMessagePath"] = TERMINATION_LOG
    return container


def _volumes(spec: SpeculativeServerSpec, data: TrainingData) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    volumes = [
        {"name": MODEL_VOLUME, **copy.deepcopy(spec.model.volume)},
        {"name": CAPTURE_VOLUME, "persistentVolumeClaim": {"claimName": data.capture_claim, "readOnly": True}},
        {"name": REVISIONS_VOLUME, "persistentVolumeClaim": {"claimName": data.revisions_claim}},
        {"name": TMP_VOLUME, "emptyDir": {}},
        {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": MODEL_VOLUME, "mountPath": spec.model.mount_path, "readOnly": True},
        {"name": CAPTURE_VOLUME, "mountPath": CAPTURE_MOUNT, "readOnly": True},
        {"name": REVISIONS_VOLUME, "mountPath": REVISIONS_MOUNT},
        {"name": TMP_VOLUME, "mountPath": "/tmp"},
        {"name": SHM_VOLUME, "mountPath": "/dev/shm"},
    ]
    return volumes, mounts


def training_labels(name: str, number: int) -> dict[str, str]:
    # Not the server pods' labels (app.kubernetes.io/name=sglang): the operator's pod index and status.selector never
    # count a training pod as a server. component=retraining is what the cluster-wide cap counts.
    labels = {LABEL_NAME: APP, LABEL_COMPONENT: COMPONENT, LABEL_PART_OF: PART_OF, LABEL_RETRAIN: str(number)}
    if len(name) <= 63:
        labels[LABEL_TRAINING_FOR] = name
    return labels


def _pod_spec(
    spec: SpeculativeServerSpec, data: TrainingData, commands: dict[str, list[str]], image: str, gpus: int, settings: TrainingJobSettings
) -> dict[str, Any]:
    volumes, mounts = _volumes(spec, data)
    pod: dict[str, Any] = {
        "restartPolicy": "Never",  # a failed stage fails the pod; the Job's backoffLimit retries it
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": TRAINING_UID,
            "runAsGroup": TRAINING_UID,
            "fsGroup": TRAINING_UID,  # the revisions claim is written by the image's user
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "initContainers": [_container(stage, commands[stage], image, gpus, mounts) for stage in STAGES],
        "containers": [_container(PUBLISH, commands[PUBLISH], image, 0, mounts)],
        "volumes": volumes,
        "tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}] + copy.deepcopy(spec.pod_template.tolerations or []),
    }
    if settings.priority_class_name:
        pod["priorityClassName"] = settings.priority_class_name
    if spec.pod_template.node_selector:
        pod["nodeSelector"] = dict(spec.pod_template.node_selector)
    if spec.pod_template.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": ref.name} for ref in spec.pod_template.image_pull_secrets]
    affinity = _gpu_affinity(spec) if gpus else None  # the servers' GPU family: the same numerics as serving
    if affinity:
        pod["affinity"] = affinity
    return pod


def training_job(
    name: str,
    namespace: str,
    owner_uid: str,
    spec: SpeculativeServerSpec,
    training: RetrainingTraining,
    data: TrainingData,
    number: int,
    trigger: str,
    settings: TrainingJobSettings = TrainingJobSettings(),
    manifest_settings: ManifestSettings = ManifestSettings(),
    revisions: RevisionsKept | None = None,
) -> dict[str, Any]:
    """The batch/v1 Job of training run `number` (pure; owned by the SpeculativeServer, so it goes with it).
    revisions: the storage cap and the revisions it must keep (the serving and the pinned one); None:
    training.maxRevisions, nothing protected."""
    budget = training.budget
    image = settings.cpu_image if budget.gpus == 0 and settings.cpu_image else settings.image
    commands = stage_commands(name, namespace, spec, training, number, manifest_settings, revisions)
    labels = training_labels(name, number)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name(name, number),
            "namespace": namespace,
            "labels": labels,
            "annotations": {ANNOTATION_TRIGGER: trigger, ANNOTATION_REVISION_DIR: revision_dir(name, number)},
            "ownerReferences": [
                {
                    "apiVersion": f"{API_GROUP}/{API_VERSION}",
                    "kind": KIND,
                    "name": name,
                    "uid": owner_uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "backoffLimit": budget.backoff_limit,
            "activeDeadlineSeconds": budget.max_minutes * 60,
            "podFailurePolicy": {
                "rules": [
                    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
                    {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [BAD_INPUT_EXIT]}},
                ]
            },
            "template": {
                "metadata": {"labels": dict(labels)},
                "spec": _pod_spec(spec, data, commands, image, budget.gpus, settings),
            },
        },
    }
