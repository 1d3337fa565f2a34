"""The retraining Job's stages run as processes would run them in its pod (issue 36, items 2 and 3): the command lines
trainjob.py renders, with the pod's mounts mapped onto directories here and the base Service onto a real HTTP server of
the tiny target (tests/support/tiny_server.py). Captured traffic in, a published revision out that keeps the serving
drafter's vocabulary map, with publish's termination message (the contract the operator reads: both drafters' offline
acceptance on the held-out slice, the validator's verdict, the storage cap's pruning); a stage that fails leaves no
revision.

Only three things differ from the pod: the paths (/models, /capture, /revisions are directories under tmp, and
/dev/termination-log a file), and regenerate's and evaluate's --max-new-tokens, appended small so the tiny target
answers in seconds."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from drafter_training.capture import capture_hf
from drafter_training.cli import main as specdec_train
from drafter_training.evaluate import load_prompts
from drafter_training.export import export_drafter
from drafter_training.gather import gather
from drafter_training.offline import drafter_runs, load_drafter
from drafter_training.publish import is_published, read_marker
from drafter_training.report import termination_message
from drafter_training.revisions import complete_revisions, size_on_disk
from drafter_training.target import load_target
from drafter_training.train import TrainConfig, train
from drafter_training.vocab import build_vocab
from specdec_operator import trainjob as t
from specdec_operator.api_retraining_job import RetrainingTraining
from specdec_operator.resource import parse_spec
from tests.support.tiny_models import make_model
from tests.support.tiny_server import TinyModelServer

LAYERS = [0, 1, 2]
# 10 of the 14 captured: the newest 8 (2 of them held out) and 2 older ones.
TRAINING = RetrainingTraining.model_validate({"budget": {"gpus": 0, "maxSteps": 2, "maxSamples": 10, "recentShare": 0.8, "regenerateConcurrency": 2}})


CAPTURED = 14  # chat conversations in the capture of the main test


def _chat(i: int) -> str:
    return json.dumps({"endpoint": "/v1/chat/completions", "messages": [{"role": "user", "content": f"please write code {i}"}]})


def _write_capture(directory: Path, lines: list[str]) -> Path:
    directory.mkdir(parents=True)
    (directory / "capture-20261207T000000Z-p.jsonl").write_text("\n".join(lines) + "\n")
    return directory


def _greedy_samples(target: Path, conversations: list[list[dict[str, str]]], path: Path, new_tokens: int = 16) -> None:
    """The target's own greedy continuations of `conversations`, token for token, as training samples."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok, model = AutoTokenizer.from_pretrained(str(target)), AutoModelForCausalLM.from_pretrained(str(target)).eval()
    with path.open("w") as f:
        for i, messages in enumerate(conversations):
            prompt = tok(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True), add_special_tokens=False).input_ids
            with torch.no_grad():
                ids = model.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False)[0].tolist()
            f.write(json.dumps({"id": i, "input_ids": ids, "loss_mask": [0] * len(prompt) + [1] * (len(ids) - len(prompt))}) + "\n")


@pytest.fixture(scope="module")
def serving(tmp_path_factory):
    """/models with a tiny target and the drafter that serves it, exported for SGLang: trained on the target's own
    greedy answers to the conversations the main test's capture holds out, so that it accepts something there (a
    random tiny target's drafter otherwise accepts nothing, and every offline figure would be 1.0)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("stages")
    target = make_model(root / "models" / "target", "llama", layers=4)
    capture = _write_capture(root / "capture-split", [_chat(i) for i in range(CAPTURED)])
    gather(capture, root / "split", max_samples=TRAINING.budget.max_samples, recent_share=TRAINING.budget.recent_share)
    heldout = [json.loads(line)["messages"] for line in (root / "split" / "heldout.jsonl").read_text().splitlines()]
    assert heldout, "the capture must hold some conversations out"
    _greedy_samples(target, heldout, root / "old.jsonl")
    capture_hf(root / "old.jsonl", target, root / "cap-old", quantization="none", capture_layers=LAYERS, progress=False)
    build_vocab(root / "cap-old", root / "cap-old", 64)
    old = {"capture_dir": str(root / "cap-old"), "target_dir": str(target), "out_dir": str(root / "run-old")}
    train(TrainConfig(**old, epochs=20, lr=3e-3, ttt_steps=2, progress=False))
    export_drafter(root / "run-old" / "final", target, root / "models" / "drafter", engine="sglang")
    server = TinyModelServer(target)
    server.start()
    yield root, server
    server.stop()
    torch.set_num_threads(before)


SPEC = parse_spec({"image": "sglang", "model": {"volume": {"emptyDir": {}}}, "target": {"path": "target"}, "drafter": {"path": "drafter"}})
MAX_NEW_TOKENS = {"regenerate": "12", "evaluate": "8"}


def _rendered(name: str, number: int = 1, revisions: t.RevisionsKept | None = None) -> dict[str, list[str]]:
    job = t.training_job(name, "team-a", "uid", SPEC, TRAINING, t.TrainingData("c", "r"), number, "Drift", revisions=revisions)
    pod = job["spec"]["template"]["spec"]
    assert pod["containers"][0]["terminationMessagePath"] == t.TERMINATION_LOG
    return {c["name"]: c["command"] for c in pod["initContainers"] + pod["containers"]}


def _here(arg: str, root: Path, capture: Path, server: TinyModelServer | None) -> str:
    if arg.startswith("http://") and server is not None:
        return server.base_url
    if arg == t.TERMINATION_LOG:
        return str(root / "termination-log")
    for mount, local in (("/models", root / "models"), ("/capture", capture), ("/revisions", root / "revisions")):
        if arg == mount or arg.startswith(mount + "/"):
            return str(local) + arg[len(mount) :]
    return arg


def _run_stages(
    root: Path, capture: Path, server: TinyModelServer | None, commands: dict[str, list[str]], only: tuple[str, ...] | None = None
) -> list[tuple[str, int]]:
    ran = []
    for stage, command in commands.items():
        if only is not None and stage not in only:
            continue
        assert command[0] == "specdec-train"  # one CPU: no torchrun
        argv = ["--quiet", *(_here(a, root, capture, server) for a in command[1:])]
        if stage in MAX_NEW_TOKENS:
            argv += ["--max-new-tokens", MAX_NEW_TOKENS[stage]]
        code = specdec_train(argv)
        ran.append((stage, code))
        if code:
            break
    return ran


def _message(root: Path) -> dict:
    text = (root / "termination-log").read_text()
    assert len(text.encode()) <= 4000 and "\n" not in text  # one line, within the contract's bound
    return json.loads(text)


def _accept_length(root: Path, drafter: Path, heldout: Path) -> float:
    """A drafter evaluated here, apart from the Job: what the Job's evaluate stage must have found for it."""
    from transformers import AutoTokenizer

    target_dir = root / "models" / "target"
    target = load_target(target_dir, "none", device="cpu")
    prompts = load_prompts(heldout, AutoTokenizer.from_pretrained(str(target_dir)), t.HELDOUT_LIMIT)
    eos = target.config.get("eos_token_id")
    settings = {"num_steps": SPEC.drafter.num_steps, "max_new_tokens": 8, "eos_ids": {eos} if isinstance(eos, int) else set(eos or [])}
    runs = drafter_runs(target.model, load_drafter(drafter, target_dir, "sglang"), prompts, [0.0], settings, False)
    return runs[0]["acceptance_length"]


def test_captured_traffic_in_a_published_revision_out_with_the_serving_map_and_its_report(serving, capsys):
    root, server = serving
    capture = _write_capture(root / "capture-ok", [_chat(i) for i in range(CAPTURED)])
    ran = _run_stages(root, capture, server, _rendered("srv"))
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
    # The drafter and the held-out slice the operator races it on (drafter_training/publish.py HELDOUT)
    assert set(read_marker(revision)["files"]) == {"config.json", "model.safetensors", "training_provenance.json", "heldout.jsonl"}
    # The server that mounts it runs as its engine image's user: every file readable (safetensors writes 0600).
    assert all(p.stat().st_mode & 0o444 == 0o444 for p in revision.iterdir())

    # The termination message of the contract: figures of both drafters on the held-out slice gather kept out.
    split = json.loads((root / "split" / "gather.json").read_text())  # the same capture's split, made by the fixture
    message = _message(root)
    assert set(message) == {"schema", "revision", "path", "heldout", "offline", "validation", "trainSamples", "steps", "bytes", "pruned"}
    assert (message["schema"], message["revision"], message["path"]) == (1, "srv-train-1", "srv-train-1")
    assert message["heldout"] == split["heldout"]
    offline = message["offline"]
    for role in ("revision", "serving"):
        assert 1.0 < offline[role]["acceptLength"] <= SPEC.drafter.num_steps + 1  # both accept some of the held-out answers
    for role, drafter in (("serving", root / "models" / "drafter"), ("revision", revision)):
        assert offline[role]["acceptLength"] == pytest.approx(_accept_length(root, drafter, root / "split" / "heldout.jsonl"), abs=1e-4)
    assert message["validation"] == {"passed": True, "codes": []}
    assert message["steps"] == TRAINING.budget.max_steps and 0 < message["trainSamples"] <= split["train"]
    assert message["bytes"] == size_on_disk(revision) > 0 and message["pruned"] == []
    assert read_marker(revision)["figures"]["offline"] == offline
    # No text of the traffic in the report nor in anything the stages printed.
    assert "please write code" not in json.dumps(message) + "".join(capsys.readouterr())


def test_a_stage_that_cannot_use_its_input_leaves_no_revision(serving, capsys):
    root, server = serving
    capture = root / "capture-bad"
    capture.mkdir()
    (capture / "capture-20261207T000000Z-p.jsonl").write_text(json.dumps({"endpoint": "/v1/completions", "prompt": "only completions"}) + "\n")
    ran = _run_stages(root, capture, server, _rendered("bad"))
    assert ran == [("gather", t.BAD_INPUT_EXIT)]  # exit 2: the Job's podFailurePolicy fails it at once
    assert "no chat conversation to train on" in capsys.readouterr().err
    assert not (root / "revisions" / "bad-train-1").exists()


def _claim(tmp_path: Path, root: Path) -> Path:
    """A fresh /revisions beside the module's /models."""
    work = tmp_path / "claim"
    work.mkdir()
    (work / "models").symlink_to(root / "models")
    return work


def _staged(root: Path, job: str, heldout: int) -> Path:
    """A Job's staging directory as the stages before validate leave it: the export (here the serving drafter's
    copy) and the held-out slice."""
    staging = root / "revisions" / ".staging" / job
    shutil.copytree(root / "models" / "drafter", staging / "export")
    (staging / "work" / "prompts").mkdir(parents=True)
    rows = [{"id": str(i), "messages": [{"role": "user", "content": f"held out {i}"}]} for i in range(heldout)]
    (staging / "work" / "prompts" / "heldout.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return staging


def _publish_earlier(root: Path, job: str, published: str) -> None:
    """A complete revision of an earlier Job (its marker's time says when)."""
    revision = root / "revisions" / job
    shutil.copytree(root / "models" / "drafter", revision)
    (revision / "COMPLETE").write_text(json.dumps({"job": job, "published": published, "files": {}}))


def test_publish_prunes_the_oldest_revisions_beyond_the_cap_never_a_protected_one(serving, tmp_path):
    root, _ = serving
    work = _claim(tmp_path, root)
    for n, published in ((1, "2026-12-01T00:00:00Z"), (2, "2026-12-02T00:00:00Z"), (3, "2026-12-03T00:00:00Z")):
        _publish_earlier(work, f"cap-train-{n}", published)
    (work / "revisions" / "cap-train-9").mkdir()  # not a revision (no COMPLETE): neither counted nor touched
    (work / "revisions" / ".staging" / "cap-train-3" / "work").mkdir(parents=True)  # what a failed Job left
    _staged(work, "cap-train-4", heldout=2)
    commands = _rendered("cap", 4, t.RevisionsKept(max_revisions=2, protect=("cap-train-1",)))
    assert commands[t.PUBLISH][-4:] == ["--termination-log", t.TERMINATION_LOG, "--protect", "cap-train-1"]
    ran = _run_stages(work, work / "capture", None, commands, only=("validate", "evaluate", t.PUBLISH))
    assert ran == [("validate", 0), ("evaluate", 0), (t.PUBLISH, 0)]
    message = _message(work)
    # Four complete, two kept: the oldest unprotected go; the protected one stays though it is the oldest.
    assert message["pruned"] == ["cap-train-2", "cap-train-3"]
    assert complete_revisions(work / "revisions") == ["cap-train-1", "cap-train-4"]
    assert (work / "revisions" / "cap-train-9").is_dir()  # not a revision: untouched
    assert list((work / "revisions" / ".staging").iterdir()) == []  # the failed Job's staging and the pruned ones gone
    # The export is the serving drafter's copy: both evaluated the same way, on the same two prompts, so equal.
    assert message["heldout"] == 2 and message["offline"]["revision"] == message["offline"]["serving"]
    assert message["validation"]["passed"] is True
    assert "trainSamples" not in message and "steps" not in message  # no training run here: its figures are missing


def test_no_heldout_conversation_leaves_the_offline_figures_out(serving, tmp_path):
    root, _ = serving
    work = _claim(tmp_path, root)
    _staged(work, "few-train-1", heldout=0)
    ran = _run_stages(work, work / "capture", None, _rendered("few"), only=("validate", "evaluate", t.PUBLISH))
    assert ran == [("validate", 0), ("evaluate", 0), (t.PUBLISH, 0)]
    message = _message(work)
    assert message["heldout"] == 0 and "offline" not in message  # the operator: OfflineEvaluationMissing


def test_an_export_the_validator_refuses_is_published_with_its_verdict(serving, tmp_path):
    """Validation does not fail the Job: its verdict (passed false, the error codes) reaches the operator."""
    root, _ = serving
    work = _claim(tmp_path, root)
    staging = _staged(work, "inv-train-1", heldout=1)
    config = json.loads((staging / "export" / "config.json").read_text())
    config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [1, 2, 40]  # a layer the 4-layer target never produces
    (staging / "export" / "config.json").write_text(json.dumps(config))
    ran = _run_stages(work, work / "capture", None, _rendered("inv"), only=("validate", "evaluate", t.PUBLISH))
    assert ran == [("validate", 0), ("evaluate", 0), (t.PUBLISH, 0)]
    message = _message(work)
    assert message["validation"]["passed"] is False
    assert set(message["validation"]["codes"]) == {"AuxLayerOutOfRange", "AuxLayersNotTrained"}


def test_an_export_evaluate_cannot_load_leaves_the_offline_figures_out(serving, tmp_path):
    root, _ = serving
    work = _claim(tmp_path, root)
    staging = _staged(work, "tok-train-1", heldout=1)
    provenance = json.loads((staging / "export" / "training_provenance.json").read_text())
    provenance["tokenizer_sha256"] = "0" * 64  # exported for another tokenizer: refused as a drafter of this target
    (staging / "export" / "training_provenance.json").write_text(json.dumps(provenance))
    ran = _run_stages(work, work / "capture", None, _rendered("tok"), only=("validate", "evaluate", t.PUBLISH))
    assert ran == [("validate", 0), ("evaluate", 0), (t.PUBLISH, 0)]
    message = _message(work)
    assert message["heldout"] == 1 and "offline" not in message


@pytest.mark.parametrize(
    ("name", "content", "said"),
    [
        ("evaluation.json", "{not json", "evaluation.json: not JSON"),
        ("validation.json", json.dumps({"passed": "yes", "codes": []}), "validation.json: needs passed (true/false) and codes"),
    ],
)
def test_a_bad_report_input_is_one_line_and_publishes_nothing(serving, tmp_path, capsys, name, content, said):
    root, _ = serving
    work = _claim(tmp_path, root)
    staging = _staged(work, "rep-train-1", heldout=1)
    (staging / "work" / name).write_text(content)
    ran = _run_stages(work, work / "capture", None, _rendered("rep"), only=(t.PUBLISH,))
    assert ran == [(t.PUBLISH, t.BAD_INPUT_EXIT)]
    err = capsys.readouterr().err.strip()
    assert said in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not is_published(work / "revisions" / "rep-train-1") and (staging / "export").is_dir()
    assert not (work / "termination-log").exists()


def test_the_message_stays_within_the_bound():
    doc = {
        "schema": 1,
        "revision": "r",
        "path": "r",
        "validation": {"passed": False, "codes": ["C"] * 3},
        "pruned": [f"x-train-{n}" * 4 for n in range(400)],
    }
    text = termination_message(doc)
    parsed = json.loads(text)
    assert len(text) <= 4000 and parsed["truncated"] is True and parsed["validation"]["codes"] == ["C"] * 3
    assert parsed["pruned"] == doc["pruned"][: len(parsed["pruned"])]
