"""spec.engine (issue 26): the engine seam (engines/), vLLM's command lines as vLLM 0.32's own parser reads them, the
load-aware schedule as vLLM's validator expands it, and admission of each engine's settings (one line naming the field)."""

from __future__ import annotations

import copy
import json

import pytest

from specdec_operator import enginefacts
from specdec_operator import manifests as m
from specdec_operator import sglang as sglang_argv
from specdec_operator.api import Variant
from specdec_operator.engines import default_engine, engine_for, engine_named
from specdec_operator.engines.sglang import SGLANG
from specdec_operator.engines.vllm import ENTRYPOINT, VLLM
from specdec_operator.errors import InputError
from specdec_operator.resource import parse_spec, speculative_revision
from tests.support.vllm_args import parse_with_vllm, vllm_missing

SGLANG_SPEC = {
    "image": "lmsysorg/sglang:v0.5.23-cu130",
    "model": {"volume": {"persistentVolumeClaim": {"claimName": "weights"}}},
    "target": {"path": "llama-3.1-8b"},
    "drafter": {"path": "eagle3/llama", "numSteps": 3},
}
VLLM_SPEC = {**copy.deepcopy(SGLANG_SPEC), "engine": "vLLM", "image": "vllm/vllm-openai:v0.32.0"}


def spec_of(raw: dict, **changes):
    out = copy.deepcopy(raw)
    for path, value in changes.items():
        node = out
        *keys, last = path.split("__")
        for key in keys:
            node = node.setdefault(key, {})
        node[last] = value
    return parse_spec(out, check_rules=True)


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_the_spec_names_its_engine_and_sglang_is_the_default():
    assert engine_for(parse_spec(SGLANG_SPEC)) is SGLANG
    assert engine_for(parse_spec(VLLM_SPEC)) is VLLM
    assert engine_for(None) is default_engine() is SGLANG  # enginefacts.DEFAULT, the one place that says so
    assert SGLANG.facts is enginefacts.DEFAULT and VLLM.facts is enginefacts.VLLM
    assert engine_named("vllm") is VLLM and engine_named("sglang") is SGLANG  # the CLIs' names
    with pytest.raises(InputError, match="spec.engine: 'TensorRT' is not one of SGLang, vLLM"):
        engine_named("TensorRT")


def test_the_sglang_engine_renders_what_sglang_py_renders():
    spec = parse_spec(SGLANG_SPEC)
    for variant in Variant:
        assert SGLANG.render_argv(spec, variant) == sglang_argv.render_argv(spec, variant)
    adaptive = SGLANG.render_argv(spec, Variant.SPECULATIVE, adaptive_config_path="/etc/t.json", adaptive_config="{}")
    assert adaptive[-3:] == ["--speculative-adaptive", "--speculative-adaptive-config", "/etc/t.json"]


def test_vllm_command_lines_differ_only_in_the_speculative_config():
    spec = spec_of(VLLM_SPEC, vllm={"gpuMemoryUtilization": 0.85, "extraArgs": ["--enforce-eager"]}, target__contextLength=8192)
    base, speculative = VLLM.render_argv(spec, "base"), VLLM.render_argv(spec, "speculative")
    assert base[:3] == list(ENTRYPOINT)
    assert flag(base, "--model") == "/models/llama-3.1-8b" and flag(base, "--served-model-name") == "llama-3.1-8b"
    assert (flag(base, "--host"), flag(base, "--port"), flag(base, "--tensor-parallel-size")) == ("0.0.0.0", "30000", "8")
    assert (flag(base, "--max-num-seqs"), flag(base, "--max-model-len"), flag(base, "--gpu-memory-utilization")) == ("128", "8192", "0.85")
    assert base[-1] == "--enforce-eager"  # extraArgs last
    cut = speculative.index("--speculative-config")
    assert speculative[:cut] + speculative[cut + 2 :] == base
    assert json.loads(speculative[cut + 1]) == {"method": "eagle3", "model": "/models/eagle3/llama", "num_speculative_tokens": 3}


def test_vllm_renders_eagle_and_nextn_methods_and_refuses_multi_node():
    eagle = VLLM.render_argv(spec_of(VLLM_SPEC, drafter__algorithm="EAGLE"), "speculative")
    assert json.loads(flag(eagle, "--speculative-config"))["method"] == "eagle"
    mtp = spec_of(VLLM_SPEC, drafter={"algorithm": "NEXTN", "numSteps": 1})
    assert json.loads(flag(VLLM.render_argv(mtp, "speculative"), "--speculative-config")) == {"method": "mtp", "num_speculative_tokens": 1}
    named = spec_of(VLLM_SPEC, vllm={"servedModelName": "meta-llama/Llama-3.1-8B"})
    assert flag(VLLM.render_argv(named, "base"), "--served-model-name") == "meta-llama/Llama-3.1-8B"
    with pytest.raises(InputError, match="^spec.resources.nodes: engine vLLM serves one node per server"):
        VLLM.render_argv(parse_spec(SGLANG_SPEC), "base", worker=True)


def test_load_aware_speculation_is_vllms_per_batch_size_schedule_inline():
    spec = spec_of(VLLM_SPEC, vllm={"maxNumSeqs": 256})
    schedule = VLLM.adaptive_document(16, 3, spec)
    assert schedule == [[1, 15, 3], [16, 256, 0]]
    argv = VLLM.render_argv(spec, "speculative", adaptive_config_path="/etc/specdec/adaptive/config.json", adaptive_config=json.dumps(schedule))
    assert json.loads(flag(argv, "--speculative-config"))["num_speculative_tokens_per_batch_size"] == schedule
    assert "/etc/specdec/adaptive/config.json" not in argv  # vLLM takes the table inline, not from the file
    # SGLang's table for the same curve: one bucket drafting, one not.
    assert SGLANG.adaptive_document(16, 3) == {"1": {"candidate_steps": [3]}, "16": {"candidate_steps": [0]}}
    assert VLLM.adaptive_unsupported_reason(spec) is None
    dp = spec_of(VLLM_SPEC, vllm={"extraArgs": ["--data-parallel-size", "2"]})
    assert "data_parallel_size > 1" in (VLLM.adaptive_unsupported_reason(dp) or "")


@pytest.mark.parametrize(
    ("changes", "where", "words"),
    [
        ({"sglangVersion": "0.5.23"}, "spec.sglangVersion", "sglangVersion is an SGLang setting"),
        ({"sglang": {"extraArgs": ["--enable-torch-compile"]}}, "spec.sglang", "use spec.vllm"),
        ({"sglang": {"maxRunningRequests": 64}}, "spec.sglang", "use spec.vllm"),
        ({"resources": {"nodes": 2, "gpus": 8}}, "spec.resources.nodes", "needs engine SGLang"),
        ({"drafter": {"path": "d", "numSteps": 3, "eagleTopk": 2, "numDraftTokens": 6}}, "spec.drafter.eagleTopk", "needs engine SGLang"),
        ({"vllm": {"extraArgs": ["--speculative-config.method", "ngram"]}}, "spec.vllm.extraArgs", "flags the operator manages"),
        ({"vllm": {"extraArgs": ["--max-num-seq", "4"]}}, "spec.vllm.extraArgs", "flags the operator manages"),
        ({"vllm": {"extraArgs": ["-tp", "2"]}}, "spec.vllm.extraArgs", "flags the operator manages"),
        ({"vllm": {"extraArgs": ["--served_model_name=x"]}}, "spec.vllm.extraArgs", "flags the operator manages"),
        ({"vllm": {"extraArgs": ["--disable-log-stats"]}}, "spec.vllm.extraArgs", "flags the operator manages"),
    ],
)
def test_vllm_refuses_sglang_settings_and_managed_flags_in_one_line(changes, where, words):
    raw = {**copy.deepcopy(VLLM_SPEC), **changes}
    with pytest.raises(InputError) as err:
        parse_spec(raw, check_rules=True)
    message = str(err.value)
    assert message.startswith(f"spec: {where}: ") and words in message and "\n" not in message, message


def test_sglang_refuses_vllm_settings_and_each_engine_accepts_its_own():
    with pytest.raises(InputError, match=r"^spec: spec.vllm: vllm settings apply to engine vLLM only"):
        parse_spec({**SGLANG_SPEC, "vllm": {"maxNumSeqs": 64}}, check_rules=True)
    parsed = spec_of(VLLM_SPEC, vllm={"maxNumSeqs": 64, "extraArgs": ["--enforce-eager", "--dtype=float32"], "env": [{"name": "A", "value": "1"}]})
    assert parsed.vllm is not None and parsed.vllm.max_num_seqs == 64
    assert parsed.sglang_version is None  # an SGLang setting: never filled in for vLLM
    assert parse_spec(SGLANG_SPEC, check_rules=True).sglang_version == "0.5.23"


def test_the_engine_is_part_of_the_revision_and_sglang_specs_keep_theirs():
    sglang = parse_spec(SGLANG_SPEC)
    assert speculative_revision(parse_spec({**SGLANG_SPEC, "engine": "SGLang"})) == speculative_revision(sglang)
    # The revision of an SGLang spec as it was before spec.engine existed (fixed: a change here re-probes every server).
    assert speculative_revision(sglang) == speculative_revision(parse_spec(copy.deepcopy(SGLANG_SPEC)))
    vllm = parse_spec(VLLM_SPEC)
    assert speculative_revision(vllm) != speculative_revision(parse_spec({**VLLM_SPEC, "vllm": {"maxNumSeqs": 64}}))
    assert speculative_revision(vllm) != speculative_revision(parse_spec({**SGLANG_SPEC, "image": VLLM_SPEC["image"]}))


def test_a_vllm_pod_runs_the_vllm_container_with_its_health_endpoint_and_env():
    spec = spec_of(VLLM_SPEC, vllm={"env": [{"name": "VLLM_CPU_KVCACHE_SPACE", "value": "4"}]})
    template = m.pod_template("srv", spec, "speculative", VLLM.render_argv(spec, "speculative"), "rev", m.ManifestSettings())
    container = template["spec"]["containers"][0]
    assert container["name"] == "vllm" and container["name"] in m.SERVER_CONTAINERS
    assert {p: container[p]["httpGet"]["path"] for p in ("startupProbe", "readinessProbe", "livenessProbe")} == dict.fromkeys(
        ("startupProbe", "readinessProbe", "livenessProbe"), "/health"
    )
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "4" and m.ALLOW_LONGER_DRAFT_CONTEXT_ENV not in env
    validator = template["spec"]["initContainers"][0]["command"]
    assert validator[validator.index("--engine") + 1] == "vllm"
    sglang_spec = parse_spec(SGLANG_SPEC)
    sglang_validator = m.validator_container(sglang_spec, m.ManifestSettings())
    assert sglang_validator is not None and "--engine" not in sglang_validator["command"]  # unchanged for SGLang pods


# ---------------------------------------------------------------------------------------------------------
# vLLM 0.32's own parser (the CPU build in ~/.cache/specdec-operator/vllm-venv; skipped where it is not installed)

SPECS = {
    "minimal": VLLM_SPEC,
    "everything": {
        **VLLM_SPEC,
        "target": {"path": "llama", "contextLength": 4096},
        "resources": {"gpus": 2},
        "vllm": {"maxNumSeqs": 48, "gpuMemoryUtilization": 0.8, "servedModelName": "team/llama", "extraArgs": ["--enforce-eager", "--dtype=float32"]},
    },
    "nextn": {**VLLM_SPEC, "drafter": {"algorithm": "NEXTN", "numSteps": 2}},
}


@pytest.fixture(scope="module")
def vllm_parsed():
    missing = vllm_missing()
    if missing is not None:
        pytest.skip(missing)
    argvs = {}
    for name, raw in SPECS.items():
        spec = parse_spec(raw, check_rules=True)
        for variant in Variant:
            argvs[f"{name}/{variant}"] = VLLM.render_argv(spec, variant)
    minimal = parse_spec(VLLM_SPEC)
    argvs["adaptive"] = VLLM.render_argv(minimal, "speculative", adaptive_config=json.dumps(VLLM.adaptive_document(12, 3, minimal)))
    # What admission refuses in vllm.extraArgs does reach the managed flags in vLLM's parser.
    argvs["abbreviated"] = VLLM.render_argv(minimal, "base") + ["--max-num-seq", "4"]
    argvs["dotted"] = VLLM.render_argv(minimal, "speculative") + ["--speculative-config.num_speculative_tokens", "7"]
    return dict(zip(argvs, parse_with_vllm(list(argvs.values())), strict=True))


def test_vllms_parser_reads_every_rendered_command_line_as_the_spec_says(vllm_parsed):
    parsed = vllm_parsed
    assert not [name for name, p in parsed.items() if "error" in p], {n: p for n, p in parsed.items() if "error" in p}
    for name, raw in SPECS.items():
        spec = parse_spec(raw)
        base, speculative = parsed[f"{name}/base"], parsed[f"{name}/speculative"]
        own = VLLM.render_argv(spec, "speculative")
        assert base["model"] == speculative["model"] == f"/models/{spec.target.path}"
        assert base["served_model_name"] == [flag(own, "--served-model-name")]
        assert (base["host"], base["port"], base["tensor_parallel_size"]) == ("0.0.0.0", 30000, spec.resources.gpus)
        assert base["max_num_seqs"] == (spec.vllm.max_num_seqs if spec.vllm else 128)
        assert base["max_model_len"] == spec.target.context_length
        assert base["speculative_config"] is None and base["disable_log_stats"] is False  # the monitor reads vLLM's metrics
        assert speculative["speculative_config"] == json.loads(flag(own, "--speculative-config"))
        assert {k: v for k, v in base.items() if k != "speculative_config"} == {k: v for k, v in speculative.items() if k != "speculative_config"}
    everything = parsed["everything/base"]
    assert (everything["gpu_memory_utilization"], everything["enforce_eager"], everything["dtype"]) == (0.8, True, "float32")


def test_vllms_schedule_lookup_drafts_below_the_break_even_and_never_from_it(vllm_parsed):
    parsed = vllm_parsed
    lookup = parsed["adaptive"]["schedule_lookup"]  # index = batch size (0 unused), up to max_num_seqs
    assert len(lookup) == 128 + 1
    assert lookup[1:12] == [3] * 11 and lookup[12:] == [0] * (128 - 11)


def test_abbreviated_and_dotted_flags_reach_the_managed_ones_so_admission_refuses_them(vllm_parsed):
    parsed = vllm_parsed
    assert parsed["abbreviated"]["max_num_seqs"] == 4
    assert parsed["dotted"]["speculative_config"]["num_speculative_tokens"] == 7
    for raw in (["--max-num-seq", "4"], ["--speculative-config.num_speculative_tokens", "7"]):
        with pytest.raises(InputError, match="spec.vllm.extraArgs"):
            parse_spec({**VLLM_SPEC, "vllm": {"extraArgs": raw}}, check_rules=True)


def test_the_clis_speak_the_spec_engine(tmp_path, capsys):
    import yaml

    from specdec_operator.cli import main as specdec_main

    cr = {"apiVersion": "specdec.io/v1alpha1", "kind": "SpeculativeServer", "metadata": {"name": "v"}, "spec": VLLM_SPEC}
    (tmp_path / "v.yaml").write_text(yaml.safe_dump(cr))
    assert specdec_main(["sglang-args", "-f", str(tmp_path / "v.yaml"), "--variant", "speculative"]) == 0
    assert json.loads(capsys.readouterr().out) == VLLM.render_argv(parse_spec(VLLM_SPEC), "speculative")
    document = {"break_even": {"concurrency": 20.0, "low": 12.0, "high": 30.0, "summary": "20 [12, 30]"}}
    (tmp_path / "probe.json").write_text(json.dumps(document))
    assert specdec_main(["adaptive-config", "--probe-json", str(tmp_path / "probe.json"), "--num-steps", "3", "--engine", "vllm"]) == 0
    assert json.loads(capsys.readouterr().out) == [[1, 11, 3], [12, 128, 0]]


def test_vllm_with_an_sglang_image_is_refused_in_one_line():
    with pytest.raises(InputError) as err:
        parse_spec({**VLLM_SPEC, "image": "lmsysorg/sglang:v0.5.23-cu130"}, check_rules=True)
    assert str(err.value).startswith("spec: spec.image: ") and "engine vLLM needs a vLLM image" in str(err.value)
