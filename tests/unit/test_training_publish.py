"""`specdec-train publish` (a retraining Job's last stage, issue 36 item 2): a revision appears whole or not at all,
and partial artifacts are never a revision. `specdec-train capture --capture-layers-of DIR`: the layers a warm start
needs, read from the exported drafter."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from drafter_training.export import export_drafter
from drafter_training.model import Eagle3Draft, trainable_state_dict
from drafter_training.publish import MARKER, is_published, publish, read_marker
from drafter_training.target import read_config
from drafter_training.train import draft_config_from_target
from drafter_training.warmstart import trained_layers
from specdec_operator.errors import InputError
from tests.support.tiny_models import make_model

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A drafter exported for vLLM from a run's final/ made by hand (random weights: publishing reads no numbers)."""
    root = tmp_path_factory.mktemp("publish")
    target = make_model(root / "target", "llama", layers=4)
    cfg = draft_config_from_target(read_config(target), 32, [0, 1, 2])
    final = root / "run" / "final"
    final.mkdir(parents=True)
    draft = Eagle3Draft(cfg)
    save_file({k: v.contiguous() for k, v in trainable_state_dict(draft).items()}, str(final / "draft.safetensors"))
    (final / "draft_config.json").write_text(json.dumps(cfg.to_dict()))
    (final / "train_summary.json").write_text(json.dumps({"num_samples": 1, "capture": {"source": "hf", "target_quantization": "none"}}))
    export_drafter(final, target, root / "drafter", engine="vllm")
    return root, target


def _staging(root: Path, name: str) -> Path:
    staging = root / name
    (staging / "work").mkdir(parents=True)
    (staging / "work" / "checkpoint.pt").write_bytes(b"partial")
    (staging / "export").mkdir()
    for f in (root / "drafter").iterdir():
        (staging / "export" / f.name).write_bytes(f.read_bytes())
    return staging


def test_publish_renames_the_checked_export_with_its_marker_and_removes_the_staging(exported):
    root, _ = exported
    staging = _staging(root, "staging-ok")
    out = root / "revisions" / "r-train-1"
    marker = publish(staging, out, "r-train-1")
    assert is_published(out) and not staging.exists()
    assert marker == read_marker(out) and marker["job"] == "r-train-1"
    on_disk = {p.name for p in out.iterdir()}
    assert on_disk == {"config.json", "model.safetensors", "training_provenance.json", MARKER}
    assert marker["files"]["model.safetensors"] == hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()
    # A pod that died after the rename runs the stage again: the revision stands as it was.
    assert publish(staging, out, "r-train-1") == marker


def test_a_broken_export_is_never_a_revision(exported):
    root, _ = exported
    staging = _staging(root, "staging-broken")
    tensors = load_file(str(staging / "export" / "model.safetensors"))
    del tensors["lm_head.weight"]  # an export cut short: the engine would skip the missing name silently
    save_file(tensors, str(staging / "export" / "model.safetensors"))
    out = root / "revisions" / "r-train-2"
    with pytest.raises(InputError, match="lm_head.weight missing"):
        publish(staging, out, "r-train-2")
    assert not out.exists() and not is_published(out) and (staging / "work" / "checkpoint.pt").exists()
    with pytest.raises(InputError, match="no export; run specdec-train export"):
        publish(root / "staging-none", out)
    # A directory that is there but was not published here is refused rather than mixed with.
    out.mkdir(parents=True)
    with pytest.raises(InputError, match=f"exists without {MARKER}"):
        publish(_staging(root, "staging-again"), out)


def test_capture_layers_of_an_exported_drafter(exported, tmp_path):
    root, target = exported
    assert trained_layers(root / "drafter", target) == [0, 1, 2]  # vLLM's config says [1, 2, 3]: its provenance says the trained ones
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "drafter_training.cli",
            "capture",
            "--samples",
            str(tmp_path / "none.jsonl"),
            "--target",
            str(target),
            "--out",
            str(tmp_path / "cap"),
            "--capture-layers",
            "1,2,3",
            "--capture-layers-of",
            str(root / "drafter"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )
    assert proc.returncode == 2 and "--capture-layers with --capture-layers-of: pass one of them" in proc.stderr


def test_publish_keeps_the_held_out_slice_beside_the_drafter_for_the_race_and_none_when_empty(exported):
    """gather's heldout.jsonl goes into the revision (its hash in the marker), where the operator's race reads it as a
    workload on the revisions claim; an empty slice publishes no file."""
    root, _ = exported
    rows = "".join(json.dumps({"id": f"{i:016x}", "messages": [{"role": "user", "content": f"Repeat this text: w{i}"}]}) + "\n" for i in range(3))
    staging = _staging(root, "staging-heldout")
    (staging / "work" / "prompts").mkdir()
    (staging / "work" / "prompts" / "heldout.jsonl").write_text(rows)
    out = root / "revisions" / "r-train-5"
    marker = publish(staging, out, "r-train-5")
    assert (out / "heldout.jsonl").read_text() == rows and (out / "heldout.jsonl").stat().st_mode & 0o777 == 0o644
    assert marker["files"]["heldout.jsonl"] == hashlib.sha256(rows.encode()).hexdigest()
    staging = _staging(root, "staging-empty")
    (staging / "work" / "prompts").mkdir()
    (staging / "work" / "prompts" / "heldout.jsonl").write_text("")
    publish(staging, root / "revisions" / "r-train-6", "r-train-6")
    assert not (root / "revisions" / "r-train-6" / "heldout.jsonl").exists()
