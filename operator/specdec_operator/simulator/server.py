"""An HTTP server that speaks SGLang 0.5.23's API over the performance model in :mod:`.model`.

Response shapes follow SGLang's own code (``srt/entrypoints/http_server.py``,
``srt/managers/tokenizer_manager.py``): streaming ``/generate`` sends cumulative ``text`` and
``output_ids`` (SGLang's default, ``incremental_streaming_output`` off) as ``data: {...}\\n\\n`` events,
one per decode step at ``stream_interval`` 1 (so a speculative step's k tokens arrive in one event) and
ends with ``data: [DONE]``; the finishing event's ``meta_info`` carries ``e2e_latency`` and, when
speculating, ``spec_verify_ct``, ``spec_accept_length`` (= completion_tokens / spec_verify_ct),
``spec_accept_rate``, ``spec_num_correct_drafts``, ``spec_num_proposed_drafts``.

The simulator generates exactly ``max_new_tokens`` tokens (it has no EOS), as SGLang does with
``ignore_eos``. A text prompt counts one token per 4 UTF-8 bytes (there is no tokenizer); ``input_ids``
count exactly.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import time
import uuid
from typing import Any, Callable

from aiohttp import web
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import CollectorRegistry

from .model import Emission, Engine, Profile, SimRequest

try:  # orjson is faster; the standard library is enough.
    import orjson

    def _dumps(obj: Any) -> bytes:
        return orjson.dumps(obj)

except ImportError:  # pragma: no cover - depends on the environment

    def _dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()


SGLANG_VERSION = "0.5.23"
_WORDS = [" the", " model", " speaks", " tokens", " quickly", " and", " well", ".", " A", " draft"]
_DONE = b"data: [DONE]\n\n"


class _TokenTape:
    """Pre-rendered JSON fragments of the simulator's output so a cumulative chunk is two slices.

    Token i is ``_WORDS[i % 10]`` with id ``1000 + i % 10``; the JSON of the first n ids and of the first
    n tokens' text are prefixes of two byte strings, so building a chunk costs O(1) Python work.
    """

    def __init__(self) -> None:
        self.ids = bytearray()
        self.ids_end: list[int] = [0]
        self.text = bytearray()
        self.text_end: list[int] = [0]

    def ensure(self, n: int) -> None:
        while len(self.ids_end) <= n:
            i = len(self.ids_end) - 1
            self.ids += (b"," if i else b"") + str(1000 + i % len(_WORDS)).encode()
            self.ids_end.append(len(self.ids))
            self.text += _WORDS[i % len(_WORDS)].encode()
            self.text_end.append(len(self.text))

    def ids_json(self, n: int) -> bytes:
        return b"[" + bytes(self.ids[: self.ids_end[n]]) + b"]"

    def text_str(self, n: int) -> str:
        return self.text[: self.text_end[n]].decode()

    def text_json(self, n: int) -> bytes:
        return b'"' + bytes(self.text[: self.text_end[n]]) + b'"'

    def delta_text(self, a: int, b: int) -> str:
        return self.text[self.text_end[a] : self.text_end[b]].decode()


_TAPE = _TokenTape()


class _Fault:
    NONE = "none"
    HTTP_500 = "http_500"
    TIMEOUT = "timeout"
    TRUNCATED = "truncated_stream"
    MALFORMED = "malformed_json"
    STALL = "stall"


class RequestError(Exception):
    """A request SGLang would refuse with 400 (its error body shape)."""


def _bad_request(message: str, status: int = 400) -> web.Response:
    body = {"error": {"message": message, "type": "invalid_request_error", "code": status}}
    return web.json_response(body, status=status)


class _Collector:
    """Renders the engine's state as SGLang's ``sglang:*`` Prometheus metrics at scrape time."""

    def __init__(self, sim: "Simulator") -> None:
        self.sim = sim

    def describe(self):  # no eager collection on register
        return []

    def collect(self):
        sim, engine = self.sim, self.sim.engine
        profile = sim.profile
        sched_labels = ["model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"]
        tok_labels = ["model_name", "engine_type"]
        model = sim.served_model_name

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            fam = GaugeMetricFamily(f"sglang:{name}", doc, labels=sched_labels)
            # Every TP rank's scheduler reports; readers average over the label sets.
            for rank in range(profile.tp_size):
                fam.add_metric([model, "unified", str(rank), "0", "0"], value)
            return fam

        running = len(engine.running)
        yield gauge("num_running_reqs", "The number of running requests.", running)
        yield gauge("num_queue_reqs", "The number of requests in the waiting queue.", len(engine.waiting))
        yield gauge("gen_throughput", "The generation throughput (token/s).", engine.last_gen_throughput)
        yield gauge("token_usage", "The token usage.", min(1.0, running / max(profile.max_running_requests, 1)))
        yield gauge("cache_hit_rate", "The prefix cache hit rate.", 0.0)
        if profile.speculative is not None:
            yield gauge("spec_accept_length", "The average acceptance length of speculative decoding.",
                        engine.last_accept_length)
            yield gauge("spec_accept_rate", "The average acceptance rate of speculative decoding.",
                        engine.last_accept_rate)
            yield gauge("spec_num_steps", "The number of speculative steps.", profile.speculative.num_steps)
            yield gauge("spec_num_draft_tokens", "The number of speculative draft tokens.",
                        profile.speculative.num_draft_tokens)
        labels = [model, "unified"]
        for name, doc, value in (
            ("prompt_tokens", "Number of prefill tokens processed.", engine.prompt_tokens_total),
            ("generation_tokens", "Number of generation tokens processed.", engine.generation_tokens_total),
            ("num_requests", "The number of requests.", engine.requests_total),
            ("spec_verify_calls", "Number of speculative verify calls.", engine.verify_calls_total),
        ):
            fam = CounterMetricFamily(f"sglang:{name}", doc, labels=tok_labels)
            fam.add_metric(labels, value)
            yield fam
        for name, doc, hist in (
            ("time_to_first_token_seconds", "Histogram of time to first token in seconds.", engine.ttft_seconds),
            ("inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", engine.itl_seconds),
            ("e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds",
             engine.e2e_seconds),
        ):
            fam = HistogramMetricFamily(f"sglang:{name}", doc, labels=tok_labels)
            buckets = [(b if b == "+Inf" else repr(float(b)), c) for b, c in hist.cumulative()]
            fam.add_metric(labels, buckets, hist.sum)
            yield fam


class Simulator:
    """The aiohttp application of one simulated SGLang server (engine, faults, endpoints)."""

    def __init__(
        self,
        profile: Profile,
        *,
        time_scale: float = 1.0,
        seed: int | None = None,
        load_seconds: float | None = None,
        on_death: Callable[[], None] | None = None,
        port: int = 30000,
        host: str = "127.0.0.1",
    ) -> None:
        self.profile = profile
        self.time_scale = time_scale
        self.seed = seed
        self.load_seconds = profile.load_seconds if load_seconds is None else load_seconds
        self.on_death = on_death
        self.port = port
        self.host = host
        self.served_model_name = profile.served_model_name or profile.model_path
        self.fault_rng = random.Random(None if seed is None else seed + 7919)
        self.engine: Engine  # created in on_startup, on the serving event loop
        self.started_wall = 0.0
        self.startup_time = time.time()
        self.generate_count = 0
        self.dead = False
        self._live_requests: dict[int, web.BaseRequest] = {}  # Request objects are unhashable
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))
        self.app = self._build_app()

    # --- application -----------------------------------------------------------------------------
    def _build_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        r = app.router
        r.add_get("/health", self.health)
        r.add_get("/health_generate", self.health)
        r.add_get("/ready", self.ready)
        r.add_route("POST", "/generate", self.generate)
        r.add_route("PUT", "/generate", self.generate)
        r.add_post("/v1/completions", self.completions)
        r.add_post("/v1/chat/completions", self.chat_completions)
        r.add_get("/v1/models", self.models)
        r.add_get("/metrics", self.metrics)
        r.add_get("/server_info", self.server_info)
        r.add_get("/get_server_info", self.server_info)
        r.add_get("/model_info", self.model_info)
        r.add_get("/get_model_info", self.model_info)
        r.add_route("*", "/flush_cache", self.flush_cache)
        return app

    async def _on_startup(self, app: web.Application) -> None:
        self.engine = Engine(self.profile, time_scale=self.time_scale, seed=self.seed)
        self.engine.start()
        self.started_wall = asyncio.get_running_loop().time()

    async def _on_cleanup(self, app: web.Application) -> None:
        await self.engine.stop()

    @property
    def loading(self) -> bool:
        elapsed = asyncio.get_running_loop().time() - self.started_wall
        return elapsed * self.time_scale < self.load_seconds

    # --- health ------------------------------------------------------------------------------------
    async def ready(self, request: web.Request) -> web.Response:
        return web.Response(status=503 if self.loading or self.dead else 200)

    async def health(self, request: web.Request) -> web.Response:
        if self.loading or self.dead:
            return web.Response(status=503)
        if request.path == "/health_generate" and not self.engine.running:
            # SGLang generates one token when idle; a wedged engine would not answer within 20 s.
            req = self.engine.submit(1, 1)
            try:
                await asyncio.wait_for(req.out.get(), timeout=20)
            except asyncio.TimeoutError:
                req.cancelled = True
                return web.Response(status=503)
        return web.Response(status=200)

    # --- info ----------------------------------------------------------------------------------------
    def resolved_args(self) -> dict[str, Any]:
        p, spec = self.profile, self.profile.speculative
        args: dict[str, Any] = {
            "model_path": p.model_path,
            "tokenizer_path": p.model_path,
            "served_model_name": self.served_model_name,
            "host": self.host,
            "port": self.port,
            "tp_size": p.tp_size,
            "max_running_requests": p.max_running_requests,
            "context_length": p.context_length,
            "stream_interval": p.stream_interval,
            "incremental_streaming_output": False,
            "enable_metrics": True,
            "speculative_algorithm": spec.algorithm if spec else None,
            "speculative_draft_model_path": f"{p.model_path}-draft" if spec else None,
            "speculative_num_steps": spec.num_steps if spec else None,
            "speculative_eagle_topk": spec.eagle_topk if spec else None,
            "speculative_num_draft_tokens": spec.num_draft_tokens if spec else None,
        }
        argv = ["sglang", "serve", "--model-path", p.model_path, "--tp-size", str(p.tp_size)]
        if spec:
            argv += ["--speculative-algorithm", spec.algorithm, "--speculative-num-steps", str(spec.num_steps),
                     "--speculative-eagle-topk", str(spec.eagle_topk),
                     "--speculative-num-draft-tokens", str(spec.num_draft_tokens)]
        args["launch_command"] = " ".join(argv)
        return args

    async def server_info(self, request: web.Request) -> web.Response:
        if self.loading:
            return web.Response(status=503)
        engine = self.engine
        state: dict[str, Any] = {"last_gen_throughput": engine.last_gen_throughput, "memory_usage": {}}
        if self.profile.speculative is not None:
            state["avg_spec_accept_length"] = engine.avg_spec_accept_length
        body = {
            **self.resolved_args(),
            "max_total_num_tokens": self.profile.max_running_requests * self.profile.context_length,
            "startup_time": self.startup_time,
            "internal_states": [state],
            "version": SGLANG_VERSION,
            "frontend": "python",
            # Not in SGLang: says plainly that this is a simulator, and which model it runs.
            "simulator": {"profile": self.profile.name, "time_scale": self.time_scale},
        }
        return web.Response(body=_dumps(body), content_type="application/json")

    async def model_info(self, request: web.Request) -> web.Response:
        body = {
            "model_path": self.profile.model_path,
            "served_model_name": self.served_model_name,
            "tokenizer_path": self.profile.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": None,
            "architectures": None,
        }
        return web.json_response(body)

    async def models(self, request: web.Request) -> web.Response:
        body = {
            "object": "list",
            "data": [{
                "id": self.served_model_name,
                "object": "model",
                "created": int(self.startup_time),
                "owned_by": "sglang",
                "root": self.served_model_name,
                "max_model_len": self.profile.context_length,
            }],
        }
        return web.json_response(body)

    async def flush_cache(self, request: web.Request) -> web.Response:
        self.engine.lifetime_tokens = self.engine.lifetime_verify = 0
        return web.Response(text="Cache flushed.\nPlease check backend logs for more details. (When there are "
                                 "running or waiting requests, the operation will not be performed.)\n")

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry),
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    # --- faults --------------------------------------------------------------------------------------
    def _draw_fault(self) -> str:
        e = self.profile.errors
        u = self.fault_rng.random()
        for name, rate in (
            (_Fault.HTTP_500, e.http_500_rate),
            (_Fault.TIMEOUT, e.timeout_rate),
            (_Fault.TRUNCATED, e.truncated_stream_rate),
            (_Fault.MALFORMED, e.malformed_json_rate),
            (_Fault.STALL, e.stall_rate),
        ):
            if u < rate:
                return name
            u -= rate
        return _Fault.NONE

    def _count_and_maybe_die(self, request: web.Request) -> bool:
        """Count a generation request; True when the server is (now) dead and the request was dropped."""
        self.generate_count += 1
        limit = self.profile.errors.die_after_requests
        if not self.dead and limit is not None and self.generate_count > limit:
            self.dead = True
            for live in list(self._live_requests.values()):
                if live.transport is not None:
                    live.transport.abort()
            if self.on_death is not None:
                self.on_death()
        if self.dead:
            if request.transport is not None:
                request.transport.abort()
            return True
        return False

    async def _preflight(self, request: web.Request) -> tuple[web.StreamResponse | None, dict | None, str]:
        """Shared start of every generation endpoint: death, loading, body, fault draw."""
        if self._count_and_maybe_die(request):
            return web.Response(status=503), None, _Fault.NONE
        if self.loading:
            return _bad_request("The server is starting (loading the model).", 503), None, _Fault.NONE
        try:
            body = await request.json(loads=json.loads)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _bad_request("Request body is not valid JSON."), None, _Fault.NONE
        if not isinstance(body, dict):
            return _bad_request("Request body must be a JSON object."), None, _Fault.NONE
        fault = self._draw_fault()
        if fault == _Fault.HTTP_500:
            return _bad_request("Internal server error (injected by the simulator).", 500), None, fault
        if fault == _Fault.TIMEOUT:
            # Accept and never answer (until the client gives up or the server stops).
            self._live_requests[id(request)] = request
            try:
                await asyncio.sleep(3600)
            finally:
                self._live_requests.pop(id(request), None)
            return web.Response(status=504), None, fault
        return None, body, fault

    # --- /generate --------------------------------------------------------------------------------------
    async def generate(self, request: web.Request) -> web.StreamResponse:
        early, body, fault = await self._preflight(request)
        if early is not None:
            return early
        assert body is not None
        try:
            prompt_tokens = _prompt_tokens(body)
            params = body.get("sampling_params") or {}
            if not isinstance(params, dict):
                raise RequestError("sampling_params must be an object")
            max_new = _int_param(params, "max_new_tokens", 128)
            interval = params.get("stream_interval")
            if interval is not None:
                interval = _int_param(params, "stream_interval", 1)
        except RequestError as exc:
            return _bad_request(str(exc))
        rid = str(body.get("rid") or uuid.uuid4().hex)
        _TAPE.ensure(max_new)
        req = self.engine.submit(prompt_tokens, max_new, interval)
        stream = bool(body.get("stream", False))
        self._live_requests[id(request)] = request
        try:
            if not stream:
                while True:
                    em = await req.out.get()
                    if em.finished:
                        break
                if fault in (_Fault.TRUNCATED, _Fault.MALFORMED):
                    payload = self._generate_json(rid, req, em)
                    cut = payload[: len(payload) // 2]
                    if fault == _Fault.TRUNCATED:
                        return await self._truncated(request, cut, "application/json")
                    return web.Response(body=cut, content_type="application/json")
                if fault == _Fault.STALL:
                    await asyncio.sleep(self.profile.errors.stall_seconds)
                return web.Response(body=self._generate_json(rid, req, em), content_type="application/json")
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            if fault == _Fault.STALL:
                return await self._stream_slow(request, resp, rid, req, fault)
            return await self._stream_fast(request, resp, rid, req, fault)
        except (asyncio.CancelledError, ConnectionResetError):
            req.cancelled = True
            raise
        finally:
            self._live_requests.pop(id(request), None)

    async def _stream_fast(self, request: web.Request, resp: web.StreamResponse, rid: str, req: SimRequest,
                           fault: str) -> web.StreamResponse:
        """Stream by writing HTTP chunks to the transport from the engine's step (no wake-up per event)."""
        transport = request.transport
        loop = asyncio.get_running_loop()
        done: asyncio.Future = loop.create_future()
        half = req.max_new_tokens // 2

        def write(data: bytes) -> None:
            transport.write(b"%x\r\n%b\r\n" % (len(data), data))

        def sink(em: Emission) -> None:
            if done.done():
                return
            if transport is None or transport.is_closing():
                req.cancelled = True
                done.set_result(False)
                return
            if fault != _Fault.NONE and em.completion_tokens >= half and not em.finished:
                if fault == _Fault.TRUNCATED:
                    req.cancelled = True
                    transport.close()
                    done.set_result(False)
                    return
                if fault == _Fault.MALFORMED:
                    write(b'data: {"text": "' + _TAPE.text_json(em.completion_tokens)[1:20] + b"\n\n")
                    return
            write(b"data: " + self._generate_json(rid, req, em) + b"\n\n")
            if em.finished:
                write(_DONE)
                done.set_result(True)

        req.sink = sink
        # Emissions queued before the sink was attached (the prefill can finish while headers were sent).
        while not req.out.empty():
            sink(req.out.get_nowait())
        try:
            completed = await done
        except asyncio.CancelledError:
            req.cancelled = True
            raise
        if completed:
            try:
                await resp.write_eof()
            except ConnectionResetError:  # the client left right after [DONE]
                pass
        return resp

    async def _stream_slow(self, request: web.Request, resp: web.StreamResponse, rid: str, req: SimRequest,
                           fault: str) -> web.StreamResponse:
        """Stream through the request's queue: needed when a fault must pause the stream (stall)."""
        half = req.max_new_tokens // 2
        stalled = False
        try:
            while True:
                em = await req.out.get()
                if not stalled and fault == _Fault.STALL and em.completion_tokens >= half and not em.finished:
                    stalled = True
                    await asyncio.sleep(self.profile.errors.stall_seconds)
                await resp.write(b"data: " + self._generate_json(rid, req, em) + b"\n\n")
                if em.finished:
                    break
            await resp.write(_DONE)
            await resp.write_eof()
        except ConnectionResetError:  # the client gave up on the stalled stream: what a stall is for
            req.cancelled = True
        return resp

    async def _truncated(self, request: web.Request, partial: bytes, content_type: str) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": content_type})
        resp.content_length = len(partial) * 2
        await resp.prepare(request)
        await resp.write(partial)
        if request.transport is not None:
            request.transport.close()
        return resp

    def _generate_json(self, rid: str, req: SimRequest, em: Emission) -> bytes:
        n = em.completion_tokens
        finish = b'{"type":"length","length":%d}' % n if em.finished else b"null"
        meta = (
            b'{"id":"%s","finish_reason":%s,"prompt_tokens":%d,"weight_version":"default","num_retractions":0,'
            b'"reasoning_tokens":0,"completion_tokens":%d,"cached_tokens":0'
            % (rid.encode(), finish, req.prompt_tokens, n)
        )
        if em.finished:
            e2e = ((req.finished_at or 0.0) - req.arrival) / self.time_scale
            meta += b',"e2e_latency":' + repr(e2e).encode()
            spec = self.profile.speculative
            if spec is not None and em.verify_ct > 0:
                proposed = em.verify_ct * (spec.num_draft_tokens - 1)
                meta += (
                    b',"spec_accept_rate":%r,"spec_accept_length":%r,"spec_num_correct_drafts":%d,'
                    b'"spec_num_proposed_drafts":%d,"spec_verify_ct":%d'
                    % (em.correct_drafts / proposed, n / em.verify_ct, em.correct_drafts, proposed, em.verify_ct)
                )
        return b'{"text":' + _TAPE.text_json(n) + b',"output_ids":' + _TAPE.ids_json(n) + b',"meta_info":' + meta + b"}}"

    # --- OpenAI-compatible ---------------------------------------------------------------------------------
    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._openai(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._openai(request, chat=True)

    async def _openai(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        early, body, fault = await self._preflight(request)
        if early is not None:
            return early
        assert body is not None
        try:
            if chat:
                messages = body.get("messages")
                if not isinstance(messages, list) or not messages:
                    raise RequestError("messages must be a non-empty list")
                text = "".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
                prompt_tokens = _text_tokens(text) + 4 * len(messages)  # role/template tokens
                max_new = _int_param(body, "max_completion_tokens", None) or _int_param(body, "max_tokens", 128)
            else:
                prompt = body.get("prompt")
                if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
                    prompt_tokens = len(prompt)
                elif isinstance(prompt, str):
                    prompt_tokens = _text_tokens(prompt)
                else:
                    raise RequestError("prompt must be a string or a list of token ids")
                max_new = _int_param(body, "max_tokens", 16)
        except RequestError as exc:
            return _bad_request(str(exc))
        model = str(body.get("model") or self.served_model_name)
        stream = bool(body.get("stream", False))
        opts = body.get("stream_options") or {}
        include_usage = bool(isinstance(opts, dict) and opts.get("include_usage"))
        _TAPE.ensure(max_new)
        req = self.engine.submit(prompt_tokens, max_new)
        created = int(time.time())
        cid = uuid.uuid4().hex
        obj = "chat.completion" if chat else "text_completion"
        self._live_requests[id(request)] = request
        try:
            if not stream:
                while True:
                    em = await req.out.get()
                    if em.finished:
                        break
                text = _TAPE.text_str(em.completion_tokens)
                choice: dict[str, Any] = {"index": 0}
                if chat:
                    choice["message"] = {"role": "assistant", "content": text, "reasoning_content": None,
                                         "tool_calls": None}
                else:
                    choice["text"] = text
                choice.update({"logprobs": None, "finish_reason": "length", "matched_stop": None})
                payload = {"id": cid, "object": obj, "created": created, "model": model, "choices": [choice],
                           "usage": _usage(req.prompt_tokens, em.completion_tokens)}
                data = _dumps(payload)
                if fault in (_Fault.TRUNCATED, _Fault.MALFORMED):
                    if fault == _Fault.TRUNCATED:
                        return await self._truncated(request, data[: len(data) // 2], "application/json")
                    return web.Response(body=data[: len(data) // 2], content_type="application/json")
                if fault == _Fault.STALL:
                    await asyncio.sleep(self.profile.errors.stall_seconds)
                return web.Response(body=data, content_type="application/json")
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await resp.prepare(request)
            sent = 0
            first = True
            chunk_obj = "chat.completion.chunk" if chat else "text_completion"
            faulted = False
            while True:
                em = await req.out.get()
                if not faulted and fault != _Fault.NONE and em.completion_tokens >= max_new // 2 and not em.finished:
                    faulted = True
                    if fault == _Fault.TRUNCATED:
                        req.cancelled = True
                        if request.transport is not None:
                            request.transport.close()
                        return resp
                    if fault == _Fault.MALFORMED:
                        await resp.write(b'data: {"id": "' + cid.encode() + b'", "choices": [\n\n')
                    if fault == _Fault.STALL:
                        await asyncio.sleep(self.profile.errors.stall_seconds)
                        if request.transport is None or request.transport.is_closing():
                            req.cancelled = True
                            return resp
                delta = _TAPE.delta_text(sent, em.completion_tokens)
                sent = em.completion_tokens
                finish = "length" if em.finished else None
                if chat:
                    d: dict[str, Any] = {"content": delta, "reasoning_content": None, "tool_calls": None}
                    if first:
                        d["role"] = "assistant"
                    choice = {"index": 0, "delta": d, "logprobs": None, "finish_reason": finish,
                              "matched_stop": None}
                else:
                    choice = {"index": 0, "text": delta, "logprobs": None, "finish_reason": finish,
                              "matched_stop": None}
                first = False
                chunk = {"id": cid, "object": chunk_obj, "created": created, "model": model, "choices": [choice],
                         "usage": None}
                await resp.write(b"data: " + _dumps(chunk) + b"\n\n")
                if em.finished:
                    break
            if include_usage:
                usage_chunk = {"id": cid, "object": chunk_obj, "created": created, "model": model, "choices": [],
                               "usage": _usage(req.prompt_tokens, sent)}
                await resp.write(b"data: " + _dumps(usage_chunk) + b"\n\n")
            await resp.write(_DONE)
            await resp.write_eof()
            return resp
        except (asyncio.CancelledError, ConnectionResetError):
            req.cancelled = True
            raise
        finally:
            self._live_requests.pop(id(request), None)


def _usage(prompt: int, completion: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion,
            "prompt_tokens_details": None, "reasoning_tokens": 0}


def _text_tokens(text: str) -> int:
    return max(1, math.ceil(len(text.encode()) / 4))


def _prompt_tokens(body: dict) -> int:
    ids = body.get("input_ids")
    text = body.get("text")
    if ids is not None:
        if isinstance(ids, list) and ids and isinstance(ids[0], list):
            raise RequestError("batched input_ids are not supported by the simulator; send one prompt a request")
        if not isinstance(ids, list) or not ids or not all(isinstance(t, int) for t in ids):
            raise RequestError("input_ids must be a non-empty list of integers")
        return len(ids)
    if text is not None:
        if isinstance(text, list):
            raise RequestError("batched text is not supported by the simulator; send one prompt a request")
        if not isinstance(text, str):
            raise RequestError("text must be a string")
        return _text_tokens(text)
    raise RequestError("Either text, input_ids or input_embeds should be provided.")


def _int_param(params: dict, key: str, default: int | None) -> int | None:
    value = params.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise RequestError(f"{key} must be a non-negative integer, got {value!r}")
    return value


class SimulatorServer:
    """Run a simulator on this event loop: ``async with SimulatorServer(profile, port=0) as url: ...``.

    ``port=0`` binds a free port; the URL (``http://host:port``) is returned by ``__aenter__`` and kept in
    :attr:`url`. ``stop()`` (or leaving the block) closes every connection.
    """

    def __init__(
        self,
        profile: Profile,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        time_scale: float = 1.0,
        seed: int | None = None,
        load_seconds: float | None = None,
        on_death: Callable[[], None] | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.sim = Simulator(profile, time_scale=time_scale, seed=seed, load_seconds=load_seconds,
                             on_death=on_death, port=port, host=host)
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> str:
        self._runner = web.AppRunner(self.sim.app, access_log=None, handle_signals=False, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await site.start()
        sockets = site._server.sockets if site._server else []  # type: ignore[attr-defined]
        self.port = sockets[0].getsockname()[1] if sockets else self.port
        self.sim.port = self.port
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.url = f"http://{host}:{self.port}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            for live in list(self.sim._live_requests.values()):
                if live.transport is not None:
                    live.transport.abort()
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> str:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def exit_process_on_death() -> None:
    """For the subprocess simulator: a server that dies exits, as a crashed SGLang would."""
    loop = asyncio.get_running_loop()
    loop.call_later(0.05, os._exit, 1)
