"""`specdec validate`: the command line (run by users and, as an init container, by the operator before a
10-minute model load). Exit 0 compatible, 1 incompatible; unusable input raises InputError (exit 2)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from ..choices import ENGINES, QUANTIZATIONS
from ..cliparse import ArgumentParser
from ..enginefacts import DEFAULT, SPECULATORS, facts_for
from ..errors import InputError
from .checks import VALIDATED_ALGORITHMS, validate
from .modelmeta import MetaReader, display_path, read_model_dir, read_weights
from .report import ValidationReport, format_text, unusable_message
from .speculators import is_speculators
from .tables import EAGLE3_DRAFT_ARCHITECTURES, EAGLE_DRAFT_ARCHITECTURES

# The draft classes whose weights the checks inspect (Eagle3LlamaForCausalLM is vLLM's name for
# SGLang's layout): only these have their safetensors headers read.
DRAFT_CLASSES_WITH_CHECKED_WEIGHTS = frozenset(EAGLE3_DRAFT_ARCHITECTURES) | EAGLE_DRAFT_ARCHITECTURES | {"Eagle3LlamaForCausalLM"}


def _one_line(text: str) -> str:
    return " ".join(text.split("\n")).replace("\r", " ")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--context-length {text!r}: must be a positive integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"--context-length {value}: must be a positive integer")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="specdec validate",
        help_hint=True,
        description="Check a drafter against its target from metadata only (config.json, tokenizer_config.json, "
        "safetensors headers, training_provenance.json). Exit 0 compatible, 1 incompatible, 2 unusable input.",
    )
    p.add_argument("--target", required=True, metavar="DIR", help="the target model directory")
    p.add_argument(
        "--drafter",
        required=True,
        metavar="DIR",
        help="the draft model directory (for NEXTN: the target directory itself, or a separate MTP checkpoint)",
    )
    p.add_argument(
        "--quantization",
        default="auto",
        type=str.lower,
        choices=QUANTIZATIONS,
        help="serving precision; auto (default) reads the target's quantization_config",
    )
    p.add_argument("--context-length", type=_positive_int, metavar="N", help="the server's --context-length, if set")
    p.add_argument(
        "--algorithm",
        default="EAGLE3",
        type=lambda s: "NEXTN" if s.upper() == "MTP" else s.upper(),
        choices=VALIDATED_ALGORITHMS,
        help="speculative algorithm (default EAGLE3; MTP is an alias of NEXTN; STANDALONE is vLLM's draft_model)",
    )
    p.add_argument(
        "--engine",
        default=DEFAULT.cli_name,
        type=str.lower,
        choices=ENGINES,
        help=f"the engine that will serve the pair (default {DEFAULT.cli_name}); they read a drafter's aux layer ids one layer apart",
    )
    p.add_argument("--json", action="store_true", help="print the full report as JSON")
    p.add_argument("--termination-log", metavar="PATH", help="also write a compact JSON summary (<= 4096 bytes) here, e.g. /dev/termination-log")
    return p


def _write_termination_log(path: str | None, text: str) -> None:
    if not path:
        return
    try:
        with open(path, "w", encoding="ascii") as fh:
            fh.write(text)
    except OSError as exc:
        print(f"specdec validate: warning: cannot write termination log {display_path(path)}: {exc.strerror or exc}", file=sys.stderr)


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def run(args: argparse.Namespace, reader: MetaReader | None = None) -> tuple[ValidationReport, MetaReader]:
    """Read both directories and validate; the reader counts the bytes read."""
    reader = reader or MetaReader()
    if args.algorithm == "NEXTN":
        target = read_model_dir(args.target, role="target", weights="names", reader=reader)
        drafter = target if _same_file(args.target, args.drafter) else read_model_dir(args.drafter, role="drafter", weights="none", reader=reader)
    else:
        target = read_model_dir(args.target, role="target", weights="none", reader=reader)
        drafter = read_model_dir(args.drafter, role="drafter", weights="none", reader=reader)
        # Only a draft class has weights worth checking; a full model passed as drafter is refused
        # from its config without parsing hundreds of shard headers.
        # A speculators-format drafter served by vLLM is checked as the Llama draft class vLLM flattens it to.
        speculator = SPECULATORS in facts_for(args.engine).drafter_formats and is_speculators(drafter.config)
        if speculator or (drafter.config.get("architectures") and drafter.architecture in DRAFT_CLASSES_WITH_CHECKED_WEIGHTS):
            read_weights(drafter, "headers", reader)
    report = validate(
        target, drafter, quantization=args.quantization, context_length=args.context_length, algorithm=args.algorithm, engine=args.engine
    )
    return report, reader


def main(argv: list[str]) -> int:
    """`specdec validate`: 0 compatible, 1 incompatible; unusable input raises InputError (exit 2)."""
    args = build_parser().parse_args(argv)
    try:
        report, _ = run(args)
    except InputError as exc:
        line = _one_line(str(exc))
        _write_termination_log(args.termination_log, unusable_message(line))
        raise InputError(line) from None
    if args.json:
        print(json.dumps(report.to_dict(), indent=2, ensure_ascii=True))
    else:
        print(format_text(report))
    _write_termination_log(args.termination_log, report.termination_message())
    return 0 if report.compatible else 1
