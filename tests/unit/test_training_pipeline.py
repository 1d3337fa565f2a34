"""The whole drafter pipeline on a tiny Llama: regenerate through a real HTTP server, capture (transformers and
the SGLang protocol), vocab, train with TTT, export in SGLang's format and `specdec validate` it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from drafter_training.capture import CaptureReader, capture_hf, capture_sglang
from drafter_training.export import check_export, export_drafter
from drafter_training.regenerate import read_conversations, regenerate
from drafter_training.target import capture_forward, load_target
from drafter_training.train import TrainConfig, train
from drafter_training.vocab import build_vocab, load_mapping
from specdec_operator.errors import InputError
from tests.support.tiny_models import make_model
from tests.support.tiny_server import TinyModelServer

REPO = Path(__file__).resolve().parents[2]
WORDS = ["alpha", "beta", "gamma", "delta", "def", "class", "return", "print", "hello", "world", "list", "dict"]
LAYERS = [0, 1, 2]


@pytest.fixture(autouse=True)
def _one_thread():
    # Tiny matrices: extra threads only contend with the other processes on a 2-core CI machine.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def write_prompts(path: Path, n: int, sharegpt_every: int = 3) -> None:
    import random

    rnd = random.Random(0)
    with path.open("w") as f:
        for i in range(n):
            user = " ".join(rnd.choice(WORDS) for _ in range(6))
            if i % sharegpt_every == 0:  # ShareGPT records, two turns
                rec = {
                    "id": f"c{i}",
                    "conversations": [
                        {"from": "human", "value": user},
                        {"from": "gpt", "value": "old answer"},
                        {"from": "human", "value": "and " + user},
                        {"from": "gpt", "value": "old"},
                    ],
                }
            else:
                rec = {
                    "id": f"c{i}",
                    "messages": [
                        {"role": "system", "content": "be brief"},
                        {"role": "user", "content": user},
                        {"role": "assistant", "content": "stale"},
                    ],
                }
            f.write(json.dumps(rec) + "\n")


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("pipeline")
    target = make_model(root / "target", "llama")
    write_prompts(root / "prompts.jsonl", 18)
    server = TinyModelServer(target, capture_layers=LAYERS, fail_first=2)
    server.start()
    counts = regenerate(
        root / "prompts.jsonl",
        root / "samples.jsonl",
        base_url=server.base_url,
        tokenizer_dir=target,
        api="chat",
        max_new_tokens=20,
        concurrency=4,
        backoff=0.01,
        progress=False,
    )
    yield {"root": root, "target": target, "server": server, "counts": counts}
    server.stop()


@pytest.fixture(scope="module")
def captured(work):
    root = work["root"]
    capture_hf(root / "samples.jsonl", work["target"], root / "cap", quantization="none", capture_layers=LAYERS, shard_samples=8, progress=False)
    build_vocab(root / "cap", root / "cap", 150)
    return root / "cap"


@pytest.fixture(scope="module")
def trained(work, captured):
    out = work["root"] / "run"
    summary = train(
        TrainConfig(
            capture_dir=str(captured),
            target_dir=str(work["target"]),
            out_dir=str(out),
            epochs=6,
            lr=3e-3,
            batch_size=4,
            ttt_steps=3,
            eval_fraction=0.15,
            progress=False,
        )
    )
    return out, summary


# ---- regenerate -------------------------------------------------------------------------------------------


def test_regenerate_replaces_assistant_turns_with_the_serving_models_output(work):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert work["counts"] == {"written": 18, "failed": 0, "skipped": 0}
    assert work["server"].requests > 18  # 2 x 503 retried, two-turn conversations ask twice
    tok = AutoTokenizer.from_pretrained(str(work["target"]))
    model = AutoModelForCausalLM.from_pretrained(str(work["target"])).eval()
    records = [json.loads(line) for line in (work["root"] / "samples.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in records) == sorted(f"c{i}" for i in range(18))
    for rec in records[:6]:
        msgs = rec["messages"]
        assistant = [m for m in msgs if m["role"] == "assistant"]
        assert assistant and all(m["content"] not in ("stale", "old", "old answer") for m in assistant)
        # The first assistant turn is exactly the model's greedy continuation of the rendered prompt.
        first = msgs.index(assistant[0])
        prompt = tok.apply_chat_template(msgs[:first], tokenize=False, add_generation_prompt=True)
        ids = torch.tensor([tok(prompt, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=20, do_sample=False, pad_token_id=tok.pad_token_id)
        gen = out[0, ids.shape[1] :].tolist()
        if tok.eos_token_id in gen:
            gen = gen[: gen.index(tok.eos_token_id)]
        assert assistant[0]["content"] == tok.decode(gen, skip_special_tokens=True)
        # loss_mask marks exactly the assistant spans (with their end-of-turn token), in the chat template.
        ids_all, mask = rec["input_ids"], rec["loss_mask"]
        assert len(ids_all) == len(mask)
        assert tok.decode(ids_all) == tok.apply_chat_template(msgs, tokenize=False)
        masked_text = tok.decode([t for t, m in zip(ids_all, mask) if m])
        assert masked_text == "".join(m["content"] + "<|im_end|>\n" for m in assistant)


@pytest.mark.parametrize("api", ["completions", "generate"])
def test_regenerate_through_other_endpoints_gives_the_same_conversations(work, api, tmp_path):
    out = tmp_path / f"{api}.jsonl"
    counts = regenerate(
        work["root"] / "prompts.jsonl",
        out,
        base_url=work["server"].base_url,
        tokenizer_dir=work["target"],
        api=api,
        max_new_tokens=20,
        concurrency=3,
        limit=4,
        progress=False,
    )
    assert counts["written"] == 4
    chat = {json.loads(x)["id"]: json.loads(x) for x in (work["root"] / "samples.jsonl").read_text().splitlines()}
    for line in out.read_text().splitlines():
        rec = json.loads(line)
        assert rec["messages"] == chat[rec["id"]]["messages"]  # greedy: same text whichever protocol
        assert rec["input_ids"] == chat[rec["id"]]["input_ids"]


def test_regenerate_resumes_and_redoes_a_cut_line(work, tmp_path):
    out = tmp_path / "s.jsonl"
    kwargs = dict(base_url=work["server"].base_url, tokenizer_dir=work["target"], max_new_tokens=8, concurrency=2, limit=5, progress=False)
    assert regenerate(work["root"] / "prompts.jsonl", out, **kwargs)["written"] == 5
    lines = out.read_text().splitlines()
    out.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:10])  # an interrupted write
    again = regenerate(work["root"] / "prompts.jsonl", out, **kwargs)
    assert again == {"written": 1, "failed": 0, "skipped": 4}


def test_regenerate_gives_up_after_retries_and_reports_failures(work, tmp_path):
    server = TinyModelServer(work["target"], fail_first=10_000)
    with server:
        counts = regenerate(
            work["root"] / "prompts.jsonl",
            tmp_path / "x.jsonl",
            base_url=server.base_url,
            tokenizer_dir=work["target"],
            limit=2,
            retries=2,
            backoff=0.01,
            progress=False,
        )
    assert counts == {"written": 0, "failed": 2, "skipped": 0}
    assert server.requests == 6  # 2 conversations x (1 + 2 retries)


def test_bad_prompt_files_name_the_line(tmp_path):
    bad = tmp_path / "p.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n{"messages": [{"role": "robot"}]}\n')
    with pytest.raises(InputError, match=r"p.jsonl:2: turn 0 needs role/from"):
        read_conversations(bad)
    bad.write_text("{not json\n")
    with pytest.raises(InputError, match=r"p.jsonl:1: not valid JSON"):
        read_conversations(bad)


# ---- capture ----------------------------------------------------------------------------------------------


def test_capture_stores_sglang_layers_and_final_hidden(work, captured):
    reader = CaptureReader(captured)
    idx = reader.index.data
    assert idx["aux_layer_ids"] == LAYERS and idx["aux_layer_ids_input_index"] == [1, 2, 3]
    assert len(reader) == 18 and len(idx["shards"]) == 3
    tgt = load_target(work["target"], "none")
    sample = reader.get(0)
    with torch.no_grad():
        out = tgt.model(input_ids=sample["input_ids"][None], output_hidden_states=True)
    # Output-index i == Hugging Face hidden_states[i + 1] == the input of layer i + 1 (what SGLang captures).
    expect = torch.cat([out.hidden_states[i + 1][0] for i in LAYERS], -1)
    torch.testing.assert_close(sample["aux"].float(), expect, atol=0.05, rtol=0.02)
    logits = sample["final"].float() @ tgt.model.lm_head.weight.T
    assert (logits.argmax(-1) == out.logits[0].argmax(-1)).float().mean() > 0.95


def test_capture_from_the_sglang_protocol_matches_transformers(work, captured, tmp_path):
    idx = capture_sglang(
        work["root"] / "samples.jsonl",
        work["target"],
        tmp_path / "sg",
        url=work["server"].base_url,
        target_quantization="none",
        capture_layers=LAYERS,
        top_k=5,
        shard_samples=7,
        progress=False,
    )
    assert idx.data["source"] == "sglang" and len(idx.samples) == 18
    hf, sg = CaptureReader(captured), CaptureReader(tmp_path / "sg")
    by_id = {m["id"]: i for i, m in enumerate(hf.index.samples)}
    for j in range(3):
        a, b = hf.get(by_id[sg.index.samples[j]["id"]]), sg.get(j)
        assert torch.equal(a["input_ids"], b["input_ids"])
        # Both are stored in bf16: compared at bf16's tolerance (one rounding step apart is the same value).
        torch.testing.assert_close(a["aux"].to(torch.bfloat16), b["aux"].to(torch.bfloat16))
        tgt_argmax = (a["final"].float() @ load_target(work["target"], "none").model.lm_head.weight.T).argmax(-1)
        assert (b["topk_ids"][:, 0] == tgt_argmax).float().mean() > 0.95


def test_capture_resumes_by_shard_and_refuses_a_different_setup(work, tmp_path):
    root = work["root"]
    lines = (root / "samples.jsonl").read_text().splitlines()
    half = tmp_path / "half.jsonl"
    half.write_text("\n".join(lines[:8]) + "\n")
    out = tmp_path / "cap"
    capture_hf(half, work["target"], out, quantization="none", capture_layers=LAYERS, shard_samples=8, progress=False)
    first_shard = (out / "shard-00000.safetensors").stat().st_mtime_ns
    idx = capture_hf(root / "samples.jsonl", work["target"], out, quantization="none", capture_layers=LAYERS, shard_samples=8, progress=False)
    assert len(idx.samples) == 18 and len({s["id"] for s in idx.samples}) == 18
    assert (out / "shard-00000.safetensors").stat().st_mtime_ns == first_shard
    with pytest.raises(InputError, match="target_quantization"):
        capture_hf(root / "samples.jsonl", work["target"], out, quantization="int4-rtn-g32", capture_layers=LAYERS, progress=False)


def test_int4_capture_differs_from_bf16_and_is_recorded(work, tmp_path):
    idx = capture_hf(
        work["root"] / "samples.jsonl",
        work["target"],
        tmp_path / "q",
        quantization="int4-rtn-g32",
        capture_layers=LAYERS,
        storage="fp8",
        progress=False,
    )
    assert idx.data["target_quantization"] == "int4-rtn-g32" and idx.data["storage"] == "fp8"
    q = CaptureReader(tmp_path / "q").get(0)
    ref = load_target(work["target"], "none")
    qt = load_target(work["target"], "int4-rtn-g32")
    aux_ref, _, _ = capture_forward(ref.model, q["input_ids"][None], LAYERS)
    aux_q, _, _ = capture_forward(qt.model, q["input_ids"][None], LAYERS)
    assert (aux_ref - aux_q).abs().mean() > 1e-3  # the quantized server's hidden states are not the bf16 ones
    torch.testing.assert_close(q["aux"], aux_q[0], atol=0.25, rtol=0.07)  # fp8 storage of the quantized ones


# ---- vocab, train, export ------------------------------------------------------------------------------------


def test_vocab_from_loss_masked_tokens(captured):
    d2t, t2d = load_mapping(captured)
    stats = json.loads((captured / "vocab_stats.json").read_text())
    assert d2t.numel() == 150 and t2d.numel() == 320 and int(t2d.sum()) == 150
    reader = CaptureReader(captured)
    masked = set()
    for i in range(len(reader)):
        s = reader.get(i)
        masked |= set(s["input_ids"][s["loss_mask"]].tolist())
    in_draft = set((d2t + torch.arange(150)).tolist())
    assert (masked <= in_draft) == (len(masked) <= 150)
    assert stats["distinct_tokens_seen"] == len(masked)


def test_training_loss_decreases_and_accuracy_is_measured(trained):
    _, summary = trained
    losses = [h["loss"] for h in summary["history"]]
    per_epoch = len(losses) // 6
    assert sum(losses[-per_epoch:]) / per_epoch < 0.8 * sum(losses[:per_epoch]) / per_epoch
    assert all(len(h["kl"]) == 3 for h in summary["history"])
    ev = summary["evals"][-1]
    assert len(ev["step_accuracy"]) == 3 and ev["positions"] > 0
    assert 1.0 <= ev["simulated_acceptance_length"] <= 4.0
    assert summary["evals"][-1]["step_kl"][0] < summary["evals"][0]["step_kl"][0]


def test_training_resumes_from_its_checkpoint(work, captured, tmp_path):
    cfg = dict(
        capture_dir=str(captured),
        target_dir=str(work["target"]),
        out_dir=str(tmp_path / "r"),
        epochs=3,
        batch_size=4,
        ttt_steps=2,
        checkpoint_every=1,
        eval_fraction=0.1,
        progress=False,
        seed=3,
    )
    first = train(TrainConfig(stop_after=3, **cfg))  # an interrupted job
    assert first["steps"] == 3 and first["evals"] == []
    second = train(TrainConfig(**cfg))
    assert second["steps"] == 3 * 4  # 16 training samples / batch 4 = 4 steps per epoch
    assert second["history"][:3] == first["history"][:3]
    uninterrupted = train(TrainConfig(**{**cfg, "out_dir": str(tmp_path / "u")}))
    assert [round(h["loss"], 4) for h in uninterrupted["history"]] == [round(h["loss"], 4) for h in second["history"]]


def test_export_round_trips_and_passes_specdec_validate(work, trained, tmp_path):
    run, _ = trained
    out = tmp_path / "drafter"
    prov = export_drafter(run / "final", work["target"], out, engine="sglang").to_json()
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["num_hidden_layers"] == 1
    assert cfg["draft_vocab_size"] == 150 and cfg["vocab_size"] == 320 and cfg["target_hidden_size"] == 64
    assert cfg["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": LAYERS, "use_aux_hidden_state": True}
    weights = load_file(str(out / "model.safetensors"))
    trained_state = load_file(str(run / "final" / "draft.safetensors"))
    assert weights["d2t"].dtype == torch.int64 and weights["t2d"].dtype == torch.bool
    assert weights["midlayer.self_attn.q_proj.weight"].shape == (64, 128)
    for name, t in weights.items():
        torch.testing.assert_close(t, trained_state[name].to(t.dtype))
    assert not any(n.startswith("embed_tokens") for n in weights)
    assert prov["hidden_state_source"] == "transformers" and prov["target_quantization"] == "none"
    assert prov["num_samples"] == 15 and len(prov["tokenizer_sha256"]) == 64

    proc = subprocess.run(
        [sys.executable, "-m", "specdec_operator.cli", "validate", "--target", str(work["target"]), "--drafter", str(out), "--json"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["compatible"] is True
    assert [f for f in report["findings"] if f["severity"] == "error"] == []

    # A checkpoint without lm_head loads in SGLang and accepts nothing: the export check refuses it.
    del weights["lm_head.weight"]
    save_file(weights, str(out / "model.safetensors"))
    with pytest.raises(InputError, match="lm_head.weight missing"):
        check_export(out)


def test_specdec_train_cli_stages_and_one_line_errors(work, captured, trained, tmp_path):
    run, _ = trained
    cli = [sys.executable, "-m", "drafter_training.cli", "--quiet"]
    proc = subprocess.run(
        cli + ["export", "--run", str(run), "--target", str(work["target"]), "--out", str(tmp_path / "e")],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["draft_vocab_size"] == 150
    proc = subprocess.run(cli + ["vocab", "--capture", str(tmp_path / "missing")], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "run `specdec-train capture` first" in proc.stderr
    proc = subprocess.run(
        cli
        + [
            "capture",
            "--samples",
            str(work["root"] / "samples.jsonl"),
            "--target",
            str(work["target"]),
            "--out",
            str(tmp_path / "c"),
            "--capture-layers",
            "0,1,3",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 2 and "--capture-layers" in proc.stderr and "Traceback" not in proc.stderr


def test_training_runs_data_parallel_under_torchrun(work, captured, tmp_path):
    """Two CPU processes over gloo: each takes half of every epoch's batches, rank 0 writes the result."""
    import os

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "drafter_training.cli",
            "--quiet",
            "train",
            "--capture",
            str(captured),
            "--target",
            str(work["target"]),
            "--out",
            str(tmp_path / "ddp"),
            "--epochs",
            "2",
            "--batch-size",
            "2",
            "--ttt-steps",
            "2",
            "--device",
            "cpu",
            "--eval-fraction",
            "0.1",
            "--lr",
            "3e-3",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((tmp_path / "ddp" / "final" / "train_summary.json").read_text())
    assert summary["num_samples"] == 16 and summary["steps"] == 2 * (8 // 2)  # 8 batches of 2, split over 2 ranks
    assert summary["last_loss"] < summary["first_loss"]
