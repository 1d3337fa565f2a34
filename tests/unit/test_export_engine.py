"""`specdec-train export --engine`: a drafter written for the engine that serves it, the engine recorded in its
provenance, and `specdec validate --engine` refusing a drafter exported for the other one (issue 26 item 2).

SGLang captures the input of target layer id + 1, vLLM the input of layer id, so the same trained drafter needs
config ids one apart. The provenance file is one model (validator/provenance.py) read and written by both sides;
files exported before the engine field existed still read, as SGLang exports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from drafter_training.capture import capture_hf
from drafter_training.export import aux_layer_ids_for, export_drafter
from drafter_training.model import DraftConfig
from drafter_training.regenerate import tokenize_conversation
from drafter_training.train import TrainConfig, train
from drafter_training.vocab import build_vocab
from specdec_operator.errors import InputError
from specdec_operator.validator.modelmeta import read_model_dir
from specdec_operator.validator.provenance import TRAINER, CaptureLayerIds, DrafterProvenance
from specdec_operator.validator.speculators import flatten
from tests.support.tiny_models import make_model

REPO = Path(__file__).resolve().parents[2]
LAYERS = [0, 1, 2]  # output indices of a 4-layer target, as training records them


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    from transformers import AutoTokenizer

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("engine")
    target = make_model(root / "target", "llama", layers=4)
    tok = AutoTokenizer.from_pretrained(str(target))
    with (root / "samples.jsonl").open("w") as f:
        for i in range(8):
            msgs = [{"role": "user", "content": f"hello {i} world"}, {"role": "assistant", "content": "def add(a, b): return a + b " * (1 + i % 3)}]
            ids, mask = tokenize_conversation(tok, msgs)
            f.write(json.dumps({"id": i, "input_ids": ids, "loss_mask": mask}) + "\n")
    capture_hf(root / "samples.jsonl", target, root / "cap", quantization="none", capture_layers=LAYERS, progress=False)
    build_vocab(root / "cap", root / "cap", 64)
    train(
        TrainConfig(
            capture_dir=str(root / "cap"),
            target_dir=str(target),
            out_dir=str(root / "run"),
            epochs=1,
            batch_size=4,
            ttt_steps=2,
            eval_fraction=0.25,
            progress=False,
        )
    )
    torch.set_num_threads(before)
    return root, target


def validate_cli(target: Path, drafter: Path, *extra: str) -> tuple[int, dict]:
    proc = subprocess.run(
        [sys.executable, "-m", "specdec_operator.cli", "validate", "--target", str(target), "--drafter", str(drafter), "--json", *extra],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def errors(report: dict) -> dict[str, str]:
    return {f["code"]: f["message"] for f in report["findings"] if f["severity"] == "error"}


def test_each_engine_gets_its_own_layer_ids_and_the_same_weights(trained_run):
    root, target = trained_run
    sglang = export_drafter(root / "run" / "final", target, root / "for-sglang", engine="sglang")
    vllm = export_drafter(root / "run" / "final", target, root / "for-vllm", engine="vllm")

    def ids(d: str) -> list[int]:
        return json.loads((root / d / "config.json").read_text())["eagle_config"]["eagle_aux_hidden_state_layer_ids"]

    assert ids("for-sglang") == LAYERS
    assert ids("for-vllm") == [i + 1 for i in LAYERS]
    assert (sglang.engine, vllm.engine) == ("sglang", "vllm")
    assert sglang.capture_layer_ids == vllm.capture_layer_ids == CaptureLayerIds(LAYERS, [i + 1 for i in LAYERS])
    a, b = load_file(str(root / "for-sglang" / "model.safetensors")), load_file(str(root / "for-vllm" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    on_disk = json.loads((root / "for-vllm" / "training_provenance.json").read_text())
    assert on_disk["engine"] == "vllm" and on_disk["capture_layer_ids"] == {"sglang_config_output_index": LAYERS, "input_index": [1, 2, 3]}
    # What the validator reads is what the export wrote.
    assert read_model_dir(str(root / "for-vllm"), role="drafter").provenance == vllm


def test_validator_passes_the_matching_engine_and_names_the_fix_for_the_other(trained_run):
    root, target = trained_run
    export_drafter(root / "run" / "final", target, root / "s", engine="sglang")
    export_drafter(root / "run" / "final", target, root / "v", engine="vllm")

    for drafter, engine in (("s", "sglang"), ("v", "vllm")):
        rc, report = validate_cli(target, root / drafter, "--engine", engine)
        assert rc == 0 and errors(report) == {} and report["engine"] == engine, report["findings"]

    rc, report = validate_cli(target, root / "s", "--engine", "vllm")
    message = errors(report)["DrafterExportedForOtherEngine"]
    assert rc == 1
    assert f"{root / 's'}/training_provenance.json" in message and "exported for SGLang" in message
    assert "runs vLLM" in message and "specdec-train export --engine vllm" in message and "\n" not in message

    rc, report = validate_cli(target, root / "v")  # the default engine is SGLang
    assert rc == 1 and "specdec-train export --engine sglang" in errors(report)["DrafterExportedForOtherEngine"]
    # vLLM's ids for this 4-layer target include 3, whose output SGLang never captures (3 + 1 == 4 layers).
    assert "AuxLayerOutOfRange" in errors(report)


def test_config_ids_edited_away_from_the_trained_layers_are_caught(trained_run):
    root, target = trained_run
    out = root / "edited"
    export_drafter(root / "run" / "final", target, out, engine="vllm")
    cfg = json.loads((out / "config.json").read_text())
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = LAYERS  # SGLang's numbers under a vLLM provenance
    (out / "config.json").write_text(json.dumps(cfg))
    rc, report = validate_cli(target, out, "--engine", "vllm")
    assert rc == 1 and "records [1, 2, 3] for vLLM" in errors(report)["AuxLayersNotTrained"]


def test_drafters_exported_before_the_engine_field_read_as_sglang_exports(trained_run):
    root, target = trained_run
    out = root / "old"
    export_drafter(root / "run" / "final", target, out, engine="sglang")
    prov = json.loads((out / "training_provenance.json").read_text())
    del prov["engine"]  # the file as exports before this field wrote it
    (out / "training_provenance.json").write_text(json.dumps(prov))
    read = read_model_dir(str(out), role="drafter").provenance
    assert read is not None and read.engine is None and read.exported_for() == "sglang"
    assert validate_cli(target, out)[0] == 0
    rc, report = validate_cli(target, out, "--engine", "vllm")
    assert rc == 1 and "DrafterExportedForOtherEngine" in errors(report)

    # Provenance from another trainer says nothing about the engine: no engine finding either way.
    (out / "training_provenance.json").write_text(json.dumps({"target_model": "t", "num_samples": 10}))
    rc, report = validate_cli(target, out, "--engine", "vllm")
    assert "DrafterExportedForOtherEngine" not in errors(report)


def test_the_ids_written_capture_the_trained_layers_under_each_engines_rule_for_the_target():
    """SGLang adds one to each id on most targets, vLLM none; SGLang's DeepSeek family adds one only when the first id
    is 1 (deepseek_v2.py), so there the ids are chosen to capture the trained layers, and a set it cannot capture is
    refused in one line rather than exported one layer off (validator/checks.ids_capturing)."""

    def draft(outputs: list[int]) -> DraftConfig:
        return DraftConfig(
            hidden_size=64,
            intermediate_size=128,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=320,
            draft_vocab_size=64,
            target_hidden_size=64,
            aux_layer_ids=outputs,
        )

    llama = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 61}
    deepseek = {"architectures": ["DeepseekV3ForCausalLM"], "num_hidden_layers": 61}
    assert aux_layer_ids_for(draft([2, 30, 58]), llama, "sglang") == [2, 30, 58]
    assert aux_layer_ids_for(draft([2, 30, 58]), llama, "vllm") == aux_layer_ids_for(draft([2, 30, 58]), deepseek, "vllm") == [3, 31, 59]
    assert aux_layer_ids_for(draft([1, 29, 57]), deepseek, "sglang") == [1, 29, 57]  # first id 1: SGLang adds one
    assert aux_layer_ids_for(draft([2, 30, 58]), deepseek, "sglang") == [3, 31, 59]  # taken as given
    with pytest.raises(
        InputError,
        match=r"^--engine sglang: no eagle_aux_hidden_state_layer_ids make SGLang 0\.5\.23's DeepseekV3ForCausalLM capture the inputs of target layers \[1, 2, 3\]",
    ) as info:
        aux_layer_ids_for(draft([0, 1, 2]), deepseek, "sglang")
    assert "\n" not in str(info.value) and "--capture-layers" in str(info.value)
    assert aux_layer_ids_for(draft([0, 1, 2]), deepseek, "vllm") == [1, 2, 3]


def test_provenance_model_round_trips_and_refuses_bad_fields_in_one_line():
    doc = {
        "target_model": "m",
        "num_samples": 3,
        "epochs": 1.5,
        "engine": "vllm",
        "capture_layer_ids": {"sglang_config_output_index": [1, 5], "input_index": [2, 6]},
        "trainer": TRAINER,
        "notes": {"kept": True},  # a key the model does not know survives a round trip
    }
    prov = DrafterProvenance.from_json(doc, "p.json")
    assert prov.extra == {"notes": {"kept": True}} and prov.capture_layer_ids is not None
    assert prov.capture_layer_ids.for_engine("vllm") == [2, 6] and prov.capture_layer_ids.for_engine("sglang") == [1, 5]
    assert DrafterProvenance.from_json(prov.to_json(), "p.json") == prov
    for bad, words in (
        ({"engine": "tgi"}, "p.json: engine must be one of sglang, vllm"),
        ({"num_samples": -1}, "p.json: num_samples must be >= 0"),
        ({"num_samples": True}, "p.json: num_samples must be an integer"),
        (
            {"capture_layer_ids": {"sglang_config_output_index": [1], "input_index": [1]}},
            "p.json: capture_layer_ids: input_index [1] must be sglang_config_output_index [1] plus one",
        ),
        ([], "p.json: must be a JSON object"),
    ):
        with pytest.raises(InputError, match="^" + words.replace("[", r"\[").replace("]", r"\]")) as info:
            DrafterProvenance.from_json(bad, "p.json")
        assert "\n" not in str(info.value)


def test_export_cli_takes_the_engine_and_refuses_an_unknown_one(trained_run):
    root, target = trained_run
    cli = [sys.executable, "-m", "drafter_training.cli", "--quiet", "export", "--run", str(root / "run"), "--target", str(target)]
    proc = subprocess.run([*cli, "--out", str(root / "cli"), "--engine", "vLLM"], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["engine"] == "vllm"
    proc = subprocess.run([*cli, "--out", str(root / "cli2"), "--engine", "tgi"], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert proc.returncode == 2 and "--engine: invalid choice: 'tgi'" in proc.stderr


def full_vocabulary_run(root: Path, name: str, order: str = "identity") -> Path:
    """The trained run's final/ with its draft vocabulary widened to the target's whole one (what `specdec-train vocab
    --draft-vocab-size <vocab>` makes): lm_head over every token, d2t all zero offsets (or a reordering), t2d all set."""
    src, out = root / "run" / "final", root / name / "final"
    out.mkdir(parents=True)
    cfg = json.loads((src / "draft_config.json").read_text())
    vocab = cfg["vocab_size"]
    cfg["draft_vocab_size"] = vocab
    (out / "draft_config.json").write_text(json.dumps(cfg))
    (out / "train_summary.json").write_text((src / "train_summary.json").read_text())
    state = load_file(str(src / "draft.safetensors"))
    state["lm_head.weight"] = torch.randn(vocab, state["lm_head.weight"].shape[1])
    state["d2t"] = torch.zeros(vocab, dtype=torch.int64)
    if order == "swapped":  # draft tokens 0 and 1 are target tokens 1 and 0
        state["d2t"][0], state["d2t"][1] = 1, -1
    state["t2d"] = torch.ones(vocab, dtype=torch.bool)
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in state.items()}, str(out / "draft.safetensors"))
    return out


def test_a_full_draft_vocabulary_is_exported_for_vllm_without_its_token_maps(trained_run):
    # vLLM 0.32 builds draft_id_to_target_id only for a smaller draft vocabulary and refuses d2t otherwise
    # (docs/vllm-cpu.md: both servers died at weight loading); SGLang loads it.
    root, target = trained_run
    final = full_vocabulary_run(root, "full")
    export_drafter(final, target, root / "full-v", engine="vllm")
    export_drafter(final, target, root / "full-s", engine="sglang")
    assert not {"d2t", "t2d"} & load_file(str(root / "full-v" / "model.safetensors")).keys()
    assert {"d2t", "t2d"} <= load_file(str(root / "full-s" / "model.safetensors")).keys()

    rc, report = validate_cli(target, root / "full-v", "--engine", "vllm")
    assert rc == 0 and errors(report) == {}, report["findings"]
    rc, report = validate_cli(target, root / "full-s", "--engine", "sglang")
    assert rc == 0 and errors(report) == {}, report["findings"]
    # The SGLang export served by vLLM: the token map vLLM would refuse, besides the layer ids one apart.
    rc, report = validate_cli(target, root / "full-s", "--engine", "vllm")
    message = errors(report)["TokenMapWithFullVocabulary"]
    assert rc == 1 and "specdec-train export --engine vllm" in message and "\n" not in message
    assert "DrafterExportedForOtherEngine" in errors(report)


def test_a_reordered_full_vocabulary_is_refused_for_vllm_in_one_line(trained_run):
    root, target = trained_run
    final = full_vocabulary_run(root, "swapped", order="swapped")
    with pytest.raises(InputError, match="d2t reorders it") as err:
        export_drafter(final, target, root / "swapped-v", engine="vllm")
    assert "\n" not in str(err.value)
    export_drafter(final, target, root / "swapped-s", engine="sglang")  # SGLang takes the map


def export_speculators(trained_run, name: str) -> tuple[Path, Path, dict]:
    root, target = trained_run
    out = root / name
    export_drafter(root / "run" / "final", target, out, engine="vllm", fmt="speculators", speculative_tokens=3)
    return out, target, json.loads((out / "config.json").read_text())


def test_a_speculators_export_flattens_to_the_plain_vllm_export_and_passes_for_vllm_only(trained_run):
    root, target = trained_run
    out, _, cfg = export_speculators(trained_run, "speculators")
    export_drafter(root / "run" / "final", target, root / "plain-v", engine="vllm")
    plain = json.loads((root / "plain-v" / "config.json").read_text())
    assert cfg["architectures"] == ["Eagle3Speculator"] and cfg["speculators_model_type"] == "eagle3"
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
    assert cfg["norm_before_residual"] is False  # written out: the format's default (true) is not how it was trained
    # What vLLM builds its draft class from is the plain vLLM export's config, under vLLM's own class name.
    flat, notes = flatten(cfg)
    assert flat is not None and notes == []
    assert flat["architectures"] == ["Eagle3LlamaForCausalLM"] and flat["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    assert {k: v for k, v in flat.items() if k in plain and k != "architectures"} == {
        k: v for k, v in plain.items() if k not in ("architectures", "eagle_config")
    }
    a, b = load_file(str(out / "model.safetensors")), load_file(str(root / "plain-v" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    rc, report = validate_cli(target, out, "--engine", "vllm")
    assert rc == 0 and errors(report) == {}, report["findings"]
    codes = {f["code"] for f in report["findings"]}
    assert "SpeculatorsFormat" in codes and "NormBeforeResidualDefault" not in codes
    rc, report = validate_cli(target, out)  # SGLang cannot load the format
    assert rc == 1 and "speculators format" in errors(report)["DrafterArchitectureUnsupported"]


def test_a_speculators_config_vllm_would_refuse_or_misread_is_named_by_its_field(trained_run):
    out, target, cfg = export_speculators(trained_run, "speculators-edited")
    del cfg["norm_before_residual"]  # vLLM then normalises before the residual: not how the layer was trained
    (out / "config.json").write_text(json.dumps(cfg))
    rc, report = validate_cli(target, out, "--engine", "vllm")
    warning = next(f for f in report["findings"] if f["code"] == "NormBeforeResidualDefault")
    assert rc == 0 and warning["severity"] == "warning" and warning["field"] == "drafter.config.norm_before_residual"

    del cfg["speculators_config"]["verifier"]
    (out / "config.json").write_text(json.dumps(cfg))
    rc, report = validate_cli(target, out, "--engine", "vllm")
    assert rc == 1 and "speculators_config.verifier.name_or_path" in errors(report)["DrafterConfigIncomplete"]

    cfg["speculators_config"]["verifier"] = {"name_or_path": "t"}
    cfg["transformer_layer_config"]["model_type"] = "mistral"
    (out / "config.json").write_text(json.dumps(cfg))
    rc, report = validate_cli(target, out, "--engine", "vllm")
    assert rc == 1 and "'mistral'" in errors(report)["DrafterArchitectureUnsupported"]


def test_the_speculators_format_is_refused_for_sglang_in_one_line(trained_run):
    root, target = trained_run
    with pytest.raises(InputError, match=r"^--format speculators with --engine sglang: only vLLM reads the speculators format") as info:
        export_drafter(root / "run" / "final", target, root / "no", engine="sglang", fmt="speculators")
    assert "\n" not in str(info.value) and not (root / "no").exists()


@pytest.mark.realengine
def test_vllms_own_speculators_reader_builds_what_the_validator_checks(trained_run):
    """vLLM 0.32's SpeculatorsConfig (its CPU build's venv, make vllm-cpu) on the export: the config its draft class
    is built from, and the speculative config it derives, are what validator/speculators.py says."""
    from tests.support.vllm_servers import vllm_env

    out, _, cfg = export_speculators(trained_run, "speculators-vllm")
    env = vllm_env("0")
    script = (
        "import json, sys\n"
        "from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig\n"
        "c = SpeculatorsConfig.from_pretrained(sys.argv[1])\n"
        "d = json.load(open(sys.argv[1] + '/config.json'))\n"
        "keys = ['architectures', 'eagle_aux_hidden_state_layer_ids', 'norm_before_residual', 'norm_before_fc', 'draft_vocab_size',\n"
        "        'target_hidden_size', 'hidden_size', 'intermediate_size', 'num_attention_heads', 'vocab_size', 'max_position_embeddings']\n"
        "print(json.dumps({'config': {k: getattr(c, k, None) for k in keys}, 'spec': SpeculatorsConfig.extract_vllm_speculative_config(d)}))\n"
    )
    proc = subprocess.run([f"{env['VLLM_VENV']}/bin/python", "-c", script, str(out)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    theirs = json.loads(proc.stdout.strip().splitlines()[-1])
    flat, _ = flatten(cfg)
    assert flat is not None
    assert theirs["config"] == {k: flat.get(k) for k in theirs["config"]}
    assert theirs["spec"] == {"method": "eagle3", "num_speculative_tokens": 3}
