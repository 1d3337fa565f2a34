"""Drafter-training benchmark on one GPU: does the pipeline produce a drafter that accepts, and does matching
the serving quantization matter?

No pretrained weights can be downloaded, so this first trains its own target: a byte-level BPE tokenizer
and a small Llama on the Python source installed on the machine (site-packages + standard library, split
by file into train / held-out). Then, with the library stages of drafter_training:

  regenerate  continuations of code prompts by the serving target (in-process batched sampling; the HTTP
              client of `specdec-train regenerate` is exercised by the CPU tests)
  capture     low/mid/high + final hidden states (transformers; bf16 storage)
  vocab       draft vocabulary from loss-masked frequencies
  train       EAGLE-3 draft with TTT
  evaluate    chain speculative decoding against the serving target (steps/topk/draft 3/1/4), greedy and
              sampled, on held-out code; bootstrap 95% intervals over prompts

Measured: (a) TTT-7 vs TTT-1 drafters; (b) an INT4 (RTN, group 128) copy of the target serves, and drafters
trained on the bf16 target's data/hidden states vs the INT4 target's are both measured against it;
(c) throughput, GPU memory, wall time per stage. Results go to <out>/drafter-h200.json as each stage ends.

    PYTHONPATH=.:operator python3 benchmarks/drafter_h200.py --out DIR          # the H200 run
    PYTHONPATH=.:operator python3 benchmarks/drafter_h200.py --out DIR --smoke  # minutes on a CPU
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "operator")]

from drafter_training.capture import capture_hf
from drafter_training.evaluate import Eagle3Proposer, evaluate_drafter
from drafter_training.target import LoadedTarget, apply_rtn_int4_, read_config
from drafter_training.train import TrainConfig, load_trained, train
from drafter_training.vocab import build_vocab

RESULTS: dict[str, Any] = {}
T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:7.1f}s] {msg}", flush=True)


def save(out: Path) -> None:
    RESULTS["elapsed_seconds"] = time.time() - T0
    (out / "drafter-h200.json").write_text(json.dumps(RESULTS, indent=1, default=float))


# ---- corpus and tokenizer --------------------------------------------------------------------------------


def python_sources(max_bytes: int, seed: int) -> list[tuple[str, str]]:
    """(path, text) of .py files under the standard library and site-packages, shuffled, up to max_bytes."""
    roots = {sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib")}
    files: list[Path] = []
    for root in sorted(roots):
        files += [p for p in Path(root).rglob("*.py") if p.is_file()]
    files = sorted(set(files))
    random.Random(seed).shuffle(files)
    out, total = [], 0
    for p in files:
        try:
            text = p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if not text.strip() or len(text) > 400_000:
            continue
        out.append((str(p), text))
        total += len(text)
        if total >= max_bytes:
            break
    return out


def train_tokenizer(texts: list[str], vocab_size: int, directory: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast.save_pretrained(str(directory))
    return fast


def encode_corpus(tokenizer, texts: list[str]) -> np.ndarray:
    eos = tokenizer.eos_token_id
    encs = tokenizer.backend_tokenizer.encode_batch(texts)
    parts = []
    for e in encs:
        parts.append(np.asarray(e.ids, dtype=np.uint16))
        parts.append(np.asarray([eos], dtype=np.uint16))
    return np.concatenate(parts)


# ---- the target ------------------------------------------------------------------------------------------


def corpus_and_tokenizer(args: Any, tdir: Path) -> tuple[Any, np.ndarray, np.ndarray, dict[str, int]]:
    """A tokenizer trained into ``tdir`` on the training files, the training and held-out token streams, and
    what they hold (one file in 50 is held out, whole)."""
    files = python_sources(args.corpus_bytes, seed=0)
    n_held = max(2, len(files) // 50)
    held, train_files = files[:n_held], files[n_held:]
    tdir.mkdir(exist_ok=True)
    tok_texts, acc = [], 0
    for _, text in train_files:
        tok_texts.append(text)
        acc += len(text)
        if acc > args.tokenizer_bytes:
            break
    tokenizer = train_tokenizer(tok_texts, args.vocab, tdir)
    train_tokens = encode_corpus(tokenizer, [x for _, x in train_files])
    held_tokens = encode_corpus(tokenizer, [x for _, x in held])
    info = {
        "files": len(files),
        "heldout_files": len(held),
        "bytes": sum(len(x) for _, x in files),
        "train_tokens": int(train_tokens.size),
        "heldout_tokens": int(held_tokens.size),
        "vocab": len(tokenizer),
    }
    return tokenizer, train_tokens, held_tokens, info


def build_target(args, vocab: int, tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 8 // 3 // 64 * 64 or 4 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.heads,
        max_position_embeddings=2048,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(cfg)


def train_target(model, tokens: np.ndarray, args, device) -> dict[str, Any]:
    """Time-budgeted pre-training: random windows, AdamW, warm-up then cosine on elapsed time."""
    model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.target_lr, betas=(0.9, 0.95), weight_decay=0.1, fused=device.type == "cuda")
    seq, bs = args.target_seq, args.target_batch
    rng = np.random.default_rng(0)
    data = torch.from_numpy(tokens.astype(np.int64))
    start, step, seen = time.time(), 0, 0
    losses = []
    while True:
        frac = (time.time() - start) / args.target_seconds
        if frac >= 1:
            break
        lr = args.target_lr * (min(1.0, (step + 1) / 100) if step < 100 else 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        idx = torch.from_numpy(rng.integers(0, len(data) - seq - 1, bs))
        batch = torch.stack([data[i : i + seq + 1] for i in idx.tolist()]).to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = model(input_ids=batch[:, :-1], use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        seen += bs * seq
        if step % 50 == 0:
            losses.append((step, float(loss)))
            log(f"target step {step} loss {float(loss):.3f} lr {lr:.2e}")
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.time() - start
    return {"steps": step, "tokens": seen, "seconds": elapsed, "tokens_per_second": seen / elapsed, "loss_curve": losses}


@torch.no_grad()
def heldout_quality(model, tokens: np.ndarray, device, seq: int = 512, windows: int = 64) -> dict[str, float]:
    model.eval()
    rng = np.random.default_rng(1)
    data = torch.from_numpy(tokens.astype(np.int64))
    idx = rng.integers(0, len(data) - seq - 1, windows)
    batch = torch.stack([data[i : i + seq + 1] for i in idx.tolist()]).to(device)
    loss_sum, correct, count, argmaxes = 0.0, 0, 0, []
    for chunk in batch.split(16):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = model(input_ids=chunk[:, :-1], use_cache=False).logits.float()
        loss_sum += float(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), chunk[:, 1:].reshape(-1), reduction="sum"))
        am = logits.argmax(-1)
        argmaxes.append(am.cpu())
        correct += int((am == chunk[:, 1:]).sum())
        count += chunk[:, 1:].numel()
    return {"loss": loss_sum / count, "top1": correct / count, "argmax": torch.cat(argmaxes)}


# ---- regenerate (in-process, batched) -----------------------------------------------------------------------


@torch.no_grad()
def regenerate_local(
    model, prompts: list[list[int]], gen_len: int, temperature: float, eos: int, batch: int, path: Path, seed: int
) -> dict[str, Any]:
    """Continuations sampled by the serving model itself; loss mask = generated span (stops at EOS)."""
    device = next(model.parameters()).device
    torch.manual_seed(seed)
    start = time.time()
    n_tokens = 0
    with path.open("w") as f:
        for b in range(0, len(prompts), batch):
            chunk = torch.tensor(prompts[b : b + batch], device=device)  # equal-length prompts: no padding
            out = model.generate(
                chunk,
                attention_mask=torch.ones_like(chunk),
                do_sample=temperature > 0,
                temperature=temperature if temperature > 0 else None,
                top_k=0,
                top_p=1.0,
                max_new_tokens=gen_len,
                min_new_tokens=gen_len,
                pad_token_id=eos,
            )
            for r in range(out.shape[0]):
                gen = out[r, chunk.shape[1] :].tolist()
                ids = prompts[b + r] + gen
                n_tokens += len(gen)
                f.write(json.dumps({"id": f"s{b + r}", "input_ids": ids, "loss_mask": [0] * len(prompts[b + r]) + [1] * len(gen)}) + "\n")
    return {"samples": len(prompts), "generated_tokens": n_tokens, "seconds": time.time() - start}


# ---- main ----------------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default="/tmp/drafter-bench")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes: runs on a CPU in a few minutes")
    ap.add_argument("--corpus-bytes", type=int, default=160_000_000)
    ap.add_argument("--tokenizer-bytes", type=int, default=24_000_000)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--target-seconds", type=float, default=150)
    ap.add_argument("--target-lr", type=float, default=1.5e-3)
    ap.add_argument("--target-batch", type=int, default=64)
    ap.add_argument("--target-seq", type=int, default=512)
    ap.add_argument("--samples", type=int, default=4096)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--gen-len", type=int, default=128)
    ap.add_argument("--regen-batch", type=int, default=512)
    ap.add_argument("--regen-temperature", type=float, default=0.7)
    ap.add_argument("--draft-vocab", type=int, default=4096)
    ap.add_argument("--draft-epochs", type=int, default=8)
    ap.add_argument("--draft-lr", type=float, default=6e-4)
    ap.add_argument("--draft-batch", type=int, default=16)
    ap.add_argument("--eval-prompts", type=int, default=48)
    ap.add_argument("--eval-tokens", type=int, default=96)
    ap.add_argument("--capture-layers", default=None)
    ap.add_argument("--serve-quant", default="int4-rtn-g128", help="how the serving copy is quantised")
    ap.add_argument(
        "--experiment",
        choices=["main", "quant-sweep"],
        default="main",
        help="main: TTT-7/TTT-1 and bf16/matched drafters; quant-sweep: the bf16-trained drafter "
        "against ever coarser RTN servers, and one drafter matched to --serve-quant",
    )
    ap.add_argument("--sweep-quants", default="int4-rtn-g128,int4-rtn-g4096,int3-rtn-g128,int2-rtn-g128")
    args = ap.parse_args()
    if args.smoke:
        args.corpus_bytes, args.tokenizer_bytes, args.vocab = 1_500_000, 600_000, 512
        args.layers, args.hidden, args.heads = 4, 64, 4
        args.target_seconds, args.target_batch, args.target_seq = 25, 16, 128
        args.samples, args.prompt_len, args.gen_len, args.regen_batch = 96, 32, 24, 48
        args.draft_vocab, args.draft_epochs, args.draft_batch, args.draft_lr = 256, 2, 8, 2e-3
        args.eval_prompts, args.eval_tokens = 6, 24
        args.capture_layers = args.capture_layers or "0,1,2"
    out, work = Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    import tokenizers
    import transformers

    RESULTS.update(
        {
            "command": " ".join(["python3", "benchmarks/drafter_h200.py"] + sys.argv[1:]),
            "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
            "versions": {
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "tokenizers": tokenizers.__version__,
                "python": sys.version.split()[0],
            },
            "args": vars(args),
            "stages": {},
        }
    )
    stages = RESULTS["stages"]

    # -- corpus + tokenizer
    t = time.time()
    tdir = work / "target"
    tokenizer, train_tokens, held_tokens, RESULTS["corpus"] = corpus_and_tokenizer(args, tdir)
    stages["corpus_and_tokenizer_seconds"] = time.time() - t
    log(f"corpus {RESULTS['corpus']}")
    save(out)

    # -- target
    t = time.time()
    model = build_target(args, len(tokenizer), tokenizer)
    n_params = sum(p.numel() for p in model.parameters())
    tr = train_target(model, train_tokens, args, device)
    q_bf16 = heldout_quality(model, held_tokens, device)
    model.to(torch.bfloat16).save_pretrained(str(tdir))
    RESULTS["target"] = {
        "params": n_params,
        "layers": args.layers,
        "hidden": args.hidden,
        **tr,
        "heldout_loss": q_bf16["loss"],
        "heldout_top1": q_bf16["top1"],
    }
    stages["target_train_seconds"] = time.time() - t
    log(f"target: {n_params / 1e6:.1f}M params, held-out loss {q_bf16['loss']:.3f} top1 {q_bf16['top1']:.3f}")
    save(out)

    # -- the quantized copies that serve
    from transformers import AutoModelForCausalLM

    from drafter_training.target import parse_quantization

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    sq = args.serve_quant
    quants = [sq]
    if args.experiment == "quant-sweep":
        quants += [q for q in args.sweep_quants.split(",") if q and q != sq]
    bf16 = AutoModelForCausalLM.from_pretrained(str(tdir), dtype=dtype).to(device).eval()
    q_ref = heldout_quality(bf16, held_tokens, device)
    cfg = read_config(tdir)
    targets = {"bf16": LoadedTarget(bf16, cfg, "none", str(tdir))}
    RESULTS["target"]["quantized"] = {}
    for q in quants:
        kind, group = parse_quantization(q)
        qm = AutoModelForCausalLM.from_pretrained(str(tdir), dtype=dtype).to(device).eval()
        n_q = apply_rtn_int4_(qm, group_size=group, bits=int(kind[3]))
        qual = heldout_quality(qm, held_tokens, device)
        RESULTS["target"]["quantized"][q] = {
            "quantized_linears": n_q,
            "heldout_loss": qual["loss"],
            "heldout_top1": qual["top1"],
            "bf16_reload_heldout_loss": q_ref["loss"],
            "top1_agreement_with_bf16": float((qual["argmax"] == q_ref["argmax"]).float().mean()),
        }
        targets[q] = LoadedTarget(qm, cfg, q, str(tdir))
        log(f"{q}: {RESULTS['target']['quantized'][q]}")
    save(out)
    layers = [int(x) for x in args.capture_layers.split(",")] if args.capture_layers else None

    # -- prompts: training prompts from training files, evaluation prompts from held-out files
    rng = np.random.default_rng(2)

    def windows(tokens: np.ndarray, n: int) -> list[list[int]]:
        starts = rng.integers(0, len(tokens) - args.prompt_len - 1, n)
        return [tokens[s : s + args.prompt_len].astype(np.int64).tolist() for s in starts]

    train_prompts = windows(train_tokens, args.samples)
    eval_prompts = windows(held_tokens, args.eval_prompts)

    # -- regenerate + capture + vocab per source of training data (the bf16 model, the serving copy)
    data: dict[str, Path] = {}
    RESULTS["data"] = {}
    for name in ("bf16", sq):
        tgt = targets[name]
        t = time.time()
        samples = work / f"samples-{name}.jsonl"
        rg = regenerate_local(
            tgt.model, train_prompts, args.gen_len, args.regen_temperature, tokenizer.eos_token_id, args.regen_batch, samples, seed=3
        )
        t_regen = time.time() - t
        t = time.time()
        cap = work / f"capture-{name}"
        capture_hf(samples, tdir, cap, capture_layers=layers, loaded=tgt, shard_samples=1024, max_batch_tokens=65536, progress=False)
        t_cap = time.time() - t
        vstats = build_vocab(cap, cap, args.draft_vocab)
        data[name] = cap
        RESULTS["data"][name] = {
            **rg,
            "regenerate_seconds": t_regen,
            "capture_seconds": t_cap,
            "vocab": vstats,
            "capture_layer_ids": json.loads((cap / "index.json").read_text())["aux_layer_ids"],
        }
        log(f"data {name}: {RESULTS['data'][name]}")
        save(out)

    # -- drafters
    runs = {f"ttt7_{sq}": (sq, 7), "ttt7_bf16": ("bf16", 7)}
    if args.experiment == "main":
        runs[f"ttt1_{sq}"] = (sq, 1)
    RESULTS["drafters"] = {}
    finals: dict[str, Path] = {}
    for name, (src, steps) in runs.items():
        t = time.time()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        s = train(
            TrainConfig(
                capture_dir=str(data[src]),
                target_dir=str(tdir),
                out_dir=str(work / f"run-{name}"),
                ttt_steps=steps,
                epochs=args.draft_epochs,
                lr=args.draft_lr,
                batch_size=args.draft_batch,
                warmup_ratio=0.03,
                max_length=args.prompt_len + args.gen_len,
                eval_fraction=0.03,
                eval_max_samples=128,
                progress=False,
            )
        )
        finals[name] = work / f"run-{name}" / "final"
        RESULTS["drafters"][name] = {
            "hidden_states_from": src,
            "ttt_steps": steps,
            "samples": s["num_samples"],
            "steps": s["steps"],
            "seconds": s["wall_seconds_this_run"],
            "tokens_per_second": s["tokens_per_second"],
            "peak_gpu_memory_bytes": s["peak_gpu_memory_bytes"],
            "first_loss": s["first_loss"],
            "last_loss": s["last_loss"],
            "evals": s["evals"],
            "stage_seconds": time.time() - t,
        }
        log(f"drafter {name}: {s['tokens_per_second']:.0f} tok/s, eval {s['evals'][-1] if s['evals'] else None}")
        save(out)

    # -- evaluation against the serving target(s)
    RESULTS["evaluation"] = {}
    eos = {tokenizer.eos_token_id}
    if args.experiment == "main":
        plan = [
            (f"ttt7_{sq}", sq, 0.0),
            ("ttt7_bf16", sq, 0.0),
            (f"ttt1_{sq}", sq, 0.0),
            (f"ttt7_{sq}", sq, 0.7),
            ("ttt7_bf16", sq, 0.7),
            ("ttt7_bf16", "bf16", 0.0),
        ]
    else:
        plan = [(f"ttt7_{sq}", sq, 0.0)] + [("ttt7_bf16", q, 0.0) for q in ["bf16"] + quants]
    for drafter, served, temp in plan:
        t = time.time()
        draft = load_trained(finals[drafter], tdir).to(device)
        r = evaluate_drafter(
            targets[served].model,
            Eagle3Proposer(draft),
            eval_prompts,
            draft.cfg.aux_layer_ids,
            num_steps=3,
            num_draft_tokens=4,
            max_new_tokens=args.eval_tokens,
            temperature=temp,
            eos_ids=eos,
            seed=5,
            draft_for_simulation=draft if temp == 0 else None,
        )
        r["seconds"] = time.time() - t
        key = f"{drafter}@{served}_T{temp}"
        RESULTS["evaluation"][key] = r
        log(f"eval {key}: accept {r['acceptance_length']:.3f} {r['acceptance_length_ci95']}")
        save(out)
    stages["total_seconds"] = time.time() - T0
    if device.type == "cuda":
        RESULTS["peak_gpu_memory_bytes_process"] = torch.cuda.max_memory_allocated()
    save(out)
    log("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
