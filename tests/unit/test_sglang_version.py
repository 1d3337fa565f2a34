"""The SGLang release is named once, as specdec_operator.SGLANG_VERSION; the files that cannot import it
(the Makefile's wheel pin, the image pins chosen for that release) are checked against it here."""

from __future__ import annotations

import re
from pathlib import Path

from specdec_operator import SGLANG_VERSION, api
from specdec_operator.sglang import supported_versions

ROOT = Path(__file__).resolve().parents[2]


def test_the_makefile_installs_the_release_the_package_describes() -> None:
    pins = re.findall(r"^SGLANG_VERSION \?= (\S+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert pins == [SGLANG_VERSION]


def test_the_training_torch_pin_was_chosen_for_this_release() -> None:
    # The training image carries the torch that SGLang release pins; bumping the release means revisiting it.
    for path in (ROOT / "images" / "images.env", ROOT / "images" / "drafter-training" / "Dockerfile"):
        assert re.findall(r"SGLang (\S+) pins", path.read_text()) == [SGLANG_VERSION], path


def test_the_spec_defaults_to_the_newest_supported_release() -> None:
    # ... when the image's tag names no release (otherwise the tag's release is the one).
    untagged = {"image": "registry.example/sglang:latest", "model": {"volume": {"emptyDir": {}}}, "target": {"path": "t"}, "drafter": {"path": "d"}}
    assert api.SpeculativeServerSpec.model_validate(untagged).sglang_version == SGLANG_VERSION
    assert supported_versions()[-1] == SGLANG_VERSION
