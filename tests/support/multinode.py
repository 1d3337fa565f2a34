"""Multi-node specs and what the kubelet makes of a rendered rank: the Kimi spec, $(VAR) expansion, SGLang's parse."""

from __future__ import annotations

import copy
import re

from specdec_operator import sglang as sglang_args

KIMI = {
    "image": "lmsysorg/sglang:v0.5.23-cu130",
    "model": {"volume": {"persistentVolumeClaim": {"claimName": "weights"}}},
    "target": {"path": "moonshotai/Kimi-K2.5"},
    "drafter": {"path": "eagle3/kimi"},
    "resources": {"gpus": 8, "nodes": 2},
}


def spec_with(**resources) -> dict:
    spec = copy.deepcopy(KIMI)
    spec["resources"].update(resources)
    return spec


def kubelet_expand(argv: list[str], env: dict[str, str]) -> list[str]:
    """$(VAR) in a container's command, expanded as the kubelet does: defined variables are replaced, $$ is a $,
    anything else is left as it is."""

    def one(arg: str) -> str:
        return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda mm: "$" if mm.group(0) == "$$" else env.get(mm.group(1), mm.group(0)), arg)

    return [one(a) for a in argv]


def parsed(parser, spec, argv):
    from sglang.srt.server_args import ServerArgs

    flags = argv[len(sglang_args.RELEASES[spec.sglang_version].entrypoint) :]
    for flag in (f for f in flags if f.startswith("--")):
        assert flag in parser._option_string_actions, f"{flag} is not a declared SGLang flag"
    return ServerArgs.from_cli_args(parser.parse_args(flags))
