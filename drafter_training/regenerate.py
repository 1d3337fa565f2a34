"""Stage 1: regenerate the assistant turns of prompt conversations with the model that will serve the drafter.

Input: JSONL, one conversation per line, either `{"messages": [{"role", "content"}, ...]}` (UltraChat /
OpenAI style) or `{"conversations": [{"from": "human"|"gpt"|"system", "value"}, ...]}` (ShareGPT), with an
optional `"id"`. Every assistant turn is replaced by what the serving model answers to the conversation
so far (user turns are kept), through one of three endpoints:

- `chat`: OpenAI `/v1/chat/completions` (the server applies its own chat template),
- `completions`: OpenAI `/v1/completions` with the prompt rendered here by the model's chat template,
- `generate`: SGLang/native `/generate` with `input_ids` rendered here (no server-side template).

The result is tokenized with the model's own chat template: `input_ids` and a `loss_mask` that is 1 on
the assistant spans (their end-of-turn token included, the generation prompt excluded). Output JSONL
lines are written as conversations finish; a rerun skips ids already written (resume).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from specdec_operator.errors import InputError

log = logging.getLogger(__name__)

ROLE_ALIASES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "model": "assistant",
    "system": "system",
}


# ---- input --------------------------------------------------------------------------------------------


def normalize_conversation(record: Any, where: str) -> list[dict[str, str]]:
    """One JSONL record -> [{"role", "content"}] with roles system/user/assistant."""
    if not isinstance(record, dict):
        raise InputError(f"{where}: expected a JSON object with 'messages' or 'conversations'")
    turns = record.get("messages", record.get("conversations"))
    if not isinstance(turns, list) or not turns:
        raise InputError(f"{where}: needs a non-empty 'messages' (role/content) or 'conversations' (from/value) list")
    out = []
    for j, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise InputError(f"{where}: turn {j} is not an object")
        role = turn.get("role", turn.get("from"))
        content = turn.get("content", turn.get("value"))
        if role is None or str(role).lower() not in ROLE_ALIASES or not isinstance(content, str):
            raise InputError(f"{where}: turn {j} needs role/from in {sorted(set(ROLE_ALIASES))} and a string content/value")
        out.append({"role": ROLE_ALIASES[str(role).lower()], "content": content})
    return out


def _jsonl_lines(path: Path, if_missing: str) -> Iterator[tuple[int, str]]:
    """The non-blank lines of a JSONL file with their line numbers; InputError saying `if_missing` when absent."""
    if not path.is_file():
        raise InputError(f"{path}: not found; {if_missing}")
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if line.strip():
            yield n, line


def read_conversations(path: str | Path) -> list[dict[str, Any]]:
    """Read prompt conversations; each gets an id (its own, or its line number)."""
    path = Path(path)
    convs = []
    for n, line in _jsonl_lines(path, "pass a JSONL file of conversations"):
        where = f"{path}:{n}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{where}: not valid JSON ({exc.msg})") from None
        convs.append({"id": str(record.get("id", n)), "messages": normalize_conversation(record, where)})
    if not convs:
        raise InputError(f"{path}: no conversations")
    return convs


def read_samples(path: str | Path) -> list[dict[str, Any]]:
    """Read regenerated samples (this stage's output): id, input_ids, loss_mask."""
    path = Path(path)
    samples = []
    for n, line in _jsonl_lines(path, "run `specdec-train regenerate` first"):
        try:
            rec = json.loads(line)
            ids, mask = rec["input_ids"], rec["loss_mask"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise InputError(f"{path}:{n}: expected a JSON object with input_ids and loss_mask") from None
        if len(ids) != len(mask):
            raise InputError(f"{path}:{n}: input_ids and loss_mask differ in length")
        samples.append({"id": str(rec.get("id", n)), "input_ids": ids, "loss_mask": mask})
    return samples


# ---- tokenization with the model's chat template -------------------------------------------------------


def _render(tokenizer: Any, messages: list[dict[str, str]], generation_prompt: bool) -> str:
    if not messages:
        return ""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []


def tokenize_conversation(tokenizer: Any, messages: list[dict[str, str]], max_length: int | None = None) -> tuple[list[int], list[int]]:
    """input_ids of the whole conversation and a loss mask of 1 on assistant-written tokens.

    The template is rendered turn by turn; every rendering must extend the previous one (true of
    Llama/Qwen/DeepSeek templates that keep past turns verbatim). The generation prompt of an assistant
    turn (e.g. '<|im_start|>assistant\\n') is the template's, so it is masked out.
    """
    if getattr(tokenizer, "chat_template", None) is None:
        raise InputError("tokenizer has no chat_template; save the serving model's tokenizer_config.json with it")
    prev_text = ""
    ids: list[int] = []
    mask: list[int] = []
    for i, msg in enumerate(messages):
        text = _render(tokenizer, messages[: i + 1], False)
        if not text.startswith(prev_text):
            raise InputError(
                "chat template re-renders earlier turns (e.g. strips reasoning); regenerate single-turn "
                "conversations or a template that keeps history verbatim"
            )
        if msg["role"] == "assistant":
            prompt_text = _render(tokenizer, messages[:i], True)
            if not text.startswith(prompt_text) or not prompt_text.startswith(prev_text):
                raise InputError("chat template's generation prompt is not a prefix of the assistant turn")
            head = _encode(tokenizer, prompt_text[len(prev_text) :])
            body = _encode(tokenizer, text[len(prompt_text) :])
            ids += head + body
            mask += [0] * len(head) + [1] * len(body)
        else:
            new = _encode(tokenizer, text[len(prev_text) :])
            ids += new
            mask += [0] * len(new)
        prev_text = text
    if max_length:
        ids, mask = ids[:max_length], mask[:max_length]
    return ids, mask


# ---- the client ---------------------------------------------------------------------------------------


class EndpointError(Exception):
    """A request that failed after its retries."""


async def _post(session: Any, url: str, body: dict[str, Any], retries: int, backoff: float) -> dict[str, Any]:
    import aiohttp

    delay = backoff
    last = ""
    for attempt in range(retries + 1):
        try:
            async with session.post(url, json=body) as resp:
                if resp.status == 200:
                    return await resp.json()
                # The status and the answer's length only: a server's error may quote the prompt, and no prompt or
                # answer text may reach the logs (docs/capture.md).
                last = f"HTTP {resp.status} ({len(await resp.read())} bytes)"
                if resp.status < 500 and resp.status != 429:
                    raise EndpointError(f"{url}: {last}")
        except (TimeoutError, aiohttp.ClientError) as exc:
            last = f"{type(exc).__name__}: {exc}"
        if attempt < retries:
            await asyncio.sleep(delay * (1 + random.random() * 0.1))
            delay = min(delay * 2, 30.0)
    raise EndpointError(f"{url}: gave up after {retries + 1} attempts ({last})")


async def complete_turn(
    session: Any,
    base_url: str,
    api: str,
    model: str,
    tokenizer: Any,
    messages: list[dict[str, str]],
    max_new_tokens: int,
    temperature: float,
    retries: int,
    backoff: float,
) -> str:
    """Ask the serving model for the next assistant turn of `messages`."""
    try:
        return await _complete_turn(session, base_url, api, model, tokenizer, messages, max_new_tokens, temperature, retries, backoff)
    except (KeyError, IndexError, TypeError) as exc:
        # The exception's type only: its text may quote the answer.
        raise EndpointError(f"{base_url} ({api}): unexpected response shape ({type(exc).__name__})") from None


async def _complete_turn(
    session: Any,
    base_url: str,
    api: str,
    model: str,
    tokenizer: Any,
    messages: list[dict[str, str]],
    max_new_tokens: int,
    temperature: float,
    retries: int,
    backoff: float,
) -> str:
    if api == "chat":
        body = {"model": model, "messages": messages, "max_tokens": max_new_tokens, "temperature": temperature}
        data = await _post(session, f"{base_url}/v1/chat/completions", body, retries, backoff)
        return data["choices"][0]["message"]["content"] or ""
    prompt = _render(tokenizer, messages, True)
    if api == "completions":
        body = {"model": model, "prompt": prompt, "max_tokens": max_new_tokens, "temperature": temperature}
        data = await _post(session, f"{base_url}/v1/completions", body, retries, backoff)
        return data["choices"][0]["text"]
    if api == "generate":
        body = {
            "input_ids": _encode(tokenizer, prompt),
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": temperature},
        }
        data = await _post(session, f"{base_url}/generate", body, retries, backoff)
        if "output_ids" in data:
            return tokenizer.decode(data["output_ids"], skip_special_tokens=True)
        return data["text"]
    raise InputError(f"--api {api}: one of chat, completions, generate")


def _done_ids(out: Path) -> set[str]:
    if not out.exists():
        return set()
    done = set()
    for line in out.read_text().splitlines():
        try:
            done.add(str(json.loads(line)["id"]))
        except (json.JSONDecodeError, KeyError, TypeError):
            continue  # a line cut by an interrupted run: redone
    return done


def regenerate(
    prompts: str | Path,
    out: str | Path,
    *,
    base_url: str,
    tokenizer_dir: str | Path,
    api: str = "chat",
    model: str = "default",
    max_new_tokens: int = 1024,
    temperature: float = 0.0,
    concurrency: int = 16,
    retries: int = 4,
    backoff: float = 1.0,
    max_length: int | None = 4096,
    limit: int | None = None,
    progress: bool = True,
) -> dict[str, int]:
    """Regenerate every assistant turn through the serving endpoint; returns counts (written/skipped/failed)."""
    if api not in ("chat", "completions", "generate"):
        raise InputError(f"--api {api}: one of chat, completions, generate")
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    except (OSError, ValueError) as exc:
        raise InputError(f"{tokenizer_dir}: cannot load its tokenizer ({str(exc).splitlines()[0]})") from None
    convs = read_conversations(prompts)[:limit]
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = _done_ids(out)
    todo = [c for c in convs if c["id"] not in done]
    log.info("regenerate: %d conversations, %d already done", len(convs), len(convs) - len(todo))
    counts = asyncio.run(
        _regenerate_all(
            todo,
            out,
            base_url.rstrip("/"),
            api,
            model,
            tokenizer,
            max_new_tokens,
            temperature,
            concurrency,
            retries,
            backoff,
            max_length,
            progress,
        )
    )
    counts["skipped"] = len(convs) - len(todo)
    return counts


async def _regenerate_all(
    todo,
    out,
    base_url,
    api,
    model,
    tokenizer,
    max_new_tokens,
    temperature,
    concurrency,
    retries,
    backoff,
    max_length,
    progress,
) -> dict[str, int]:
    import aiohttp
    from tqdm import tqdm

    sem = asyncio.Semaphore(concurrency)
    counts = {"written": 0, "failed": 0}
    bar = tqdm(total=len(todo), desc="regenerate", unit="conv", disable=not progress)
    timeout = aiohttp.ClientTimeout(total=900)
    with out.open("a") as sink:
        async with aiohttp.ClientSession(timeout=timeout) as session:

            async def one(conv: dict[str, Any]) -> None:
                async with sem:
                    messages: list[dict[str, str]] = []
                    try:
                        for turn in conv["messages"]:
                            if turn["role"] != "assistant":
                                messages.append(turn)
                                continue
                            text = await complete_turn(
                                session,
                                base_url,
                                api,
                                model,
                                tokenizer,
                                messages,
                                max_new_tokens,
                                temperature,
                                retries,
                                backoff,
                            )
                            messages.append({"role": "assistant", "content": text})
                        if not any(m["role"] == "assistant" for m in messages):
                            text = await complete_turn(
                                session,
                                base_url,
                                api,
                                model,
                                tokenizer,
                                messages,
                                max_new_tokens,
                                temperature,
                                retries,
                                backoff,
                            )
                            messages.append({"role": "assistant", "content": text})
                    except EndpointError as exc:
                        log.warning("conversation %s failed: %s", conv["id"], exc)
                        counts["failed"] += 1
                        bar.update(1)
                        return
                ids, mask = tokenize_conversation(tokenizer, messages, max_length)
                record = {"id": conv["id"], "input_ids": ids, "loss_mask": mask, "messages": messages}
                sink.write(json.dumps(record) + "\n")
                sink.flush()
                counts["written"] += 1
                bar.update(1)

            await asyncio.gather(*(one(c) for c in todo))
    bar.close()
    return counts
