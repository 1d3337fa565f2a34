"""The retraining Job's stages run as processes would run them in its pod (issue 36, item 2): the command lines
trainjob.py renders, with the pod's mounts mapped onto directories here and the base Service onto a real HTTP server of
the tiny target (tests/support/tiny_server.py). Captured traffic in, a published revision out that keeps the serving
drafter's vocabulary map; a stage that fails leaves no revision.

Only two things differ from the pod: the paths (/models, /capture, /revisions are directories under tmp) and
regenerate's --max-new-tokens, appended small so the tiny target answers in seconds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from drafter_training.capture import capture_hf
from drafter_training.cli import main as specdec_train
from drafter_training.export import export_drafter
from drafter_training.publish import is_published, read_marker
from drafter_training.regenerate import tokenize_conversation
from drafter_training.train import TrainConfig, train
from drafter_training.vocab import build_vocab
from specdec_operator import trainjob as t
from specdec_operator.api_retraining_job import RetrainingTraining
from specdec_operator.resource import parse_spec
from tests.support.tiny_models import make_model
from tests.support.tiny_server import TinyModelServer

LAYERS = [0, 1, 2]
TRAINING = RetrainingTraining.model_validate({"budget": {"gpus": 0, "maxSteps": 2, "maxSamples": 10, "regenerateConcurrency": 2}})


@pytest.fixture(scope="module")
def serving(tmp_path_factory):
    """/models with a tiny target and the drafter that serves it (trained briefly, exported for SGLang)."""
    from transformers import AutoTokenizer

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("stages")
    target = make_model(root / "models" / "target", "llama", layers=4)
    tok = AutoTokenizer.from_pretrained(str(target))
    with (root / "old.jsonl").open("w") as f:
        for i in range(4):
            ids, mask = tokenize_conversation(tok, [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "x = 1 " * (2 + i)}])
            f.write(json.dumps({"id": i, "input_ids": ids, "loss_mask": mask}) + "\n")
    capture_hf(root / "old.jsonl", target, root / "cap-old", quantization="none", capture_layers=LAYERS, progress=False)
    build_vocab(root / "cap-old", root / "cap-old", 40)
    train(
        TrainConfig(capture_dir=str(root / "cap-old"), target_dir=str(target), out_dir=str(root / "run-old"), epochs=1, ttt_steps=2, progress=False)
    )
    export_drafter(root / "run-old" / "final", target, root / "models" / "drafter", engine="sglang")
    server = TinyModelServer(target)
    server.start()
    yield root, server
    server.stop()
    torch.set_num_threads(before)


def _rendered(root: Path, name: str) -> dict[str, list[str]]:
    spec = parse_spec({"image": "sglang", "model": {"volume": {"emptyDir": {}}}, "target": {"path": "target"}, "drafter": {"path": "drafter"}})
    job = t.training_job(name, "team-a", "uid", spec, TRAINING, t.TrainingData("c", "r"), 1, "Drift")
    pod = job["spec"]["template"]["spec"]
    return {c["name"]: c["command"] for c in pod["initContainers"] + pod["containers"]}


def _here(arg: str, root: Path, capture: Path, server: TinyModelServer) -> str:
    if arg.startswith("http://"):
        return server.base_url
    for mount, local in (("/models", root / "models"), ("/capture", capture), ("/revisions", root / "revisions")):
        if arg == mount or arg.startswith(mount + "/"):
            return str(local) + arg[len(mount) :]
    return arg


def _run_stages(root: Path, capture: Path, server: TinyModelServer, name: str) -> list[tuple[str, int]]:
    ran = []
    for stage, command in _rendered(root, name).items():
        assert command[0] == "specdec-train"  # one CPU: no torchrun
        argv = ["--quiet", *(_here(a, root, capture, server) for a in command[1:])]
        if stage == "regenerate":
            argv += ["--max-new-tokens", "12"]
        code = specdec_train(argv)
        ran.append((stage, code))
        if code:
            break
    return ran


def _chat(i: int) -> str:
    return json.dumps({"endpoint": "/v1/chat/completions", "messages": [{"role": "user", "content": f"please write code {i}"}]})


def test_captured_traffic_in_a_published_revision_out_with_the_serving_map(serving, capsys):
    root, server = serving
    capture = root / "capture-ok"
    capture.mkdir()
    (capture / "capture-20261207T000000Z-p.jsonl").write_text("\n".join(_chat(i) for i in range(14)) + "\n")
    ran = _run_stages(root, capture, server, "srv")
    assert ran == [(stage, 0) for stage in (*t.STAGES, t.PUBLISH)]
    revision = root / "revisions" / "srv-train-1"
    assert is_published(revision) and read_marker(revision)["job"] == "srv-train-1"
    assert not (root / "revisions" / ".staging" / "srv-train-1").exists()
    served, retrained = load_file(str(root / "models" / "drafter" / "model.safetensors")), load_file(str(revision / "model.safetensors"))
    assert torch.equal(served["d2t"], retrained["d2t"]) and torch.equal(served["t2d"], retrained["t2d"])
    assert not torch.equal(served["fc.weight"], retrained["fc.weight"])
    provenance = json.loads((revision / "training_provenance.json").read_text())
    assert provenance["warm_started_from"] == str(root / "models" / "drafter") and provenance["engine"] == "sglang"
    assert provenance["capture_layer_ids"]["sglang_config_output_index"] == LAYERS
    assert set(read_marker(revision)["files"]) == {"config.json", "model.safetensors", "training_provenance.json"}


def test_a_stage_that_cannot_use_its_input_leaves_no_revision(serving, capsys):
    root, server = serving
    capture = root / "capture-bad"
    capture.mkdir()
    (capture / "capture-20261207T000000Z-p.jsonl").write_text(json.dumps({"endpoint": "/v1/completions", "prompt": "only completions"}) + "\n")
    ran = _run_stages(root, capture, server, "bad")
    assert ran == [("gather", t.BAD_INPUT_EXIT)]  # exit 2: the Job's podFailurePolicy fails it at once
    assert "no chat conversation to train on" in capsys.readouterr().err
    assert not (root / "revisions" / "bad-train-1").exists()
