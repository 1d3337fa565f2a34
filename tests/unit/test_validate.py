"""`specdec validate`: every finding code on realistic model directories, and the CLI contract."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from specdec_operator import validator
from specdec_operator.errors import InputError
from specdec_operator.validator import ValidationReport, validate
from specdec_operator.validator.modelmeta import read_model_dir
from tests.support import model_dirs as md


def check(
    target: Path, drafter: Path, *, quantization: str | None = None, context_length: int | None = None, algorithm: str = "EAGLE3"
) -> ValidationReport:
    """Validate a pair exactly as the CLI does (validator.run), without a subprocess."""
    argv = ["--target", str(target), "--drafter", str(drafter), "--algorithm", algorithm]
    if quantization:
        argv += ["--quantization", quantization]
    if context_length:
        argv += ["--context-length", str(context_length)]
    report, _ = validator.run(validator.build_parser().parse_args(argv))
    return report


def finding(report: ValidationReport, code: str) -> validator.Finding:
    matches = [f for f in report.findings if f.code == code]
    assert matches, f"{code} not in {report.codes()}"
    return matches[0]


def cli(*args: str | Path, check_rc: int | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "specdec_operator.cli", "validate", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if check_rc is not None:
        assert proc.returncode == check_rc, (proc.returncode, proc.stdout, proc.stderr)
    return proc


# -- fixtures: the pairs people actually deploy -------------------------------------------------------


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {
        "kimi25": md.make_target(root / "Kimi-K2.5", md.kimi_k25(), tokenizer_config=md.KIMI_TOKENIZER, shards=8),
        "kimi25_textq": md.make_target(root / "Kimi-K2.5-textq", md.kimi_k25(quantization_in_text_config=True), shards=2),
        "kimi_k2": md.make_target(root / "Kimi-K2-Instruct", md.KIMI_K2, tokenizer_config=md.KIMI_TOKENIZER, shards=4),
        "deepseek_v3": md.make_target(root / "DeepSeek-V3", md.DEEPSEEK_V3, shards=4),
        "llama8b": md.make_target(root / "Llama-3.1-8B-Instruct", md.LLAMA_31_8B, tokenizer_config=md.LLAMA_31_TOKENIZER),
        "qwen3": md.make_target(root / "Qwen3-8B", md.QWEN3_8B, tokenizer_config=md.QWEN3_TOKENIZER),
        "kimi_draft": md.make_drafter(
            root / "Kimi-K2.5-eagle3", md.kimi_drafter_config(), provenance=md.provenance(), tokenizer_config=md.KIMI_TOKENIZER
        ),
        "llama_draft": md.make_drafter(root / "EAGLE3-LLaMA3.1-Instruct-8B", md.llama31_8b_drafter_config()),
        "qwen3_draft": md.make_drafter(root / "Qwen3-8B-eagle3", md.qwen3_8b_drafter_config(), shards=2),
    }


# -- compatible pairs ------------------------------------------------------------------------------------


def test_kimi_k25_int4_with_matching_drafter_is_clean(dirs: dict[str, Path]) -> None:
    report = check(dirs["kimi25"], dirs["kimi_draft"])
    assert report.compatible
    assert report.codes("error") == [] and report.codes("warning") == []
    assert report.serving_quantization == "int4"
    # The wrapper's language-model fields come from text_config.
    assert report.target["text_config"] == "text_config"
    assert (report.target["hidden_size"], report.target["num_hidden_layers"]) == (7168, 61)
    # DeepSeek-family targets take [2, 30, 58] as input indices unchanged (first id != 1).
    assert "[2, 30, 58]" in finding(report, "AuxLayers").message


def test_quantization_config_inside_text_config_is_found(dirs: dict[str, Path]) -> None:
    report = check(dirs["kimi25_textq"], dirs["kimi_draft"])
    assert report.serving_quantization == "int4" and report.compatible


def test_llama_pair_compatible_but_drafter_context_is_short(dirs: dict[str, Path]) -> None:
    report = check(dirs["llama8b"], dirs["llama_draft"])
    assert report.compatible and report.serving_quantization == "bf16"
    warn = finding(report, "ContextLengthExceedsDrafter")
    assert "131072" in warn.message and "2048" in warn.message
    assert "AuxLayersDefaulted" in report.codes("info")
    assert "[2, 16, 29]" in finding(report, "AuxLayersDefaulted").message
    # bf16 target without provenance: nothing to warn about.
    assert "ProvenanceMissing" not in report.codes()
    # Serving with a context the drafter covers silences the warning.
    assert "ContextLengthExceedsDrafter" not in check(dirs["llama8b"], dirs["llama_draft"], context_length=2048).codes()


def test_hugging_face_cache_layout_with_symlinked_blobs(tmp_path: Path, dirs: dict[str, Path]) -> None:
    # huggingface_hub snapshots are directories of relative symlinks into ../../blobs.
    built = md.make_drafter(tmp_path / "build", md.kimi_drafter_config(), provenance=md.provenance())
    repo = tmp_path / "hub" / "models--acme--Kimi-K2.5-eagle3"
    snapshot, blobs = repo / "snapshots" / ("a" * 40), repo / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    for i, f in enumerate(sorted(built.iterdir())):
        f.rename(blobs / f"blob{i}")
        (snapshot / f.name).symlink_to(Path("..", "..", "blobs", f"blob{i}"))
    report = check(dirs["kimi25"], snapshot)
    assert report.compatible and report.drafter["tensors"] == 15


def test_sharded_qwen3_drafter_headers_are_merged(dirs: dict[str, Path]) -> None:
    report = check(dirs["qwen3"], dirs["qwen3_draft"])
    assert report.compatible, report.findings
    assert report.drafter["weight_files"] == 2 and report.drafter["tensors"] == 15
    # Qwen3 adds 1 to every id: [1, 17, 32] -> inputs of layers [2, 18, 33].
    assert "[2, 18, 33]" in finding(report, "AuxLayers").message


# -- errors --------------------------------------------------------------------------------------------


def test_target_architecture_without_aux_capture(tmp_path: Path, dirs: dict[str, Path]) -> None:
    mixtral = dict(
        md.LLAMA_31_8B,
        architectures=["MixtralForCausalLM"],
        model_type="mixtral",
        vocab_size=32000,
        num_local_experts=8,
        num_experts_per_tok=2,
        max_position_embeddings=32768,
        rope_scaling=None,
    )
    target = md.make_target(tmp_path / "Mixtral-8x7B", mixtral)
    drafter = md.make_drafter(tmp_path / "d", md.eagle3_config(hidden=4096, vocab=32000, max_position=32768))
    report = check(target, drafter)
    f = finding(report, "TargetArchitectureUnsupported")
    assert f.severity == "error" and "MixtralForCausalLM" in f.message and not report.compatible


def test_vllm_named_drafter_gets_rename_advice(tmp_path: Path, dirs: dict[str, Path]) -> None:
    cfg = md.llama31_8b_drafter_config(architectures=["Eagle3LlamaForCausalLM"])
    report = check(dirs["llama8b"], md.make_drafter(tmp_path / "d", cfg))
    f = finding(report, "DrafterArchitectureUnsupported")
    assert "LlamaForCausalLMEagle3" in f.message and not report.compatible


def test_vllms_own_draft_class_name_is_refused_for_sglang_only(tmp_path: Path, dirs: dict[str, Path]) -> None:
    cfg = md.llama31_8b_drafter_config(architectures=["Eagle3LlamaForCausalLM"])
    drafter = md.make_drafter(tmp_path / "d", cfg)
    argv = ["--target", str(dirs["llama8b"]), "--drafter", str(drafter), "--engine", "vllm"]
    report, _ = validator.run(validator.build_parser().parse_args(argv))
    assert "DrafterArchitectureUnsupported" not in report.codes(), report.codes()
    assert "DrafterArchitectureUnsupported" in check(dirs["llama8b"], drafter).codes("error")


def test_speculators_format_drafter_gets_conversion_advice(tmp_path: Path, dirs: dict[str, Path]) -> None:
    cfg = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": "0.2.0",
        "draft_vocab_size": 32000,
        "norm_before_residual": True,
        "target_hidden_size": None,
        "transformer_layer_config": dict(md.LLAMA_31_8B, num_hidden_layers=1),
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
            "verifier": {"name_or_path": "meta-llama/Llama-3.1-8B-Instruct", "architectures": ["LlamaForCausalLM"]},
        },
    }
    tensors = {k.replace("midlayer.", "layers.0."): v for k, v in md.eagle3_tensors(md.llama31_8b_drafter_config()).items()}
    report = check(dirs["llama8b"], md.make_drafter(tmp_path / "d", cfg, tensors=tensors))
    f = finding(report, "DrafterArchitectureUnsupported")
    assert "speculators" in f.message and "norm_before_residual" in f.message
    assert report.codes("error") == ["DrafterArchitectureUnsupported"]


def test_full_model_passed_as_drafter(dirs: dict[str, Path]) -> None:
    report = check(dirs["llama8b"], dirs["llama8b"])
    assert "full model" in finding(report, "DrafterArchitectureUnsupported").message
    # A 61-layer MoE passed as drafter is refused from its config: no shard header is parsed.
    kimi = check(dirs["kimi25"], dirs["kimi_k2"])
    assert "DeepseekV3ForCausalLM" in finding(kimi, "DrafterArchitectureUnsupported").message
    assert "NEXTN" not in finding(kimi, "DrafterArchitectureUnsupported").message  # Kimi-K2 has no MTP layers
    assert "tensors" not in kimi.drafter and kimi.drafter["bytes_read"] < 20_000
    deepseek = check(dirs["kimi25"], dirs["deepseek_v3"])
    assert "--algorithm NEXTN" in finding(deepseek, "DrafterArchitectureUnsupported").message


def test_eagle_drafter_with_eagle3_and_the_reverse(tmp_path: Path, dirs: dict[str, Path]) -> None:
    eagle_cfg = dict(md.LLAMA_31_8B, architectures=["LlamaForCausalLMEagle"], num_hidden_layers=1)
    eagle_dir = md.make_drafter(tmp_path / "eagle", eagle_cfg, tensors={"fc.weight": ("BF16", [4096, 8192])})
    assert "--algorithm EAGLE" in finding(check(dirs["llama8b"], eagle_dir), "AlgorithmMismatch").message
    ok = check(dirs["llama8b"], eagle_dir, algorithm="EAGLE")
    assert ok.compatible, ok.findings
    wrong = check(dirs["llama8b"], dirs["llama_draft"], algorithm="EAGLE")
    assert "EAGLE3" in finding(wrong, "AlgorithmMismatch").message and not wrong.compatible


def test_hidden_size_mismatch(tmp_path: Path, dirs: dict[str, Path]) -> None:
    # A Llama-3.3-70B drafter (hidden 8192) against the 8B target.
    cfg = md.eagle3_config(hidden=8192, vocab=128256, heads=64, intermediate=28672)
    report = check(dirs["llama8b"], md.make_drafter(tmp_path / "d70", cfg))
    f = finding(report, "HiddenSizeMismatch")
    assert "8192" in f.message and "4096" in f.message and f.field == "drafter.config.hidden_size"


def test_target_hidden_size_decides_fc_width_and_needs_own_embeddings(tmp_path: Path, dirs: dict[str, Path]) -> None:
    # A small drafter (hidden 4096) for the Kimi target (7168): legal with target_hidden_size,
    # but SGLang then does not share the target's embeddings, so the checkpoint must carry them.
    cfg = md.kimi_drafter_config(hidden=4096, heads=32, intermediate=14336, target_hidden=7168)
    no_embed = check(dirs["kimi25"], md.make_drafter(tmp_path / "a", cfg, provenance=md.provenance()))
    assert "HiddenSizeMismatch" not in no_embed.codes()
    assert "embed_tokens.weight" in finding(no_embed, "MissingDrafterWeights").message
    tensors = md.eagle3_tensors(cfg, num_aux=3)
    tensors["embed_tokens.weight"] = ("BF16", [163840, 4096])
    with_embed = check(dirs["kimi25"], md.make_drafter(tmp_path / "b", cfg, tensors=tensors, provenance=md.provenance()))
    assert with_embed.compatible, with_embed.findings
    wrong = md.kimi_drafter_config(hidden=4096, heads=32, intermediate=14336, target_hidden=5120)
    assert "5120" in finding(check(dirs["kimi25"], md.make_drafter(tmp_path / "c", wrong)), "HiddenSizeMismatch").message


def test_vocab_size_mismatch(dirs: dict[str, Path]) -> None:
    # Llama-3.1 drafter (128256) on Qwen3-8B (151936): same hidden size, other tokenizer.
    report = check(dirs["qwen3"], dirs["llama_draft"])
    f = finding(report, "VocabSizeMismatch")
    assert "128256" in f.message and "151936" in f.message
    assert "HiddenSizeMismatch" not in report.codes()


def test_draft_vocab_too_large(tmp_path: Path, dirs: dict[str, Path]) -> None:
    cfg = md.kimi_drafter_config(draft_vocab_size=200000)
    report = check(dirs["kimi25"], md.make_drafter(tmp_path / "d", cfg, provenance=md.provenance()))
    assert "200000" in finding(report, "DraftVocabTooLarge").message


@pytest.mark.parametrize(
    "target,ids,bad",
    [
        ("qwen3", [1, 17, 35], "[35]"),  # Qwen3 (36 layers) captures id+1 = 36: never produced
        ("kimi25", [2, 30, 61], "[61]"),  # DeepSeek family, first id != 1: used as is, 61 >= 61
        ("kimi25", [1, 29, 60], "[60]"),  # DeepSeek family, first id == 1: +1 -> 61
        ("llama8b", [-1, 15, 28], "[-1]"),
    ],
)
def test_aux_layer_out_of_range(tmp_path: Path, dirs: dict[str, Path], target: str, ids: list[int], bad: str) -> None:
    base = {"qwen3": md.qwen3_8b_drafter_config, "kimi25": md.kimi_drafter_config, "llama8b": md.llama31_8b_drafter_config}[target]
    drafter = md.make_drafter(tmp_path / "d", base(aux_layer_ids=ids), provenance=md.provenance())
    f = finding(check(dirs[target], drafter), "AuxLayerOutOfRange")
    assert bad in f.message and f.severity == "error"


def test_aux_layer_in_range_at_the_edge(tmp_path: Path, dirs: dict[str, Path]) -> None:
    # DeepSeek family, first id != 1: 60 is the last layer's input, still produced.
    drafter = md.make_drafter(tmp_path / "d", md.kimi_drafter_config(aux_layer_ids=[2, 30, 60]), provenance=md.provenance())
    assert check(dirs["kimi25"], drafter).compatible


def test_aux_layers_duplicated_and_count_disagreeing(tmp_path: Path, dirs: dict[str, Path]) -> None:
    dup = md.make_drafter(tmp_path / "dup", md.kimi_drafter_config(aux_layer_ids=[2, 2, 58]), provenance=md.provenance())
    assert "AuxLayersDuplicated" in check(dirs["kimi25"], dup).codes("error")
    cfg = md.kimi_drafter_config(num_aux_hidden_states=4)
    count = md.make_drafter(tmp_path / "count", cfg, tensors=md.eagle3_tensors(cfg), provenance=md.provenance())
    assert "num_aux_hidden_states 4 != 3" in finding(check(dirs["kimi25"], count), "AuxLayerOutOfRange").message


def test_aux_hidden_states_disabled(tmp_path: Path, dirs: dict[str, Path]) -> None:
    cfg = md.kimi_drafter_config()
    cfg["eagle_config"]["use_aux_hidden_state"] = False
    report = check(dirs["kimi25"], md.make_drafter(tmp_path / "d", cfg, provenance=md.provenance()))
    assert finding(report, "AuxHiddenStatesDisabled").severity == "error"


@pytest.mark.parametrize("dropped", ["lm_head.weight", "fc.weight", "d2t", "midlayer.self_attn.q_proj.weight"])
def test_missing_drafter_weights(tmp_path: Path, dirs: dict[str, Path], dropped: str) -> None:
    drafter = md.make_drafter(tmp_path / "d", md.kimi_drafter_config(), drop=(dropped,), provenance=md.provenance())
    f = finding(check(dirs["kimi25"], drafter), "MissingDrafterWeights")
    assert dropped.replace("midlayer.", "layers.0.") in f.message and "silently" in f.message


def test_lm_head_not_needed_when_shared_with_target(tmp_path: Path, dirs: dict[str, Path]) -> None:
    # draft_vocab_size null and untied embeddings: SGLang takes lm_head from the target.
    cfg = md.llama31_8b_drafter_config(draft_vocab_size=None, max_position=131072)
    drafter = md.make_drafter(tmp_path / "d", cfg, drop=("lm_head.weight",))
    report = check(dirs["llama8b"], drafter)
    assert report.compatible, report.findings


def test_draft_vocab_size_key_is_required_for_untied_llama_drafts(tmp_path: Path, dirs: dict[str, Path]) -> None:
    cfg = md.llama31_8b_drafter_config(max_position=131072)
    tensors = md.eagle3_tensors(cfg)
    del cfg["draft_vocab_size"]
    report = check(dirs["llama8b"], md.make_drafter(tmp_path / "d", cfg, tensors=tensors))
    assert "AttributeError" in finding(report, "DrafterConfigIncomplete").message and not report.compatible
    tied = check(dirs["llama8b"], md.make_drafter(tmp_path / "t", dict(cfg, tie_word_embeddings=True), tensors=tensors))
    assert "DrafterConfigIncomplete" not in tied.codes()
    untyped = {k: v for k, v in md.llama31_8b_drafter_config(max_position=131072).items() if k != "model_type"}
    no_type = check(dirs["llama8b"], md.make_drafter(tmp_path / "m", untyped, tensors=tensors))
    assert "model_type" in finding(no_type, "DrafterConfigIncomplete").message


def test_drafter_without_any_weights(tmp_path: Path, dirs: dict[str, Path]) -> None:
    d = tmp_path / "d"
    md.write_json(d / "config.json", md.kimi_drafter_config())
    assert "no model.safetensors" in finding(check(dirs["kimi25"], d), "MissingDrafterWeights").message


@pytest.mark.parametrize(
    "name,shape,expected",
    [
        ("fc.weight", [7168, 2 * 7168], "fc.weight is [7168, 14336], expected [7168, 21504]"),
        ("midlayer.self_attn.q_proj.weight", [8192, 7168], "expected [8192, 14336]"),
        ("lm_head.weight", [163840, 7168], "lm_head.weight is [163840, 7168], expected [32000, 7168]"),
        ("d2t", [31999], "d2t is [31999], expected [32000]"),
        ("t2d", [129280], "t2d is [129280], expected [163840]"),
        ("midlayer.mlp.gate_proj.weight", [11008, 7168], "expected [18432, 7168]"),
    ],
)
def test_drafter_weight_shape_mismatch(tmp_path: Path, dirs: dict[str, Path], name: str, shape: list[int], expected: str) -> None:
    drafter = md.make_drafter(tmp_path / "d", md.kimi_drafter_config(), reshape={name: shape}, provenance=md.provenance())
    f = finding(check(dirs["kimi25"], drafter), "DrafterWeightShapeMismatch")
    assert expected in f.message


def test_d2t_must_be_integer(tmp_path: Path, dirs: dict[str, Path]) -> None:
    tensors = md.eagle3_tensors(md.kimi_drafter_config())
    tensors["d2t"] = ("F32", [32000])
    drafter = md.make_drafter(tmp_path / "d", md.kimi_drafter_config(), tensors=tensors, provenance=md.provenance())
    assert "integer" in finding(check(dirs["kimi25"], drafter), "DrafterWeightShapeMismatch").message


def test_mla_drafter_layout(tmp_path: Path, dirs: dict[str, Path]) -> None:
    cfg = dict(
        md.kimi_drafter_config(),
        architectures=["Eagle3DeepseekV2ForCausalLM"],
        model_type="deepseek_v3",
        q_lora_rank=1536,
        kv_lora_rank=512,
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=128,
    )
    h = 7168
    tensors = {
        "fc.weight": ("BF16", [h, 3 * h]),
        "norm.weight": ("BF16", [h]),
        "lm_head.weight": ("BF16", [32000, h]),
        "d2t": ("I64", [32000]),
        "t2d": ("BOOL", [163840]),
        "layers.0.hidden_norm.weight": ("BF16", [h]),
        "layers.0.input_layernorm.weight": ("BF16", [h]),
        "layers.0.post_attention_layernorm.weight": ("BF16", [h]),
        "layers.0.self_attn.q_a_proj.weight": ("BF16", [1536, 2 * h]),
        "layers.0.self_attn.kv_a_proj_with_mqa.weight": ("BF16", [576, 2 * h]),
        "layers.0.self_attn.kv_b_proj.weight": ("BF16", [64 * 256, 512]),
        "layers.0.self_attn.o_proj.weight": ("BF16", [h, 64 * 128]),
        "layers.0.mlp.gate_proj.weight": ("BF16", [18432, h]),
        "layers.0.mlp.up_proj.weight": ("BF16", [18432, h]),
        "layers.0.mlp.down_proj.weight": ("BF16", [h, 18432]),
    }
    good = check(dirs["kimi25"], md.make_drafter(tmp_path / "good", cfg, tensors=tensors, provenance=md.provenance()))
    assert good.compatible, good.findings
    no_lora = {k: v for k, v in cfg.items() if k != "q_lora_rank"}
    incomplete = check(dirs["kimi25"], md.make_drafter(tmp_path / "nolora", no_lora, tensors=tensors, provenance=md.provenance()))
    assert "q_lora_rank" in finding(incomplete, "DrafterConfigIncomplete").message
    bad = check(
        dirs["kimi25"],
        md.make_drafter(
            tmp_path / "bad", cfg, tensors=tensors, provenance=md.provenance(), reshape={"layers.0.self_attn.q_a_proj.weight": [1536, h]}
        ),
    )
    assert "q_a_proj" in finding(bad, "DrafterWeightShapeMismatch").message


def test_unused_weight_names_are_reported(tmp_path: Path, dirs: dict[str, Path]) -> None:
    tensors = md.eagle3_tensors(md.kimi_drafter_config())
    tensors["eagle_head.fc.weight"] = ("BF16", [7168, 21504])
    drafter = md.make_drafter(tmp_path / "d", md.kimi_drafter_config(), tensors=tensors, provenance=md.provenance())
    assert "eagle_head.fc.weight" in finding(check(dirs["kimi25"], drafter), "UnusedDrafterWeights").message


def test_pickled_weights_are_not_inspected(tmp_path: Path, dirs: dict[str, Path]) -> None:
    d = tmp_path / "d"
    md.write_json(d / "config.json", md.llama31_8b_drafter_config(max_position=131072))
    (d / "pytorch_model.bin").write_bytes(b"PK\x03\x04")
    report = check(dirs["llama8b"], d)
    assert report.compatible and "WeightsNotInspected" in report.codes("warning")


# -- warnings ------------------------------------------------------------------------------------------


def test_the_seed_failure_bf16_hidden_states_on_int4_server(tmp_path: Path, dirs: dict[str, Path]) -> None:
    prov = md.provenance(target_quantization="bf16", hidden_state_source="HF transformers bf16", num_samples=10_000)
    drafter = md.make_drafter(tmp_path / "d", md.kimi_drafter_config(), provenance=prov, tokenizer_config=md.KIMI_TOKENIZER)
    report = check(dirs["kimi25"], drafter)
    assert report.compatible  # it loads; it just will not accept
    mismatch = finding(report, "HiddenStateSourceMismatch")
    assert mismatch.severity == "warning" and "bf16" in mismatch.message and "int4" in mismatch.message
    assert "10,000" in finding(report, "SmallTrainingSet").message
    # --quantization bf16 (say, serving the bf16 original) removes the mismatch.
    assert "HiddenStateSourceMismatch" not in check(dirs["kimi25"], drafter, quantization="bf16").codes()


def test_provenance_missing_only_for_quantized_targets(tmp_path: Path, dirs: dict[str, Path]) -> None:
    drafter = md.make_drafter(tmp_path / "d", md.kimi_drafter_config())
    assert finding(check(dirs["kimi25"], drafter), "ProvenanceMissing").severity == "warning"
    assert finding(check(dirs["kimi_k2"], drafter), "ProvenanceMissing")  # Kimi-K2 is FP8
    assert "ProvenanceMissing" not in check(dirs["kimi25"], drafter, quantization="none").codes()


def test_special_tokens_and_chat_template_differ(tmp_path: Path, dirs: dict[str, Path]) -> None:
    tok = dict(md.KIMI_TOKENIZER, eos_token="<|im_end|>", chat_template="{{ messages }}")
    drafter = md.make_drafter(tmp_path / "d", md.kimi_drafter_config(), provenance=md.provenance(), tokenizer_config=tok)
    report = check(dirs["kimi25"], drafter)
    assert "eos_token" in finding(report, "SpecialTokensDiffer").message
    assert "ChatTemplateDiffers" in report.codes("warning")
    assert report.compatible


def test_context_length_beyond_target(dirs: dict[str, Path]) -> None:
    report = check(dirs["llama8b"], dirs["llama_draft"], context_length=262144)
    assert "262144" in finding(report, "ContextLengthExceedsTarget").message


# -- quantization ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "qc,label",
    [
        (md.COMPRESSED_TENSORS_INT4, "int4"),
        ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}, "int4"),
        ({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False}, "int4"),
        ({"quant_method": "gptq", "bits": 8, "group_size": 128}, "int8"),
        ({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}, "fp8"),
        (
            {
                "quant_method": "compressed-tensors",
                "format": "float-quantized",
                "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}},
            },
            "fp8",
        ),
        (
            {
                "quant_method": "compressed-tensors",
                "format": "nvfp4-pack-quantized",
                "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "float", "group_size": 16}}},
            },
            "fp4",
        ),
        ({"quant_method": "modelopt", "quant_algo": "NVFP4", "kv_cache_quant_algo": None}, "fp4"),
        ({"quant_method": "mxfp4"}, "fp4"),
        ({"quant_method": "w8a8_int8"}, "int8"),
        (None, "bf16"),
    ],
)
def test_serving_quantization_from_quantization_config(tmp_path: Path, qc: dict[str, Any] | None, label: str) -> None:
    target = md.make_target(tmp_path / "t", md.with_quantization(md.LLAMA_31_8B, qc))
    meta = read_model_dir(str(target), role="target", weights="none")
    assert validator.checkpoint_quantization(meta)[0] == label


def test_modelopt_hf_quant_config_file(tmp_path: Path) -> None:
    # nvidia/*-FP4 checkpoints carry hf_quant_config.json instead of a quantization_config.
    target = md.make_target(tmp_path / "t", md.LLAMA_31_8B)
    md.write_json(
        target / "hf_quant_config.json",
        {"producer": {"name": "modelopt", "version": "0.29.0"}, "quantization": {"quant_algo": "NVFP4", "group_size": 16}},
    )
    assert validator.checkpoint_quantization(read_model_dir(str(target), role="target", weights="none"))[0] == "fp4"


def test_unknown_quantization_is_a_warning_and_override_wins(tmp_path: Path, dirs: dict[str, Path]) -> None:
    target = md.make_target(tmp_path / "t", md.with_quantization(md.LLAMA_31_8B, {"quant_method": "quixotic-q3"}))
    report = check(target, dirs["llama_draft"])
    assert "QuantizationUnrecognized" in report.codes("warning") and report.serving_quantization is None
    forced = check(target, dirs["llama_draft"], quantization="fp8")
    assert forced.serving_quantization == "fp8" and "QuantizationUnrecognized" not in forced.codes()
    overridden = check(dirs["kimi25"], dirs["kimi_draft"], quantization="fp8")
    assert "QuantizationOverridden" in overridden.codes("info")
    assert "HiddenStateSourceMismatch" in overridden.codes("warning")


# -- NEXTN / MTP ----------------------------------------------------------------------------------------


def test_nextn_on_deepseek_v3_uses_its_mtp_layer(dirs: dict[str, Path]) -> None:
    report = check(dirs["deepseek_v3"], dirs["deepseek_v3"], algorithm="NEXTN")
    assert report.compatible, report.findings


def test_nextn_without_mtp_layers(tmp_path: Path, dirs: dict[str, Path]) -> None:
    kimi = check(dirs["kimi_k2"], dirs["kimi_k2"], algorithm="NEXTN")
    assert finding(kimi, "NextNLayersMissing").severity == "error"
    stripped = md.make_target(tmp_path / "DeepSeek-V3-int4-noMTP", md.DEEPSEEK_V3, mtp=False)
    assert "model.layers.61." in finding(check(stripped, stripped, algorithm="NEXTN"), "MissingDrafterWeights").message
    wrapper = check(dirs["kimi25"], dirs["kimi25"], algorithm="NEXTN")
    assert "KimiK25ForConditionalGeneration" in finding(wrapper, "TargetArchitectureUnsupported").message


# -- the command line --------------------------------------------------------------------------------------


def test_cli_exit_codes_and_json(dirs: dict[str, Path], tmp_path: Path) -> None:
    ok = cli("--target", dirs["kimi25"], "--drafter", dirs["kimi_draft"], "--json", check_rc=0)
    doc = json.loads(ok.stdout)
    assert doc["compatible"] is True and doc["serving_quantization"] == "int4"
    assert doc["target"]["hidden_size"] == 7168 and doc["drafter"]["draft_vocab_size"] == 32000
    assert set(doc["findings"][0]) == {"severity", "code", "message", "field"}

    bad = cli("--target", dirs["qwen3"], "--drafter", dirs["llama_draft"], check_rc=1)
    assert "INCOMPATIBLE" in bad.stdout and "VocabSizeMismatch" in bad.stdout

    missing = cli("--target", tmp_path / "nope", "--drafter", dirs["kimi_draft"], check_rc=2)
    assert missing.stdout == "" and len(missing.stderr.strip().splitlines()) == 1
    assert "nope" in missing.stderr and "Traceback" not in missing.stderr

    usage = cli("--target", dirs["kimi25"], "--drafter", dirs["kimi_draft"], "--quantization", "int3", check_rc=2)
    assert len(usage.stderr.strip().splitlines()) == 1 and "int3" in usage.stderr


def test_cli_termination_log(dirs: dict[str, Path], tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    cli("--target", dirs["qwen3"], "--drafter", dirs["llama_draft"], "--termination-log", log, check_rc=1)
    doc = json.loads(log.read_text())
    assert doc["compatible"] is False
    assert "VocabSizeMismatch" in [f["code"] for f in doc["findings"]]
    assert set(doc["findings"][0]) == {"severity", "code", "message"}

    cli("--target", tmp_path / "nope", "--drafter", dirs["kimi_draft"], "--termination-log", log, check_rc=2)
    doc = json.loads(log.read_text())
    assert doc["compatible"] is False and "nope" in doc["unusable"]
    assert doc["findings"][0]["code"] == "ValidatorInputError" and "nope" in doc["findings"][0]["message"]


def test_termination_message_always_fits() -> None:
    many = [validator.Finding("warning" if i % 2 else "error", f"Code{i}", "x\u00e9" * 900, "f") for i in range(200)]
    report = ValidationReport(
        algorithm="EAGLE3",
        serving_quantization="int4",
        checkpoint_quantization="int4",
        engine="sglang",
        findings=sorted(many, key=lambda f: validator.SEVERITY_ORDER[f.severity]),
    )
    text = report.termination_message()
    assert len(text.encode()) <= 4096
    doc = json.loads(text)
    assert doc["truncated"] == 200 - len(doc["findings"]) > 0
    assert doc["findings"] and all(f["severity"] == "error" for f in doc["findings"])  # errors are kept first


def test_unusable_message_always_fits() -> None:
    for line in ("x" * 10_000, "\u6a21\u578b" * 5_000, "ok"):
        text = validator.unusable_message(line)
        doc = json.loads(text)
        assert len(text.encode()) <= 4096 and doc["findings"][0]["code"] == "ValidatorInputError"
        assert line.startswith(doc["unusable"].rstrip("."))


def test_validate_rejects_unknown_algorithm(dirs: dict[str, Path]) -> None:
    t = read_model_dir(str(dirs["llama8b"]), role="target", weights="none")
    with pytest.raises(InputError):
        validate(t, t, algorithm="MEDUSA")


def test_validate_import_stays_light() -> None:
    code = (
        "import sys; import specdec_operator.cli, specdec_operator.validator; "
        "heavy = [m for m in ('kopf', 'kubernetes', 'torch', 'pydantic', 'aiohttp', 'numpy') if m in sys.modules]; "
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=dict(os.environ))
    assert out.returncode == 0 and out.stdout.strip() == "[]", out
