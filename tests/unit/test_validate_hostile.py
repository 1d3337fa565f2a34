"""Hostile model directories: `specdec validate` fails cleanly (exit 2, one line naming the file)
within bounded time and memory, and never with a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdec_operator import validator
from specdec_operator.errors import InputError
from specdec_operator.validator import validate
from specdec_operator.validator.modelmeta import MetaReader, MiB, read_model_dir
from tests.support import model_dirs as md
from tests.support.hostile_dirs import CASES, good_drafter, spread_over_shards, write_raw_safetensors

PEAK_MEMORY_LIMIT = 8 * MiB  # Python allocations while reading one hostile pair


def run_cli(target: Path | bytes, drafter: Path | bytes, *extra: str) -> subprocess.CompletedProcess[bytes]:
    args = [os.fsencode(a) for a in (sys.executable, "-m", "specdec_operator.cli", "validate", "--target", target, "--drafter", drafter, *extra)]
    # A hang (a FIFO read, a symlink chase) fails the test through the timeout.
    return subprocess.run(args, capture_output=True, timeout=60)


def assert_clean_failure(proc: subprocess.CompletedProcess[bytes], *needles: str) -> str:
    err = proc.stderr.decode("utf-8")  # must be valid UTF-8 even for non-UTF-8 names
    assert proc.returncode == 2, (proc.returncode, proc.stdout, err)
    assert proc.stdout == b""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def read_pair_bounded(target: Path, drafter: Path) -> tuple[Exception | None, int]:
    """Read and validate in-process; return the error raised and the peak Python allocation."""
    tracemalloc.start()
    error: Exception | None = None
    try:
        validator.run(validator.build_parser().parse_args(["--target", str(target), "--drafter", str(drafter)]))
    except InputError as exc:
        error = exc
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return error, peak


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return md.make_target(tmp_path_factory.mktemp("t") / "Kimi-K2.5", md.kimi_k25(), tokenizer_config=md.KIMI_TOKENIZER)


@pytest.mark.parametrize("case", list(CASES))
def test_hostile_drafter_fails_cleanly(tmp_path: Path, target: Path, case: str) -> None:
    breaker, needles = CASES[case]
    drafter = good_drafter(tmp_path / "drafter")
    breaker(drafter)
    assert_clean_failure(run_cli(target, drafter), *needles)
    error, peak = read_pair_bounded(target, drafter)
    assert isinstance(error, InputError)
    assert peak < PEAK_MEMORY_LIMIT, f"{case}: peak Python allocation {peak / MiB:.1f} MiB"


def test_symlink_loop_as_the_model_directory(tmp_path: Path, target: Path) -> None:
    os.symlink(tmp_path / "b", tmp_path / "a")
    os.symlink(tmp_path / "a", tmp_path / "b")
    assert_clean_failure(run_cli(target, tmp_path / "a"), "--drafter", "symlink loop")


def test_directory_is_a_file(tmp_path: Path, target: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert_clean_failure(run_cli(target, tmp_path / "model.safetensors"), "--drafter", "not a model directory")


def test_non_utf8_directory_names(tmp_path: Path, target: Path) -> None:
    base = os.fsencode(tmp_path)
    good = base + b"/drafter-\xff\xfe"
    try:
        os.mkdir(good)
    except (OSError, UnicodeError):
        pytest.skip("filesystem refuses non-UTF-8 names")
    good_drafter(Path(os.fsdecode(good)))
    ok = run_cli(target, good, "--json")
    assert ok.returncode == 0, ok.stderr
    doc = json.loads(ok.stdout.decode("utf-8"))
    assert doc["drafter"]["path"].endswith("drafter-\\xff\\xfe")

    empty = base + b"/empty-\xc3\x28\n"
    os.mkdir(empty)
    line = assert_clean_failure(run_cli(target, empty), "config.json", "\\xc3(\\x0a")
    assert "not found" in line


def test_hostile_shard_name_in_index(tmp_path: Path, target: Path) -> None:
    drafter = good_drafter(tmp_path / "d")
    (drafter / "model.safetensors").unlink()
    md.write_json(drafter / "model.safetensors.index.json", {"weight_map": {"fc.weight": "shard-\udcff\n.safetensors"}})
    assert_clean_failure(run_cli(target, drafter), "shard-\\xff\\x0a.safetensors")


def test_tensor_count_is_bounded_across_shards(tmp_path: Path, target: Path) -> None:
    drafter = good_drafter(tmp_path / "d")
    spread_over_shards(drafter)
    assert_clean_failure(run_cli(target, drafter), "model-00003-of-00003.safetensors", "20,000 tensors")
    error, peak = read_pair_bounded(target, drafter)
    assert isinstance(error, InputError) and peak < 128 * MiB


def test_termination_log_written_for_unusable_input(tmp_path: Path, target: Path) -> None:
    drafter = good_drafter(tmp_path / "d")
    CASES["header-claims-2^60"][0](drafter)
    log = tmp_path / "log"
    assert_clean_failure(run_cli(target, drafter, "--termination-log", str(log)))
    doc = json.loads(log.read_text())
    assert doc["compatible"] is False and "model.safetensors" in doc["unusable"]
    assert len(log.read_bytes()) <= 4096


# -- property: arbitrary bytes and arbitrary JSON never escape as anything but InputError ----------------


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(blob=st.binary(max_size=512))
def test_random_safetensors_bytes(tmp_path: Path, blob: bytes) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes(blob)
    try:
        MetaReader().read_safetensors_header(str(path))
    except InputError as exc:
        assert "\n" not in str(exc)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    header=st.dictionaries(
        st.text(max_size=12),
        st.one_of(
            st.none(),
            st.integers(),
            st.text(max_size=8),
            st.fixed_dictionaries(
                {
                    "dtype": st.sampled_from(["BF16", "I64", "F4", "BOOL", "bf16", "X"]),
                    "shape": st.lists(st.integers(min_value=-2, max_value=1 << 40), max_size=4),
                    "data_offsets": st.lists(st.integers(min_value=-1, max_value=1 << 62), max_size=3),
                }
            ),
        ),
        max_size=4,
    )
)
def test_random_safetensors_headers(tmp_path: Path, header: dict[str, Any]) -> None:
    path = tmp_path / "model.safetensors"
    write_raw_safetensors(path, header, 64)
    try:
        tensors, _ = MetaReader().read_safetensors_header(str(path))
    except InputError:
        return
    for info in tensors.values():
        assert all(d >= 0 for d in info.shape)


JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=10)),
    lambda children: st.one_of(st.lists(children, max_size=3), st.dictionaries(st.text(max_size=8), children, max_size=3)),
    max_leaves=10,
)
CONFIG_KEYS = [
    "architectures",
    "hidden_size",
    "vocab_size",
    "num_hidden_layers",
    "draft_vocab_size",
    "target_hidden_size",
    "eagle_config",
    "text_config",
    "quantization_config",
    "tie_word_embeddings",
    "max_position_embeddings",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "num_aux_hidden_states",
    "rope_scaling",
    "num_nextn_predict_layers",
]
TOKENIZER_KEYS = ["bos_token", "eos_token", "pad_token", "added_tokens_decoder", "chat_template"]
PROVENANCE_KEYS = ["target_quantization", "hidden_state_source", "num_samples", "epochs"]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    target_patch=st.dictionaries(st.sampled_from(CONFIG_KEYS), JSON_VALUES, max_size=4),
    drafter_patch=st.dictionaries(st.sampled_from(CONFIG_KEYS), JSON_VALUES, max_size=4),
    tokenizer_patch=st.dictionaries(st.sampled_from(TOKENIZER_KEYS), JSON_VALUES, max_size=3),
    provenance_patch=st.dictionaries(st.sampled_from(PROVENANCE_KEYS), JSON_VALUES, max_size=3),
    algorithm=st.sampled_from(["EAGLE3", "EAGLE", "NEXTN"]),
)
def test_arbitrary_config_values_give_a_report_or_an_input_error(
    tmp_path_factory: pytest.TempPathFactory,
    target_patch: dict[str, Any],
    drafter_patch: dict[str, Any],
    tokenizer_patch: dict[str, Any],
    provenance_patch: dict[str, Any],
    algorithm: str,
) -> None:
    root = tmp_path_factory.mktemp("prop")
    t = md.make_target(root / "t", md.DEEPSEEK_V3, shards=1)
    base = md.DEEPSEEK_V3 if algorithm == "NEXTN" else md.kimi_k25()
    md.write_json(t / "config.json", dict(base, **target_patch))
    d = md.make_drafter(root / "d", md.kimi_drafter_config(), provenance=md.provenance())
    md.write_json(d / "config.json", dict(md.kimi_drafter_config(), **drafter_patch))
    md.write_json(d / "tokenizer_config.json", dict(md.KIMI_TOKENIZER, **tokenizer_patch))
    md.write_json(t / "tokenizer_config.json", md.KIMI_TOKENIZER)
    md.write_json(d / "training_provenance.json", dict(md.provenance(), **provenance_patch))
    try:
        tm = read_model_dir(str(t), role="target", weights="names" if algorithm == "NEXTN" else "none")
        dm = read_model_dir(str(d), role="drafter", weights="headers")
        report = validate(tm, dm, algorithm=algorithm)
    except InputError as exc:
        assert "\n" not in str(exc)
        return
    json.dumps(report.to_dict())  # the report is always serializable
    assert len(report.termination_message().encode()) <= 4096
