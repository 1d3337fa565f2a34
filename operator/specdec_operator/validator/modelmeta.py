"""Bounded reads of a model directory's metadata: what `specdec validate` knows about a model.

Only small files are read whole (config.json, tokenizer_config.json, chat_template.jinja,
hf_quant_config.json, training_provenance.json, model.safetensors.index.json); of safetensors
files only the HEADER is read (8 bytes of length plus a JSON table of names, dtypes, shapes and
offsets), never tensor data, so a 500 GB checkpoint validates as fast as a 1 GB one.

Every read is bounded, because the validator runs as an init container against whatever a user
mounted: a file is opened non-blocking and must be a regular file (a FIFO or /dev/zero named
config.json must not hang the pod), its size is checked against a per-kind cap before reading,
a safetensors header length is checked against a cap and the file size before allocating, and a
reader-wide byte budget bounds the total. Anything unusable raises InputError with one line that
names the file and says how to fix it. This module imports only the standard library so that the
init container starts in milliseconds.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import stat
from dataclasses import dataclass, field
from typing import Any

from ..errors import InputError
from ..textutil import clip
from .provenance import FILENAME as PROVENANCE_FILENAME
from .provenance import DrafterProvenance

KiB = 1024
MiB = 1024 * KiB

# Per-file caps. Real files are far smaller (a config.json is a few KiB, a tokenizer_config.json
# with a chat template tens of KiB, a 1,000-tensor shard header ~150 KiB); the caps only stop
# hostile or mistaken inputs from costing memory and time.
MAX_CONFIG_BYTES = 4 * MiB
MAX_TOKENIZER_CONFIG_BYTES = 8 * MiB
MAX_SMALL_JSON_BYTES = 1 * MiB  # provenance, hf_quant_config.json, chat_template.jinja
MAX_INDEX_BYTES = 64 * MiB  # a Kimi-K2 INT4 index lists ~200k tensors (tens of MiB); read only on demand
# Headers are parsed into Python objects (~13x their size), so they get a tighter cap than their bytes
# alone would need: a 1-layer draft's header is ~2 KiB, the largest real shard headers ~1 MiB.
MAX_SAFETENSORS_HEADER_BYTES = 4 * MiB
MAX_TENSORS = 20_000  # across all headers one reader parses (a draft has ~15; only drafts and NEXTN single files are parsed)
MAX_TOTAL_BYTES = 128 * MiB  # everything one reader may read
MAX_SHARDS = 4096
MAX_DIR_ENTRIES_SCANNED = 10_000

CONFIG = "config.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
CHAT_TEMPLATE = "chat_template.jinja"
HF_QUANT_CONFIG = "hf_quant_config.json"
PROVENANCE = PROVENANCE_FILENAME
SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"

# Bits per element of every dtype the safetensors format defines (F4/F6 are packed sub-byte types).
SAFETENSORS_DTYPE_BITS: dict[str, int] = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "I64": 64,
    "U64": 64,
    "F64": 64,
    "C64": 64,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
}

# Sub-configs where vision-language wrappers keep their language model's fields, in the order
# SGLang's get_hf_text_config prefers them (thinker_config > llm_config > language_config > text_config).
TEXT_CONFIG_KEYS = ("llm_config", "language_config", "text_config")


_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")


def display_path(path: str | os.PathLike[str]) -> str:
    """A path as printable one-line UTF-8: undecodable bytes of non-UTF-8 names and control
    characters (a newline in a directory name) become \\xNN escapes."""
    text = os.fsencode(path).decode("utf-8", "backslashreplace")
    return _CONTROL_CHARS.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def human_bytes(n: int) -> str:
    """1536 -> '1.5 KiB'; used in messages about caps."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if size < 1024 or unit == "PiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as its safetensors header declares it (no data is read)."""

    dtype: str
    shape: tuple[int, ...]
    file: str


class MetaReader:
    """Reads files under caps and counts the bytes it read (the benchmark reports the count)."""

    def __init__(self, max_total_bytes: int = MAX_TOTAL_BYTES) -> None:
        self.max_total_bytes = max_total_bytes
        self.bytes_read = 0
        self.files_read = 0
        self.tensors_parsed = 0

    # -- low level ---------------------------------------------------------------------------
    def _open_regular(self, path: str, what: str) -> tuple[int, os.stat_result]:
        shown = display_path(path)
        flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
        flags |= getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(path, flags)
        except FileNotFoundError:
            raise InputError(f"{shown}: {what} not found") from None
        except OSError as exc:
            raise InputError(f"{shown}: cannot open {what}: {_os_reason(exc)}") from None
        try:
            st = os.fstat(fd)
        except OSError as exc:  # pragma: no cover - fstat on an open fd does not fail in practice
            os.close(fd)
            raise InputError(f"{shown}: cannot stat {what}: {_os_reason(exc)}") from None
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise InputError(f"{shown}: {what} is {_file_kind(st.st_mode)}, not a regular file")
        return fd, st

    def _account(self, n: int, shown: str) -> None:
        if self.bytes_read + n > self.max_total_bytes:
            raise InputError(
                f"{shown}: reading it would exceed the validator's {human_bytes(self.max_total_bytes)} "
                "metadata budget; the model directory holds implausibly large metadata"
            )
        self.bytes_read += n

    def _pread_exact(self, fd: int, n: int, offset: int, shown: str, what: str) -> bytes:
        chunks: list[bytes] = []
        remaining = n
        while remaining > 0:
            try:
                chunk = os.pread(fd, min(remaining, 4 * MiB), offset)
            except OSError as exc:
                raise InputError(f"{shown}: cannot read {what}: {_os_reason(exc)}") from None
            if not chunk:
                raise InputError(f"{shown}: {what} is truncated (file shrank while reading)")
            chunks.append(chunk)
            remaining -= len(chunk)
            offset += len(chunk)
        return b"".join(chunks)

    def read_bytes(self, path: str, cap: int, what: str) -> bytes:
        """Read a whole small regular file, refusing files over `cap` bytes."""
        shown = display_path(path)
        fd, st = self._open_regular(path, what)
        try:
            if st.st_size > cap:
                raise InputError(
                    f"{shown}: {what} is {human_bytes(st.st_size)}, over the {human_bytes(cap)} "
                    f"limit; this is not a real {what} (replace it with the model's own file)"
                )
            self._account(st.st_size, shown)
            data = self._pread_exact(fd, st.st_size, 0, shown, what)
            # A file that grew since fstat is read only up to the size we checked.
            self.files_read += 1
            return data
        finally:
            os.close(fd)

    def read_json(self, path: str, cap: int, what: str) -> dict[str, Any]:
        """Read a JSON object from a small file (UTF-8, optional BOM)."""
        shown = display_path(path)
        data = self.read_bytes(path, cap, what)
        return _parse_json_object(data, shown, what)

    def read_text(self, path: str, cap: int, what: str) -> str:
        shown = display_path(path)
        data = self.read_bytes(path, cap, what)
        try:
            return data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise InputError(f"{shown}: {what} is not UTF-8 text (byte {exc.start})") from None

    def read_safetensors_header(self, path: str) -> tuple[dict[str, TensorInfo], dict[str, str]]:
        """Read a safetensors file's header only: tensors by name and the __metadata__ strings.

        Checks the header against the file: every tensor's byte range must lie inside the data
        area and match its dtype and shape, so a truncated download is caught here, not after a
        10-minute model load.
        """
        shown = display_path(path)
        what = "safetensors file"
        fd, st = self._open_regular(path, what)
        try:
            size = st.st_size
            if size < 8:
                raise InputError(f"{shown}: truncated safetensors file ({size} bytes, no header); download it again")
            self._account(8, shown)
            prefix = self._pread_exact(fd, 8, 0, shown, what)
            if prefix.startswith(b"version "):
                raise InputError(f"{shown}: is a Git LFS pointer, not the weights; run `git lfs pull` in the model directory")
            header_len = int.from_bytes(prefix, "little")
            if header_len > MAX_SAFETENSORS_HEADER_BYTES:
                raise InputError(
                    f"{shown}: safetensors header claims {header_len} bytes, over the "
                    f"{human_bytes(MAX_SAFETENSORS_HEADER_BYTES)} limit; the file is corrupt or not safetensors"
                )
            if 8 + header_len > size:
                raise InputError(
                    f"{shown}: truncated safetensors file (header claims {header_len} bytes, file has {size - 8} after the length); download it again"
                )
            self._account(header_len, shown)
            raw = self._pread_exact(fd, header_len, 8, shown, what)
            self.files_read += 1
        finally:
            os.close(fd)
        header = _parse_json_object(raw, shown, "safetensors header", strip_padding=True)
        self.tensors_parsed += len(header)
        if self.tensors_parsed > MAX_TENSORS:
            raise InputError(f"{shown}: the headers read so far declare more than {MAX_TENSORS:,} tensors; that is a full model, not a draft")
        data_len = size - 8 - header_len
        name = os.path.basename(path)
        tensors: dict[str, TensorInfo] = {}
        metadata: dict[str, str] = {}
        for key, entry in header.items():
            if key == "__metadata__":
                if isinstance(entry, dict):
                    metadata = {str(k): str(v) for k, v in entry.items()}
                continue
            tensors[key] = _check_tensor_entry(key, entry, data_len, shown, display_path(name))
        return tensors, metadata


def _os_reason(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "symlink loop"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission denied (make it readable by the validator's user)"
    if exc.errno == errno.EISDIR:
        return "is a directory"
    if exc.errno == errno.ENAMETOOLONG:
        return "name too long"
    return os.strerror(exc.errno) if exc.errno else str(exc)


def _file_kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _parse_json_object(data: bytes, shown: str, what: str, *, strip_padding: bool = False) -> dict[str, Any]:
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(f"{shown}: {what} is not UTF-8 (invalid byte at offset {exc.start})") from None
    if strip_padding:
        text = text.rstrip(" \x00")
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise InputError(f"{shown}: {what} is not valid JSON (line {exc.lineno} column {exc.colno}: {exc.msg})") from None
    except RecursionError:
        raise InputError(f"{shown}: {what} is nested too deeply to be real metadata") from None
    except ValueError as exc:  # NaN/Infinity, or an integer literal with thousands of digits
        raise InputError(f"{shown}: {what} is not valid JSON ({str(exc).splitlines()[0]})") from None
    if not isinstance(value, dict):
        raise InputError(f"{shown}: {what} must be a JSON object, found {type(value).__name__}")
    return value


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _check_tensor_entry(key: str, entry: Any, data_len: int, shown: str, file_name: str) -> TensorInfo:
    where = f"{shown}: tensor {key!r}"
    if not isinstance(entry, dict):
        raise InputError(f"{where} has a malformed header entry; the file is corrupt")
    dtype = entry.get("dtype")
    shape = entry.get("shape")
    offsets = entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in SAFETENSORS_DTYPE_BITS:
        raise InputError(f"{where} has unknown dtype {str(dtype)[:20]!r}; the file is corrupt or from a newer format")
    if not isinstance(shape, list) or not all(_is_nonneg_int(d) for d in shape) or len(shape) > 8:
        raise InputError(f"{where} has a malformed shape; the file is corrupt")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_nonneg_int(o) for o in offsets) or offsets[0] > offsets[1]:
        raise InputError(f"{where} has malformed data_offsets; the file is corrupt")
    numel = math.prod(shape)
    expected = (numel * SAFETENSORS_DTYPE_BITS[dtype] + 7) // 8
    if offsets[1] - offsets[0] != expected:
        raise InputError(f"{where} declares shape {shape} {dtype} ({expected} bytes) but spans {offsets[1] - offsets[0]} bytes; the file is corrupt")
    if offsets[1] > data_len:
        raise InputError(f"{where} ends at byte {offsets[1]} of a {data_len}-byte data area: the file is truncated; download it again")
    return TensorInfo(dtype=dtype, shape=tuple(shape), file=file_name)


def _is_nonneg_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


# -- model directories ---------------------------------------------------------------------------


@dataclass
class ModelMeta:
    """What the validator read from one model directory.

    `config` is config.json as written; `text` is the language model's config, which is `config`
    itself except for vision-language wrappers (Kimi-K2.5's KimiK25ForConditionalGeneration keeps
    hidden_size, vocab_size and num_hidden_layers under `text_config`).
    """

    path: str  # printable (see display_path)
    config: dict[str, Any]
    text: dict[str, Any]
    text_config_key: str | None = None
    tokenizer_config: dict[str, Any] | None = None
    chat_template: str | None = None
    hf_quant_config: dict[str, Any] | None = None
    provenance: DrafterProvenance | None = None
    # Weights: "safetensors" (one file), "sharded" (index + shards), "bin" (pickled torch, not
    # inspectable without loading), or "none".
    weight_format: str = "none"
    weight_files: list[str] = field(default_factory=list)
    tensors: dict[str, TensorInfo] | None = None  # from headers, when read
    weight_names: frozenset[str] | None = None  # from the index only, when read
    # weights="names" on a sharded checkpoint keeps the index text unparsed: a DeepSeek-V3 index is
    # ~9 MiB, and json.loads of it costs ~100x the substring search that answers "is layer L there?".
    index_text: str | None = None
    bytes_read: int = 0
    fs_path: str = ""  # the path as given, for reading more later (read_weights)

    # -- typed field access ----------------------------------------------------------------------
    @property
    def config_file(self) -> str:
        return f"{self.path}/{CONFIG}"

    def field_path(self, name: str) -> str:
        """Where a text-model field lives, e.g. 'text_config.hidden_size'."""
        return f"{self.text_config_key}.{name}" if self.text_config_key else name

    def text_int(self, name: str, *, required: bool = False, minimum: int = 0) -> int | None:
        """An integer field of the language model's config (None when absent and not required)."""
        return self._int(self.text, self.field_path(name), name, required=required, minimum=minimum)

    def top_int(self, name: str, *, required: bool = False, minimum: int = 0) -> int | None:
        """An integer field of the top-level config."""
        return self._int(self.config, name, name, required=required, minimum=minimum)

    def _int(self, cfg: dict[str, Any], shown_name: str, key: str, *, required: bool, minimum: int) -> int | None:
        value = cfg.get(key)
        if value is None:
            if required:
                raise InputError(f"{self.config_file}: missing {shown_name}; a model config needs it")
            return None
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise InputError(f"{self.config_file}: {shown_name} must be an integer >= {minimum}, got {_short(value)}")
        return value

    @property
    def architectures(self) -> list[str]:
        """config.json `architectures` (the class SGLang instantiates is the first)."""
        archs = self.config.get("architectures")
        if archs is None:
            return []
        if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
            raise InputError(f"{self.config_file}: architectures must be a list of class names, got {_short(archs)}")
        return archs

    @property
    def architecture(self) -> str | None:
        archs = self.architectures
        return archs[0] if archs else None

    @property
    def quantization_config(self) -> dict[str, Any] | None:
        """quantization_config (or compressed-tensors' compression_config) from the top level or the text config."""
        for cfg in (self.config, self.text):
            for key in ("quantization_config", "compression_config"):
                value = cfg.get(key)
                if value is None:
                    continue
                if not isinstance(value, dict):
                    raise InputError(f"{self.config_file}: {key} must be an object, got {_short(value)}")
                return value
        return None

    @property
    def eagle_config(self) -> dict[str, Any]:
        value = self.config.get("eagle_config")
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise InputError(f"{self.config_file}: eagle_config must be an object, got {_short(value)}")
        return value

    def aux_layer_ids(self) -> list[int] | None:
        """eagle_config.eagle_aux_hidden_state_layer_ids (or the top-level field), validated."""
        ids = self.eagle_config.get("eagle_aux_hidden_state_layer_ids")
        shown = "eagle_config.eagle_aux_hidden_state_layer_ids"
        if ids is None:
            ids = self.config.get("eagle_aux_hidden_state_layer_ids")
            shown = "eagle_aux_hidden_state_layer_ids"
        if ids is None:
            return None
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise InputError(f"{self.config_file}: {shown} must be a list of layer numbers, got {_short(ids)}")
        return ids

    def has_tensor_prefix(self, prefix: str) -> bool | None:
        """Whether any tensor name starts with `prefix` (also under a wrapper, e.g. 'language_model.');
        None when the weight names were not read."""
        if self.weight_names is not None:
            return any(n.startswith(prefix) or f".{prefix}" in n for n in self.weight_names)
        if self.index_text is not None:
            return f'"{prefix}' in self.index_text or f".{prefix}" in self.index_text
        return None

    def facts(self) -> dict[str, Any]:
        """The facts `specdec validate --json` reports for this model."""

        def number(cfg: dict[str, Any], key: str) -> Any:
            value = cfg.get(key)
            return value if isinstance(value, (int, float, type(None))) else _short(value)

        facts: dict[str, Any] = {
            "path": self.path,
            "architectures": self.config.get("architectures"),
            "model_type": self.config.get("model_type"),
            "text_config": self.text_config_key,
            "hidden_size": number(self.text, "hidden_size"),
            "vocab_size": number(self.text, "vocab_size"),
            "num_hidden_layers": number(self.text, "num_hidden_layers"),
            "max_position_embeddings": number(self.text, "max_position_embeddings"),
            "weights": self.weight_format,
            "weight_files": len(self.weight_files),
            "bytes_read": self.bytes_read,
        }
        for key in ("draft_vocab_size", "target_hidden_size", "num_nextn_predict_layers"):
            if key in self.text or key in self.config:
                facts[key] = self.text.get(key, self.config.get(key))
        if self.eagle_config:
            facts["eagle_aux_hidden_state_layer_ids"] = self.eagle_config.get("eagle_aux_hidden_state_layer_ids")
        if self.tensors is not None:
            facts["tensors"] = len(self.tensors)
        if self.provenance is not None:
            facts["provenance"] = self.provenance.to_json()
        return facts


def _short(value: Any) -> str:
    """A config value as messages quote it: JSON (a string in quotes), at most 60 characters."""
    return clip(json.dumps(value, ensure_ascii=True, default=str) if not isinstance(value, str) else repr(value), 60)


def language_model_config(config: dict[str, Any], config_file: str) -> tuple[dict[str, Any], str | None]:
    """The language model's part of a config.json, and the key it sits under (None: the config itself).

    Vision-language wrappers keep hidden_size, vocab_size and num_hidden_layers under one of
    TEXT_CONFIG_KEYS. The validator and the training pipeline (drafter_training/target.py) both read
    models through this function, so they cannot disagree on a target's sizes.
    """
    for key in TEXT_CONFIG_KEYS:
        sub = config.get(key)
        if sub is None:
            continue
        if not isinstance(sub, dict):
            raise InputError(f"{config_file}: {key} must be an object, got {_short(sub)}")
        return sub, key
    return config, None


def _check_dir(path: str, flag: str) -> str:
    shown = display_path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InputError(f"{flag} {shown}: no such directory; mount the model and pass its directory") from None
    except OSError as exc:
        raise InputError(f"{flag} {shown}: cannot access: {_os_reason(exc)}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise InputError(f"{flag} {shown}: is {_file_kind(st.st_mode)}, not a model directory")
    return shown


def _exists(path: str) -> bool:
    """True when the path exists; broken links and loops count as existing (reading them then fails clearly)."""
    try:
        os.lstat(path)
        return True
    except OSError:
        return False


def read_model_dir(
    path: str,
    *,
    role: str,
    weights: str = "headers",
    reader: MetaReader | None = None,
) -> ModelMeta:
    """Read one model directory's metadata.

    role: "target" or "drafter" (used in messages: `--target DIR`).
    weights: "headers" reads every safetensors header (the drafter, a few KiB); "names" reads
    only the index's tensor names (a NEXTN target's MTP layers); "none" only notes which weight
    files exist (a target: its index can be tens of MiB and is not needed).
    """
    if weights not in ("headers", "names", "none"):
        raise ValueError(f"weights must be headers|names|none, not {weights!r}")
    reader = reader or MetaReader()
    start = reader.bytes_read
    shown = _check_dir(path, f"--{role}")
    join = os.path.join

    config = reader.read_json(join(path, CONFIG), MAX_CONFIG_BYTES, "config.json")
    text, text_key = language_model_config(config, f"{shown}/{CONFIG}")
    meta = ModelMeta(path=shown, config=config, text=text, text_config_key=text_key, fs_path=os.fspath(path))

    if _exists(join(path, TOKENIZER_CONFIG)):
        meta.tokenizer_config = reader.read_json(join(path, TOKENIZER_CONFIG), MAX_TOKENIZER_CONFIG_BYTES, "tokenizer_config.json")
    if _exists(join(path, CHAT_TEMPLATE)):
        meta.chat_template = reader.read_text(join(path, CHAT_TEMPLATE), MAX_SMALL_JSON_BYTES, "chat_template.jinja")
    if _exists(join(path, HF_QUANT_CONFIG)):
        meta.hf_quant_config = reader.read_json(join(path, HF_QUANT_CONFIG), MAX_SMALL_JSON_BYTES, "hf_quant_config.json")
    if role == "drafter" and _exists(join(path, PROVENANCE)):
        meta.provenance = DrafterProvenance.from_json(
            reader.read_json(join(path, PROVENANCE), MAX_SMALL_JSON_BYTES, "training_provenance.json"),
            f"{shown}/{PROVENANCE}",
        )

    _read_weights(meta, path, weights, reader)
    meta.bytes_read = reader.bytes_read - start
    return meta


def read_weights(meta: ModelMeta, weights: str, reader: MetaReader | None = None) -> ModelMeta:
    """Read (more of) a model's weight metadata after read_model_dir, e.g. once its architecture
    shows it is worth reading: a full model passed as drafter is refused without parsing its headers."""
    if weights not in ("headers", "names", "none"):
        raise ValueError(f"weights must be headers|names|none, not {weights!r}")
    reader = reader or MetaReader()
    start = reader.bytes_read
    _read_weights(meta, meta.fs_path, weights, reader)
    meta.bytes_read += reader.bytes_read - start
    return meta


def _read_weights(meta: ModelMeta, path: str, weights: str, reader: MetaReader) -> None:
    join = os.path.join
    single, index = join(path, SAFETENSORS), join(path, SAFETENSORS_INDEX)
    if _exists(single):
        meta.weight_format, meta.weight_files = "safetensors", [SAFETENSORS]
        if weights in ("headers", "names"):
            meta.tensors, _ = reader.read_safetensors_header(single)
            meta.weight_names = frozenset(meta.tensors)
        return
    if _exists(index):
        meta.weight_format = "sharded"
        if weights == "none":
            return
        if weights == "names":
            shown = f"{meta.path}/{SAFETENSORS_INDEX}"
            raw = reader.read_bytes(index, MAX_INDEX_BYTES, SAFETENSORS_INDEX)
            try:
                text = raw.decode("utf-8-sig")
            except UnicodeDecodeError as exc:
                raise InputError(f"{shown}: is not UTF-8 (invalid byte at offset {exc.start})") from None
            if not text.lstrip().startswith("{") or '"weight_map"' not in text:
                raise InputError(f"{shown}: has no weight_map object; it is not a safetensors index")
            meta.index_text = text
            return
        weight_map = _read_index(reader, index, meta.path)
        shards = sorted(set(weight_map.values()))
        meta.weight_files = shards
        meta.weight_names = frozenset(weight_map)
        if weights == "headers":
            tensors: dict[str, TensorInfo] = {}
            for shard in shards:
                shard_path = join(path, shard)
                if not _exists(shard_path):
                    raise InputError(f"{meta.path}/{display_path(shard)}: listed in {SAFETENSORS_INDEX} but missing; the download is incomplete")
                shard_tensors, _ = reader.read_safetensors_header(shard_path)
                tensors.update(shard_tensors)
            meta.tensors = tensors
        return
    # Neither standard name: other safetensors files (shards without an index) or pickled torch.
    found_st: list[str] = []
    found_bin: list[str] = []
    try:
        with os.scandir(path) as entries:
            for n, entry in enumerate(entries):
                if n >= MAX_DIR_ENTRIES_SCANNED:
                    break
                if entry.name.endswith(".safetensors"):
                    found_st.append(entry.name)
                elif entry.name.endswith(".bin") and entry.name.startswith("pytorch_model"):
                    found_bin.append(entry.name)
    except OSError as exc:
        raise InputError(f"{meta.path}: cannot list directory: {_os_reason(exc)}") from None
    if found_st:
        meta.weight_format, meta.weight_files = "safetensors", sorted(found_st)[:MAX_SHARDS]
        if weights in ("headers", "names"):
            tensors = {}
            for name in meta.weight_files:
                shard_tensors, _ = reader.read_safetensors_header(join(path, name))
                tensors.update(shard_tensors)
            meta.tensors = tensors
            meta.weight_names = frozenset(tensors)
    elif found_bin:
        meta.weight_format, meta.weight_files = "bin", sorted(found_bin)


def _read_index(reader: MetaReader, index: str, shown_dir: str) -> dict[str, str]:
    shown = f"{shown_dir}/{SAFETENSORS_INDEX}"
    doc = reader.read_json(index, MAX_INDEX_BYTES, SAFETENSORS_INDEX)
    weight_map = doc.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise InputError(f"{shown}: weight_map must be a non-empty object of tensor name -> shard file")
    shards: set[str] = set()
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or not shard.endswith(".safetensors"):
            raise InputError(f"{shown}: weight_map[{name[:60]!r}] must name a .safetensors file, got {_short(shard)}")
        # Shards are files next to the index; a name with a separator could point anywhere.
        if "/" in shard or "\\" in shard or shard in (".", "..") or "\x00" in shard:
            raise InputError(f"{shown}: weight_map[{name[:60]!r}] = {_short(shard)} is not a plain file name in the model directory")
        shards.add(shard)
        if len(shards) > MAX_SHARDS:
            raise InputError(f"{shown}: lists more than {MAX_SHARDS} shard files; that is not a real checkpoint")
    return weight_map
