"""`specdec`: the operator-side command line.

Subcommands are imported lazily so that fast commands (`specdec validate` runs as an init container
before a 10-minute model load) never pay for importing kopf or the Kubernetes client.
Each subcommand module exposes `main(argv: list[str]) -> int`.
"""

from __future__ import annotations

import importlib
import sys

from ..errors import InputError

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("specdec_operator.controller.runner", "run the operator (wraps kopf's runner)"),
    "validate": ("specdec_operator.validator.cli", "check a drafter against its target from metadata only"),
    "sglang-args": ("specdec_operator.cli.sglang_args", "print the server command line (SGLang's or vLLM's) of a SpeculativeServer variant"),
    "crd": ("specdec_operator.cli.crd", "print the CustomResourceDefinition generated from the API models"),
    "probe": ("specdec_operator.cli.probe", "measure a speculative server against its base and decide"),
    "dataset-serve": ("specdec_operator.probe.reader", "read a prompt dataset file and serve it normalised (the File source's reader pod)"),
    "adaptive-config": ("specdec_operator.cli.adaptive_config", "derive SGLang's adaptive speculation table from a probe's speedup curve"),
    "simulate": ("specdec_operator.simulator.cli", "run an SGLang-compatible simulator for tests and demos"),
    "capture": ("specdec_operator.capture.cli", "forward a server's traffic unchanged and keep a sampled share of it (spec.retraining.capture)"),
}


def _usage() -> str:
    width = max(len(n) for n in COMMANDS)
    lines = ["usage: specdec COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name.ljust(width)}  {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "`specdec COMMAND --help` describes a command."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if argv[0] == "--version":
        from .. import __version__

        print(__version__)
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"specdec: unknown command {name!r}; one of: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    try:
        return int(module.main(rest) or 0)
    except InputError as exc:
        print(f"specdec {name}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
