"""`specdec-train regenerate` never logs the traffic (issue 36, item 1's rule): a server's error answer that quotes the
prompt reaches the logs and the stage's one-line error as its status and length only."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import pytest
from aiohttp import web

from drafter_training.regenerate import EndpointError, _post, complete_turn

SECRET = "my card number is 4111 1111 1111 1111"


async def _serve(handler) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


async def _echoing(request: web.Request) -> web.Response:
    body = await request.json()
    return web.json_response({"error": f"bad request: {body['messages'][0]['content']}"}, status=400)


async def _shapeless(request: web.Request) -> web.Response:
    return web.json_response({"choices": f"not a list but {SECRET}"})


def _ask(handler, messages: list[dict[str, str]]) -> str:
    async def go() -> str:
        runner, url = await _serve(handler)
        try:
            async with aiohttp.ClientSession() as session:
                try:
                    await complete_turn(session, url, "chat", "m", None, messages, 8, 0.0, 0, 0.01)
                except EndpointError as exc:
                    return str(exc)
                raise AssertionError("no EndpointError")
        finally:
            await runner.cleanup()

    return asyncio.run(go())


def test_an_error_answer_quoting_the_prompt_is_logged_as_status_and_length(caplog):
    caplog.set_level(logging.DEBUG)
    message = _ask(_echoing, [{"role": "user", "content": SECRET}])
    assert "HTTP 400 (" in message and "bytes)" in message
    assert "4111" not in message and "4111" not in caplog.text


def test_an_answer_of_another_shape_is_named_by_its_error_type_only():
    message = _ask(_shapeless, [{"role": "user", "content": "hello"}])
    assert "unexpected response shape (TypeError)" in message and "4111" not in message


def test_a_server_error_is_retried_and_still_says_no_text():
    async def failing(request: web.Request) -> web.Response:
        return web.Response(text=f"overloaded while answering {SECRET}", status=503)

    async def go() -> str:
        runner, url = await _serve(failing)
        try:
            async with aiohttp.ClientSession() as session:
                with pytest.raises(EndpointError) as caught:
                    await _post(session, f"{url}/v1/chat/completions", {"messages": []}, 1, 0.01)
                return str(caught.value)
        finally:
            await runner.cleanup()

    message = asyncio.run(go())
    assert "gave up after 2 attempts (HTTP 503 (" in message and "4111" not in message
