"""The retraining Job (trainjob.py, issue 36 item 2): a stable name, valid Kubernetes, the budget's limits, the stages'
command lines in the serving engine's terms, the capture read-only and the output published only at the end."""

from __future__ import annotations

import copy
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from drafter_training.cli import build_parser
from specdec_operator import trainjob as t
from specdec_operator.api_retraining_job import RetrainingTraining
from specdec_operator.resource import parse_spec

EXAMPLE = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "llama31-8b-eagle3.yaml").read_text())
DATA = t.TrainingData(capture_claim="llama31-8b-capture", revisions_claim="llama31-8b-revisions")
TRAINING = RetrainingTraining.model_validate(
    {"budget": {"gpus": 2, "maxSteps": 500, "maxMinutes": 90, "backoffLimit": 2, "regenerateConcurrency": 6}}
)


def spec_of(**changes):
    spec = copy.deepcopy(EXAMPLE["spec"])
    spec.update(changes)
    return parse_spec(spec)


def job(spec=None, training=TRAINING, number=3, name="llama31-8b", settings=t.TrainingJobSettings()):
    return t.training_job(name, "team-a", "uid-1", spec or spec_of(), training, DATA, number, "Drift", settings)


def containers(obj: dict) -> dict[str, dict]:
    pod = obj["spec"]["template"]["spec"]
    return {c["name"]: c for c in pod["initContainers"] + pod["containers"]}


def test_the_job_is_valid_kubernetes_for_each_engine_and_budget():
    vllm = spec_of(engine="vLLM", image="vllm/vllm-openai:v0.32.0", sglang=None, vllm={"maxNumSeqs": 64})
    for obj in (job(), job(spec=vllm), job(training=RetrainingTraining()), job(training=RetrainingTraining.model_validate({"budget": {"gpus": 0}}))):
        kubernetes_validate.validate(obj, "1.36.0", strict=True)


def test_the_name_is_stable_and_a_dns_label():
    assert job()["metadata"]["name"] == t.job_name("llama31-8b", 3) == "llama31-8b-train-3"
    assert job() == job()  # rendered twice (an operator restart): the same object, the same name
    assert job(number=4)["metadata"]["name"] == "llama31-8b-train-4"
    long_a, long_b = "a" * 200, "a" * 199 + "b"
    for name in (long_a, long_b, "x." * 60 + "y"):
        rendered = t.job_name(name, 123456)
        assert len(rendered) <= 63 and rendered.endswith("-train-123456")
        assert all(c.isalnum() or c == "-" for c in rendered) and rendered[0].isalnum() and rendered == rendered.lower()
    assert t.job_name(long_a, 1) != t.job_name(long_b, 1)  # cut names stay apart by their hash


def test_budget_priority_owner_and_failure_policy():
    obj = job()
    spec, pod = obj["spec"], obj["spec"]["template"]["spec"]
    assert (spec["activeDeadlineSeconds"], spec["backoffLimit"]) == (90 * 60, 2)
    assert pod["priorityClassName"] == t.DEFAULT_PRIORITY_CLASS == "specdec-training" and t.PRIORITY_CLASS_VALUE < 0
    assert "priorityClassName" not in job(settings=t.TrainingJobSettings(priority_class_name=""))["spec"]["template"]["spec"]
    rules = spec["podFailurePolicy"]["rules"]
    assert rules[0] == {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    assert rules[1] == {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [2]}}
    assert pod["restartPolicy"] == "Never"
    owner = obj["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == ("SpeculativeServer", "llama31-8b", "uid-1", True)
    gpus = {name: c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu") for name, c in containers(obj).items()}
    assert gpus == {
        "gather": None,
        "regenerate": None,
        "capture": "2",
        "train": "2",
        "export": None,
        "validate": None,
        "evaluate": "2",
        "publish": None,
    }
    assert pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"] == [
        {"key": "nvidia.com/gpu.family", "operator": "In", "values": ["hopper"]}
    ]
    labels = obj["metadata"]["labels"]
    assert labels["app.kubernetes.io/name"] == "drafter-training" and labels["specdec.io/training-for"] == "llama31-8b"
    assert "app.kubernetes.io/managed-by" not in labels  # never counted as a server pod


def test_images_gpu_and_cpu():
    assert {c["image"] for c in containers(job()).values()} == {t.DEFAULT_TRAINING_IMAGE}
    cpu = RetrainingTraining.model_validate({"budget": {"gpus": 0}})
    settings = t.TrainingJobSettings(cpu_image="localhost/specdec/drafter-training-cpu:0.1.0")
    rendered = job(training=cpu, settings=settings)
    assert {c["image"] for c in containers(rendered).values()} == {"localhost/specdec/drafter-training-cpu:0.1.0"}
    assert all("resources" not in c for c in containers(rendered).values()) and "affinity" not in rendered["spec"]["template"]["spec"]
    assert {c["image"] for c in containers(job(settings=settings)).values()} == {t.DEFAULT_TRAINING_IMAGE}  # GPUs: the CUDA image
    env = {
        line.split("=", 1)[0]: line.split("=", 1)[1]
        for line in (Path(__file__).resolve().parents[2] / "images" / "images.env").read_text().splitlines()
        if "=" in line and not line.startswith("#")
    }
    assert f"{env['TRAINING_IMAGE']}:{env['TRAINING_TAG']}" == t.DEFAULT_TRAINING_IMAGE
    assert f"{env['TRAINING_CPU_IMAGE']}:{env['TRAINING_CPU_TAG']}" == settings.cpu_image  # what make images-training-cpu builds


def test_capture_read_only_and_output_published_only_by_the_last_container():
    obj = job()
    pod = obj["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["captured"]["persistentVolumeClaim"] == {"claimName": "llama31-8b-capture", "readOnly": True}
    assert volumes["revisions"]["persistentVolumeClaim"] == {"claimName": "llama31-8b-revisions"}
    assert volumes["model"]["hostPath"] == {"path": "/data/models", "type": "Directory"}
    for c in containers(obj).values():
        mounts = {m["name"]: m for m in c["volumeMounts"]}
        assert mounts["captured"]["readOnly"] and mounts["model"]["readOnly"] and not mounts["revisions"].get("readOnly")
        assert c["securityContext"]["readOnlyRootFilesystem"] and c["securityContext"]["runAsNonRoot"]
    revision = obj["metadata"]["annotations"]["specdec.io/revision-dir"]
    assert revision == "/revisions/llama31-8b-train-3"
    staged = "/revisions/.staging/llama31-8b-train-3"
    # Only publish names the revision; every stage before it writes under the staging directory.
    for name, c in containers(obj).items():
        outs = [c["command"][i + 1] for i, a in enumerate(c["command"]) if a == "--out"]
        assert outs and all(o.startswith(staged) for o in outs) if name != "publish" else outs == [revision]
    assert [c["name"] for c in pod["initContainers"]] == list(t.STAGES) and [c["name"] for c in pod["containers"]] == ["publish"]


def test_the_stages_speak_the_serving_engine_and_quantization():
    def flags(obj: dict, stage: str) -> dict[str, str]:
        cmd = containers(obj)[stage]["command"]
        return {a: cmd[i + 1] for i, a in enumerate(cmd) if a.startswith("--") and i + 1 < len(cmd)}

    sglang = job()
    assert flags(sglang, "export")["--engine"] == "sglang"
    assert flags(sglang, "regenerate")["--base-url"] == "http://llama31-8b-base.team-a.svc:30000"
    assert flags(sglang, "regenerate")["--concurrency"] == "6" and flags(sglang, "gather")["--max-samples"] == "5000"
    assert flags(sglang, "gather")["--recent-share"] == "0.5"
    drafter = "/models/eagle3/sglang-EAGLE3-LLaMA3.1-Instruct-8B"
    assert flags(sglang, "capture")["--capture-layers-of"] == drafter and flags(sglang, "train")["--init-from-drafter"] == drafter
    assert flags(sglang, "capture")["--quantization"] == "checkpoint" and flags(sglang, "train")["--max-steps"] == "500"
    # Two GPUs: torchrun, each rank on its own GPU; one GPU: specdec-train on cuda.
    assert containers(sglang)["train"]["command"][:2] == ["torchrun", "--nproc-per-node=2"] and "--device" not in flags(sglang, "train")
    one = job(training=RetrainingTraining())
    assert containers(one)["train"]["command"][0] == "specdec-train" and flags(one, "train")["--device"] == "cuda"
    vllm = job(spec=spec_of(engine="vLLM", image="vllm/vllm-openai:v0.32.0", sglang=None, vllm={"maxNumSeqs": 64, "servedModelName": "llama"}))
    assert flags(vllm, "export")["--engine"] == "vllm" and flags(vllm, "regenerate")["--model"] == "llama"
    bf16 = job(spec=spec_of(target={"path": "m", "quantization": "bf16"}))
    assert flags(bf16, "capture")["--quantization"] == "none"
    with pytest.raises(ValueError, match="NGRAM has no drafter model"):
        job(spec=spec_of(drafter={"algorithm": "NGRAM"}))


def _flags(cmd: list[str]) -> dict[str, str]:
    """--flag value pairs of a command line (a flag without a value maps to "")."""
    return {a: cmd[i + 1] if i + 1 < len(cmd) and not cmd[i + 1].startswith("--") else "" for i, a in enumerate(cmd) if a.startswith("--")}


def test_validate_evaluate_and_publish_check_the_new_export_against_the_serving_drafter():
    from specdec_operator.manifests import ManifestSettings, validator_container

    vllm_spec = spec_of(engine="vLLM", image="vllm/vllm-openai:v0.32.0", sglang=None, vllm={"maxNumSeqs": 64})
    for spec in (spec_of(), spec_of(target={"path": "m", "quantization": "fp8", "contextLength": 4096}), vllm_spec):
        stages, export = containers(job(spec=spec)), "/revisions/.staging/llama31-8b-train-3/export"
        # The flags of the speculative pod's own `specdec validate`, on the new export.
        in_pod = _flags(validator_container(spec, ManifestSettings())["command"])
        expected = {k: v for k, v in in_pod.items() if k not in ("--json", "--termination-log")} | {"--drafter": export}
        expected.setdefault("--engine", "sglang")
        assert {k: v for k, v in _flags(stages["validate"]["command"]).items() if k != "--out"} == expected
        evaluate = _flags(stages["evaluate"]["command"])
        serving = _flags(stages["train"]["command"])["--init-from-drafter"]
        assert (evaluate["--drafter"], evaluate["--serving"]) == (export, serving)  # the new export and the drafter it started from
        assert evaluate["--prompts"].endswith("/work/prompts/heldout.jsonl")
        assert evaluate["--quantization"] == _flags(stages["capture"]["command"])["--quantization"]  # the target as capture loads it
        assert evaluate["--num-steps"] == str(spec.drafter.num_steps) and evaluate["--temperature"] == "0"
    publish = containers(job())["publish"]
    assert publish["terminationMessagePath"] == t.TERMINATION_LOG and _flags(publish["command"])["--keep"] == str(t.DEFAULT_MAX_REVISIONS)
    assert "--protect" not in publish["command"]
    seven = job(training=RetrainingTraining.model_validate({"maxRevisions": 7}))
    assert _flags(containers(seven)["publish"]["command"])["--keep"] == "7"  # spec.retraining.training.maxRevisions
    kept = t.RevisionsKept(5, ("llama31-8b-train-1", "llama31-8b-train-2"))
    command = containers(t.training_job("llama31-8b", "team-a", "uid-1", spec_of(), TRAINING, DATA, 3, "Drift", revisions=kept))["publish"]["command"]
    assert command[command.index("--keep") + 1] == "5" and command[command.index("--protect") :] == ["--protect", *kept.protect]


def test_every_stage_command_line_parses_as_specdec_train_reads_it():
    parser = build_parser()
    for obj in (job(training=RetrainingTraining()), job(training=RetrainingTraining.model_validate({"budget": {"gpus": 0}}))):
        for name, c in containers(obj).items():
            args = parser.parse_args(c["command"][1:])
            assert args.stage == name
    multi = containers(job())["train"]["command"]
    assert parser.parse_args(multi[multi.index("train") :]).init_from_drafter.endswith("Instruct-8B")
