"""An HTTP server that speaks SGLang 0.5.23's API over the performance model in :mod:`.model`.

This module routes; the parts live beside it: inputs.py parses the generation requests, generation.py answers them
(formats.py renders the bodies, tokens.py holds the generated tokens), faults.py draws and applies the profile's
faults, info.py and metrics.py answer what the server says about itself.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, TypeVar

from aiohttp import web
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import CollectorRegistry

from . import info
from .faults import Fault, FaultInjector
from .formats import GenerateFormat, OpenAIFormat, dumps, error_response
from .generation import Generation, LiveRequests, respond_generate, respond_openai
from .inputs import (
    GenerateInput,
    GenerationInput,
    OpenAIInput,
    RequestError,
    parse_chat_completions,
    parse_completions,
    parse_generate,
)
from .metrics import SGLangMetrics
from .model import Engine, Profile
from .tokens import CorruptedTokens, OutputTape

Input = TypeVar("Input", bound=GenerationInput)


class Simulator:
    """The aiohttp application of one simulated SGLang server: its engine, its faults, its routes."""

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
        # What /generate's meta_info divides proposed drafts by: SGLang's resolved speculative_num_draft_tokens.
        self.reported_speculative = profile.speculative
        if profile.speculative is not None and profile.adaptive_active:
            self.reported_speculative = dataclasses.replace(profile.speculative, num_draft_tokens=profile.speculative.num_steps + 1)
        self.faults = FaultInjector(profile.errors, seed)
        self.tape = OutputTape()
        self.engine: Engine  # created in on_startup, on the serving event loop
        self.started_wall = 0.0
        self.startup_time = time.time()
        self.generate_count = 0  # generation requests received, answered or not
        self.dead = False
        self.live = LiveRequests()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(SGLangMetrics(self))
        self.app = self._build_app()

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
            except TimeoutError:
                req.cancelled = True
                return web.Response(status=503)
        return web.Response(status=200)

    # --- what the server says about itself ---------------------------------------------------------
    async def server_info(self, request: web.Request) -> web.Response:
        if self.loading:
            return web.Response(status=503)
        return web.Response(body=dumps(info.server_info(self)), content_type="application/json")

    async def model_info(self, request: web.Request) -> web.Response:
        return web.json_response(info.model_info(self))

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response(info.models(self))

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry), headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def flush_cache(self, request: web.Request) -> web.Response:
        self.engine.lifetime_tokens = self.engine.lifetime_verify = 0
        return web.Response(
            text="Cache flushed.\nPlease check backend logs for more details. (When there are "
            "running or waiting requests, the operation will not be performed.)\n"
        )

    # --- generation ----------------------------------------------------------------------------------
    async def generate(self, request: web.Request) -> web.StreamResponse:
        return await self._serve_generation(request, parse_generate, self._respond_generate)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        parse = partial(parse_completions, served_model_name=self.served_model_name)
        return await self._serve_generation(request, parse, self._respond_openai)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        parse = partial(parse_chat_completions, served_model_name=self.served_model_name)
        return await self._serve_generation(request, parse, self._respond_openai)

    async def _respond_generate(self, request: web.Request, ask: GenerateInput, generation: Generation, fault: Fault) -> web.StreamResponse:
        fmt = GenerateFormat(self._tokens(ask), ask.rid, generation.req, time_scale=self.time_scale, speculative=self.reported_speculative)
        return await respond_generate(request, generation, fmt, fault, self.profile.errors.stall_seconds)

    async def _respond_openai(self, request: web.Request, ask: OpenAIInput, generation: Generation, fault: Fault) -> web.StreamResponse:
        fmt = OpenAIFormat(self._tokens(ask), ask)
        return await respond_openai(request, generation, fmt, fault, self.profile.errors.stall_seconds)

    def _tokens(self, ask: GenerationInput) -> OutputTape | CorruptedTokens:
        """The request's output tokens: the shared tape, or its corrupted copy under errors.corrupt_token_share."""
        share = self.profile.errors.corrupt_token_share
        if share <= 0:
            return self.tape
        return CorruptedTokens(self.tape, ask.prompt_key, share, max(1, ask.max_new_tokens))

    async def _serve_generation(
        self,
        request: web.Request,
        parse: Callable[[dict[str, Any]], Input],
        respond: Callable[[web.Request, Input, Generation, Fault], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        """What every generation endpoint does: the server's death and loading, the body, the fault, the engine."""
        if self._count_generation_request(request):
            return web.Response(status=503)
        if self.loading:
            return error_response("The server is starting (loading the model).", 503)
        try:
            body = await request.json(loads=json.loads)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return error_response("Request body is not valid JSON.")
        if not isinstance(body, dict):
            return error_response("Request body must be a JSON object.")
        fault = self.faults.draw()
        if fault is Fault.HTTP_500:
            return error_response("Internal server error (injected by the simulator).", 500)
        if fault is Fault.TIMEOUT:
            with self.live.track(request):  # accepted, never answered (until the client or the server stops)
                await asyncio.sleep(3600)
            return web.Response(status=504)
        try:
            ask = parse(body)
        except RequestError as exc:
            return error_response(str(exc))
        generation = Generation(self.engine, self.tape, ask)
        with self.live.track(request):
            try:
                return await respond(request, ask, generation, fault)
            except (asyncio.CancelledError, ConnectionResetError):
                generation.cancel()
                raise

    def _count_generation_request(self, request: web.Request) -> bool:
        """Count a generation request; True when the server is (now) dead and the request was dropped."""
        self.generate_count += 1
        if not self.dead and self.faults.kills_at(self.generate_count):
            self.dead = True
            self.live.abort_all()
            if self.on_death is not None:
                self.on_death()
        if self.dead:
            if request.transport is not None:
                request.transport.abort()
            return True
        return False


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
        self.sim = Simulator(profile, time_scale=time_scale, seed=seed, load_seconds=load_seconds, on_death=on_death, port=port, host=host)
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
            self.sim.live.abort_all()
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
