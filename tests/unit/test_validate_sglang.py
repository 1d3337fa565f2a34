"""The validator's SGLang tables, re-derived from the installed SGLang package's source.

operator/specdec_operator/validator/tables.py hard-codes what the SGLang release SGLANG_VERSION supports
(so the init container needs no SGLang); these tests read the wheel's source with `ast` (importing its
model files needs a GPU stack) and fail when the tables and the release disagree, e.g. after an SGLang
upgrade.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
from pathlib import Path

import pytest

from specdec_operator import SGLANG_VERSION
from specdec_operator.validator import tables

spec = importlib.util.find_spec("sglang")
if spec is None or spec.origin is None:
    pytest.skip("sglang is not installed (make test installs it with --no-deps)", allow_module_level=True)
SGLANG = Path(spec.origin).parent
MODELS = SGLANG / "srt" / "models"


def test_installed_release_is_the_one_the_tables_describe() -> None:
    assert importlib.metadata.version("sglang") == SGLANG_VERSION


class _Classes:
    """Every model class in srt/models: bases, whether it defines a method, and EntryClass lists."""

    def __init__(self) -> None:
        self.classes: dict[str, list[tuple[str, list[str], set[str]]]] = {}
        self.entry: dict[str, list[str]] = {}
        for path in sorted(MODELS.glob("*.py")):
            tree = ast.parse(path.read_text())
            for node in tree.body:
                if isinstance(node, ast.ClassDef):
                    bases = [ast.unparse(b).split(".")[-1] for b in node.bases]
                    methods = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
                    self.classes.setdefault(node.name, []).append((path.name, bases, methods))
                elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "EntryClass" for t in node.targets):
                    value = node.value
                    elts = value.elts if isinstance(value, (ast.List, ast.Tuple)) else [value]
                    self.entry[path.name] = [ast.unparse(e) for e in elts]

    def defining_file(self, name: str, method: str, seen: tuple[str, ...] = ()) -> str | None:
        if name in seen:
            return None
        for file, bases, methods in self.classes.get(name, []):
            if method in methods:
                return file
            for base in bases:
                found = self.defining_file(base, method, seen + (name,))
                if found:
                    return found
        return None

    def entry_classes(self) -> set[str]:
        return {name for names in self.entry.values() for name in names}


@pytest.fixture(scope="module")
def classes() -> _Classes:
    return _Classes()


def _is_draft_or_auxiliary(name: str) -> bool:
    return "Eagle" in name or name.endswith(("NextN", "MTP")) or name.startswith("Embedding")


def test_eagle3_target_architectures_match_set_eagle3_layers_to_capture(classes: _Classes) -> None:
    derived = {
        name for name in classes.entry_classes() if classes.defining_file(name, "set_eagle3_layers_to_capture") and not _is_draft_or_auxiliary(name)
    }
    assert derived == tables.EAGLE3_TARGET_ARCHITECTURES, (
        f"missing from the table: {sorted(derived - tables.EAGLE3_TARGET_ARCHITECTURES)}; "
        f"no longer in SGLang: {sorted(tables.EAGLE3_TARGET_ARCHITECTURES - derived)}"
    )
    # The seed's target and the common ones, stated plainly.
    for arch in ("KimiK25ForConditionalGeneration", "DeepseekV3ForCausalLM", "LlamaForCausalLM", "Qwen3ForCausalLM"):
        assert arch in derived
    assert "MixtralForCausalLM" not in derived


def test_deepseek_capture_convention(classes: _Classes) -> None:
    """Classes whose set_eagle3_layers_to_capture adds 1 only when the first id is 1."""
    heuristic_files = set()
    for path in MODELS.glob("*.py"):
        source = path.read_text()
        start = source.find("def set_eagle3_layers_to_capture")
        if start >= 0 and "layer_ids[0] == 1" in source[start : start + 1500]:
            heuristic_files.add(path.name)
    assert heuristic_files, "the first-id-is-1 rule vanished from SGLang: revisit AuxLayerOutOfRange"
    derived = {name for name in tables.EAGLE3_TARGET_ARCHITECTURES if classes.defining_file(name, "set_eagle3_layers_to_capture") in heuristic_files}
    # Kimi-K2.5 delegates to its language model, a DeepseekV3ForCausalLM.
    kimi = (MODELS / "kimi_k25.py").read_text()
    assert "self.language_model = DeepseekV3ForCausalLM(" in kimi
    derived.add("KimiK25ForConditionalGeneration")
    assert derived == tables.DEEPSEEK_CAPTURE_CONVENTION


def test_other_targets_add_one_to_layer_ids() -> None:
    for name in ("llama.py", "qwen3.py", "qwen2.py"):
        source = (MODELS / name).read_text()
        body = source[source.find("def set_eagle3_layers_to_capture") :][:1200]
        assert "[val + 1 for val in layer_ids]" in body, name
        assert "num_layers // 2" in body and "num_layers - 3" in body  # the default [2, L//2, L-3]


def test_draft_architectures_are_registered(classes: _Classes) -> None:
    entries = classes.entry_classes()
    assert set(tables.EAGLE3_DRAFT_ARCHITECTURES) == set(classes.entry["llama_eagle3.py"]) | set(classes.entry["kimi_k25_eagle3.py"])
    assert entries >= tables.EAGLE_DRAFT_ARCHITECTURES
    # The names SGLang cannot load are really absent.
    assert "Eagle3LlamaForCausalLM" not in entries and "Eagle3Speculator" not in entries


def test_eagle3_weight_names_the_checks_rely_on() -> None:
    source = (MODELS / "llama_eagle3.py").read_text()
    assert '"midlayer": "layers.0"' in source  # midlayer.* is renamed
    assert 'f"model.{name}"' in source  # a missing model. prefix is added
    assert "self.fc = torch.nn.Linear(" in source and "self.hidden_size_in * self.num_aux_hidden_states" in source
    assert "hidden_size = 2 * self.hidden_size if self.is_input_layer" in source  # q/k/v input is 2 x hidden
    assert "config.draft_vocab_size is None" in source and "load_lm_head_from_target = True" in source
    assert "loaded_weight + torch.arange(loaded_weight.shape[0])" in source  # d2t semantics
    llama = (MODELS / "llama.py").read_text()
    assert "target_hidden_size != self.config.hidden_size" in llama  # embeddings not shared then


def _config_draft_model_archs() -> set[str]:
    tree = ast.parse((SGLANG / "srt" / "configs" / "model_config.py").read_text())
    func = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "_config_draft_model")
    found: set[str] = set()
    for node in ast.walk(func):
        if isinstance(node, ast.Compare) and "architectures[0]" in ast.unparse(node.left):
            for comp in node.comparators:
                for const in ast.walk(comp):
                    if isinstance(const, ast.Constant) and isinstance(const.value, str):
                        found.add(const.value)
    return found


def test_nextn_targets_match_the_draft_rewrite_table() -> None:
    derived = _config_draft_model_archs()
    # Rewrites that are not NextN/MTP heads of a target checkpoint.
    not_nextn = {
        "DSparkMiniMaxDraftModel",
        "NemotronH_Omni_Reasoning_V3",
        "InternS2PreviewForConditionalGeneration",
        "InternS2MobiusForConditionalGeneration",
        "Cosmos3ForConditionalGeneration",
    }
    assert derived >= tables.NEXTN_TARGET_ARCHITECTURES, sorted(tables.NEXTN_TARGET_ARCHITECTURES - derived)
    unexplained = derived - tables.NEXTN_TARGET_ARCHITECTURES - not_nextn
    assert not unexplained, f"SGLang rewrites these to NextN/MTP drafts too: {sorted(unexplained)}"


def test_context_length_keys_match() -> None:
    source = (SGLANG / "srt" / "utils" / "hf_transformers" / "common.py").read_text()
    start = source.index("CONTEXT_LENGTH_KEYS = [")
    keys = ast.literal_eval(source[start + len("CONTEXT_LENGTH_KEYS = ") : source.index("]", start) + 1])
    assert tuple(keys) == tables.CONTEXT_LENGTH_KEYS
    model_config = (SGLANG / "srt" / "configs" / "model_config.py").read_text()
    assert "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN" in model_config  # the start-up refusal the warning cites
