"""`specdec sglang-args`: print the command line of one server of a SpeculativeServer, as its engine renders it
(Engine.render_argv: SGLang's, or vLLM's for spec.engine vLLM; the name is older than spec.engine)."""

from __future__ import annotations

import json
import shlex
import sys

from ..api import Variant
from ..cliparse import ArgumentParser
from ..engines import engine_for
from ..resource import load_custom_resource


def main(argv: list[str]) -> int:
    parser = ArgumentParser(
        prog="specdec sglang-args",
        description="Print the command line of one server of a SpeculativeServer (SGLang's, or vLLM's with engine vLLM), as a JSON array.",
    )
    parser.add_argument("-f", "--filename", required=True, help="SpeculativeServer YAML file")
    parser.add_argument("--variant", required=True, choices=[v.value for v in Variant], help="which server")
    parser.add_argument("--shell", action="store_true", help="print one shell-quoted line instead of JSON")
    args = parser.parse_args(argv)
    _, spec = load_custom_resource(args.filename)
    command = engine_for(spec).render_argv(spec, args.variant)
    sys.stdout.write((shlex.join(command) if args.shell else json.dumps(command)) + "\n")
    return 0
