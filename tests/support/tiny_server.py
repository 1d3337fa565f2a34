"""A real HTTP server that serves a tiny Hugging Face model with transformers' generate.

It speaks the OpenAI protocol (/v1/chat/completions, /v1/completions) and SGLang's native /generate,
including what an SGLang server started with `--enable-return-aux-hidden-states` returns
(meta_info.hidden_states of the prompt, input/output top-k log-probabilities). SGLang itself needs a GPU,
so this is the stand-in the tests regenerate and capture against; it runs in a background thread.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import torch


class TinyModelServer:
    def __init__(
        self,
        model_dir: Path,
        *,
        capture_layers: list[int] | None = None,
        fail_first: int = 0,
        quantization: str | None = None,
    ) -> None:
        from transformers import AutoTokenizer

        from drafter_training.target import load_target

        self.model_dir = model_dir
        self.target = load_target(model_dir, quantization or "none")
        self.model = self.target.model
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        self.capture_layers = capture_layers  # not None: behaves as --enable-return-aux-hidden-states
        self.fail_first = fail_first  # answer 503 to the first N requests (exercises client retries)
        self.requests = 0
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: Any = None
        self.base_url = ""

    # ---- model work (synchronous, serialised) ----------------------------------------------------------
    def _generate(self, ids: list[int], max_new_tokens: int, temperature: float) -> list[int]:
        with self._lock, torch.no_grad():
            inp = torch.tensor([ids])
            kwargs: dict[str, Any] = {"do_sample": temperature > 0, "max_new_tokens": max_new_tokens, "pad_token_id": self.tokenizer.pad_token_id}
            if temperature > 0:
                kwargs["temperature"] = temperature
            out = self.model.generate(inp, attention_mask=torch.ones_like(inp), **kwargs)
            new = out[0, len(ids) :].tolist()
            eos = self.tokenizer.eos_token_id
            if eos in new:
                new = new[: new.index(eos) + 1]
            return new

    def _capture(self, ids: list[int], top_k: int) -> dict[str, Any]:
        from drafter_training.target import capture_forward

        with self._lock:
            aux, _, logits = capture_forward(self.model, torch.tensor([ids]), self.capture_layers)
        logp = torch.log_softmax(logits[0].float(), -1)
        top = logp.topk(top_k, dim=-1)
        rows = [[[float(v), int(i), None] for v, i in zip(top.values[t], top.indices[t])] for t in range(len(ids))]
        return {"hidden": aux[0].tolist(), "input_top": [None] + rows[:-1], "output_top": [rows[-1]]}

    # ---- HTTP -------------------------------------------------------------------------------------------
    def _flaky(self):
        from aiohttp import web

        self.requests += 1
        if self.requests <= self.fail_first:
            return web.json_response({"error": "warming up"}, status=503)
        return None

    async def _chat(self, request):
        from aiohttp import web

        if (r := self._flaky()) is not None:
            return r
        body = await request.json()
        text = self.tokenizer.apply_chat_template(body["messages"], tokenize=False, add_generation_prompt=True)
        return web.json_response(await self._complete(text, body, chat=True))

    async def _completions(self, request):
        from aiohttp import web

        if (r := self._flaky()) is not None:
            return r
        body = await request.json()
        return web.json_response(await self._complete(body["prompt"], body, chat=False))

    async def _complete(self, text: str, body: dict[str, Any], chat: bool) -> dict[str, Any]:
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        max_new = int(body.get("max_tokens") or 16)
        new = await asyncio.to_thread(self._generate, ids, max_new, float(body.get("temperature") or 0.0))
        out_text = self.tokenizer.decode(new, skip_special_tokens=True)
        finish = "stop" if new and new[-1] == self.tokenizer.eos_token_id else "length"
        usage = {"prompt_tokens": len(ids), "completion_tokens": len(new), "total_tokens": len(ids) + len(new)}
        common = {"id": f"cmpl-{uuid.uuid4().hex[:12]}", "created": int(time.time()), "model": body.get("model"), "usage": usage}
        if chat:
            return {
                **common,
                "object": "chat.completion",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": out_text}, "finish_reason": finish}],
            }
        return {**common, "object": "text_completion", "choices": [{"index": 0, "text": out_text, "finish_reason": finish}]}

    async def _native_generate(self, request):
        from aiohttp import web

        if (r := self._flaky()) is not None:
            return r
        body = await request.json()
        ids = body.get("input_ids") or self.tokenizer(body["text"], add_special_tokens=False)["input_ids"]
        sp = body.get("sampling_params") or {}
        new = await asyncio.to_thread(self._generate, ids, int(sp.get("max_new_tokens", 16)), float(sp.get("temperature", 1.0)))
        meta: dict[str, Any] = {
            "id": uuid.uuid4().hex,
            "prompt_tokens": len(ids),
            "completion_tokens": len(new),
            "finish_reason": {"type": "stop" if new and new[-1] == self.tokenizer.eos_token_id else "length"},
        }
        if body.get("return_hidden_states"):
            if self.capture_layers is None:
                return web.json_response({"error": "return_hidden_states needs --enable-return-hidden-states"}, status=400)
            cap = await asyncio.to_thread(self._capture, ids, int(body.get("top_logprobs_num") or 1))
            meta["hidden_states"] = [cap["hidden"]]
            if body.get("return_logprob"):
                meta["input_top_logprobs"] = cap["input_top"]
                meta["output_top_logprobs"] = cap["output_top"]
        return web.json_response({"text": self.tokenizer.decode(new, skip_special_tokens=True), "output_ids": new, "meta_info": meta})

    async def _health(self, _request):
        from aiohttp import web

        return web.Response(text="ok")

    # ---- lifecycle --------------------------------------------------------------------------------------
    def start(self) -> str:
        from aiohttp import web

        ready = threading.Event()

        async def boot() -> None:
            app = web.Application(client_max_size=64 * 2**20)
            app.router.add_post("/v1/chat/completions", self._chat)
            app.router.add_post("/v1/completions", self._completions)
            app.router.add_post("/generate", self._native_generate)
            app.router.add_get("/health", self._health)
            self._runner = web.AppRunner(app)
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]
            self.base_url = f"http://127.0.0.1:{port}"
            ready.set()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            self._loop.run_until_complete(boot())
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        if not ready.wait(30):
            raise RuntimeError("tiny model server did not start")
        return self.base_url

    def stop(self) -> None:
        if self._loop is None:
            return
        fut = asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop)
        fut.result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def __enter__(self) -> TinyModelServer:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
