"""One truth about the SGLang release, and specs that contradict themselves, refused at admission (issue 25, item 6).

The release comes from the image tag where the tag names one; a sglangVersion that disagrees is refused naming
both; an unknown release is refused; NEXTN with a drafter.path is refused. The unit tests parse specs as the CLI
does (pydantic and the CRD's CEL rules through cel-python); tests/cluster/test_admission_cluster.py sends the same
specs to the real API server. Also here: the validator's TargetWeightsMissing.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from specdec_operator import SGLANG_VERSION, api
from specdec_operator import sglang as sglang_args
from specdec_operator.choices import SGLANG_VERSIONS
from specdec_operator.errors import InputError
from specdec_operator.resource import parse_spec
from specdec_operator.validator.cli import build_parser, run
from tests.support import model_dirs as md

SPEC: dict[str, Any] = {
    "image": "lmsysorg/sglang:v0.5.23-cu129",
    "model": {"volume": {"persistentVolumeClaim": {"claimName": "weights"}}},
    "target": {"path": "llama"},
    "drafter": {"path": "eagle3/llama"},
    "resources": {"gpus": 1, "gpuFamily": "hopper"},
}


def spec_with(**fields: Any) -> dict[str, Any]:
    spec = copy.deepcopy(SPEC)
    spec.update(copy.deepcopy(fields))
    return spec


def refusal(spec: dict[str, Any]) -> str:
    with pytest.raises(InputError) as info:
        parse_spec(spec, check_rules=True)
    return str(info.value)


@pytest.mark.parametrize(
    "image, release",
    [
        ("lmsysorg/sglang:v0.5.23-cu129", "0.5.23"),
        ("lmsysorg/sglang:v0.5.23", "0.5.23"),
        ("lmsysorg/sglang:0.5.22", "0.5.22"),
        ("lmsysorg/sglang:v0.5.9-cu126-b200", "0.5.9"),
        ("lmsysorg/sglang:v0.5.9_arm64", "0.5.9"),
        ("registry.example:5000/mirror/sglang:v0.5.22-cu129", "0.5.22"),
        ("lmsysorg/sglang:v0.5.23-cu129@sha256:" + "a" * 64, "0.5.23"),
        ("lmsysorg/sglang:v0.5.10.post1-cu129", "0.5.10.post1"),
        ("lmsysorg/sglang:latest", None),
        ("lmsysorg/sglang:dev-cu13", None),
        ("lmsysorg/sglang:v0.5.23rc1", None),
        ("lmsysorg/sglang@sha256:" + "a" * 64, None),
        ("registry.example:5000/sglang", None),
        ("sglang", None),
        ("sglang:0.5.22", "0.5.22"),
        # The version tag of another repository is that image's own version, not SGLang's.
        ("ghcr.io/specdec/sglang-simulator:0.1.0", None),
        ("my-team/inference:0.5.23", None),
        ("my-team/sglang-fork:v0.5.23", None),
    ],
)
def test_the_release_an_image_tag_names(image: str, release: str | None) -> None:
    assert api.image_release(image) == release


def test_the_release_comes_from_the_tag_else_sglang_version_else_the_operators() -> None:
    assert parse_spec(spec_with(image="lmsysorg/sglang:v0.5.22-cu129"), check_rules=True).sglang_version == "0.5.22"
    agreeing = parse_spec(spec_with(image="lmsysorg/sglang:v0.5.9-cu126", sglangVersion="0.5.9"), check_rules=True)
    assert agreeing.sglang_version == "0.5.9" and sglang_args.render_argv(agreeing, "base")[:3] == ["python3", "-m", "sglang.launch_server"]
    assert parse_spec(spec_with(image="mirror.example/sglang:prod", sglangVersion="0.5.22"), check_rules=True).sglang_version == "0.5.22"
    # Admitted under an older CRD (the operator does not check the rules again): rendered for the operator's own release.
    assert parse_spec(spec_with(image="mirror.example/sglang:prod")).sglang_version == SGLANG_VERSION


@pytest.mark.parametrize(
    "image",
    ["mirror.example/sglang:prod", "mirror.example/inference:v0.5.23", "lmsysorg/sglang@sha256:" + "a" * 64, "lmsysorg/sglang:latest"],
)
def test_an_image_that_names_no_release_is_refused_unless_the_spec_names_the_release(image: str) -> None:
    """Issue 34: a mirror that renames the repository, a digest, latest: no silent rendering for the operator's release."""
    message = refusal(spec_with(image=image))
    assert message == f"spec: spec.image: {api.unnamed_release({'image': image})}"
    assert f"image {image} names no SGLang release" in message and "set spec.sglangVersion" in message and "\n" not in message
    assert parse_spec(spec_with(image=image, sglangVersion="0.5.22"), check_rules=True).sglang_version == "0.5.22"
    # vLLM: rendered for its one release; the rule is SGLang's.
    assert api.unnamed_release({"image": image, "engine": "vLLM"}) is None


def test_the_cel_rule_on_an_image_that_names_no_release_says_what_the_parser_says() -> None:
    """The API server evaluates the spec as written (no sglangVersion filled in); cel-python evaluates the same rule."""
    from specdec_operator.celrules import violations
    from specdec_operator.crd import structural_schema
    from specdec_operator.resource import dump

    spec = dump(parse_spec(spec_with(image="mirror.example/inference:v1")))
    del spec["sglangVersion"]  # filled in by parsing; absent on the wire
    found = [(where, text) for where, text in violations(structural_schema(api.SpeculativeServerSpec), spec, "spec")]
    assert found == [("spec.image", api.unnamed_release({"image": "mirror.example/inference:v1"}))]
    spec["sglangVersion"] = "0.5.22"
    assert not list(violations(structural_schema(api.SpeculativeServerSpec), spec, "spec"))


def test_a_sglang_version_that_disagrees_with_the_image_is_refused_naming_both() -> None:
    message = refusal(spec_with(image="lmsysorg/sglang:v0.5.23-cu129", sglangVersion="0.5.22"))
    assert "sglangVersion 0.5.22 disagrees with image lmsysorg/sglang:v0.5.23-cu129 (SGLang 0.5.23)" in message
    assert "leave sglangVersion out" in message and "\n" not in message


def test_an_image_of_an_unknown_release_is_refused() -> None:
    message = refusal(spec_with(image="lmsysorg/sglang:v0.5.10-cu129"))
    assert message.startswith("spec: spec.image:") and "lmsysorg/sglang:v0.5.10-cu129" in message
    assert all(v in message for v in SGLANG_VERSIONS)


def test_an_unknown_sglang_version_is_refused() -> None:
    assert "spec.sglangVersion" in refusal(spec_with(image="mirror.example/sglang:prod", sglangVersion="0.5.10"))


def test_the_releases_the_api_admits_are_the_ones_the_renderer_knows() -> None:
    assert set(SGLANG_VERSIONS) == set(sglang_args.RELEASES) and SGLANG_VERSION in SGLANG_VERSIONS


def test_the_cel_message_expression_names_both_as_the_parser_does() -> None:
    """The API server's message comes from messageExpression; cel-python evaluates the same expression."""
    from specdec_operator.celrules import violations
    from specdec_operator.crd import structural_schema
    from specdec_operator.resource import dump

    spec = dump(parse_spec(spec_with(image="lmsysorg/sglang:v0.5.22")))  # defaulted, as the API server evaluates it
    spec["sglangVersion"] = "0.5.9"
    found = [text for _, text in violations(structural_schema(api.SpeculativeServerSpec), spec, "spec")]
    assert found == [api.release_disagreement("lmsysorg/sglang:v0.5.22", "0.5.9")]


def test_nextn_with_a_drafter_path_is_refused() -> None:
    message = refusal(spec_with(drafter={"algorithm": "NEXTN", "path": "mtp"}))
    assert "spec.drafter.path: drafter.path must not be set with algorithm NEXTN" in message
    parse_spec(spec_with(drafter={"algorithm": "NEXTN", "numSteps": 1}), check_rules=True)


def _model_dirs(tmp_path: Path) -> tuple[Path, Path]:
    target = md.make_target(tmp_path / "target", md.LLAMA_31_8B, tokenizer_config=md.LLAMA_31_TOKENIZER)
    drafter = md.make_drafter(tmp_path / "drafter", md.llama31_8b_drafter_config())
    return target, drafter


def test_a_target_directory_without_weights_is_a_validator_error(tmp_path: Path) -> None:
    target, drafter = _model_dirs(tmp_path)
    args = build_parser().parse_args(["--target", str(target), "--drafter", str(drafter)])
    report, _ = run(args)
    assert "TargetWeightsMissing" not in report.codes()
    for weights in list(target.glob("*.safetensors")) + list(target.glob("*.index.json")):
        weights.unlink()
    report, _ = run(args)
    assert report.codes("error") == ["TargetWeightsMissing"] and not report.compatible
    finding = next(f for f in report.findings if f.code == "TargetWeightsMissing")
    assert str(target.name) in finding.message and finding.field == "target.path"
    # pytorch_model*.bin counts as weights.
    (target / "pytorch_model.bin").write_bytes(b"\0")
    report, _ = run(args)
    assert "TargetWeightsMissing" not in report.codes()
