"""The validator against published drafter and target configs, with the verdicts SGLang 0.5.23's code implies.

tests/data/published_configs/ holds config.json files byte for byte as their repositories committed them
(SOURCES.json: repository, path, commit, sha256): EAGLE-3 drafter configs of SpecForge, TorchSpec and the
EAGLE authors, and Hugging Face configs of their targets as ai-dynamo/aiconfigurator keeps them. Each case
pairs a drafter with its target, writes the safetensors header a standard export of that drafter config
holds (the names SpecForge/TorchSpec checkpoints use; no tensor data), runs the validator and compares the
errors and warnings with the expected ones. `why` says how each verdict follows from SGLang's source.

The second half re-derives the per-family rules from the installed SGLang and transformers packages and
checks each rule on small synthetic drafters (where no published file exercises it).
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from specdec_operator.validator import tables, validate
from specdec_operator.validator.checks import eagle3_captured_layers
from specdec_operator.validator.modelmeta import read_model_dir
from specdec_operator.validator.report import ValidationReport
from tests.support import model_dirs as md

CORPUS = Path(__file__).resolve().parents[1] / "data" / "published_configs"
SOURCES = json.loads((CORPUS / "SOURCES.json").read_text())["files"]


def test_corpus_bytes_are_the_published_ones() -> None:
    """Every corpus file is listed with its origin, and its bytes are those recorded (nothing was reformatted)."""
    listed = {entry["file"] for entry in SOURCES}
    on_disk = {str(p.relative_to(CORPUS)) for p in CORPUS.rglob("*.json") if p.name != "SOURCES.json"}
    assert listed == on_disk
    for entry in SOURCES:
        data = (CORPUS / entry["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"], entry["file"]
        assert len(data) == entry["bytes"]
        assert entry["repository"].startswith("https://github.com/") and len(entry["commit"]) == 40 and entry["path"]
        json.loads(data)


# -- published pairs -------------------------------------------------------------------------------------------


def export_tensors(cfg: dict[str, Any]) -> dict[str, tuple[str, list[int]]]:
    """The tensors a standard export of this drafter config holds: SpecForge's LlamaForCausalLMEagle3 layout
    (midlayer.*, fc, norm, lm_head, d2t/t2d, fc_norm.* when fc_norm is on) or TorchSpec's MLA layout."""
    ids = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") or [0, 0, 0]
    h, vocab = cfg["hidden_size"], cfg["vocab_size"]
    dv = cfg.get("draft_vocab_size") or vocab
    if cfg["architectures"][0] == "Eagle3DeepseekV2ForCausalLM":
        heads, inter = cfg["num_attention_heads"], cfg["intermediate_size"]
        q_lora, kv_lora = cfg["q_lora_rank"], cfg["kv_lora_rank"]
        nope, rope, v = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
        t: dict[str, tuple[str, list[int]]] = {
            "fc.weight": ("BF16", [h, len(ids) * h]),
            "norm.weight": ("BF16", [h]),
            "lm_head.weight": ("BF16", [dv, h]),
            "layers.0.hidden_norm.weight": ("BF16", [h]),
            "layers.0.input_layernorm.weight": ("BF16", [h]),
            "layers.0.post_attention_layernorm.weight": ("BF16", [h]),
            "layers.0.self_attn.q_a_proj.weight": ("BF16", [q_lora, 2 * h]),
            "layers.0.self_attn.q_a_layernorm.weight": ("BF16", [q_lora]),
            "layers.0.self_attn.q_b_proj.weight": ("BF16", [heads * (nope + rope), q_lora]),
            "layers.0.self_attn.kv_a_proj_with_mqa.weight": ("BF16", [kv_lora + rope, 2 * h]),
            "layers.0.self_attn.kv_a_layernorm.weight": ("BF16", [kv_lora]),
            "layers.0.self_attn.kv_b_proj.weight": ("BF16", [heads * (nope + v), kv_lora]),
            "layers.0.self_attn.o_proj.weight": ("BF16", [h, heads * v]),
            "layers.0.mlp.gate_proj.weight": ("BF16", [inter, h]),
            "layers.0.mlp.up_proj.weight": ("BF16", [inter, h]),
            "layers.0.mlp.down_proj.weight": ("BF16", [h, inter]),
        }
        if dv != vocab:
            t["d2t"], t["t2d"] = ("I64", [dv]), ("BOOL", [vocab])
        return t
    full = dict(cfg)
    full.setdefault("num_key_value_heads", cfg["num_attention_heads"])
    t = md.eagle3_tensors(full, num_aux=len(ids))
    if cfg.get("fc_norm"):
        t.update({f"fc_norm.{i}.weight": ("BF16", [h]) for i in range(len(ids))})
    return t


@dataclass(frozen=True)
class Case:
    drafter: str
    target: str
    errors: tuple[str, ...]
    warnings: tuple[str, ...]
    why: str


CASES = [
    Case(
        "specforge--llama3-8B-eagle3",
        "meta-llama--Meta-Llama-3.1-8B",
        (),
        ("ContextLengthExceedsDrafter",),
        "llama_eagle3 LlamaForCausalLMEagle3, no layer ids: llama.py captures [2, 16, 29]; max_position_embeddings "
        "2048 < the target's 131072 (llama3 rope: factor 1): model_config._derive_context_length refuses without the env",
    ),
    Case(
        "specforge--llama3-70B-ealge3",
        "meta-llama--Meta-Llama-3.1-70B",
        (),
        ("ContextLengthExceedsDrafter",),
        "as the 8B: draft 4096 < 131072",
    ),
    Case(
        "specforge--llama4-scout-17B-16E-eagle3",
        "meta-llama--Llama-4-Scout-17B-16E-Instruct",
        (),
        ("ContextLengthExceedsDrafter",),
        "model_type llama (not llama4_text), so the MLP is intermediate_size 32768; mllama4.py delegates capture to "
        "Llama4ForCausalLM (+1); draft 2048 < the target's 10485760",
    ),
    Case("specforge--qwen3-8b-eagle3", "Qwen--Qwen3-8B", (), (), "qwen3.py +1, defaults [2, 18, 33]; 40960 = 40960"),
    Case(
        "specforge--qwen3-30B-A3B-eagle3",
        "Qwen--Qwen3-30B-A3B",
        (),
        ("ContextLengthExceedsDrafter",),
        "qwen3_moe.py defaults [2, 24, 45]; draft 2048 < 40960",
    ),
    Case(
        "specforge--qwen3-30B-A3B-eagle3.1",
        "Qwen--Qwen3-30B-A3B",
        (),
        ("ContextLengthExceedsDrafter",),
        "fc_norm and norm_output at the top level: llama_eagle3 LlamaModel builds fc_norm.0-2, which the export holds",
    ),
    Case("specforge--qwen3-235B-A22B-eagle3", "Qwen--Qwen3-235B-A22B", (), (), "[1, 46, 90] +1 -> [2, 47, 91] < 94 layers"),
    Case(
        "specforge--qwen3-30B-A3B-eagle3-moe-draft",
        "Qwen--Qwen3-30B-A3B",
        ("DrafterArchitectureUnsupported",),
        (),
        "Qwen3MoEForCausalLMEagle3 is no registered SGLang class (EntryClass of llama_eagle3/kimi_k25_eagle3)",
    ),
    Case("specforge--qwen3.5-35b-a3b-eagle3", "Qwen--Qwen3.5-35B-A3B", (), (), "qwen3_vl.py +1 defaults [2, 20, 37]; 262144 = 262144"),
    Case(
        "specforge--qwen3.5-122b-a10b-eagle3-moe",
        "Qwen--Qwen3.5-122B-A10B",
        ("DrafterArchitectureUnsupported",),
        (),
        "Qwen3MoeForCausalLMEagle3 is not registered",
    ),
    Case(
        "specforge--deepseek-v3-671b-eagle3",
        "deepseek-ai--DeepSeek-V3",
        (),
        ("ProvenanceMissing",),
        "deepseek_v2.py: first id 1 -> +1: [2, 30, 58] < 61; fp8 target and no provenance",
    ),
    Case(
        "specforge--kimi-k2-eagle3",
        "moonshotai--Kimi-K2-Instruct",
        (),
        ("ProvenanceMissing",),
        "model_type kimi_k2 loads as SGLang's DeepseekV3Config alias (head_dim given: 128); deepseek_v2.py: first id "
        "2 -> as given [2, 30, 58]; 131072 = 131072; fp8 target",
    ),
    Case(
        "specforge--kimi-k25-eagle3",
        "moonshotai--Kimi-K2.5",
        (),
        ("ProvenanceMissing", "ContextLengthExceedsDrafter"),
        "kimi_k25.py delegates to DeepseekV3ForCausalLM: [2, 30, 58] as given; draft 131072 < 262144; INT4 target",
    ),
    Case(
        "specforge--gpt-oss-20B-eagle3",
        "openai--gpt-oss-20b",
        (),
        ("ProvenanceMissing", "ContextLengthExceedsDrafter"),
        "gpt_oss.py: max id 21 != 24 layers -> +1: [2, 12, 22]; draft 4096 < 131072; mxfp4 target",
    ),
    Case(
        "specforge--gpt-oss-120B-eagle3",
        "openai--gpt-oss-120b",
        (),
        ("ProvenanceMissing", "ContextLengthExceedsDrafter"),
        "gpt_oss.py: [1, 17, 33] +1 -> [2, 18, 34] < 36",
    ),
    Case(
        "specforge--gpt-oss-20B-eagle3-moe",
        "openai--gpt-oss-20b",
        ("DrafterArchitectureUnsupported",),
        ("ProvenanceMissing", "ContextLengthExceedsDrafter"),
        "GptOssForCausalLMEagle3 (num_local_experts 16) is not registered",
    ),
    Case(
        "specforge--gemma4-26b-a4b-eagle3",
        "google--gemma-4-26B-A4B",
        (),
        ("ContextLengthExceedsDrafter",),
        "gemma4_mm.py +1: [6, 18, 30]; 30 = num_layers is the last layer's output, which gemma4_causal.py "
        "Gemma4TextModel.forward captures (`num_layers in self.layers_to_capture`); draft 4096 < 262144",
    ),
    Case(
        "torchspec--kimi_k25_eagle3",
        "moonshotai--Kimi-K2.5",
        ("DrafterConfigIncomplete",),
        ("ProvenanceMissing",),
        "no draft_vocab_size and untied: LlamaForCausalLMEagle3.__init__ reads config.draft_vocab_size (AttributeError)",
    ),
    Case(
        "torchspec--kimi_k25_eagle3_mla",
        "moonshotai--Kimi-K2.5",
        (),
        ("ProvenanceMissing", "ContextLengthExceedsDrafter"),
        "Eagle3DeepseekV2ForCausalLM; [1, 29, 57] first id 1 -> [2, 30, 58]; no max_position_embeddings: kimi_k2 is "
        "SGLang's DeepseekV3Config alias, whose default is 4096 (yarn with original_max_position_embeddings: factor 1) < 262144",
    ),
    Case("torchspec--qwen3_8b_eagle3", "Qwen--Qwen3-8B", (), (), "as SpecForge's Qwen3-8B draft"),
    Case(
        "torchspec--qwen3_8b_eagle3_mla",
        "Qwen--Qwen3-8B",
        (),
        (),
        "MLA draft on Qwen3: no draft_vocab_size is fine here (kimi_k25_eagle3 uses getattr(..., None): lm_head from the target); 262144 >= 40960",
    ),
    Case(
        "torchspec--minimax_m25_eagle3",
        "MiniMaxAI--MiniMax-M2.5",
        ("DrafterConfigIncomplete",),
        ("ProvenanceMissing",),
        "no draft_vocab_size (AttributeError at start-up); minimax_m2.py defaults [2, 31, 59]; fp8 target",
    ),
    Case(
        "eagle--traineagle3-config",
        "meta-llama--Meta-Llama-3.1-8B",
        ("DrafterArchitectureUnsupported",),
        ("ContextLengthExceedsDrafter",),
        "architectures LlamaForCausalLM: SGLang would load a full Llama model as the draft",
    ),
    Case(
        "eagle--Mixtral_8x7B_config",
        "mistralai--Mixtral-8x7B-v0.1",
        ("TargetArchitectureUnsupported", "DrafterArchitectureUnsupported"),
        ("ContextLengthExceedsDrafter",),
        "mixtral.py has no set_eagle3_layers_to_capture (start-up ValueError); the EAGLE-1 draft is a LlamaForCausalLM",
    ),
]


def _pair_dirs(tmp_path: Path, case: Case) -> tuple[Path, Path]:
    target, drafter = tmp_path / "target", tmp_path / "drafter"
    target.mkdir()
    drafter.mkdir()
    shutil.copyfile(CORPUS / "targets" / f"{case.target}.json", target / "config.json")
    # The target's weights are not read (weights="none"), but a directory without any is TargetWeightsMissing.
    (target / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": {}}))
    shutil.copyfile(CORPUS / "drafters" / f"{case.drafter}.json", drafter / "config.json")
    cfg = json.loads((drafter / "config.json").read_text())
    md.write_safetensors(drafter / "model.safetensors", export_tensors(cfg), metadata={"format": "pt"})
    return target, drafter


def run_case(tmp_path: Path, case: Case) -> ValidationReport:
    target, drafter = _pair_dirs(tmp_path, case)
    return validate(read_model_dir(str(target), role="target", weights="none"), read_model_dir(str(drafter), role="drafter"))


def test_every_corpus_file_is_in_a_case() -> None:
    used = {f"drafters/{c.drafter}.json" for c in CASES} | {f"targets/{c.target}.json" for c in CASES}
    assert used == {entry["file"] for entry in SOURCES}


@pytest.mark.parametrize("case", CASES, ids=[c.drafter for c in CASES])
def test_published_pair(tmp_path: Path, case: Case) -> None:
    report = run_case(tmp_path, case)
    assert sorted(report.codes("error")) == sorted(case.errors), report.findings
    assert sorted(report.codes("warning")) == sorted(case.warnings), report.findings
    assert report.compatible == (not case.errors)


def test_published_gemma4_last_layer_output_is_captured(tmp_path: Path) -> None:
    case = next(c for c in CASES if c.drafter == "specforge--gemma4-26b-a4b-eagle3")
    aux = next(f for f in run_case(tmp_path, case).findings if f.code == "AuxLayers")
    assert "[6, 18, 30 (last layer's output)]" in aux.message


def test_published_mla_draft_without_max_position_embeddings(tmp_path: Path) -> None:
    case = next(c for c in CASES if c.drafter == "torchspec--kimi_k25_eagle3_mla")
    warning = next(f for f in run_case(tmp_path, case).findings if f.code == "ContextLengthExceedsDrafter")
    assert "built for 4096" in warning.message and "kimi_k2 default" in warning.message


# -- the rules, re-derived from the installed SGLang ---------------------------------------------------------

_sglang = importlib.util.find_spec("sglang")
SGLANG = Path(_sglang.origin).parent if _sglang and _sglang.origin else None
needs_sglang = pytest.mark.skipif(SGLANG is None, reason="sglang is not installed (make venv installs it with --no-deps)")


def _entry_files() -> dict[str, Path]:
    """Registered class name -> the model file whose EntryClass lists it (names repeat across files)."""
    assert SGLANG is not None
    found: dict[str, Path] = {}
    for path in sorted((SGLANG / "srt" / "models").glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "EntryClass" for t in node.targets):
                elts = node.value.elts if isinstance(node.value, (ast.List, ast.Tuple)) else [node.value]
                for e in elts:
                    found.setdefault(ast.unparse(e), path)
    return found


def _method(path: Path, cls: str, method: str, seen: tuple[str, ...] = ()) -> tuple[Path, str] | None:
    """The source of `method` on `cls` as defined in `path`, following base classes imported into that file."""
    assert SGLANG is not None
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls and cls not in seen:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == method:
                    return path, ast.unparse(item)
            for base in node.bases:
                name = ast.unparse(base).split(".")[-1]
                for candidate in [path, *_importing_files(tree, name)]:
                    found = _method(candidate, name, method, seen + (cls,))
                    if found:
                        return found
    return None


def _importing_files(tree: ast.Module, name: str) -> list[Path]:
    assert SGLANG is not None
    out = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and any(a.name == name for a in node.names):
            rel = node.module.replace("sglang.", "", 1).replace(".", "/") + ".py"
            out.append(SGLANG / rel)
    return out


# Delegations set_eagle3_layers_to_capture makes to another class (read in the test below).
DELEGATES = {
    "Gemma3ForConditionalGeneration": ("gemma3_mm.py", "self.language_model.set_eagle3_layers_to_capture", "Gemma3ForCausalLM"),
    "Llama4ForConditionalGeneration": ("mllama4.py", "self.language_model.set_eagle3_layers_to_capture", "Llama4ForCausalLM"),
    "KimiK25ForConditionalGeneration": ("kimi_k25.py", "self.language_model.set_eagle3_layers_to_capture", "DeepseekV3ForCausalLM"),
}


@needs_sglang
def test_capture_rules_match_each_targets_set_eagle3_layers_to_capture() -> None:
    entries = _entry_files()
    derived: dict[str, str] = {}
    for arch in sorted(tables.EAGLE3_TARGET_ARCHITECTURES):
        resolved = arch
        if arch in DELEGATES:
            file, call, delegate = DELEGATES[arch]
            found = _method(entries[arch], arch, "set_eagle3_layers_to_capture")
            assert found and found[0].name == file and call in found[1], arch
            resolved = delegate
        found = _method(entries[resolved], resolved, "set_eagle3_layers_to_capture")
        assert found, arch
        body = found[1]
        if "layer_ids[0] == 1" in body:
            derived[arch] = tables.CAPTURE_FIRST_ID_ONE
        elif "max(layer_ids) == num_layers" in body:
            derived[arch] = tables.CAPTURE_MAX_IS_BOUNDARY
        elif "val + 1 for val in layer_ids" in body:
            derived[arch] = tables.CAPTURE_PLUS_ONE
        elif body.count("\n") <= 2 and "self.model.set_eagle3_layers_to_capture(layer_ids)" in body:
            derived[arch] = tables.CAPTURE_DELEGATED  # mindspore.py: the model lives outside SGLang
        else:
            pytest.fail(f"{arch}: unknown set_eagle3_layers_to_capture in {found[0].name}:\n{body}")
    assert derived == tables.EAGLE3_CAPTURE_RULE


# The inner model each target's capture list lands in (the class whose forward reads layers_to_capture).
LAST_OUTPUT_FORWARDS = {
    "gpt_oss.py": ("GptOssModel", "self.end_layer in self.layers_to_capture"),
    "gemma3_causal.py": ("Gemma3TextModel", "num_layers in self.layers_to_capture"),
    "gemma4_causal.py": ("Gemma4TextModel", "num_layers in self.layers_to_capture"),
    "minimax_m3.py": ("MiniMaxM3Model", "self.end_layer in self.layers_to_capture"),
}


@needs_sglang
def test_last_layer_output_capture_matches_the_model_forwards() -> None:
    assert SGLANG is not None
    models = SGLANG / "srt" / "models"
    files_capturing_last = set()
    for path in sorted(models.glob("*.py")):
        text = path.read_text()
        if "layers_to_capture" in text and ("num_layers in self.layers_to_capture" in text or "self.end_layer in self.layers_to_capture" in text):
            files_capturing_last.add(path.name)
    assert set(LAST_OUTPUT_FORWARDS) <= files_capturing_last
    for name, (cls, test) in LAST_OUTPUT_FORWARDS.items():
        forward = _method(models / name, cls, "forward")
        assert forward and test in forward[1], name
    # Which registered targets reach those forwards: their set_eagle3_layers_to_capture is defined in (or
    # delegates to a class defined in) one of these files, or wraps the same text model.
    entries = _entry_files()
    derived = set()
    for arch in tables.EAGLE3_TARGET_ARCHITECTURES:
        resolved = DELEGATES.get(arch, ("", "", arch))[2]
        found = _method(entries[resolved], resolved, "set_eagle3_layers_to_capture")
        assert found
        if found[0].name in LAST_OUTPUT_FORWARDS:
            derived.add(arch)
        elif found[0].name == "gemma4_mm.py":
            assert "self.language_model = Gemma4TextModel(" in (models / "gemma4_mm.py").read_text()
            derived.add(arch)
        elif found[0].name == "minimax_m3_vl.py":
            assert "MiniMaxM3Model" in (models / "minimax_m3_vl.py").read_text()
            derived.add(arch)
    assert derived == tables.EAGLE3_CAPTURES_LAST_LAYER_OUTPUT


@needs_sglang
def test_default_layer_ids() -> None:
    entries = _entry_files()
    plus_one_defaults = set()
    for arch in tables.EAGLE3_TARGET_ARCHITECTURES:
        resolved = DELEGATES.get(arch, ("", "", arch))[2]
        found = _method(entries[resolved], resolved, "set_eagle3_layers_to_capture")
        assert found
        if tables.EAGLE3_CAPTURE_RULE[arch] == tables.CAPTURE_DELEGATED:
            continue
        assert "num_layers // 2" in found[1] and "num_layers - 3" in found[1], arch
        if "layer_ids = [2, num_layers // 2, num_layers - 3]" in found[1]:
            plus_one_defaults.add(arch)  # the defaults then go through the +1 below
    assert plus_one_defaults == tables.EAGLE3_DEFAULT_IDS_PLUS_ONE


@needs_sglang
def test_draft_classes_build_what_the_checks_expect() -> None:
    """The config fields and names the weight checks rely on, in llama_eagle3.py and kimi_k25_eagle3.py."""
    assert SGLANG is not None
    llama = (SGLANG / "srt" / "models" / "llama_eagle3.py").read_text()
    for needle in (
        'bias=getattr(config, "bias", False)',  # fc bias
        'eagle_config.get("norm_before_fc", getattr(config, "norm_before_fc", False))',  # input_norm
        'getattr(config, "fc_norm", None) or getattr(\n            config, "use_aux_norm", False\n        )',
        'self.norm_output = getattr(config, "norm_output", False)',
        'if config.model_type == "llama4_text":\n            inter_size = config.intermediate_size_mlp',
        "self.mlp = LlamaMLP(",  # dense, always
        '"aux_norm_low": "fc_norm.0"',
    ):
        assert needle in llama, needle
    base = (SGLANG / "srt" / "models" / "llama.py").read_text()
    assert 'attention_bias = getattr(config, "attention_bias", False) or getattr(\n            config, "bias", False\n        )' in base
    mla = (SGLANG / "srt" / "models" / "kimi_k25_eagle3.py").read_text()
    assert "self.mlp = DeepseekV2MLP(" in mla and "input_norm" not in mla and "norm_before_fc" not in mla
    assert 'mapped_name = re.sub(r"^layers\\.0\\.", "midlayer.", name)' in mla and 'mapped_name = f"model.{mapped_name}"' in mla
    assert 'logger.warning("Eagle3 MLA: skipping unexpected weight %s", name)' in mla
    common = (SGLANG / "srt" / "utils" / "hf_transformers" / "common.py").read_text()
    assert 'class _KimiK2ConfigAlias(_HFDeepseekV3Config):\n        model_type = "kimi_k2"' in common


_transformers = importlib.util.find_spec("transformers")


@pytest.mark.skipif(_transformers is None, reason="transformers is not installed")
@pytest.mark.parametrize("model_type", sorted(tables.DRAFT_CONFIG_DEFAULTS))
def test_draft_config_defaults_match_transformers(model_type: str) -> None:
    from transformers import CONFIG_MAPPING

    cls = CONFIG_MAPPING[tables.DRAFT_CONFIG_CLASS_MODEL_TYPE.get(model_type, model_type)]
    expected = tables.DRAFT_CONFIG_DEFAULTS[model_type]
    sizes: dict[str, Any] = {"hidden_size": 1536, "num_attention_heads": 8}  # 1536 / 8 = 192: no class default is 192
    config = cls(**sizes)
    for key, value in expected.items():
        actual = getattr(config, key, None)
        if key == "head_dim":
            actual = None if actual in (None, 192) else actual
        assert actual == value, (model_type, key, actual)


# -- the rules on synthetic drafters -----------------------------------------------------------------------------


def _target(tmp_path: Path, name: str) -> Path:
    d = tmp_path / "target"
    d.mkdir(parents=True)
    shutil.copyfile(CORPUS / "targets" / f"{name}.json", d / "config.json")
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": {}}))  # not TargetWeightsMissing
    return d


def _check(target: Path, drafter: Path) -> ValidationReport:
    return validate(read_model_dir(str(target), role="target", weights="none"), read_model_dir(str(drafter), role="drafter"))


def _drafter(tmp_path: Path, cfg: dict[str, Any], tensors: dict[str, tuple[str, list[int]]] | None = None, name: str = "d") -> Path:
    return md.make_drafter(tmp_path / name, cfg, tensors=tensors if tensors is not None else export_tensors(cfg), provenance=md.provenance())


def _published(name: str) -> dict[str, Any]:
    cfg: dict[str, Any] = json.loads((CORPUS / "drafters" / f"{name}.json").read_text())
    return cfg


@pytest.mark.parametrize(
    "ids,captured,ok",
    [
        ([1, 11, 24], [1, 11, 24], True),  # the largest id is num_layers (24): kept, 24 = the final hidden state
        ([1, 11, 23], [2, 12, 24], True),  # +1 reaches 24, which GptOssModel.forward captures after the final norm
        ([1, 11, 25], [2, 12, 26], False),
    ],
)
def test_gpt_oss_capture_rule(tmp_path: Path, ids: list[int], captured: list[int], ok: bool) -> None:
    assert eagle3_captured_layers("GptOssForCausalLM", ids, 24)[0] == captured
    cfg = dict(_published("specforge--gpt-oss-20B-eagle3"), eagle_config={"eagle_aux_hidden_state_layer_ids": ids})
    report = _check(_target(tmp_path, "openai--gpt-oss-20b"), _drafter(tmp_path, cfg))
    assert ("AuxLayerOutOfRange" not in report.codes("error")) == ok, report.findings


def test_last_layer_output_only_where_the_forward_captures_it(tmp_path: Path) -> None:
    # Qwen3 (36 layers): [1, 17, 35] + 1 -> 36, never produced; Gemma 4 (30 layers): 29 + 1 = 30 is.
    qwen = dict(_published("specforge--qwen3-8b-eagle3"), eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 17, 35]})
    assert "AuxLayerOutOfRange" in _check(_target(tmp_path, "Qwen--Qwen3-8B"), _drafter(tmp_path, qwen)).codes("error")
    assert eagle3_captured_layers("Gemma4ForConditionalGeneration", [1, 15, 29], 30)[0] == [2, 16, 30]
    assert eagle3_captured_layers("DeepseekV3ForCausalLM", [1, 29, 60], 61)[0] == [2, 30, 61]  # 61: never produced
    assert eagle3_captured_layers("MiniMaxM3SparseForConditionalGeneration", None, 60)[0] == [3, 31, 58]


def test_duplicated_layers_are_refused(tmp_path: Path) -> None:
    cfg = dict(_published("specforge--deepseek-v3-671b-eagle3"), eagle_config={"eagle_aux_hidden_state_layer_ids": [2, 2, 57]})
    report = _check(_target(tmp_path, "deepseek-ai--DeepSeek-V3"), _drafter(tmp_path, cfg))
    assert "AuxLayersDuplicated" in report.codes("error")


def test_moe_decoder_layer_in_a_llama_draft(tmp_path: Path) -> None:
    """A Qwen3-MoE draft renamed to LlamaForCausalLMEagle3: SGLang builds a dense LlamaMLP, skips the experts."""
    cfg = dict(_published("specforge--qwen3-30B-A3B-eagle3-moe-draft"), architectures=["LlamaForCausalLMEagle3"])
    tensors = export_tensors(dict(cfg, intermediate_size=6144))
    for n in ("gate_proj", "up_proj", "down_proj"):
        del tensors[f"midlayer.mlp.{n}.weight"]
    tensors["midlayer.mlp.gate.weight"] = ("BF16", [128, 2048])
    for e in range(2):
        tensors[f"midlayer.mlp.experts.{e}.gate_proj.weight"] = ("BF16", [768, 2048])
    target = _target(tmp_path, "Qwen--Qwen3-30B-A3B")
    report = _check(target, _drafter(tmp_path, cfg, tensors))
    assert report.codes("error") == ["DrafterMoEUnsupported"], report.findings
    # The explicit switch some trainers write is refused from config.json alone.
    flagged = dict(_published("specforge--qwen3-8b-eagle3"), use_moe=True)
    report = _check(_target(tmp_path / "q", "Qwen--Qwen3-8B"), _drafter(tmp_path, flagged, name="u"))
    assert "DrafterMoEUnsupported" in report.codes("error")
    # Leftover MoE fields with a dense checkpoint are fine: SGLang loads the dense MLP.
    leftover = dict(_published("specforge--qwen3-8b-eagle3"), num_experts=128)
    assert _check(_target(tmp_path / "r", "Qwen--Qwen3-8B"), _drafter(tmp_path, leftover, name="l")).compatible


def test_fc_norm_tensors_and_flag(tmp_path: Path) -> None:
    base = _published("specforge--qwen3-30B-A3B-eagle3.1")
    target = _target(tmp_path, "Qwen--Qwen3-30B-A3B")
    # Flag on, norms missing: they load as ones.
    tensors = {k: v for k, v in export_tensors(base).items() if not k.startswith("fc_norm.")}
    report = _check(target, _drafter(tmp_path, base, tensors, name="a"))
    assert "DrafterNormMissing" in report.codes("warning") and report.compatible
    # Legacy names load into fc_norm.0-2 (llama_eagle3 legacy_name_map).
    legacy = dict(tensors, **{f"aux_norm_{p}.weight": ("BF16", [2048]) for p in ("low", "mid", "high")})
    assert "DrafterNormMissing" not in _check(target, _drafter(tmp_path, base, legacy, name="b")).codes()
    # Norms trained, flag off: skipped.
    off = {k: v for k, v in base.items() if k != "fc_norm"}
    report = _check(target, _drafter(tmp_path, off, export_tensors(base), name="c"))
    assert "DrafterConfigTensorMismatch" in report.codes("error")
    # Flag nested in eagle_config: SGLang reads it only at the top level.
    nested = dict(off, eagle_config={"fc_norm": True})
    report = _check(target, _drafter(tmp_path, nested, export_tensors(base), name="d"))
    assert "DrafterConfigIgnored" in report.codes("error")


def test_norm_before_fc(tmp_path: Path) -> None:
    target = _target(tmp_path, "Qwen--Qwen3-8B")
    cfg = dict(_published("specforge--qwen3-8b-eagle3"), eagle_config={"norm_before_fc": True})
    tensors = dict(export_tensors(cfg), **{"input_norm.weight": ("BF16", [3 * 4096])})
    assert _check(target, _drafter(tmp_path, cfg, tensors, name="a")).compatible
    report = _check(target, _drafter(tmp_path, cfg, export_tensors(cfg), name="b"))
    assert "DrafterNormMissing" in report.codes("warning")
    plain = _published("specforge--qwen3-8b-eagle3")
    assert "DrafterConfigTensorMismatch" in _check(target, _drafter(tmp_path, plain, tensors, name="c")).codes("error")
    # The MLA draft class has no input norm at all.
    mla = dict(_published("torchspec--qwen3_8b_eagle3_mla"))
    mla["eagle_config"] = {"norm_before_fc": True}
    assert "DrafterConfigIgnored" in _check(target, _drafter(tmp_path, mla, name="d")).codes("error")


def test_bias_builds_fc_and_o_proj_biases(tmp_path: Path) -> None:
    target = _target(tmp_path, "Qwen--Qwen3-8B")
    cfg = dict(_published("specforge--qwen3-8b-eagle3"), bias=True)
    report = _check(target, _drafter(tmp_path, cfg, name="a"))
    missing = next(f for f in report.findings if f.code == "MissingDrafterWeights").message
    assert "fc.bias" in missing and "o_proj.bias" in missing
    with_bias = dict(export_tensors(cfg), **{"fc.bias": ("BF16", [4096]), "midlayer.self_attn.o_proj.bias": ("BF16", [4096])})
    assert _check(target, _drafter(tmp_path, cfg, with_bias, name="b")).compatible
    plain = _published("specforge--qwen3-8b-eagle3")
    report = _check(target, _drafter(tmp_path, plain, with_bias, name="c"))
    assert "DrafterConfigTensorMismatch" in report.codes("error")


def test_llama4_text_mlp_width(tmp_path: Path) -> None:
    """model_type llama4_text: LlamaDecoderLayer builds LlamaMLP(intermediate_size_mlp), default 16384."""
    target = _target(tmp_path, "meta-llama--Llama-4-Scout-17B-16E-Instruct")
    cfg = dict(_published("specforge--llama4-scout-17B-16E-eagle3"), model_type="llama4_text", intermediate_size=8192)
    trained = export_tensors(dict(cfg, intermediate_size=16384))  # the width SGLang builds
    assert _check(target, _drafter(tmp_path, cfg, trained, name="a")).compatible
    report = _check(target, _drafter(tmp_path, cfg, export_tensors(cfg), name="b"))  # 8192-wide MLP
    assert "intermediate_size_mlp" in next(f for f in report.findings if f.code == "DrafterWeightShapeMismatch").message


def test_missing_max_position_embeddings_takes_the_model_type_default(tmp_path: Path) -> None:
    target = _target(tmp_path, "Qwen--Qwen3-8B")
    cfg = {k: v for k, v in _published("specforge--qwen3-8b-eagle3").items() if k != "max_position_embeddings"}
    warning = next(f for f in _check(target, _drafter(tmp_path, cfg, name="a")).findings if f.code == "ContextLengthExceedsDrafter")
    assert "built for 2048" in warning.message  # LlamaConfig's default
    qwen3 = dict(cfg, model_type="qwen3")
    warning = next(f for f in _check(target, _drafter(tmp_path, qwen3, name="b")).findings if f.code == "ContextLengthExceedsDrafter")
    assert "built for 32768" in warning.message


def test_mla_names_with_a_model_prefix_are_skipped(tmp_path: Path) -> None:
    """kimi_k25_eagle3 prefixes model. itself: model.layers.0.* becomes model.model.* and is skipped."""
    cfg = _published("torchspec--kimi_k25_eagle3_mla")
    tensors = {(f"model.{k}" if k.startswith("layers.") else k): v for k, v in export_tensors(cfg).items()}
    report = _check(_target(tmp_path, "moonshotai--Kimi-K2.5"), _drafter(tmp_path, cfg, tensors))
    assert "MissingDrafterWeights" in report.codes("error") and "UnusedDrafterWeights" in report.codes("warning")
