"""Stage 2: capture the target's hidden states for every regenerated sample.

Two sources, recorded in the index and later in the drafter's provenance:

- `sglang`: a running SGLang server started with `--enable-return-aux-hidden-states
  --speculative-algorithm EAGLE3 --disable-radix-cache` (the serving engine and quantization themselves,
  the faithful source). `/generate` with `return_hidden_states` returns the concatenated low/mid/high
  layers for every prompt token; the final layer is not returned on that path, so the target
  distribution is kept as the top-k log-probabilities of each position (`return_logprob`,
  `logprob_start_len: 0`, `top_logprobs_num`).
- `hf`: Hugging Face transformers loading the same checkpoint with the same quantization; stores the
  low/mid/high outputs and the final normed hidden state (the trainer applies the target's lm_head).

Output: `shard-NNNNN.safetensors` files (per sample `<id>.input_ids`, `<id>.loss_mask`, `<id>.aux`,
then `<id>.final` or `<id>.topk_ids`/`<id>.topk_logprobs`; fp8 storage adds `<id>.aux_scale`) and
`index.json`, rewritten after every shard, so an interrupted capture resumes at the next shard.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from specdec_operator.errors import InputError

from .regenerate import read_samples
from .target import (
    capture_forward,
    load_target,
    read_config,
    resolve_capture_layers,
    tokenizer_sha256,
)

log = logging.getLogger(__name__)
INDEX = "index.json"
FORMAT_VERSION = 1
FP8_MAX = 448.0  # float8_e4m3fn


# ---- storage ----------------------------------------------------------------------------------------


def encode_hidden(x: torch.Tensor, storage: str, num_layers: int) -> dict[str, torch.Tensor]:
    """bf16 as is; fp8 (e4m3) with one float32 scale per token and captured layer."""
    if storage == "bf16":
        return {"": x.to(torch.bfloat16).contiguous()}
    if storage == "fp8":
        t, width = x.shape
        chunks = x.float().reshape(t, num_layers, width // num_layers)
        scale = (chunks.abs().amax(-1, keepdim=True) / FP8_MAX).clamp(min=1e-12)
        q = (chunks / scale).to(torch.float8_e4m3fn).reshape(t, width)
        return {"": q.contiguous(), "_scale": scale.squeeze(-1).contiguous()}
    raise InputError(f"--storage {storage}: one of bf16, fp8")


def decode_hidden(tensors: dict[str, torch.Tensor], num_layers: int) -> torch.Tensor:
    x = tensors[""]
    if x.dtype == torch.float8_e4m3fn:
        t, width = x.shape
        scale = tensors["_scale"].float()
        return (x.float().reshape(t, num_layers, width // num_layers) * scale[..., None]).reshape(t, width)
    return x


@dataclass
class CaptureIndex:
    """index.json of a capture directory."""

    data: dict[str, Any]

    @property
    def samples(self) -> list[dict[str, Any]]:
        return self.data["samples"]

    @property
    def target_kind(self) -> str:
        return self.data["target_kind"]

    @classmethod
    def load(cls, directory: str | Path) -> CaptureIndex:
        path = Path(directory) / INDEX
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise InputError(f"{path}: not found; run `specdec-train capture` first") from None
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}: not valid JSON ({exc.msg}); delete it and capture again") from None
        if data.get("format_version") != FORMAT_VERSION:
            raise InputError(f"{path}: format_version {data.get('format_version')}, expected {FORMAT_VERSION}")
        return cls(data)

    def save(self, directory: str | Path) -> None:
        path = Path(directory) / INDEX
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1))
        os.replace(tmp, path)


class CaptureReader:
    """Random access to captured samples (safetensors files are memory-mapped, one handle per shard)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.index = CaptureIndex.load(directory)
        self.num_aux = len(self.index.data["aux_layer_ids"])
        self._handles: dict[str, Any] = {}

    def __len__(self) -> int:
        return len(self.index.samples)

    def _handle(self, shard: str) -> Any:
        if shard not in self._handles:
            self._handles[shard] = safe_open(str(self.directory / shard), framework="pt")
        return self._handles[shard]

    def get(self, i: int) -> dict[str, torch.Tensor]:
        meta = self.index.samples[i]
        f = self._handle(meta["shard"])
        key = meta["key"]
        out = {
            "input_ids": f.get_tensor(f"{key}.input_ids").long(),
            "loss_mask": f.get_tensor(f"{key}.loss_mask").bool(),
        }
        hidden = {"": f.get_tensor(f"{key}.aux")}
        if meta.get("fp8"):
            hidden["_scale"] = f.get_tensor(f"{key}.aux_scale")
        out["aux"] = decode_hidden(hidden, self.num_aux)
        if self.index.target_kind == "final":
            out["final"] = f.get_tensor(f"{key}.final")
        else:
            out["topk_ids"] = f.get_tensor(f"{key}.topk_ids").long()
            out["topk_logprobs"] = f.get_tensor(f"{key}.topk_logprobs").float()
        return out

    def lengths(self) -> list[int]:
        return [s["length"] for s in self.index.samples]


# ---- capture from Hugging Face ------------------------------------------------------------------------


def _batches(items: list[dict[str, Any]], max_tokens: int) -> Iterator[list[dict[str, Any]]]:
    batch: list[dict[str, Any]] = []
    longest = 0
    for item in items:
        n = len(item["input_ids"])
        if batch and max(longest, n) * (len(batch) + 1) > max_tokens:
            yield batch
            batch, longest = [], 0
        batch.append(item)
        longest = max(longest, n)
    if batch:
        yield batch


def _new_index(
    source: str,
    target: str,
    quantization: str,
    cfg: dict[str, Any],
    layers: list[int],
    storage: str,
    target_kind: str,
    samples_file: str,
) -> CaptureIndex:
    return CaptureIndex(
        {
            "format_version": FORMAT_VERSION,
            "source": source,
            "target_model": str(target),
            "target_quantization": quantization,
            "target_num_layers": cfg["num_hidden_layers"],
            "hidden_size": cfg["hidden_size"],
            "vocab_size": cfg["vocab_size"],
            # Output index: SGLang's eagle_aux_hidden_state_layer_ids. Input index: what SGLang captures.
            "aux_layer_ids": layers,
            "aux_layer_ids_input_index": [i + 1 for i in layers],
            "storage": storage,
            "target_kind": target_kind,
            "samples_file": samples_file,
            "tokenizer_sha256": None,
            "samples": [],
            "shards": [],
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
    )


def _open_or_create(out: Path, fresh: CaptureIndex) -> CaptureIndex:
    out.mkdir(parents=True, exist_ok=True)
    if (out / INDEX).exists():
        existing = CaptureIndex.load(out)
        for key in ("source", "target_model", "target_quantization", "aux_layer_ids", "storage"):
            if existing.data[key] != fresh.data[key]:
                raise InputError(
                    f"{out / INDEX}: {key} is {existing.data[key]!r}, this run asks for {fresh.data[key]!r}; use another --out directory or delete it"
                )
        return existing
    return fresh


def _write_shard(out: Path, index: CaptureIndex, tensors: dict[str, torch.Tensor], metas: list[dict]) -> None:
    name = f"shard-{len(index.data['shards']):05d}.safetensors"
    save_file(tensors, str(out / name))
    for m in metas:
        m["shard"] = name
    index.data["shards"].append(name)
    index.samples.extend(metas)
    index.save(out)


def capture_hf(
    samples_path: str | Path,
    target: str | Path,
    out: str | Path,
    *,
    quantization: str | None = "checkpoint",
    capture_layers: list[int] | None = None,
    storage: str = "bf16",
    device: str = "cpu",
    shard_samples: int = 256,
    max_batch_tokens: int = 16384,
    progress: bool = True,
    loaded: Any = None,
) -> CaptureIndex:
    """Capture low/mid/high and final-layer hidden states with transformers; resumable by shard."""
    from tqdm import tqdm

    out = Path(out)
    cfg = read_config(target)
    layers = resolve_capture_layers(capture_layers, cfg["num_hidden_layers"])
    tgt = loaded or load_target(target, quantization, device=device)
    index = _open_or_create(out, _new_index("hf", str(target), tgt.quantization, cfg, layers, storage, "final", str(samples_path)))
    index.data["tokenizer_sha256"] = tokenizer_sha256(target)
    done = {s["id"] for s in index.samples}
    todo = [s for s in read_samples(samples_path) if s["id"] not in done]
    todo.sort(key=lambda s: len(s["input_ids"]))
    log.info("capture: %d samples to do, %d already captured", len(todo), len(done))
    bar = tqdm(total=len(todo), desc="capture", unit="sample", disable=not progress)
    model_device = next(tgt.model.parameters()).device
    for start in range(0, len(todo), shard_samples):
        chunk = todo[start : start + shard_samples]
        tensors: dict[str, torch.Tensor] = {}
        metas: list[dict[str, Any]] = []
        for batch in _batches(chunk, max_batch_tokens):
            longest = max(len(s["input_ids"]) for s in batch)
            ids = torch.zeros(len(batch), longest, dtype=torch.long)
            mask = torch.zeros(len(batch), longest, dtype=torch.long)
            for r, s in enumerate(batch):
                ids[r, : len(s["input_ids"])] = torch.tensor(s["input_ids"])
                mask[r, : len(s["input_ids"])] = 1
            aux, final, _ = capture_forward(tgt.model, ids.to(model_device), layers, mask.to(model_device))
            for r, s in enumerate(batch):
                n = len(s["input_ids"])
                key = f"r{len(index.samples) + len(metas)}"
                enc = encode_hidden(aux[r, :n].cpu(), storage, len(layers))
                tensors[f"{key}.aux"] = enc[""]
                if "_scale" in enc:
                    tensors[f"{key}.aux_scale"] = enc["_scale"]
                tensors[f"{key}.final"] = final[r, :n].to(torch.bfloat16).cpu().contiguous()
                tensors[f"{key}.input_ids"] = torch.tensor(s["input_ids"], dtype=torch.int32)
                tensors[f"{key}.loss_mask"] = torch.tensor(s["loss_mask"], dtype=torch.uint8)
                metas.append({"id": s["id"], "key": key, "length": n, "fp8": storage == "fp8"})
            bar.update(len(batch))
        _write_shard(out, index, tensors, metas)
    bar.close()
    return index


# ---- capture from a running SGLang server --------------------------------------------------------------


def parse_sglang_capture(response: dict[str, Any], num_tokens: int, top_k: int) -> dict[str, torch.Tensor]:
    """Turn one SGLang /generate response into (aux [T, 3H], top-k ids/logprobs [T, k]) for T prompt tokens.

    meta_info.hidden_states[0] holds the prefill's aux hidden states of every prompt token;
    input_top_logprobs[j] is the distribution that predicted prompt token j (None for j = 0), and
    output_top_logprobs[0] the one after the last prompt token, so position t's next-token distribution
    is input_top_logprobs[t + 1] for t < T - 1 and output_top_logprobs[0] for t = T - 1.
    """
    meta = response.get("meta_info") or {}
    hidden = meta.get("hidden_states")
    if not hidden or hidden[0] is None:
        raise InputError(
            "SGLang response has no meta_info.hidden_states; start the server with --enable-return-aux-hidden-states --speculative-algorithm EAGLE3"
        )
    aux = torch.tensor(hidden[0], dtype=torch.float32)
    if aux.dim() != 2 or aux.shape[0] != num_tokens:
        raise InputError(
            f"SGLang returned hidden states for {aux.shape[0] if aux.dim() else 0} of {num_tokens} prompt tokens; "
            "start the server with --disable-radix-cache so cached prefixes are recomputed"
        )
    rows = list(meta.get("input_top_logprobs") or [])[1:] + [(meta.get("output_top_logprobs") or [None])[0]]
    if len(rows) != num_tokens or any(r is None for r in rows):
        raise InputError("SGLang response lacks input_top_logprobs; the capture request must set return_logprob")
    ids = torch.zeros(num_tokens, top_k, dtype=torch.int32)
    lps = torch.full((num_tokens, top_k), float("-inf"), dtype=torch.float32)
    for t, row in enumerate(rows):
        for j, entry in enumerate(row[:top_k]):
            lps[t, j], ids[t, j] = float(entry[0]), int(entry[1])
    return {"aux": aux, "topk_ids": ids, "topk_logprobs": lps}


async def _sglang_capture_one(session: Any, url: str, ids: list[int], top_k: int, retries: int) -> dict[str, Any]:
    import aiohttp

    body = {
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
        "return_hidden_states": True,
        "return_logprob": True,
        "logprob_start_len": 0,
        "top_logprobs_num": top_k,
    }
    delay = 1.0
    for attempt in range(retries + 1):
        try:
            async with session.post(f"{url}/generate", json=body) as resp:
                if resp.status >= 500 or resp.status == 429:
                    raise aiohttp.ClientResponseError(resp.request_info, (), status=resp.status)
                if resp.status != 200:
                    text = await resp.text()
                    raise InputError(f"{url}/generate answered {resp.status}: {text[:200]}")
                return await resp.json()
        except (TimeoutError, aiohttp.ClientError):
            if attempt == retries:
                raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 30)
    raise AssertionError("unreachable")


def capture_sglang(
    samples_path: str | Path,
    target: str | Path,
    out: str | Path,
    *,
    url: str,
    target_quantization: str,
    capture_layers: list[int] | None = None,
    storage: str = "bf16",
    top_k: int = 20,
    concurrency: int = 8,
    retries: int = 3,
    shard_samples: int = 256,
    progress: bool = True,
) -> CaptureIndex:
    """Capture from a running SGLang server (the serving engine itself); resumable by shard.

    `target` is the checkpoint directory the server serves (read for its config and tokenizer hash);
    `capture_layers` must equal the server's --return-aux-hidden-state-layer-ids (or its default).
    """
    return asyncio.run(
        _capture_sglang(
            samples_path,
            target,
            out,
            url.rstrip("/"),
            target_quantization,
            capture_layers,
            storage,
            top_k,
            concurrency,
            retries,
            shard_samples,
            progress,
        )
    )


async def _capture_sglang(
    samples_path,
    target,
    out,
    url,
    quantization,
    capture_layers,
    storage,
    top_k,
    concurrency,
    retries,
    shard_samples,
    progress,
) -> CaptureIndex:
    import aiohttp
    from tqdm import tqdm

    out = Path(out)
    cfg = read_config(target)
    layers = resolve_capture_layers(capture_layers, cfg["num_hidden_layers"])
    index = _open_or_create(out, _new_index("sglang", str(target), quantization, cfg, layers, storage, "topk", str(samples_path)))
    index.data["tokenizer_sha256"] = tokenizer_sha256(target)
    index.data["top_k"] = top_k
    done = {s["id"] for s in index.samples}
    todo = [s for s in read_samples(samples_path) if s["id"] not in done]
    bar = tqdm(total=len(todo), desc="capture", unit="sample", disable=not progress)
    sem = asyncio.Semaphore(concurrency)
    expected_width = len(layers) * cfg["hidden_size"]
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def one(s: dict[str, Any]) -> dict[str, torch.Tensor]:
            async with sem:
                resp = await _sglang_capture_one(session, url, s["input_ids"], top_k, retries)
            parsed = parse_sglang_capture(resp, len(s["input_ids"]), top_k)
            if parsed["aux"].shape[1] != expected_width:
                raise InputError(
                    f"SGLang returned hidden width {parsed['aux'].shape[1]}, expected {expected_width} "
                    f"({len(layers)} layers x {cfg['hidden_size']}); check --return-aux-hidden-state-layer-ids"
                )
            bar.update(1)
            return parsed

        for start in range(0, len(todo), shard_samples):
            chunk = todo[start : start + shard_samples]
            results = await asyncio.gather(*(one(s) for s in chunk))
            tensors: dict[str, torch.Tensor] = {}
            metas: list[dict[str, Any]] = []
            for s, parsed in zip(chunk, results):
                key = f"r{len(index.samples) + len(metas)}"
                enc = encode_hidden(parsed["aux"], storage, len(layers))
                tensors[f"{key}.aux"] = enc[""]
                if "_scale" in enc:
                    tensors[f"{key}.aux_scale"] = enc["_scale"]
                tensors[f"{key}.topk_ids"] = parsed["topk_ids"]
                tensors[f"{key}.topk_logprobs"] = parsed["topk_logprobs"]
                tensors[f"{key}.input_ids"] = torch.tensor(s["input_ids"], dtype=torch.int32)
                tensors[f"{key}.loss_mask"] = torch.tensor(s["loss_mask"], dtype=torch.uint8)
                metas.append({"id": s["id"], "key": key, "length": len(s["input_ids"]), "fp8": storage == "fp8"})
            _write_shard(out, index, tensors, metas)
    bar.close()
    return index
