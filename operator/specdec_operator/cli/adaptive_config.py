"""`specdec adaptive-config`: the engine's adaptive speculation table for a measured speedup curve (loadaware.adaptive_config,
Engine.adaptive_document): SGLang's --speculative-adaptive-config, or vLLM's num_speculative_tokens_per_batch_size."""

from __future__ import annotations

import json
import sys
from typing import Any

from ..cliparse import ArgumentParser
from ..enginefacts import CLI_NAMES, DEFAULT
from ..engines import engine_named
from ..errors import InputError
from ..loadaware import adaptive_config
from ..probe.curve import BreakEven


def _break_even_of(document: Any, source: str) -> BreakEven:
    found = document.get("break_even") if isinstance(document, dict) else None
    if not isinstance(found, dict) or not isinstance(found.get("summary"), str):
        raise InputError(f"{source}: no break_even in it: give the `specdec probe --json` document of a probe with two or more workloads")
    numbers = {key: found.get(key) for key in ("concurrency", "low", "high")}
    if any(value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))) for value in numbers.values()):
        raise InputError(f"{source}: break_even.concurrency, .low and .high must be numbers or null")
    return BreakEven(numbers["concurrency"], numbers["low"], numbers["high"], found["summary"])


def main(argv: list[str]) -> int:
    """Print SGLang's --speculative-adaptive-config for the curve a `specdec probe --json` run measured."""
    parser = ArgumentParser(
        prog="specdec adaptive-config",
        description="Derive SGLang's --speculative-adaptive-config from a measured speedup curve: the given number of "
        "draft steps below the first batch size where speculation may stop paying (the low end of the break-even "
        "interval), no drafting from there up. Exit 0 with the JSON on stdout; 1 when the curve has no such range.",
    )
    parser.add_argument("--probe-json", required=True, metavar="FILE", help="the output of `specdec probe --json`")
    parser.add_argument("--num-steps", required=True, type=int, help="draft steps where speculation pays (the spec's drafter.numSteps)")
    parser.add_argument(
        "--engine",
        default=DEFAULT.cli_name,
        choices=CLI_NAMES,
        help=f"whose table (default {DEFAULT.cli_name}); vllm prints num_speculative_tokens_per_batch_size for its default max_num_seqs (128)",
    )
    args = parser.parse_args(argv)
    try:
        with open(args.probe_json, encoding="utf-8") as fh:
            document = json.load(fh)
    except OSError as exc:
        raise InputError(f"--probe-json {args.probe_json}: cannot read: {exc.strerror}") from None
    except ValueError as exc:
        raise InputError(f"--probe-json {args.probe_json}: not JSON: {exc}") from None
    if args.num_steps < 1:
        raise InputError(f"--num-steps {args.num_steps}: must be >= 1")
    found = _break_even_of(document, args.probe_json)
    plan = adaptive_config(found, args.num_steps)
    if plan is None:
        print(f"specdec adaptive-config: no load range to speculate on: break-even {found.summary}", file=sys.stderr)
        return 1
    print(json.dumps(engine_named(args.engine).adaptive_document(plan.no_draft_from, args.num_steps), indent=2))
    return 0
