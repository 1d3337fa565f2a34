"""The real-engine tier's model cache (tests/support/real_engine.py): its key follows the pipeline's sources and the
build's parameters, so a changed pipeline is rebuilt and an unchanged one is found; a finished build is reused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import real_engine


def test_the_key_changes_with_the_build_parameters_and_the_pipeline_sources(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    key = real_engine.pipeline_key()
    assert real_engine.pipeline_key() == key  # stable
    monkeypatch.setitem(real_engine.BUILD, "train_steps", {"a": 151, "b": 40})
    assert real_engine.pipeline_key() != key
    monkeypatch.undo()
    # A copy of the checkout whose training code differs by one byte gets another key.
    repo = tmp_path / "repo"
    for rel in ["drafter_training", "tests/support", "operator/specdec_operator/validator"]:
        for src in (real_engine.REPO / rel).rglob("*.py"):
            dst = repo / src.relative_to(real_engine.REPO)
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(src.read_bytes())
    monkeypatch.setattr(real_engine, "REPO", repo)
    assert real_engine.pipeline_key() == key
    train = repo / "drafter_training" / "train.py"
    train.write_text(train.read_text() + "\n")
    assert real_engine.pipeline_key() != key


def test_a_finished_build_is_found_without_building(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(real_engine, "CACHE", tmp_path)
    root = tmp_path / real_engine.pipeline_key()
    root.mkdir()
    (root / "build.json").write_text(json.dumps({"seconds": 1}))

    def no_build(dest: Path) -> None:
        raise AssertionError("rebuilt a finished build")

    monkeypatch.setattr(real_engine, "build", no_build)
    models = real_engine.real_engine_models()
    assert models.root == root and models.drafter("b", "sglang") == root / "drafter-b-sglang"


def test_a_failed_build_leaves_nothing_behind(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(real_engine, "CACHE", tmp_path)

    def failing_build(dest: Path) -> None:
        dest.mkdir()
        (dest / "half.jsonl").write_text("{}")
        raise RuntimeError("specdec-train train exited 1")

    monkeypatch.setattr(real_engine, "build", failing_build)
    with pytest.raises(RuntimeError, match="train exited 1"):
        real_engine.real_engine_models()
    assert [p.name for p in tmp_path.iterdir()] == [".lock"]
