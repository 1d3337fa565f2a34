"""`specdec-train train --init-from-drafter DIR` (issue 36, item 2): a retrain starts from the exported drafter that
serves, in either engine's export format, and keeps its d2t/t2d vocabulary map through training and export.

Tiny models on CPU: one 4-layer Llama target, a drafter trained for one epoch on code-like samples and exported for
SGLang (plain config) and vLLM (speculators config), then warm-started on other traffic whose own vocabulary would
differ."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from drafter_training.capture import capture_hf
from drafter_training.export import export_drafter
from drafter_training.regenerate import tokenize_conversation
from drafter_training.train import TrainConfig, train
from drafter_training.vocab import build_vocab, load_mapping
from drafter_training.warmstart import load_exported_drafter
from specdec_operator.errors import InputError
from tests.support.tiny_models import make_model

REPO = Path(__file__).resolve().parents[2]
LAYERS = [0, 1, 2]
DRAFT_VOCAB = 48


def _samples(path: Path, tok, texts: list[str]) -> None:
    with path.open("w") as f:
        for i, text in enumerate(texts):
            ids, mask = tokenize_conversation(tok, [{"role": "user", "content": f"q {i}"}, {"role": "assistant", "content": text}])
            f.write(json.dumps({"id": i, "input_ids": ids, "loss_mask": mask}) + "\n")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A target, a trained and exported drafter (both engines), and new traffic captured from the same layers."""
    from transformers import AutoTokenizer

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("warm")
    target = make_model(root / "target", "llama", layers=4)
    tok = AutoTokenizer.from_pretrained(str(target))
    _samples(root / "old.jsonl", tok, ["def add(a, b): return a + b " * (1 + i % 3) for i in range(6)])
    _samples(root / "new.jsonl", tok, ["The quick brown fox jumps over the lazy dog; zebras yawn. " * (1 + i % 2) for i in range(6)])
    for name in ("old", "new"):
        capture_hf(root / f"{name}.jsonl", target, root / f"cap-{name}", quantization="none", capture_layers=LAYERS, progress=False)
        build_vocab(root / f"cap-{name}", root / f"cap-{name}", DRAFT_VOCAB)
    common = dict(target_dir=str(target), epochs=1, batch_size=2, ttt_steps=2, eval_fraction=0.2, progress=False)
    train(TrainConfig(capture_dir=str(root / "cap-old"), out_dir=str(root / "run-old"), **common))
    export_drafter(root / "run-old" / "final", target, root / "serving-sglang", engine="sglang")
    export_drafter(root / "run-old" / "final", target, root / "serving-vllm", engine="vllm", fmt="speculators")
    yield root, target, common
    torch.set_num_threads(before)


def _first_loss(root: Path, out: str, common: dict, **kw) -> dict:
    return train(TrainConfig(capture_dir=str(root / "cap-new"), out_dir=str(root / out), max_steps=1, **common, **kw))


@pytest.mark.parametrize("export", ["serving-sglang", "serving-vllm"])
def test_warm_start_loads_the_exported_weights_and_keeps_the_map(world, export):
    root, target, common = world
    served = load_file(str(root / export / "model.safetensors"))
    new_d2t, _ = load_mapping(root / "cap-new")
    # The new traffic's own vocabulary differs: a run that took the capture's map would be caught below.
    assert not torch.equal(new_d2t, served["d2t"])

    # The oracle: the training run's own weights, rounded to bf16 as every export stores them, with the run's map,
    # read through the older --init-from path (a run's final/). Step 0's loss is computed before the first update.
    final = load_file(str(root / "run-old" / "final" / "draft.safetensors"))
    oracle = root / f"oracle-{export}"
    oracle.mkdir()
    save_file({k: v if k in ("d2t", "t2d") else v.to(torch.bfloat16).float() for k, v in final.items()}, str(oracle / "draft.safetensors"))
    expected = _first_loss(root, f"oracle-run-{export}", common, vocab_dir=str(root / "cap-old"), init_from=str(oracle))
    warm = _first_loss(root, f"warm-{export}", common, init_from_drafter=str(root / export))
    cold = _first_loss(root, f"cold-{export}", common)
    assert warm["first_loss"] == pytest.approx(expected["first_loss"], rel=1e-6, abs=1e-7)
    assert abs(cold["first_loss"] - warm["first_loss"]) > 1e-3  # a fresh draft starts elsewhere

    engine = "vllm" if "vllm" in export else "sglang"
    prov = export_drafter(root / f"warm-{export}" / "final", target, root / f"retrained-{export}", engine=engine)
    retrained = load_file(str(root / f"retrained-{export}" / "model.safetensors"))
    assert torch.equal(retrained["d2t"], served["d2t"]) and torch.equal(retrained["t2d"], served["t2d"])
    assert prov.capture_layer_ids is not None and prov.capture_layer_ids.output_index == LAYERS
    assert prov.extra == {"warm_started_from": str(root / export)}
    # The weights moved (one step of training), the shape did not.
    assert retrained.keys() == served.keys() and not torch.equal(retrained["fc.weight"], served["fc.weight"])


def test_both_export_formats_read_as_the_same_drafter(world):
    root, target, _ = world
    a = load_exported_drafter(root / "serving-sglang", target)
    b = load_exported_drafter(root / "serving-vllm", target)
    assert a.config == b.config and a.config.aux_layer_ids == LAYERS  # vLLM's ids are one apart; both read as output indices
    assert (a.engine, b.engine) == ("sglang", "vllm")
    assert torch.equal(a.d2t, b.d2t) and all(torch.equal(a.weights[k], b.weights[k]) for k in a.weights)


def test_without_provenance_the_config_ids_are_read_in_the_engine_named(world, tmp_path):
    root, target, _ = world
    for src, engine in (("serving-sglang", "sglang"), ("serving-vllm", "vllm")):
        bare = tmp_path / src
        bare.mkdir()
        for name in ("config.json", "model.safetensors"):
            (bare / name).write_bytes((root / src / name).read_bytes())
        if engine == "sglang":  # a plain config says nothing of its convention
            with pytest.raises(InputError, match="pass --init-from-engine sglang or vllm"):
                load_exported_drafter(bare, target)
        assert load_exported_drafter(bare, target, engine).config.aux_layer_ids == LAYERS
    # Read in the wrong convention, the SGLang ids name other layers: the capture check below then refuses it.
    assert load_exported_drafter(tmp_path / "serving-sglang", target, "vllm").config.aux_layer_ids == [i - 1 for i in LAYERS]


def test_a_capture_of_other_layers_or_another_target_is_refused_in_one_line(world, tmp_path):
    root, target, common = world
    wrong = dict(json.loads((root / "serving-sglang" / "training_provenance.json").read_text()))
    moved = tmp_path / "moved"
    moved.mkdir()
    for name in ("config.json", "model.safetensors"):
        (moved / name).write_bytes((root / "serving-sglang" / name).read_bytes())
    (moved / "training_provenance.json").write_text(json.dumps({**wrong, "capture_layer_ids": {"sglang_config_output_index": [0, 1, 3]}}))
    with pytest.raises(InputError, match=r"trained on \[0, 1, 3\]; capture again with --capture-layers 0,1,3$"):
        _first_loss(root, "refused-layers", common, init_from_drafter=str(moved))
    (moved / "training_provenance.json").write_text(json.dumps({**wrong, "tokenizer_sha256": "0" * 64}))
    with pytest.raises(InputError, match="tokenizer_sha256 differs"):
        load_exported_drafter(moved, target)
    with pytest.raises(InputError, match="drop --vocab"):
        _first_loss(root, "refused-vocab", common, init_from_drafter=str(root / "serving-sglang"), vocab_dir=str(root / "cap-new"))


def test_the_cli_flag_reaches_training_and_bad_input_exits_2(world):
    root, target, _ = world
    base = [sys.executable, "-m", "drafter_training.cli", "--quiet", "train", "--capture", str(root / "cap-new"), "--target", str(target)]
    ok = subprocess.run(
        [
            *base,
            "--out",
            str(root / "cli-run"),
            "--init-from-drafter",
            str(root / "serving-vllm"),
            "--max-steps",
            "1",
            "--epochs",
            "1",
            "--ttt-steps",
            "2",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )
    assert ok.returncode == 0, ok.stderr
    summary = json.loads((root / "cli-run" / "final" / "train_summary.json").read_text())
    assert summary["config"]["init_from_drafter"] == str(root / "serving-vllm") and summary["steps"] == 1
    bad = subprocess.run(
        [*base, "--out", str(root / "cli-bad"), "--init-from-drafter", str(root)], capture_output=True, text=True, cwd=REPO, timeout=600
    )
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert bad.stderr.startswith(f"specdec-train train: error: {root}/config.json: not found")
