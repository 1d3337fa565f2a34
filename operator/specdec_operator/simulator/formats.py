"""The bytes of SGLang 0.5.23's generation responses: /generate's body with its meta_info, the OpenAI completion and
chat bodies and their SSE chunks, and the error body.

The shapes follow SGLang's own code (``srt/entrypoints/http_server.py``, ``srt/managers/tokenizer_manager.py``):
a streamed /generate event carries the cumulative ``text`` and ``output_ids`` (SGLang's default,
``incremental_streaming_output`` off); the finishing event's ``meta_info`` carries ``e2e_latency`` and, when
speculating, ``spec_verify_ct``, ``spec_accept_length`` (= completion_tokens / spec_verify_ct),
``spec_accept_rate``, ``spec_num_correct_drafts``, ``spec_num_proposed_drafts``. An OpenAI chunk carries the delta.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from aiohttp import web

from .inputs import OpenAIInput
from .model import Emission, SimRequest, SpeculativeConfig
from .tokens import CorruptedTokens, OutputTape

Tokens = OutputTape | CorruptedTokens

try:  # orjson is faster; the standard library is enough.
    import orjson

    def dumps(obj: Any) -> bytes:
        return orjson.dumps(obj)

except ImportError:  # pragma: no cover - depends on the environment

    def dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()


DONE_EVENT = b"data: [DONE]\n\n"


def sse_event(payload: bytes) -> bytes:
    return b"data: " + payload + b"\n\n"


def error_response(message: str, status: int = 400) -> web.Response:
    body = {"error": {"message": message, "type": "invalid_request_error", "code": status}}
    return web.json_response(body, status=status)


class GenerateFormat:
    """SGLang's /generate body for one request; streamed, each event is the body so far."""

    def __init__(self, tape: Tokens, rid: str, req: SimRequest, *, time_scale: float, speculative: SpeculativeConfig | None) -> None:
        self.tape = tape
        self.rid = rid.encode()
        self.req = req
        self.time_scale = time_scale
        self.speculative = speculative

    def body(self, em: Emission) -> bytes:
        n = em.completion_tokens
        finish = b'{"type":"length","length":%d}' % n if em.finished else b"null"
        meta = (
            b'{"id":"%s","finish_reason":%s,"prompt_tokens":%d,"weight_version":"default","num_retractions":0,'
            b'"reasoning_tokens":0,"completion_tokens":%d,"cached_tokens":0' % (self.rid, finish, self.req.prompt_tokens, n)
        )
        if em.finished:
            e2e = ((self.req.finished_at or 0.0) - self.req.arrival) / self.time_scale
            meta += b',"e2e_latency":' + repr(e2e).encode()
            spec = self.speculative
            if spec is not None and em.verify_ct > 0:
                proposed = em.verify_ct * (spec.num_draft_tokens - 1)
                meta += (
                    b',"spec_accept_rate":%r,"spec_accept_length":%r,"spec_num_correct_drafts":%d,'
                    b'"spec_num_proposed_drafts":%d,"spec_verify_ct":%d'
                    % (em.correct_drafts / proposed, n / em.verify_ct, em.correct_drafts, proposed, em.verify_ct)
                )
        tape = self.tape
        return b'{"text":' + tape.text_json(n) + b',"output_ids":' + tape.ids_json(n) + b',"meta_info":' + meta + b"}}"

    def malformed_event(self, em: Emission) -> bytes:
        """An event cut inside its text (the malformed_json fault)."""
        return b'data: {"text": "' + self.tape.text_json(em.completion_tokens)[1:20] + b"\n\n"


class OpenAIFormat:
    """The OpenAI /v1/completions or /v1/chat/completions body for one request, or its SSE chunks."""

    def __init__(self, tape: Tokens, ask: OpenAIInput) -> None:
        self.tape = tape
        self.continuous_usage = ask.continuous_usage
        self.chat = ask.chat
        self.model = ask.model
        self.prompt_tokens = ask.prompt_tokens
        self.include_usage = ask.include_usage
        self.return_token_ids = ask.return_token_ids
        self.id = uuid.uuid4().hex
        self.created = int(time.time())
        self.sent = 0  # tokens already in a chunk
        self.chunk_object = "chat.completion.chunk" if ask.chat else "text_completion"

    def body(self, em: Emission) -> bytes:
        text = self.tape.text_str(em.completion_tokens)
        choice: dict[str, Any] = {"index": 0}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text, "reasoning_content": None, "tool_calls": None}
        else:
            choice["text"] = text
        choice.update({"logprobs": None, "finish_reason": "length", "matched_stop": None})
        if self.return_token_ids:  # vLLM's completions: the generated token ids beside the text
            choice["token_ids"] = json.loads(self.tape.ids_json(em.completion_tokens))
        return dumps(
            {
                "id": self.id,
                "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created,
                "model": self.model,
                "choices": [choice],
                "usage": usage(self.prompt_tokens, em.completion_tokens),
            }
        )

    def chunk(self, em: Emission) -> bytes:
        """The SSE event(s) of the tokens emitted since the previous chunk.

        Chat streams as SGLang's serving_chat.py does: a first chunk with the role and empty content, a content
        chunk per emission (its usage under ``stream_options.continuous_usage_stats``), then a chunk with only
        the finish reason. Text completions carry the finish reason in the last content chunk.
        """
        first = self.sent == 0
        delta = self.tape.delta_text(self.sent, em.completion_tokens)
        self.sent = em.completion_tokens
        finish = "length" if em.finished else None
        usage_now = usage(self.prompt_tokens, em.completion_tokens) if self.continuous_usage else None
        if not self.chat:
            choice = {"index": 0, "text": delta, "logprobs": None, "finish_reason": finish, "matched_stop": None}
            return self._event([choice], usage_now)
        out = b""
        if first:
            role = {"role": "assistant", "content": "", "reasoning_content": None, "tool_calls": None}
            out += self._event([{"index": 0, "delta": role, "logprobs": None, "finish_reason": None, "matched_stop": None}], None)
        d: dict[str, Any] = {"role": None, "content": delta, "reasoning_content": None, "tool_calls": None}
        out += self._event([{"index": 0, "delta": d, "logprobs": None, "finish_reason": None, "matched_stop": None}], usage_now)
        if finish is not None:
            end = {"role": None, "content": None, "reasoning_content": None, "tool_calls": None}
            out += self._event([{"index": 0, "delta": end, "logprobs": None, "finish_reason": finish, "matched_stop": None}], None)
        return out

    def _event(self, choices: list[dict[str, Any]], usage_now: dict[str, Any] | None) -> bytes:
        return sse_event(
            dumps({"id": self.id, "object": self.chunk_object, "created": self.created, "model": self.model, "choices": choices, "usage": usage_now})
        )

    def usage_chunk(self) -> bytes:
        """The last SSE event when the client asked for stream_options.include_usage."""
        return sse_event(
            dumps(
                {
                    "id": self.id,
                    "object": self.chunk_object,
                    "created": self.created,
                    "model": self.model,
                    "choices": [],
                    "usage": usage(self.prompt_tokens, self.sent),
                }
            )
        )

    def malformed_chunk(self) -> bytes:
        """An event cut inside its JSON (the malformed_json fault)."""
        return b'data: {"id": "' + self.id.encode() + b'", "choices": [\n\n'


def usage(prompt: int, completion: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": None,
        "reasoning_tokens": 0,
    }
