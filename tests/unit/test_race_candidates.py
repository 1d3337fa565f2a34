"""The real-engine race's candidates (tests/support/race_candidates.py) as the operator renders them: one spec, three
--speculative-config documents, the draft models found in the local build instead of the pod's /models mount."""

from __future__ import annotations

from pathlib import Path

from tests.support.copy_models import CopyModels
from tests.support.race_candidates import CANDIDATES, candidate_server, rendered_config


def test_each_candidate_renders_its_vllm_method_with_the_local_draft_model(tmp_path: Path) -> None:
    models = CopyModels(tmp_path / "build")
    configs = {name: rendered_config(name, models) for name in CANDIDATES}
    assert configs["eagle3"] == {"method": "eagle3", "model": str(models.eagle3), "num_speculative_tokens": 3}
    assert configs["draft-model"] == {"method": "draft_model", "model": str(models.draft), "num_speculative_tokens": 3}
    assert configs["ngram"] == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4}


def test_a_candidate_server_serves_the_target_with_its_config(tmp_path: Path) -> None:
    models = CopyModels(tmp_path / "build")
    server = candidate_server(models, "draft-model", tmp_path / "dm.log")
    cmd = server.command("python")
    assert cmd[cmd.index("--model") + 1] == str(models.target)
    assert '"method": "draft_model"' in cmd[cmd.index("--speculative-config") + 1]
    assert server.core == "1"
