"""Hostile model directories for `specdec validate` (tests/unit/test_validate_hostile.py and
benchmarks/validate_hostile.py): each case breaks one thing in an otherwise good drafter directory,
and names what the one-line error must say; the builders they are made of are shared with the tests."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specdec_operator.validator.modelmeta import MAX_SAFETENSORS_HEADER_BYTES, MiB
from tests.support import model_dirs as md


def good_drafter(path: Path) -> Path:
    """A Kimi-sized EAGLE-3 drafter that validates cleanly against the Kimi-K2.5 target."""
    return md.make_drafter(path, md.kimi_drafter_config(), provenance=md.provenance())


def write_raw_safetensors(path: Path, header: dict[str, Any], data_bytes: int) -> None:
    """A safetensors file with `header` written as given (nothing checked, no padding), then `data_bytes` zeros."""
    raw = json.dumps(header).encode()
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + b"\0" * data_bytes)


def spread_over_shards(d: Path, shards: int = 3, tensors_per_shard: int = 8_000) -> None:
    """Replace the drafter's weights by an index and `shards` shards of one-byte tensors: 24,000 tensors by
    default, over the validator's 20,000-tensor limit, each shard's header within its own cap."""
    (d / "model.safetensors").unlink()
    weight_map: dict[str, str] = {}
    for shard in range(shards):
        name = f"model-{shard + 1:05d}-of-{shards:05d}.safetensors"
        tensors = {f"s{shard}.t{i}": ("U8", [1]) for i in range(tensors_per_shard)}
        md.write_safetensors(d / name, tensors)
        weight_map.update({n: name for n in tensors})
    md.write_json(d / "model.safetensors.index.json", {"weight_map": weight_map})


def _truncated_header(d: Path) -> None:
    st_file = d / "model.safetensors"
    data = st_file.read_bytes()[:200]
    st_file.write_bytes(data)


def _header_claims_2_60(d: Path) -> None:
    (d / "model.safetensors").write_bytes((1 << 60).to_bytes(8, "little") + b"{}")


def _header_over_cap(d: Path) -> None:
    with open(d / "model.safetensors", "wb") as fh:
        fh.write((MAX_SAFETENSORS_HEADER_BYTES + 8).to_bytes(8, "little"))
    os.truncate(d / "model.safetensors", MAX_SAFETENSORS_HEADER_BYTES + 64)


def _data_truncated(d: Path) -> None:
    md.write_safetensors(d / "model.safetensors", md.eagle3_tensors(md.kimi_drafter_config()), truncate_data_to=4096)


def _huge_config(d: Path) -> None:
    with open(d / "config.json", "wb") as fh:
        fh.write(b'{"architectures": ["LlamaForCausalLMEagle3"], "pad": "')
    os.truncate(d / "config.json", 100 * MiB)


def _config_symlink_loop(d: Path) -> None:
    (d / "config.json").unlink()
    os.symlink("config.json", d / "config.json")


def _config_is_fifo(d: Path) -> None:
    (d / "config.json").unlink()
    os.mkfifo(d / "config.json")


def _config_is_dev_zero(d: Path) -> None:
    (d / "config.json").unlink()
    os.symlink("/dev/zero", d / "config.json")


def _lfs_pointer(d: Path) -> None:
    (d / "model.safetensors").write_text("version https://git-lfs.github.com/spec/v1\noid sha256:" + "a" * 64 + "\nsize 1946157056\n")


def _config_not_utf8(d: Path) -> None:
    (d / "config.json").write_bytes(b'{"architectures": ["\xff\xfe"]}')


def _config_deeply_nested(d: Path) -> None:
    (d / "config.json").write_text("[" * 200_000 + "]" * 200_000)


def _config_huge_integer(d: Path) -> None:
    (d / "config.json").write_text('{"hidden_size": ' + "9" * 100_000 + "}")


def _config_nan(d: Path) -> None:
    (d / "config.json").write_text('{"hidden_size": NaN}')


def _config_is_list(d: Path) -> None:
    (d / "config.json").write_text("[1, 2, 3]")


def _hidden_size_is_string(d: Path) -> None:
    md.write_json(d / "config.json", md.kimi_drafter_config(hidden_size="7168"))


def _header_bad_offsets(d: Path) -> None:
    write_raw_safetensors(d / "model.safetensors", {"fc.weight": {"dtype": "BF16", "shape": [7168, 21504], "data_offsets": [0, 10]}}, 16)


def _header_unknown_dtype(d: Path) -> None:
    write_raw_safetensors(d / "model.safetensors", {"fc.weight": {"dtype": "Q3_K", "shape": [2], "data_offsets": [0, 2]}}, 2)


def _index_escapes_directory(d: Path) -> None:
    (d / "model.safetensors").unlink()
    md.write_json(d / "model.safetensors.index.json", {"weight_map": {"fc.weight": "../../etc/passwd.safetensors"}})


def _index_missing_shard(d: Path) -> None:
    (d / "model.safetensors").unlink()
    md.write_json(d / "model.safetensors.index.json", {"weight_map": {"fc.weight": "model-00001-of-00002.safetensors"}})


def _provenance_wrong_type(d: Path) -> None:
    md.write_json(d / "training_provenance.json", dict(md.provenance(), num_samples="lots"))


def _weights_unreadable(d: Path) -> None:
    os.chmod(d / "model.safetensors", 0)


CASES: dict[str, tuple[Callable[[Path], None], tuple[str, ...]]] = {
    "truncated-header": (_truncated_header, ("model.safetensors", "truncated")),
    "header-claims-2^60": (_header_claims_2_60, ("model.safetensors", str(1 << 60))),
    "header-over-cap": (_header_over_cap, ("model.safetensors", "limit")),
    "data-truncated": (_data_truncated, ("model.safetensors", "truncated")),
    "config-100MB": (_huge_config, ("config.json", "100.0 MiB")),
    "config-symlink-loop": (_config_symlink_loop, ("config.json", "symlink loop")),
    "config-fifo": (_config_is_fifo, ("config.json", "FIFO")),
    "config-dev-zero": (_config_is_dev_zero, ("config.json", "character device")),
    "git-lfs-pointer": (_lfs_pointer, ("model.safetensors", "git lfs pull")),
    "config-not-utf8": (_config_not_utf8, ("config.json", "UTF-8")),
    "config-nested-200k": (_config_deeply_nested, ("config.json",)),
    "config-100k-digit-int": (_config_huge_integer, ("config.json",)),
    "config-nan": (_config_nan, ("config.json", "NaN")),
    "config-not-object": (_config_is_list, ("config.json", "object")),
    "hidden-size-string": (_hidden_size_is_string, ("config.json", "hidden_size")),
    "header-bad-offsets": (_header_bad_offsets, ("fc.weight", "corrupt")),
    "header-unknown-dtype": (_header_unknown_dtype, ("fc.weight", "dtype")),
    "index-path-escape": (_index_escapes_directory, ("model.safetensors.index.json", "plain file name")),
    "index-missing-shard": (_index_missing_shard, ("model-00001-of-00002.safetensors", "incomplete")),
    "provenance-wrong-type": (_provenance_wrong_type, ("training_provenance.json", "num_samples")),
}
if os.geteuid() != 0:  # root reads mode-000 files anyway
    CASES["weights-unreadable"] = (_weights_unreadable, ("model.safetensors", "permission denied"))
