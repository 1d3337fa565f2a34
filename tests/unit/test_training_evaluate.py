"""Evaluation is provably right, and the pipeline runs on Qwen3- and DeepSeek-V3-like targets."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from drafter_training.capture import capture_hf
from drafter_training.evaluate import (
    Eagle3Proposer,
    TargetGreedyProposer,
    bootstrap_ci,
    evaluate_drafter,
    load_prompts,
    verify_chain,
)
from drafter_training.export import export_drafter
from drafter_training.model import Eagle3Draft
from drafter_training.regenerate import tokenize_conversation
from drafter_training.target import read_config
from drafter_training.train import TrainConfig, draft_config_from_target, load_trained, train
from drafter_training.vocab import build_mapping, build_vocab
from tests.support.tiny_models import make_model

REPO = Path(__file__).resolve().parents[2]
LAYERS = [0, 1, 2]


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    d = make_model(tmp_path_factory.mktemp("eval") / "llama", "llama", seed=1)
    model = AutoModelForCausalLM.from_pretrained(str(d)).double().eval()  # float64: no near-tie argmax flips
    return d, model


def random_draft(target_dir: Path, seed: int) -> Eagle3Draft:
    from drafter_training.train import target_embeddings_and_head

    cfg = read_config(target_dir)
    counts = torch.arange(cfg["vocab_size"], 0, -1)
    d2t, t2d, _ = build_mapping(counts, 200)
    torch.manual_seed(seed)
    draft = Eagle3Draft(draft_config_from_target(cfg, 200, LAYERS))
    draft.embed_tokens.weight.data.copy_(target_embeddings_and_head(target_dir)[0].float())
    draft.set_vocab_mapping(d2t, t2d)
    return draft.double().eval()


PROMPTS = [[5, 17, 40, 41, 99, 3], [200, 201, 7, 8], [1, 2, 3, 4, 5, 6, 7, 8, 9], [300, 12]]


@pytest.mark.parametrize("num_steps", [1, 3, 5])
def test_the_targets_own_predictor_is_always_fully_accepted(llama, num_steps):
    _, model = llama
    r = evaluate_drafter(model, TargetGreedyProposer(model), PROMPTS, LAYERS, num_steps=num_steps, max_new_tokens=19)
    assert r["acceptance_length"] == num_steps + 1 == r["num_draft_tokens"]
    assert r["acceptance_rate"] == 1.0
    assert r["accept_length_histogram"][str(num_steps + 1)] == r["verifies"]
    assert r["tokens_per_verify"] <= num_steps + 1  # the last verify is cut at max_new_tokens


def test_speculative_output_is_the_targets_greedy_output(llama):
    from drafter_training.evaluate import speculative_generate

    d, model = llama
    draft = random_draft(d, 0)
    for prompt in PROMPTS[:2]:
        ids = torch.tensor([prompt])
        plain = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=15, do_sample=False, pad_token_id=0)[
            0, len(prompt) :
        ].tolist()
        for proposer in (TargetGreedyProposer(model), Eagle3Proposer(draft)):
            res = speculative_generate(model, proposer, prompt, LAYERS, num_steps=3, max_new_tokens=15)
            assert res.generated == plain


def test_a_random_drafter_accepts_about_nothing(llama):
    d, model = llama
    r = evaluate_drafter(
        model, Eagle3Proposer(random_draft(d, 0)), PROMPTS, LAYERS, num_steps=3, max_new_tokens=24, draft_for_simulation=random_draft(d, 0)
    )
    assert 1.0 <= r["acceptance_length"] < 1.15
    assert r["simulated_acceptance_length"] < 1.15
    lo, hi = r["acceptance_length_ci95"]
    assert lo <= r["acceptance_length"] <= hi


def test_sampled_verification_keeps_the_target_distribution():
    """Whatever the draft proposes, the first emitted token is distributed as softmax(logits / T)."""
    torch.manual_seed(0)
    logits = torch.randn(2, 6) * 2
    gen = torch.Generator().manual_seed(1)
    temperature, n = 0.8, 6000
    want = torch.softmax(logits[0] / temperature, -1)
    for draft in (int(want.argmax()), int(want.argmin())):
        counts = torch.zeros(6)
        accepted = 0
        for _ in range(n):
            out = verify_chain(logits, [draft], temperature, gen)
            counts[out[0]] += 1
            accepted += len(out) == 2
        freq = counts / n
        assert (freq - want).abs().max() < 0.025
        assert abs(accepted / n - float(want[draft])) < 0.025  # acceptance probability = p_target(draft)
    assert verify_chain(logits, [int(logits[0].argmax())], 0.0) == [int(logits[0].argmax()), int(logits[1].argmax())]


def test_sampled_evaluation_with_the_targets_predictor(llama):
    _, model = llama
    cold = evaluate_drafter(model, TargetGreedyProposer(model), PROMPTS, LAYERS, num_steps=3, max_new_tokens=16, temperature=0.05, seed=1)
    assert cold["acceptance_length"] > 3.0  # near-greedy sampling accepts the argmax chain nearly always
    hot = evaluate_drafter(model, TargetGreedyProposer(model), PROMPTS, LAYERS, num_steps=3, max_new_tokens=16, temperature=2.0, seed=1)
    assert 1.0 <= hot["acceptance_length"] < cold["acceptance_length"]


def test_bootstrap_interval_brackets_the_ratio():
    num, den = [3.0, 2.0, 4.0, 1.0, 3.0], [1.0, 1.0, 2.0, 1.0, 1.0]
    lo, hi = bootstrap_ci(num, den, resamples=500)
    assert lo <= sum(num) / sum(den) <= hi and lo < hi
    assert bootstrap_ci([2.0] * 4, [1.0] * 4) == (2.0, 2.0)


@pytest.mark.parametrize("family", ["qwen3", "deepseek_v3"])
def test_pipeline_on_other_families_exports_what_specdec_validate_accepts(family, tmp_path):
    from transformers import AutoTokenizer

    # SGLang's DeepSeek family adds one to the ids only when the first id is 1, so no ids capture layer 0's output
    # first there (docs/validator.md): its drafter is trained on the outputs of layers 1, 2, 3 of 5.
    layers, depth = (LAYERS, 4) if family == "qwen3" else ([1, 2, 3], 5)
    target = make_model(tmp_path / family, family, layers=depth)
    tok = AutoTokenizer.from_pretrained(str(target))
    with (tmp_path / "samples.jsonl").open("w") as f:
        for i in range(10):
            msgs = [{"role": "user", "content": f"hello {i} world"}, {"role": "assistant", "content": "def add(a, b): return a + b " * (1 + i % 3)}]
            ids, mask = tokenize_conversation(tok, msgs)
            f.write(json.dumps({"id": i, "input_ids": ids, "loss_mask": mask}) + "\n")
    capture_hf(tmp_path / "samples.jsonl", target, tmp_path / "cap", quantization="int4-rtn-g32", capture_layers=layers, progress=False)
    build_vocab(tmp_path / "cap", tmp_path / "cap", 64)
    summary = train(
        TrainConfig(
            capture_dir=str(tmp_path / "cap"),
            target_dir=str(target),
            out_dir=str(tmp_path / "r"),
            epochs=3,
            batch_size=3,
            lr=3e-3,
            ttt_steps=2,
            eval_fraction=0.2,
            progress=False,
        )
    )
    assert summary["last_loss"] < summary["first_loss"]
    prov = export_drafter(tmp_path / "r" / "final", target, tmp_path / "drafter", engine="sglang").to_json()
    assert prov["target_quantization"] == "int4-rtn-g32"
    proc = subprocess.run(
        [sys.executable, "-m", "specdec_operator.cli", "validate", "--target", str(target), "--drafter", str(tmp_path / "drafter"), "--json"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not [f for f in json.loads(proc.stdout)["findings"] if f["severity"] == "error"]

    # The `evaluate` stage end to end through the CLI, prompts taken from the samples' prompt spans.
    assert len(load_prompts(tmp_path / "samples.jsonl", tok)) == 10
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "drafter_training.cli",
            "--quiet",
            "evaluate",
            "--target",
            str(target),
            "--drafter",
            str(tmp_path / "r" / "final"),
            "--prompts",
            str(tmp_path / "samples.jsonl"),
            "--limit",
            "3",
            "--max-new-tokens",
            "8",
            "--temperature",
            "0",
            "--quantization",
            "int4-rtn-g32",
            "--device",
            "cpu",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    run = json.loads(proc.stdout)["runs"][0]
    assert run["prompts"] == 3 and 1.0 <= run["acceptance_length"] <= 3.0
    assert load_trained(tmp_path / "r" / "final").cfg.aux_layer_ids == layers
