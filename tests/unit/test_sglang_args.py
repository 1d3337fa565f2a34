"""SGLang command lines, checked with SGLang's own argument parser (the installed sglang==0.5.23 wheel).

Every rendered command line goes through `argparse.ArgumentParser` + `ServerArgs.add_cli_args` (what
`sglang serve` builds) and `ServerArgs.from_cli_args`. In 0.5.23 construction does not resolve anything
(`ServerArgs.__post_init__` is empty); resolution (`resolve_once`: GPU platform, model config, the speculative
defaults) runs in the launcher and needs the full GPU runtime, so it is not run here: the invariants it would
enforce (topk/draft tokens need steps, topk 1 means steps + 1 draft tokens) are asserted on the parsed values.
SGLang is imported lazily, here only: the operator never imports it.
"""

from __future__ import annotations

import argparse
import copy
import json
import pathlib
import shlex

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdec_operator import api, cli, resource
from specdec_operator import sglang as sglang_args
from specdec_operator.choices import SGLANG_VERSIONS
from specdec_operator.errors import InputError

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))

MINIMAL = {
    "image": "lmsysorg/sglang:v0.5.23-cu130",
    "model": {"volume": {"persistentVolumeClaim": {"claimName": "weights"}}},
    "target": {"path": "llama"},
    "drafter": {"path": "eagle3/llama"},
}

# Valid flags of 0.5.23 that users put in extraArgs (none managed by the operator).
EXTRA_ARG_CHOICES = [
    ["--cuda-graph-max-bs-decode", "256"],
    ["--trust-remote-code"],
    ["--attention-backend", "flashinfer"],
    ["--decode-log-interval", "10"],
    ["--kv-cache-dtype", "fp8_e4m3"],
    ["--chunked-prefill-size=8192"],
    ["--served-model-name", "kimi"],
    ["--watchdog-timeout", "600"],
]


OLD_IMAGE = "lmsysorg/sglang:v0.5.9-cu126"  # its tag names the release the command line is rendered for


def spec_of(data: dict) -> api.SpeculativeServerSpec:
    return resource.parse_spec(data, check_rules=True)


# The first CEL evaluation builds celpy's environment, which raises the recursion limit; do it before
# hypothesis runs (it warns when a test changes the limit).
spec_of(MINIMAL)


def server_flags(spec: api.SpeculativeServerSpec, argv: list[str]) -> list[str]:
    entrypoint = sglang_args.RELEASES[spec.sglang_version].entrypoint
    assert tuple(argv[: len(entrypoint)]) == entrypoint
    return argv[len(entrypoint) :]


def parse(parser: argparse.ArgumentParser, flags: list[str]):
    """Parse as the server does, construct ServerArgs, and insist that every flag is spelled out in full.

    argparse accepts unambiguous prefixes (`--tp` for `--tp-size`); a prefix breaks as soon as SGLang adds a
    flag sharing it (that is how `--cuda-graph-max-bs` broke), so rendered flags must be declared names.
    """
    from sglang.srt.server_args import ServerArgs

    for flag in (f.split("=", 1)[0] for f in flags if f.startswith("--")):
        assert flag in parser._option_string_actions, f"{flag} is not a declared SGLang 0.5.23 flag"
    namespace = parser.parse_args(flags)
    server_args = ServerArgs.from_cli_args(namespace)
    return namespace, server_args


def check_command_lines(parser, spec: api.SpeculativeServerSpec) -> None:
    """The assertions every spec must pass, for both variants."""
    base = sglang_args.render_argv(spec, "base")
    spec_argv = sglang_args.render_argv(spec, "speculative")
    base_ns, base_args = parse(parser, server_flags(spec, base))
    spec_ns, spec_args = parse(parser, server_flags(spec, spec_argv))

    for _ns, args in ((base_ns, base_args), (spec_ns, spec_args)):
        assert args.host == "0.0.0.0"
        assert args.port == sglang_args.server_port(spec) == 30000
        assert args.tp_size == spec.resources.gpus
        assert args.max_running_requests == spec.sglang.max_running_requests  # never None: no silent 48
        assert args.enable_metrics is True
        assert args.model_path == sglang_args.target_model_path(spec)
        assert args.model_path.startswith(spec.model.mount_path.rstrip("/") + "/")
        assert args.context_length == spec.target.context_length
        assert args.mem_fraction_static == spec.sglang.mem_fraction_static
        assert args.quantization is None  # SGLang reads it from the checkpoint
        assert "--cuda-graph-max-bs" not in base + spec_argv

    # The base server speculates in no way.
    assert all(getattr(base_args, k) is None for k in (
        "speculative_algorithm", "speculative_draft_model_path", "speculative_num_steps",
        "speculative_eagle_topk", "speculative_num_draft_tokens",
    ))  # fmt: skip

    # Speculation shape: all three given (SGLang asserts on topk/draft tokens without steps) and consistent
    # (topk 1 with draft tokens != steps + 1 would be rewritten by SGLang; more than the tree holds is invalid).
    drafter = spec.drafter
    assert spec_args.speculative_algorithm == drafter.algorithm
    steps, topk, tokens = (
        spec_args.speculative_num_steps,
        spec_args.speculative_eagle_topk,
        spec_args.speculative_num_draft_tokens,
    )
    assert (steps, topk, tokens) == (drafter.num_steps, drafter.eagle_topk, drafter.draft_tokens)
    assert None not in (steps, topk, tokens)
    if topk == 1:
        assert tokens == steps + 1
    else:
        assert 2 <= tokens <= steps * topk + 1
    if drafter.algorithm == "NEXTN":
        assert spec_args.speculative_draft_model_path is None  # SGLang uses the target's own MTP layers
    else:
        assert spec_args.speculative_draft_model_path == sglang_args.draft_model_path(spec)
        assert spec_args.speculative_draft_model_path.startswith(spec.model.mount_path.rstrip("/") + "/")

    # A fair comparison: apart from the speculative flags, both servers get exactly the same configuration.
    stripped, i = [], 0
    while i < len(spec_argv):
        if spec_argv[i] in sglang_args.SPECULATIVE_FLAGS:
            i += 2
            continue
        stripped.append(spec_argv[i])
        i += 1
    assert stripped == base
    differing = {k for k in vars(base_ns) if getattr(base_ns, k) != getattr(spec_ns, k)}
    assert differing and all(k.startswith("speculative_") for k in differing)

    # extraArgs pass through unchanged, last.
    extra = list(spec.sglang.extra_args)
    if extra:
        assert base[-len(extra) :] == extra and spec_argv[-len(extra) :] == extra


# --------------------------------------------------------------------------------------------------
# Hypothesis: a range of valid specs, every one parsed by SGLang.


@st.composite
def valid_specs(draw) -> dict:
    algorithm = draw(st.sampled_from(["EAGLE3", "EAGLE", "NEXTN"]))
    steps = draw(st.integers(1, 8))
    topk = draw(st.sampled_from([1, 1, 2, 4, 8]))
    drafter: dict = {"algorithm": algorithm, "numSteps": steps, "eagleTopk": topk}
    if topk == 1:
        if draw(st.booleans()):
            drafter["numDraftTokens"] = steps + 1
    else:
        drafter["numDraftTokens"] = draw(st.integers(2, min(64, steps * topk + 1)))
    mount = draw(st.sampled_from(["/models", "/mnt/weights"]))  # the API refuses a trailing slash
    absolute = [f"{mount}/abs"]
    if algorithm != "NEXTN":  # NEXTN with a drafter.path is refused at admission
        drafter["path"] = draw(st.sampled_from(["eagle3/d", "drafters/kimi-k2.5 eagle3", "./eagle3/x/", *[a + "/draft" for a in absolute]]))
    sglang: dict = {"maxRunningRequests": draw(st.sampled_from([1, 48, 128, 256, 16384]))}
    if draw(st.booleans()):
        sglang["memFractionStatic"] = draw(st.sampled_from([0.5, 0.8, 0.85, 0.9, 0.93]))
    sglang["extraArgs"] = [
        a for chunk in draw(st.lists(st.sampled_from(EXTRA_ARG_CHOICES), max_size=3, unique_by=lambda c: c[0].split("=")[0])) for a in chunk
    ]
    target: dict = {
        "path": draw(st.sampled_from(["llama", "moonshotai/Kimi-K2.5", *[a + "/target" for a in absolute], "with space/model"])),
        "quantization": draw(st.sampled_from(["auto", "none", "bf16", "fp8", "int8", "int4", "fp4"])),
    }
    if draw(st.booleans()):
        target["contextLength"] = draw(st.sampled_from([2048, 8192, 131072, 262144]))
    return {
        "image": "lmsysorg/sglang:v0.5.23-cu130",
        "sglangVersion": "0.5.23",
        "model": {"mountPath": mount, "volume": {"hostPath": {"path": "/data"}}},
        "target": target,
        "drafter": drafter,
        "resources": {"gpus": draw(st.sampled_from([1, 2, 4, 8, 16]))},
        "sglang": sglang,
    }


@settings(max_examples=60, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=valid_specs())
def test_generated_specs_render_command_lines_sglang_accepts(server_parser, data):
    check_command_lines(server_parser, spec_of(data))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_render_command_lines_sglang_accepts(server_parser, path):
    _, spec = resource.load_custom_resource(str(path))
    check_command_lines(server_parser, spec)


def test_examples_exist():
    assert len(EXAMPLES) >= 2


# --------------------------------------------------------------------------------------------------
# Concrete expectations


def test_seed_kimi_command_line_is_exact():
    _, spec = resource.load_custom_resource(str(ROOT / "examples" / "kimi-k25-int4-eagle3.yaml"))
    assert sglang_args.render_argv(spec, "speculative") == [
        "sglang", "serve", "--model-type", "llm",
        "--model-path", "/models/kimi-k2.5-int4",
        "--host", "0.0.0.0", "--port", "30000", "--tp-size", "8",
        "--max-running-requests", "128", "--enable-metrics",
        "--speculative-algorithm", "EAGLE3",
        "--speculative-draft-model-path", "/models/eagle3/kimi-k2.5-custom-10k",
        "--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4",
    ]  # fmt: skip


def test_paths_are_joined_under_the_mount_and_absolute_paths_kept():
    spec = spec_of({**MINIMAL, "model": {"mountPath": "/w", "volume": {"hostPath": {"path": "/d"}}},
                    "target": {"path": "/w/t"}, "drafter": {"path": "./d/x/"}})  # fmt: skip
    assert sglang_args.target_model_path(spec) == "/w/t"
    assert sglang_args.draft_model_path(spec) == "/w/d/x"
    with pytest.raises(InputError, match="spec.model.mountPath"):
        spec_of({**MINIMAL, "model": {"mountPath": "/w/", "volume": {"hostPath": {"path": "/d"}}}})


def test_nextn_never_passes_a_draft_path_even_when_one_is_set():
    # Refused at admission now (tests/cluster/test_admission_cluster.py); an object admitted before that rule still renders.
    spec = resource.parse_spec({**MINIMAL, "drafter": {"algorithm": "NEXTN", "path": "mtp", "numSteps": 1}})
    argv = sglang_args.render_argv(spec, "speculative")
    assert "--speculative-draft-model-path" not in argv
    assert argv[argv.index("--speculative-algorithm") + 1] == "NEXTN"
    assert argv[argv.index("--speculative-num-draft-tokens") + 1] == "2"


@pytest.mark.parametrize("quantization", ["auto", "none", "bf16", "fp8", "int8", "int4", "fp4"])
def test_quantization_is_left_to_the_checkpoint(quantization):
    spec = spec_of({**MINIMAL, "target": {"path": "t", "quantization": quantization}})
    reference = spec_of({**MINIMAL, "target": {"path": "t"}})
    for variant in ("base", "speculative"):
        assert sglang_args.render_argv(spec, variant) == sglang_args.render_argv(reference, variant)
        assert not any(a.startswith("--quantization") for a in sglang_args.render_argv(spec, variant))


def test_optional_flags_only_when_set():
    argv = sglang_args.render_argv(spec_of(MINIMAL), "base")
    assert "--context-length" not in argv and "--mem-fraction-static" not in argv
    spec = spec_of({**MINIMAL, "target": {"path": "llama", "contextLength": 32768}, "sglang": {"memFractionStatic": 0.88}})
    argv = sglang_args.render_argv(spec, "base")
    assert argv[argv.index("--context-length") + 1] == "32768"
    assert argv[argv.index("--mem-fraction-static") + 1] == "0.88"


# --------------------------------------------------------------------------------------------------
# Removed flags and releases


def test_sglang_0_5_23_really_rejects_cuda_graph_max_bs(server_parser):
    """The test above could fail: 0.5.23's parser refuses the flag that 0.5.9 accepted (ambiguous prefix)."""
    with pytest.raises(AssertionError, match="ambiguous option: --cuda-graph-max-bs"):
        server_parser.parse_args(["--model-path", "/m", "--cuda-graph-max-bs", "256"])
    for flag, _ in sglang_args.RELEASES["0.5.23"].rejected_flags.items():
        with pytest.raises(AssertionError):
            server_parser.parse_args(["--model-path", "/m", flag, "1"])


def test_a_removed_flag_in_extra_args_is_refused_with_its_replacement():
    spec = spec_of({**MINIMAL, "sglang": {"extraArgs": ["--cuda-graph-max-bs=256"]}})
    with pytest.raises(InputError, match=r"spec\.sglang\.extraArgs: --cuda-graph-max-bs .*0\.5\.23.*--cuda-graph-max-bs-decode"):
        sglang_args.render_argv(spec, "base")
    old = spec_of({**MINIMAL, "image": OLD_IMAGE, "sglang": {"extraArgs": ["--cuda-graph-max-bs", "256"]}})
    assert sglang_args.render_argv(old, "base")[-2:] == ["--cuda-graph-max-bs", "256"]
    old_new_flag = spec_of({**MINIMAL, "image": OLD_IMAGE, "sglang": {"extraArgs": ["--cuda-graph-max-bs-decode", "8"]}})
    with pytest.raises(InputError, match="0.5.9"):
        sglang_args.render_argv(old_new_flag, "speculative")


@pytest.mark.parametrize(
    "extra, managed",
    [
        (["--max-running", "48"], "--max-running-requests"),
        (["--max-running-req=48"], "--max-running-requests"),
        (["--enable-metric"], "--enable-metrics"),
        (["--mem-frac", "0.5"], "--mem-fraction-static"),
        (["--context-len", "4096"], "--context-length"),
        (["--model-p", "/other"], "--model-path"),
    ],
)
def test_abbreviations_of_managed_flags_in_extra_args_are_refused(server_parser, extra, managed):
    """SGLang's parser takes prefixes of flags: the API's CEL rule refuses them, and so does the renderer (for
    objects admitted before that rule existed)."""
    with pytest.raises(InputError, match="spec.sglang.extraArgs"):
        spec_of({**MINIMAL, "sglang": {"extraArgs": extra}})
    spec = resource.parse_spec({**MINIMAL, "sglang": {"extraArgs": extra}})  # pydantic only, no CEL: an old object
    # The danger is real: appended last, an abbreviation with a value overrides what the operator set.
    flags = server_flags(spec, sglang_args.render_argv(spec_of(MINIMAL), "speculative")) + extra
    action = server_parser._option_string_actions[managed]
    if action.nargs != 0:
        assert getattr(server_parser.parse_args(flags), action.dest) != getattr(server_parser.parse_args(flags[: -len(extra)]), action.dest)
    with pytest.raises(InputError, match=f"spec.sglang.extraArgs: {extra[0].split('=')[0]} would set {managed}"):
        sglang_args.render_argv(spec, "speculative")


def test_unknown_release_names_the_field_and_the_supported_ones():
    with pytest.raises(InputError) as info:
        spec_of({**MINIMAL, "sglangVersion": "0.5.10"})
    message = str(info.value)
    assert message.startswith("spec: spec.sglangVersion: ")
    assert all(v in message for v in sglang_args.supported_versions())
    assert "\n" not in message


def test_release_table_covers_the_installed_wheel_and_the_default():
    import sglang.version

    assert sglang.version.__version__ in sglang_args.RELEASES
    assert set(sglang_args.RELEASES) == set(SGLANG_VERSIONS)  # what the API admits is what can be rendered
    assert sglang_args.supported_versions() == ["0.5.9", "0.5.22", "0.5.23"]


def test_older_release_uses_launch_server_with_the_same_flags():
    new = spec_of(MINIMAL)
    old = spec_of({**MINIMAL, "image": OLD_IMAGE})
    for variant in ("base", "speculative"):
        new_argv, old_argv = sglang_args.render_argv(new, variant), sglang_args.render_argv(old, variant)
        assert old_argv[:3] == ["python3", "-m", "sglang.launch_server"]
        assert old_argv[3:] == new_argv[4:]


def test_bad_variant_is_an_input_error():
    with pytest.raises(InputError, match="variant"):
        sglang_args.render_argv(spec_of(MINIMAL), "canary")


def test_sglang_serve_dispatches_the_rendered_command_to_the_llm_server(server_parser, monkeypatch):
    """Run the real `sglang` console entrypoint up to the point where it would start the server."""
    import sys

    import sglang.cli.main
    import sglang.cli.serve

    captured = {}
    monkeypatch.setattr(sglang.cli.serve, "_run_llm", lambda request: captured.setdefault("argv", list(request.argv)))
    monkeypatch.setattr(sglang.cli.serve, "_run_diffusion", lambda request: pytest.fail("dispatched to diffusion"))
    monkeypatch.setattr(sglang.cli.serve, "kill_process_tree", lambda *a, **k: None)  # would kill pytest's children
    monkeypatch.setattr("sglang.srt.plugins.load_plugins", lambda: None)
    _, spec = resource.load_custom_resource(str(ROOT / "examples" / "llama31-8b-eagle3.yaml"))
    argv = sglang_args.render_argv(spec, "speculative")
    assert argv[0] == "sglang"
    monkeypatch.setattr(sys, "argv", argv)
    sglang.cli.main.main()
    assert captured["argv"] == server_flags(spec, argv)
    namespace, _ = parse(server_parser, captured["argv"])
    assert namespace.speculative_algorithm == "EAGLE3"


# --------------------------------------------------------------------------------------------------
# `specdec sglang-args`


def write_cr(tmp_path, spec: dict, name="cr.yaml") -> str:
    import yaml

    path = tmp_path / name
    path.write_text(yaml.safe_dump({"apiVersion": "specdec.io/v1alpha1", "kind": "SpeculativeServer",
                                    "metadata": {"name": "x"}, "spec": spec}))  # fmt: skip
    return str(path)


@pytest.mark.parametrize("variant", ["base", "speculative"])
def test_cli_prints_the_rendered_command_as_json(tmp_path, capsys, variant):
    spec = copy.deepcopy(MINIMAL)
    spec["target"] = {"path": "my model"}
    path = write_cr(tmp_path, spec)
    assert cli.main(["sglang-args", "-f", path, "--variant", variant]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    assert json.loads(out) == sglang_args.render_argv(spec_of(spec), variant)


def test_cli_shell_line_round_trips(tmp_path, capsys):
    spec = copy.deepcopy(MINIMAL)
    spec["target"] = {"path": "it's a model"}
    path = write_cr(tmp_path, spec)
    assert cli.main(["sglang-args", "-f", path, "--variant", "speculative", "--shell"]) == 0
    assert shlex.split(capsys.readouterr().out) == sglang_args.render_argv(spec_of(spec), "speculative")


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--variant", "base"], "-f/--filename"),
        (["-f", "{missing}", "--variant", "base"], "cannot read"),
        (["-f", "{cr}", "--variant", "canary"], "invalid choice"),
        (["-f", "{cr}"], "--variant"),
        (["-f", "{old}", "--variant", "base"], "spec.sglangVersion"),
        (["-f", "{removed}", "--variant", "speculative"], "spec.sglang.extraArgs"),
    ],
)
def test_cli_errors_are_one_line_and_exit_2(tmp_path, capsys, args, expected):
    paths = {
        "missing": str(tmp_path / "nope.yaml"),
        "cr": write_cr(tmp_path, MINIMAL),
        "old": write_cr(tmp_path, {**MINIMAL, "sglangVersion": "0.4.0"}, "old.yaml"),
        "removed": write_cr(tmp_path, {**MINIMAL, "sglang": {"extraArgs": ["--cuda-graph-max-bs", "8"]}}, "removed.yaml"),
    }
    assert cli.main(["sglang-args", *[a.format(**paths) for a in args]]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and expected in captured.err
    assert captured.err.startswith("specdec sglang-args: error: ")
