"""`specdec validate` compares config.json's aux layer ids with the layers the drafter was trained on, in the serving
engine's convention, not with the engine it was exported for (issue 33 item 6).

A drafter `specdec-train export` wrote for SGLang (ids [0, 1, 2]; training_provenance.json: trained on output indices
[0, 1, 2], input indices [1, 2, 3]) whose config a user corrected by hand for vLLM (ids [1, 2, 3]) serves well under
vLLM (2.71 served against 2.67 offline; 2.15 with the uncorrected ids): the validator passes it, and names the ids to
write when they are not the trained layers. SGLang captures the input of layer id + 1 (its DeepSeek family: + 1 only
when the first id is 1), vLLM the input of layer id (enginefacts.EngineFacts.aux_layer_id_offset)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from specdec_operator import validator
from specdec_operator.validator import ValidationReport, format_text
from specdec_operator.validator.provenance import TRAINER
from tests.support import model_dirs as md

REPO = Path(__file__).resolve().parents[2]
LLAMA_4_LAYERS = dict(md.LLAMA_31_8B, num_hidden_layers=4)
OUTPUTS = [0, 1, 2]  # the trained layers as output indices (SGLang's ids on a Llama target)
INPUTS = [1, 2, 3]  # the same layers as input indices (vLLM's ids)
ID_CODES = {"DrafterExportedForOtherEngine", "AuxLayersNotTrained", "DrafterConvertedForEngine"}


def provenance(engine: str | None, outputs: list[int] | None = OUTPUTS) -> dict[str, Any]:
    """training_provenance.json as `specdec-train export --engine <engine>` writes it."""
    doc: dict[str, Any] = {
        "target_model": "meta-llama/Llama-3.1-8B-Instruct",
        "target_quantization": "bf16",
        "hidden_state_source": "transformers",
        "num_samples": 200_000,
        "epochs": 3,
        "trainer": TRAINER,
    }
    if engine is not None:
        doc["engine"] = engine
    if outputs is not None:
        doc["capture_layer_ids"] = {"sglang_config_output_index": outputs, "input_index": [i + 1 for i in outputs]}
    return doc


def drafter(root: Path, name: str, ids: list[int] | None, prov: dict[str, Any] | None, **cfg: Any) -> Path:
    config = md.llama31_8b_drafter_config(aux_layer_ids=ids, **cfg) if "hidden" not in cfg else md.eagle3_config(aux_layer_ids=ids, **cfg)
    return md.make_drafter(root / name, config, provenance=prov)


def check(target: Path, drafter_dir: Path, engine: str) -> ValidationReport:
    argv = ["--target", str(target), "--drafter", str(drafter_dir), "--engine", engine]
    report, _ = validator.run(validator.build_parser().parse_args(argv))
    return report


def messages(report: ValidationReport, severity: str | None = None) -> dict[str, str]:
    return {f.code: f.message for f in report.findings if severity is None or f.severity == severity}


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return md.make_target(tmp_path_factory.mktemp("t") / "llama-4", LLAMA_4_LAYERS, tokenizer_config=md.LLAMA_31_TOKENIZER)


def test_an_sglang_export_corrected_by_hand_for_vllm_passes_under_vllm(tmp_path: Path, llama: Path) -> None:
    corrected = drafter(tmp_path, "corrected", INPUTS, provenance("sglang"))
    report = check(llama, corrected, "vllm")
    assert report.compatible and messages(report, "error") == {}, report.findings
    info = messages(report)["DrafterConvertedForEngine"]
    assert "exported for SGLang" in info and "[1, 2, 3]" in info and "vLLM's numbering" in info
    # The CLI's verdict and summary line: the engine validated for, not SGLang.
    proc = subprocess.run(
        [sys.executable, "-m", "specdec_operator.cli", "validate", "--target", str(llama), "--drafter", str(corrected), "--engine", "vllm"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = proc.stdout.splitlines()[0]
    assert summary.startswith("compatible: 0 error(s)") and "on vLLM 0.32.0)" in summary and "SGLang" not in summary


def test_the_uncorrected_sglang_export_under_vllm_names_the_ids_to_write(tmp_path: Path, llama: Path) -> None:
    report = check(llama, drafter(tmp_path, "as-exported", OUTPUTS, provenance("sglang")), "vllm")
    errors = messages(report, "error")
    assert not report.compatible and set(errors) & ID_CODES == {"DrafterExportedForOtherEngine"}, report.findings
    message = errors["DrafterExportedForOtherEngine"]
    assert "exported for SGLang" in message and "runs vLLM" in message and "\n" not in message
    assert "write eagle_aux_hidden_state_layer_ids [1, 2, 3] in config.json" in message
    assert "specdec-train export --engine vllm" in message
    assert "on vLLM 0.32.0)" in format_text(report).splitlines()[0]


def test_the_same_for_sglang_in_reverse(tmp_path: Path, llama: Path) -> None:
    corrected = check(llama, drafter(tmp_path, "corrected", OUTPUTS, provenance("vllm")), "sglang")
    assert corrected.compatible and messages(corrected, "error") == {}, corrected.findings
    assert "exported for vLLM" in messages(corrected)["DrafterConvertedForEngine"]
    assert "on SGLang 0.5.23)" in format_text(corrected).splitlines()[0]

    uncorrected = check(llama, drafter(tmp_path, "as-exported", INPUTS, provenance("vllm")), "sglang")
    errors = messages(uncorrected, "error")
    assert "write eagle_aux_hidden_state_layer_ids [0, 1, 2] in config.json" in errors["DrafterExportedForOtherEngine"]
    assert "runs SGLang" in errors["DrafterExportedForOtherEngine"]
    assert "AuxLayerOutOfRange" in errors  # id 3 + 1 is past the 4 layers SGLang captures on a Llama target


def test_ids_that_are_neither_engines_numbers_name_the_fix_for_the_serving_engine(tmp_path: Path, llama: Path) -> None:
    for engine, write in (("vllm", INPUTS), ("sglang", OUTPUTS)):
        report = check(llama, drafter(tmp_path, f"edited-{engine}", [0, 2, 3], provenance("sglang")), engine)
        message = messages(report, "error")["AuxLayersNotTrained"]
        assert f"records {write} for " in message and f"write eagle_aux_hidden_state_layer_ids {write} in config.json" in message
        assert "DrafterExportedForOtherEngine" not in messages(report)
    # No ids in config.json: the engine's defaults (2, L//2, L-3 = 2, 2, 1 here) are not the trained layers either.
    report = check(llama, drafter(tmp_path, "no-ids", None, provenance("vllm")), "vllm")
    assert "names no eagle_aux_hidden_state_layer_ids" in messages(report, "error")["AuxLayersNotTrained"]


def test_sglangs_deepseek_rule_decides_the_ids_to_write(tmp_path: Path) -> None:
    # DeepseekV3ForCausalLM adds one only when the first id is 1: trained on the inputs of layers [2, 30, 58], SGLang
    # reads them from ids [1, 29, 57] or, like vLLM, from [2, 30, 58].
    target = md.make_target(tmp_path / "kimi-k2", md.KIMI_K2, tokenizer_config=md.KIMI_TOKENIZER, shards=1)
    kimi = dict(hidden=7168, vocab=163840, heads=64, kv_heads=8, head_dim=128, intermediate=18432, max_position=131072)
    prov = provenance("vllm", outputs=[1, 29, 57])
    as_for_vllm = drafter(tmp_path, "for-vllm", [2, 30, 58], prov, **kimi)
    for engine in ("vllm", "sglang"):
        report = check(target, as_for_vllm, engine)
        assert set(messages(report, "error")) & ID_CODES == set(), (engine, report.findings)
    report = check(target, drafter(tmp_path, "for-sglang", [1, 29, 57], prov, **kimi), "vllm")
    assert "write eagle_aux_hidden_state_layer_ids [2, 30, 58]" in messages(report, "error")["AuxLayersNotTrained"]


def test_drafters_without_provenance_or_trained_layers_are_checked_as_before(tmp_path: Path, llama: Path) -> None:
    for ids in (OUTPUTS, INPUTS):
        bare = drafter(tmp_path, f"bare-{ids[0]}", ids, None)
        for engine in ("sglang", "vllm"):
            assert set(messages(check(llama, bare, engine))) & ID_CODES == set()
    assert check(llama, drafter(tmp_path, "bare-v", INPUTS, None), "vllm").compatible
    assert "AuxLayerOutOfRange" in messages(check(llama, drafter(tmp_path, "bare-s", INPUTS, None), "sglang"), "error")
    # Provenance that names the export engine but not the trained layers: whether the ids were converted is not
    # known, so a warning (not a refusal) says what to do if they were not.
    report = check(llama, drafter(tmp_path, "no-layers", INPUTS, provenance("sglang", outputs=None)), "vllm")
    assert report.compatible
    warning = messages(report, "warning")["DrafterExportedForOtherEngine"]
    assert "records no capture_layer_ids" in warning and "specdec-train export --engine vllm" in warning
    # Another trainer's provenance, without engine or layers: nothing to compare.
    other = {k: v for k, v in provenance(None, outputs=None).items() if k != "trainer"}
    assert set(messages(check(llama, drafter(tmp_path, "other", OUTPUTS, other), "vllm"))) & ID_CODES == set()


def test_context_warnings_say_what_the_serving_engine_does(tmp_path: Path, llama: Path) -> None:
    # The drafter says 2048 positions, the target 131072: SGLang refuses to start unless told, vLLM caps the draft.
    d = drafter(tmp_path, "d", INPUTS, None)
    sglang, vllm = (messages(check(llama, d, e), "warning")["ContextLengthExceedsDrafter"] for e in ("sglang", "vllm"))
    assert "SGLang 0.5.23 refuses to start unless SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1" in sglang
    assert "vLLM 0.32.0 caps the draft's max_model_len at 2048" in vllm and "SGLANG" not in vllm
    argv = ["--target", str(llama), "--drafter", str(d), "--engine", "vllm", "--context-length", "200000"]
    report, _ = validator.run(validator.build_parser().parse_args(argv))
    assert "vLLM 0.32.0 refuses to start unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1" in messages(report)["ContextLengthExceedsTarget"]


def test_the_json_report_names_the_engine_and_its_release(tmp_path: Path, llama: Path) -> None:
    doc = check(llama, drafter(tmp_path, "d", INPUTS, provenance("sglang")), "vllm").to_dict()
    assert (doc["engine"], doc["engine_version"]) == ("vllm", "0.32.0")
    assert json.loads(json.dumps(doc))["compatible"] is True
