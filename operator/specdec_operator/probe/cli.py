"""`specdec probe`: measure a speculative SGLang server (or race several: ``--arm NAME=URL``) against its base and print
the decision."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from functools import partial
from typing import Any

from ..api import OutputCheck, Prompts
from ..cliparse import ArgumentParser
from ..enginefacts import CLI_NAMES, DEFAULT
from ..engines import engine_named
from ..errors import InputError
from ..probecost import cli_cost, render_cost
from .client import parse_workload
from .datasets import load_dataset_file
from .evidence import Decide
from .run import DEFAULT_CONFIDENCE, ProbeResult, run_probe

DEFAULT_WORKLOADS = ["single-stream:1:1024:256:4", "concurrent-64:64:1024:256:128"]


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="specdec probe",
        description="Alternate paired rounds of load against a base and a speculative SGLang server, put a "
        "confidence interval on the speedup, and decide promote or rollback. Exit 0 whatever the decision; "
        "2 for bad arguments, 3 when the base server cannot be reached.",
    )
    p.add_argument("--base", required=True, help="base SGLang server URL, e.g. http://127.0.0.1:30000")
    p.add_argument(
        "--speculative",
        "--candidate",
        dest="speculative",
        default=None,
        help="speculative SGLang server URL, the arm 'speculative' (--candidate: the same)",
    )
    p.add_argument(
        "--arm",
        action="append",
        default=None,
        metavar="NAME=URL",
        help="another speculative server to race (repeatable): each arm is paired with a base measurement of its own "
        "every round, and the fastest arm that passes wins (give --speculative, --arm, or both)",
    )
    p.add_argument(
        "--workload",
        action="append",
        default=None,
        metavar="NAME:C:IN:OUT:REQ[:WEIGHT]",
        help="traffic shape (repeatable): name, concurrency, input tokens, output tokens, requests per "
        f"round and server, optional weight. Default: {' '.join(DEFAULT_WORKLOADS)}",
    )
    p.add_argument("--min-speedup", type=float, default=1.0, help="promote only when the interval's low end is above this (default 1.0)")
    p.add_argument("--max-rounds", type=int, default=6, help="paired rounds before Inconclusive (default 6)")
    p.add_argument(
        "--accept-length-floor",
        type=float,
        default=1.1,
        help="reject at once when the first round's acceptance length is at or below this (default 1.1)",
    )
    p.add_argument(
        "--policy", default="all", choices=["all", "weighted"], help="all: every workload must pass; weighted: the weight-averaged speedup must pass"
    )
    p.add_argument(
        "--confidence",
        type=float,
        default=DEFAULT_CONFIDENCE,
        help=f"family-wise confidence of the intervals over all looks (default {DEFAULT_CONFIDENCE}: "
        "equal servers are promoted in under 0.1%% of probes)",
    )
    p.add_argument("--timeout", type=float, default=3600.0, help="time budget of the whole probe in seconds")
    p.add_argument("--request-timeout", type=float, default=600.0, help="seconds one request may take")
    _add_traffic_options(p)
    _add_cost_options(p)
    p.add_argument(
        "--settle",
        type=float,
        default=None,
        metavar="SECONDS",
        help="pause before measuring a server right after the other one, while the other may still keep a core busy "
        "(default: the engine's idle spin, vLLM 1 s, SGLang 0)",
    )
    p.add_argument("--seed", type=int, default=None, help="seed for the random prompts and the order of a dataset's prompts")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--quiet", action="store_true", help="no per-round progress on stderr")
    return p


def _add_traffic_options(p: argparse.ArgumentParser) -> None:
    """What the probe sends and in which protocol: the prompts, the endpoint, the output lengths, the output check."""
    p.add_argument(
        "--dataset",
        metavar="FILE",
        default=None,
        help="prompts for every workload: JSONL of OpenAI chat requests ({messages, max_tokens?}), ShareGPT "
        "({conversations}, JSONL or a JSON array) or JSONL of {prompt}. Default: the shipped prompt set",
    )
    p.add_argument("--dataset-format", default="Auto", choices=["Auto", "Chat", "ShareGPT", "Prompt"], help="the dataset's format (default Auto)")
    p.add_argument(
        "--random-ids",
        action="store_true",
        help="send random token ids of INPUT_TOKENS instead of prompts (synthetic traffic: the decision says so)",
    )
    p.add_argument(
        "--endpoint",
        default="chat",
        choices=["chat", "generate"],
        help="chat: /v1/chat/completions, streaming, the server's chat template (default); generate: /generate with text",
    )
    p.add_argument(
        "--output-length",
        default="fixed",
        choices=["fixed", "dataset"],
        help="fixed: OUTPUT_TOKENS with ignore_eos (default); dataset: each prompt's max_tokens capped by --max-output-tokens, stopping at EOS",
    )
    p.add_argument("--max-output-tokens", type=int, default=1024, help="the cap with --output-length dataset (default 1024)")
    p.add_argument(
        "--output-check-prompts",
        type=int,
        default=8,
        help="prompts whose greedy completions are compared between the servers afterwards (default 8; 0: no check)",
    )
    p.add_argument("--min-match-rate", type=float, default=0.9, help="rollback OutputMismatch below this match rate (default 0.9)")
    p.add_argument(
        "--engine",
        default=DEFAULT.cli_name,
        choices=CLI_NAMES,
        help=f"the servers' engine (default {DEFAULT.cli_name}): vllm speaks its OpenAI API and reads acceptance from its counters",
    )


def _add_cost_options(p: argparse.ArgumentParser) -> None:
    """What each server holds, for the decision's GPU-seconds or core-seconds."""
    # In a race every arm's server holds what --speculative-* declares; the JSON's candidate_* are all arms' together.
    holder = {"base": "the base server", "speculative": "each speculative server (every arm of a race)"}
    for side in ("base", "speculative"):
        p.add_argument(
            f"--{side}-gpus",
            type=float,
            default=None,
            metavar="N",
            help=f"GPUs {holder[side]} holds (0 for a CPU server), for the decision's GPU-seconds (default: unknown)",
        )
        p.add_argument(
            f"--{side}-cores",
            type=float,
            default=None,
            metavar="N",
            help=f"CPU cores {holder[side]} holds (a CPU build: vLLM's), for the decision's core-seconds (default: unknown)",
        )


def render_text(result: ProbeResult, cost: dict[str, Any] | None = None) -> str:
    lines = [f"decision: {result.decision} ({result.reason}) after {result.rounds} round(s)"]
    if len(result.arms) > 1:
        lines.append(f"winner: {result.winner or 'none'} (the lines below are {'its' if result.winner else 'the leading arm'}'s)")
        for name, arm in result.arms.items():
            speed = (
                "not measured"
                if arm.speedup is None
                else f"{arm.speedup:.3f}x [{arm.speedup_low or 0:.3f}, {'inf' if arm.speedup_high is None else f'{arm.speedup_high:.3f}'}]"
            )
            accept = "" if arm.accept_length is None else f", acceptance length {arm.accept_length:.3f}"
            lines.append(f"  arm {name}: {arm.outcome} after {arm.rounds} round(s), speedup {speed}{accept}")
    if result.accept_length is not None:
        lines.append(f"acceptance length: {result.accept_length:.3f}")
    elif result.server_accept_length is not None:
        lines.append(f"acceptance length (server): {result.server_accept_length:.3f}")
    for name, what in result.traffic.items():
        lines.append(f"traffic {name}: {what}")
    if result.output_match_rate is not None:
        lines.append(f"greedy output match: {result.output_match_rate:.1%} over {result.outputs_compared} prompts")
    for w in result.workloads:
        if w.speedup is None:
            lines.append(f"  {w.name} (c={w.concurrency}): not measured")
            continue
        hi = "inf" if w.speedup_high is None else f"{w.speedup_high:.3f}"
        lines.append(
            f"  {w.name} (c={w.concurrency}): base {w.base_tok_s or 0:.1f} tok/s, speculative "
            f"{w.speculative_tok_s or 0:.1f} tok/s, speedup {w.speedup:.3f}x [{w.speedup_low or 0:.3f}, {hi}]"
        )
    found = result.break_even()
    if found is not None:
        lines.append(f"break-even concurrency: {found.summary}")
    for warning in result.warnings:
        lines.append(f"warning: {warning}")
    if cost is not None:
        lines.append(render_cost(cost, result.wall_seconds))
    lines.append(result.message)
    return "\n".join(lines)


def parse_arms(values: list[str] | None) -> dict[str, str]:
    """``--arm NAME=URL`` values by name; one-line InputError for a malformed one (run_probe checks names and URLs)."""
    arms: dict[str, str] = {}
    for value in values or ():
        name, sep, url = value.partition("=")
        if not sep or not name or not url:
            raise InputError(f"--arm {value!r}: expected NAME=URL, e.g. --arm eagle3-k4=http://127.0.0.1:30001")
        if name in arms:
            raise InputError(f"--arm {name}: given twice; give each arm one URL")
        arms[name] = url
    return arms


def main(argv: list[str], decide: Decide | None = None) -> int:
    """``decide``: the probe's decision (cli/probe.py passes reconcile/race.py's; this layer cannot import it)."""
    if decide is None:
        raise InputError("specdec probe: run it as `specdec probe` (the command passes the decision to the probe)")
    args = build_parser().parse_args(argv)
    arms = parse_arms(args.arm)
    if args.speculative is None and not arms:
        raise InputError("--speculative URL or --arm NAME=URL: at least one speculative server to measure against --base")
    workloads = [parse_workload(w) for w in (args.workload or DEFAULT_WORKLOADS)]
    if args.random_ids and args.dataset:
        raise InputError("--random-ids and --dataset: choose one (random token ids, or the dataset's prompts)")
    try:
        if args.random_ids:
            prompts = Prompts(source="Random")
        else:
            prompts = Prompts(
                endpoint="Chat" if args.endpoint == "chat" else "Generate",
                output_length="Fixed" if args.output_length == "fixed" else "Dataset",
                max_output_tokens=args.max_output_tokens,
            )
        check = None
        if args.output_check_prompts > 0:
            check = OutputCheck(prompts=args.output_check_prompts, min_match_rate=args.min_match_rate)
    except ValueError as exc:  # pydantic's ValidationError
        raise InputError(f"--max-output-tokens/--output-check-prompts/--min-match-rate: {str(exc).splitlines()[-2].strip()}") from None
    workloads = [w.model_copy(update={"prompts": prompts}) for w in workloads]
    cli_cost(None, args.base_gpus, args.speculative_gpus, args.base_cores, args.speculative_cores)  # refused before any request
    # A race holds every arm's server for the whole probe: the speculative side is each arm's GPUs (cores) times the arms.
    servers = len(arms) + (args.speculative is not None)
    cost_of = partial(
        cli_cost,
        base_gpus=args.base_gpus,
        speculative_gpus=None if args.speculative_gpus is None else args.speculative_gpus * servers,
        base_cores=args.base_cores,
        speculative_cores=None if args.speculative_cores is None else args.speculative_cores * servers,
    )
    datasets = None
    if args.dataset:
        dataset = load_dataset_file(args.dataset, args.dataset_format)
        datasets = {w.name: dataset for w in workloads}

    def progress(result: ProbeResult) -> None:
        if args.quiet:
            return
        parts = [f"{w.name} {w.speedup:.3f}x" for w in result.workloads if w.speedup is not None]
        print(f"specdec probe: round {result.rounds}: {', '.join(parts)}", file=sys.stderr, flush=True)

    result = asyncio.run(
        run_probe(
            args.base,
            args.speculative,
            workloads,
            arms=arms,
            min_speedup=args.min_speedup,
            max_rounds=args.max_rounds,
            accept_length_floor=args.accept_length_floor,
            policy=args.policy,
            confidence=args.confidence,
            timeout=args.timeout,
            request_timeout=args.request_timeout,
            seed=args.seed,
            on_round=progress,
            datasets=datasets,
            output_check=check,
            engine=engine_named(args.engine),
            decide=decide,
            settle_s=args.settle,
        )
    )
    cost = cost_of(result.wall_seconds)
    if args.json:
        print(json.dumps({**result.to_dict(), **cost}, indent=2))
    else:
        print(render_text(result, cost))
    if not result.base_reachable:
        print(f"specdec probe: error: {result.message}", file=sys.stderr)
        return 3
    return 0
