"""`specdec-train`: the drafter-training command line, one subcommand per stage.

    specdec-train gather     --capture CAPTURED/ --out prompts/   (the captured traffic: prompts.jsonl, heldout.jsonl)
    specdec-train regenerate --prompts P.jsonl --base-url URL --tokenizer DIR --out samples.jsonl
    specdec-train capture    --samples samples.jsonl --target DIR --out caps/ [--source hf|sglang]
    specdec-train vocab      --capture caps/ [--draft-vocab-size 32000]
    specdec-train train      --capture caps/ --target DIR --out run/ [--ttt-steps 7 --epochs 10] [--init-from-drafter DIR]
    specdec-train export     --run run/ --target DIR --out drafter/ [--engine sglang|vllm] [--format plain|speculators]
    specdec-train validate   --target DIR --drafter EXPORT/ --out validation.json   (the validator's verdict, recorded)
    specdec-train evaluate   --target DIR --drafter EXPORT/ --serving DRAFTER/ --prompts heldout.jsonl --out evaluation.json
    specdec-train publish    --staging STAGING/ --out revisions/R [--keep N --protect NAME...]   (a retraining Job's last stage)

Every stage resumes where an interrupted run stopped. Unusable input exits 2 with one line naming the
file or flag and the fix.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

from specdec_operator.choices import ENGINES
from specdec_operator.enginefacts import DEFAULT, DRAFTER_FORMATS, PLAIN
from specdec_operator.errors import InputError


def _layers(value: str) -> list[int]:
    try:
        return [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: expected comma-separated layer ids, e.g. 1,15,28") from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="specdec-train", description=__doc__.split("\n\n")[0])
    p.add_argument("--quiet", action="store_true", help="no progress bars, warnings only")
    sub = p.add_subparsers(dest="stage", required=True)

    g = sub.add_parser("gather", help="the captured traffic's chat conversations as prompts.jsonl and a held-out heldout.jsonl")
    g.add_argument("--capture", required=True, help="the captured traffic's directory (capture-*.jsonl)")
    g.add_argument("--out", required=True, help="directory for prompts.jsonl, heldout.jsonl and gather.json")
    g.add_argument("--heldout-share", type=float, default=0.1, help="share of conversations held out for evaluation (default 0.1)")
    g.add_argument("--max-samples", type=int, default=None, help="keep N conversations at most (default: all)")
    g.add_argument(
        "--recent-share",
        type=float,
        default=0.5,
        help="of --max-samples, the share taken from the newest conversations (the held-out slice comes from these); the rest "
        "are spread evenly over the older ones, so a drafter retrained after a traffic shift keeps what it knew (default 0.5; "
        "1: the newest only)",
    )

    r = sub.add_parser("regenerate", help="regenerate assistant turns with the serving model")
    r.add_argument("--prompts", required=True, help="JSONL conversations (messages or ShareGPT conversations)")
    r.add_argument("--out", required=True, help="output JSONL of input_ids/loss_mask (appended; resumes)")
    r.add_argument("--base-url", required=True, help="server root, e.g. http://127.0.0.1:30000")
    r.add_argument("--tokenizer", required=True, help="the serving model's directory (tokenizer + chat template)")
    r.add_argument("--api", choices=["chat", "completions", "generate"], default="chat")
    r.add_argument("--model", default="default", help="model name sent to the OpenAI endpoints")
    r.add_argument("--max-new-tokens", type=int, default=1024)
    r.add_argument("--temperature", type=float, default=0.0)
    r.add_argument("--concurrency", type=int, default=16)
    r.add_argument("--retries", type=int, default=4)
    r.add_argument("--max-length", type=int, default=4096)
    r.add_argument("--limit", type=int, default=None)

    c = sub.add_parser("capture", help="capture low/mid/high (+ final) hidden states")
    c.add_argument("--samples", required=True)
    c.add_argument("--target", required=True, help="target checkpoint directory")
    c.add_argument("--out", required=True)
    c.add_argument("--source", choices=["hf", "sglang"], default="hf")
    c.add_argument("--url", help="SGLang server (source sglang) started with --enable-return-aux-hidden-states")
    c.add_argument(
        "--quantization", default="checkpoint", help="hf: checkpoint | none | int4-rtn-g128; sglang: the server's --quantization (recorded)"
    )
    c.add_argument("--capture-layers", type=_layers, default=None, help="output-index layer ids low,mid,high (default [1, N/2-1, N-4])")
    c.add_argument(
        "--capture-layers-of",
        default=None,
        metavar="DIR",
        help="the layers an exported drafter was trained on (for train --init-from-drafter DIR); instead of --capture-layers",
    )
    c.add_argument("--storage", choices=["bf16", "fp8"], default="bf16")
    c.add_argument("--device", default=None)
    c.add_argument("--top-k", type=int, default=20, help="sglang: top-k log-probabilities kept per position")
    c.add_argument("--concurrency", type=int, default=8)
    c.add_argument("--shard-samples", type=int, default=256)

    v = sub.add_parser("vocab", help="build d2t/t2d from loss-masked token frequencies")
    v.add_argument("--capture", required=True)
    v.add_argument("--out", default=None, help="default: the capture directory")
    v.add_argument("--draft-vocab-size", type=int, default=32000)

    t = sub.add_parser("train", help="train the EAGLE-3 draft with training-time test")
    t.add_argument("--capture", required=True)
    t.add_argument("--target", required=True)
    t.add_argument("--out", required=True)
    t.add_argument("--vocab", default=None, help="directory of vocab_map.safetensors (default: --capture)")
    t.add_argument("--ttt-steps", type=int, default=7)
    t.add_argument("--epochs", type=int, default=10)
    t.add_argument("--lr", type=float, default=1e-4)
    t.add_argument("--weight-decay", type=float, default=0.0)
    t.add_argument("--warmup-ratio", type=float, default=0.015)
    t.add_argument("--grad-clip", type=float, default=0.5)
    t.add_argument("--batch-size", type=int, default=1)
    t.add_argument("--max-length", type=int, default=2048)
    t.add_argument("--eval-fraction", type=float, default=0.05)
    t.add_argument("--checkpoint-every", type=int, default=0)
    t.add_argument("--max-steps", type=int, default=None, help="cap on total steps (the LR schedule spans them)")
    t.add_argument("--stop-after", type=int, default=None, help="leave after N steps of this run (resume later)")
    t.add_argument("--intermediate-size", type=int, default=None)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--device", default=None)
    t.add_argument(
        "--init-from-drafter",
        default=None,
        metavar="DIR",
        help="warm start from an exported drafter (specdec-train export --out, either engine or format): its shape, weights and "
        "vocabulary map are kept (no --vocab); the capture must be of the layers it was trained on",
    )
    t.add_argument(
        "--init-from-engine",
        type=str.lower,
        choices=ENGINES,
        default=None,
        help="with --init-from-drafter: the engine whose layer-id convention its config.json uses, when its training_provenance.json does not say",
    )

    _add_output_stages(sub)
    return p


def _add_output_stages(sub: Any) -> None:
    """The stages after training: export, validate, publish, evaluate."""
    e = sub.add_parser("export", help="write the EAGLE-3 checkpoint for the serving engine and training_provenance.json")
    e.add_argument("--run", required=True, help="training output directory (its final/ is exported)")
    e.add_argument("--target", required=True)
    e.add_argument("--out", required=True)
    e.add_argument("--target-model", default=None, help="name recorded as target_model (default: capture's)")
    e.add_argument(
        "--engine",
        type=str.lower,
        choices=ENGINES,
        default=DEFAULT.cli_name,
        help=f"the engine that will serve the drafter (default {DEFAULT.cli_name}): they read the aux layer ids one layer apart",
    )
    e.add_argument(
        "--format",
        dest="export_format",
        choices=DRAFTER_FORMATS,
        default=PLAIN,
        help="config.json format: plain (both engines) or speculators (vLLM only: transformer_layer_config beside the EAGLE-3 fields)",
    )
    e.add_argument(
        "--speculative-tokens", type=int, default=3, help="with --format speculators: the proposal method's speculative_tokens (default 3)"
    )

    va = sub.add_parser("validate", help="the validator's checks of an export against the target, recorded in a file (exit 0 either way)")
    va.add_argument("--target", required=True, metavar="DIR")
    va.add_argument("--drafter", required=True, metavar="DIR", help="the export to check")
    va.add_argument("--quantization", default="auto", help="the serving precision, as `specdec validate --quantization`")
    va.add_argument("--algorithm", default="EAGLE3")
    va.add_argument("--context-length", default=None, help="the server's --context-length, if set")
    va.add_argument("--engine", type=str.lower, choices=ENGINES, default=DEFAULT.cli_name)
    va.add_argument("--out", required=True, help="validation.json: passed, the error codes, the findings")

    pb = sub.add_parser("publish", help="check an export and make it a revision directory in one rename, with its COMPLETE marker")
    pb.add_argument("--staging", required=True, help="the Job's staging directory (its export/ is published, the rest removed)")
    pb.add_argument("--out", required=True, help="the new revision directory (on the staging directory's volume)")
    pb.add_argument("--job", default=None, help="the Job's name, recorded in the marker")
    pb.add_argument(
        "--keep", type=int, default=None, metavar="N", help="keep at most N complete revisions beside --out (maxRevisions): the oldest go"
    )
    pb.add_argument("--protect", nargs="*", default=[], metavar="NAME", help="revisions never pruned (the serving and the pinned one)")
    pb.add_argument(
        "--termination-log", default=None, metavar="PATH", help="write the report here as one JSON line (<= 4,000 bytes), e.g. /dev/termination-log"
    )

    ev = sub.add_parser("evaluate", help="real acceptance length by chain speculative decoding")
    ev.add_argument("--target", required=True)
    ev.add_argument("--drafter", required=True, help="a training run's final/ directory or an exported drafter (specdec-train export --out)")
    ev.add_argument("--serving", default=None, metavar="DIR", help="also evaluate this drafter (the one serving) the same way, on the same prompts")
    ev.add_argument(
        "--engine",
        type=str.lower,
        choices=ENGINES,
        default=None,
        help="the layer-id convention of an export's config.json when its training_provenance.json does not say",
    )
    ev.add_argument("--prompts", required=True, help="held-out samples or conversations (JSONL)")
    ev.add_argument("--quantization", default="checkpoint", help="how the target serves (as in capture)")
    ev.add_argument("--num-steps", type=int, default=3)
    ev.add_argument("--num-draft-tokens", type=int, default=None)
    ev.add_argument("--max-new-tokens", type=int, default=128)
    ev.add_argument("--temperature", type=float, action="append", default=None, help="0 for greedy; repeat for several (default: 0 and 0.7)")
    ev.add_argument("--limit", type=int, default=64)
    ev.add_argument("--device", default=None)
    ev.add_argument("--seed", type=int, default=0)
    ev.add_argument("--out", default=None, help="write the JSON report here too")


def _run(args: argparse.Namespace) -> Any:
    progress = not args.quiet
    if args.stage == "gather":
        from .gather import gather

        return gather(args.capture, args.out, args.heldout_share, args.max_samples, args.recent_share)
    if args.stage == "regenerate":
        from .regenerate import regenerate

        return regenerate(
            args.prompts,
            args.out,
            base_url=args.base_url,
            tokenizer_dir=args.tokenizer,
            api=args.api,
            model=args.model,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            concurrency=args.concurrency,
            retries=args.retries,
            max_length=args.max_length,
            limit=args.limit,
            progress=progress,
        )
    if args.stage == "capture":
        return _capture(args, progress)
    if args.stage == "vocab":
        from .vocab import build_vocab

        return build_vocab(args.capture, args.out or args.capture, args.draft_vocab_size)
    if args.stage == "train":
        from .train import TrainConfig, train

        cfg = TrainConfig(
            capture_dir=args.capture,
            target_dir=args.target,
            out_dir=args.out,
            vocab_dir=args.vocab,
            ttt_steps=args.ttt_steps,
            epochs=args.epochs,
            lr=args.lr,
            weight_decay=args.weight_decay,
            warmup_ratio=args.warmup_ratio,
            grad_clip=args.grad_clip,
            batch_size=args.batch_size,
            max_length=args.max_length,
            eval_fraction=args.eval_fraction,
            checkpoint_every=args.checkpoint_every,
            max_steps=args.max_steps,
            stop_after=args.stop_after,
            intermediate_size=args.intermediate_size,
            seed=args.seed,
            device=args.device,
            progress=progress,
            init_from_drafter=args.init_from_drafter,
            init_from_engine=args.init_from_engine,
        )
        s = train(cfg)
        return {k: s[k] for k in ("num_samples", "steps", "first_loss", "last_loss", "tokens_per_second")} | {
            "eval": s["evals"][-1] if s["evals"] else None
        }
    if args.stage == "export":
        from pathlib import Path

        from .export import export_drafter

        return export_drafter(
            Path(args.run) / "final",
            args.target,
            args.out,
            engine=args.engine,
            target_model=args.target_model,
            fmt=args.export_format,
            speculative_tokens=args.speculative_tokens,
        ).to_json()
    if args.stage == "publish":
        from .report import publish_revision

        return publish_revision(args.staging, args.out, args.job, keep=args.keep, protect=args.protect, termination_log=args.termination_log)
    if args.stage == "validate":
        return _validate(args)
    if args.stage == "evaluate":
        return _evaluate(args, progress)
    raise AssertionError(args.stage)


def _validate(args: argparse.Namespace) -> dict[str, Any]:
    """specdec-train validate: `specdec validate` with these flags, its verdict written to --out."""
    from .validation import validate_export, write_json

    flags = {"--target": args.target, "--drafter": args.drafter, "--quantization": args.quantization, "--algorithm": args.algorithm}
    flags |= {"--engine": args.engine} | ({"--context-length": args.context_length} if args.context_length else {})
    verdict = validate_export([part for flag, value in flags.items() for part in (flag, value)])
    write_json(args.out, verdict)
    return verdict


def _capture(args: argparse.Namespace, progress: bool) -> dict[str, Any]:
    """specdec-train capture: the hidden states, from an SGLang server or HF transformers."""
    from .capture import capture_hf, capture_sglang

    if args.capture_layers_of:
        from .warmstart import trained_layers

        if args.capture_layers is not None:
            raise InputError("--capture-layers with --capture-layers-of: pass one of them")
        args.capture_layers = trained_layers(args.capture_layers_of, args.target)
    if args.source == "sglang":
        if not args.url:
            raise InputError("--url: required with --source sglang (the capture server's root URL)")
        idx = capture_sglang(
            args.samples,
            args.target,
            args.out,
            url=args.url,
            target_quantization=args.quantization,
            capture_layers=args.capture_layers,
            storage=args.storage,
            top_k=args.top_k,
            concurrency=args.concurrency,
            shard_samples=args.shard_samples,
            progress=progress,
        )
    else:
        idx = capture_hf(
            args.samples,
            args.target,
            args.out,
            quantization=args.quantization,
            capture_layers=args.capture_layers,
            storage=args.storage,
            device=args.device or "cpu",
            shard_samples=args.shard_samples,
            progress=progress,
        )
    return {
        "samples": len(idx.samples),
        "aux_layer_ids": idx.data["aux_layer_ids"],
        "aux_layer_ids_input_index": idx.data["aux_layer_ids_input_index"],
    }


def _evaluate(args: argparse.Namespace, progress: bool) -> dict[str, Any]:
    """specdec-train evaluate: the drafter's acceptance (and, with --serving, the serving drafter's, the same way)."""
    from .offline import evaluation_report

    drafters = {"drafter": args.drafter} | ({"serving": args.serving} if args.serving else {})
    settings = {"num_steps": args.num_steps, "num_draft_tokens": args.num_draft_tokens, "max_new_tokens": args.max_new_tokens, "seed": args.seed}
    report = evaluation_report(
        args.target,
        drafters,
        args.prompts,
        quantization=args.quantization,
        engine=args.engine,
        temperatures=args.temperature,
        limit=args.limit,
        device=args.device,
        settings=settings,
        progress=progress,
    )
    if args.out:
        from .validation import write_json

        write_json(args.out, report)  # whole or absent: publish reads it
    return report


def _runtime_failures() -> tuple[type[BaseException], ...]:
    import asyncio

    import aiohttp

    from .regenerate import EndpointError

    return (OSError, RuntimeError, EndpointError, aiohttp.ClientError, asyncio.TimeoutError)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        result = _run(args)
    except InputError as exc:
        print(f"specdec-train {args.stage}: error: {exc}", file=sys.stderr)
        return 2
    except _runtime_failures() as exc:  # server gone, disk full, CUDA out of memory: one line, exit 1
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"specdec-train {args.stage}: failed: {type(exc).__name__}: {first}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    print(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
