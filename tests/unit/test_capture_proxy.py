"""The capture proxy (spec.retraining.capture, docs/capture.md) against a real HTTP upstream: a small aiohttp server
that records what reaches it and answers JSON or server-sent events, and the SGLang simulator.

Forwarding is byte for byte (requests and answers, streamed answers chunk by chunk as they come), the sampling share,
the per-request opt-out, the redaction (patterns and a redaction service), the size cap and the retention; and no
word of a prompt reaches the log or the metrics."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import traceback
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from specdec_operator.capture.proxy import CaptureConfig, CaptureProxy, running
from specdec_operator.capture.store import CaptureStore

SECRET = "zebra-quartz-4417"  # a word that must never reach a log line or a metric


class Upstream:
    """A real HTTP server standing in for the model servers: it records every request and answers chat/completions
    as JSON, or as server-sent events sent one by one with a pause between them (stream: true)."""

    def __init__(self, chunk_pause: float = 0.05) -> None:
        self.seen: list[dict[str, Any]] = []
        self.chunk_pause = chunk_pause
        self.app = web.Application()
        self.app.router.add_route("*", "/{tail:.*}", self.handle)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.seen.append({"method": request.method, "path_qs": request.path_qs, "headers": dict(request.headers), "body": body})
        if request.path == "/health":
            return web.Response(text="fine", headers={"X-Upstream": "1"})
        if request.path == "/fail":
            return web.json_response({"error": "nope"}, status=400)
        document = json.loads(body) if body else {}
        if document.get("stream"):
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "X-Upstream": "1"})
            await response.prepare(request)
            for word in ("Hello", " there", ", friend"):
                chunk = {"choices": [{"index": 0, "delta": {"content": word}}]}
                await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
                await asyncio.sleep(self.chunk_pause)
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            return response
        if request.path == "/v1/completions":
            return web.json_response({"choices": [{"index": 0, "text": "a completion"}]}, headers={"X-Upstream": "1"})
        return web.json_response(
            {"choices": [{"index": 0, "message": {"role": "assistant", "content": f"echo {SECRET}"}}]}, headers={"X-Upstream": "1"}
        )


@asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def make_proxy(upstream: str, directory: Path, **config: Any) -> CaptureProxy:
    store_args = {k: config.pop(k) for k in ("max_bytes", "retention_seconds", "segment_bytes", "clock") if k in config}
    store = CaptureStore(
        directory, "pod-a", store_args.get("max_bytes", 1 << 20), store_args.get("retention_seconds", 3600.0), store_args.get("segment_bytes", 0)
    )
    if "clock" in store_args:
        store.clock = store_args["clock"]
    return CaptureProxy(CaptureConfig(upstream=upstream, **{"sample_share": 1.0, "seed": 7, **config}), store)


def records(directory: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for path in sorted(directory.glob("capture-*.jsonl")) for line in path.read_text().splitlines()]


def chat(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": 8, "temperature": 0.0, "user": "u-1", **extra}


def test_forwards_requests_and_answers_unchanged_and_streams_chunk_by_chunk(tmp_path: Path) -> None:
    upstream = Upstream(chunk_pause=0.3)

    async def scenario() -> dict[str, Any]:
        async with serving(upstream.app) as up_url:
            proxy = make_proxy(up_url, tmp_path, include_responses=True)
            async with running(proxy) as url, aiohttp.ClientSession() as s:
                body = json.dumps(chat("hi")).encode()
                headers = {"Content-Type": "application/json", "Authorization": "Bearer t", "X-Team": "a"}
                async with s.post(f"{url}/v1/chat/completions?x=1&y=%20", data=body, headers=headers) as r:
                    plain = (r.status, await r.read(), r.headers.get("X-Upstream"))
                async with s.get(f"{url}/health") as r:
                    health = (r.status, await r.text())
                async with s.post(f"{url}/fail", data=b"{}") as r:
                    failed = r.status
                # Streaming: each event arrives while the upstream is still producing the next one.
                arrivals = []
                started = time.monotonic()
                async with s.post(f"{url}/v1/chat/completions", json=chat("stream me", stream=True)) as r:
                    streamed_type = r.headers.get("Content-Type")
                    streamed = b""
                    async for chunk in r.content.iter_any():
                        arrivals.append(time.monotonic() - started)
                        streamed += chunk
            return {
                "plain": plain,
                "body": body,
                "health": health,
                "failed": failed,
                "arrivals": arrivals,
                "streamed": streamed,
                "type": streamed_type,
            }

    out = asyncio.run(scenario())
    status, answer, marker = out["plain"]
    assert status == 200 and marker == "1" and json.loads(answer)["choices"][0]["message"]["content"] == f"echo {SECRET}"
    first = upstream.seen[0]
    assert first["method"] == "POST" and first["path_qs"] == "/v1/chat/completions?x=1&y=%20"
    assert first["body"] == out["body"]  # the same bytes
    assert first["headers"]["Authorization"] == "Bearer t" and first["headers"]["X-Team"] == "a"
    assert out["health"] == (200, "fine") and out["failed"] == 400
    assert out["type"] == "text/event-stream"
    assert out["streamed"].count(b"data: ") == 4 and out["streamed"].endswith(b"data: [DONE]\n\n")
    # The first event came before the upstream had sent the last (3 pauses of 0.3 s): nothing was buffered.
    assert out["arrivals"][0] < 0.6 and out["arrivals"][-1] > 0.8
    kept = records(tmp_path)
    assert [r["endpoint"] for r in kept] == ["chat", "chat"]
    assert kept[0]["messages"] == [{"role": "user", "content": "hi"}] and kept[0]["parameters"] == {"max_tokens": 8, "temperature": 0.0}
    assert "user" not in kept[0]  # only the kept parameters
    assert kept[0]["response"] == [f"echo {SECRET}"] and kept[1]["response"] == ["Hello there, friend"]


def test_samples_the_share_and_honours_the_opt_out(tmp_path: Path) -> None:
    upstream = Upstream()

    async def scenario() -> tuple[int, int]:
        async with serving(upstream.app) as up_url:
            proxy = make_proxy(up_url, tmp_path, sample_share=0.25, seed=11)
            async with running(proxy) as url, aiohttp.ClientSession() as s:
                for i in range(400):
                    async with s.post(f"{url}/v1/completions", json={"model": "m", "prompt": f"p{i}"}) as r:
                        await r.read()
                for value in ("off", "No", "false", "0"):
                    for _ in range(25):
                        async with s.post(f"{url}/v1/chat/completions", json=chat("private"), headers={"X-Specdec-Capture": value}) as r:
                            assert r.status == 200
            opted = int(proxy.metrics.opted_out._value.get())
            return len(records(tmp_path)), opted

    kept, opted = asyncio.run(scenario())
    # 400 draws at 0.25: 100 expected, sd 8.7; the seed fixes the draws, the bound is what any seed would meet.
    assert 60 <= kept <= 140
    assert opted == 100
    assert len(upstream.seen) == 500  # every request forwarded, the opted-out ones too
    assert all(r["endpoint"] == "completions" for r in records(tmp_path))
    assert all(s["headers"].get("X-Specdec-Capture") for s in upstream.seen[400:])  # forwarded with the header


def test_redaction_patterns_and_service_before_writing(tmp_path: Path) -> None:
    upstream = Upstream()
    redactor_seen: list[dict[str, Any]] = []

    async def redact(request: web.Request) -> web.Response:
        record = await request.json()
        redactor_seen.append(record)
        if "drop me" in json.dumps(record):
            return web.Response(status=500)
        record["redacted_by"] = "team"
        return web.json_response(record)

    redactor = web.Application()
    redactor.router.add_post("/redact", redact)

    async def scenario() -> None:
        async with serving(upstream.app) as up_url, serving(redactor) as red_url:
            proxy = make_proxy(
                up_url,
                tmp_path,
                include_responses=True,
                redaction_patterns=(r"[0-9]{3}-[0-9]{2}-[0-9]{4}", r"zebra-[\w-]+"),
                redaction_url=f"{red_url}/redact",
            )
            async with running(proxy) as url, aiohttp.ClientSession() as s:
                async with s.post(f"{url}/v1/chat/completions", json=chat("my ssn is 123-45-6789")) as r:
                    assert r.status == 200
                async with s.post(f"{url}/v1/chat/completions", json=chat("drop me please")) as r:
                    assert r.status == 200

    asyncio.run(scenario())
    kept = records(tmp_path)
    assert len(kept) == 1 and kept[0]["redacted_by"] == "team"
    assert kept[0]["messages"][0]["content"] == "my ssn is [REDACTED]"
    assert kept[0]["response"] == ["echo [REDACTED]"]  # the answer too
    assert "123-45-6789" not in json.dumps(redactor_seen)  # the patterns run before the service sees the record
    assert all(SECRET not in p.read_text() for p in tmp_path.glob("*.jsonl"))


def test_size_cap_drops_the_oldest_files_and_retention_deletes_old_ones(tmp_path: Path) -> None:
    upstream = Upstream()
    now = [1_000_000.0]

    async def scenario() -> CaptureProxy:
        async with serving(upstream.app) as up_url:
            proxy = make_proxy(up_url, tmp_path, max_bytes=4096, segment_bytes=1024, retention_seconds=3600.0, clock=lambda: now[0])
            async with running(proxy) as url, aiohttp.ClientSession() as s:
                for i in range(60):
                    now[0] += 1
                    async with s.post(f"{url}/v1/completions", json={"model": "m", "prompt": f"prompt number {i:03d} " + "x" * 80}) as r:
                        await r.read()
                    await proxy.queue.join()
                await proxy.enforce()
            return proxy

    proxy = asyncio.run(scenario())
    files = sorted(tmp_path.glob("capture-*.jsonl"))
    assert sum(p.stat().st_size for p in files) <= 4096
    kept = records(tmp_path)
    numbers = [int(r["prompt"].split()[2]) for r in kept]
    assert numbers == sorted(numbers) and numbers[-1] == 59 and numbers[0] > 0  # the newest kept, the oldest dropped
    assert proxy.metrics.bytes_deleted.labels("cap")._value.get() > 0
    # Retention: files whose last write is older than an hour go, newer ones stay.
    old, new = files[0], files[-1]
    os.utime(old, (now[0] - 7200, now[0] - 7200))
    store = proxy.store
    deleted = store.enforce()
    assert not old.exists() and new.exists() and deleted.retention_bytes > 0


def test_no_prompt_text_in_logs_or_metrics(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    upstream = Upstream()

    async def redact_fails(request: web.Request) -> web.Response:
        return web.Response(status=503, text=await request.text())

    redactor = web.Application()
    redactor.router.add_post("/redact", redact_fails)

    async def scenario() -> tuple[str, str]:
        async with serving(upstream.app) as up_url, serving(redactor) as red_url:
            proxy = make_proxy(up_url, tmp_path, include_responses=True)
            failing = make_proxy(up_url, tmp_path / "b", redaction_url=f"{red_url}/redact")
            dead = make_proxy("http://127.0.0.1:9", tmp_path / "c")
            async with running(proxy) as url, running(failing) as url_b, running(dead) as url_c, aiohttp.ClientSession() as s:
                for target in (url, url_b, url_c):
                    for stream in (False, True):
                        async with s.post(f"{target}/v1/chat/completions?q={SECRET}", json=chat(f"tell me {SECRET}", stream=stream)) as r:
                            await r.read()
                    async with s.post(f"{target}/v1/chat/completions", data=f"not json {SECRET}") as r:
                        await r.read()
                await proxy.enforce()
            from prometheus_client import generate_latest

            return b"".join(generate_latest(p.metrics.registry) for p in (proxy, failing, dead)).decode(), str(len(records(tmp_path)))

    with caplog.at_level(logging.DEBUG):
        metrics_text, kept = asyncio.run(scenario())
    assert int(kept) == 2  # it did capture (the prompt is on disk, only there)
    assert caplog.records, "the proxy logged nothing: the assertion below would be empty"
    assert any("redaction service" in r.getMessage() for r in caplog.records) and any("upstream" in r.getMessage() for r in caplog.records)
    logged = "\n".join(r.getMessage() + repr(r.args) + (r.exc_text or "") for r in caplog.records)
    assert SECRET not in logged and "tell me" not in logged
    assert SECRET not in metrics_text and "specdec_capture_records_written_total 2.0" in metrics_text


def test_capture_command_line_refuses_bad_input(tmp_path: Path) -> None:
    from specdec_operator.capture.cli import parse
    from specdec_operator.errors import InputError

    base = ["--upstream", "http://x:1", "--dir", str(tmp_path), "--max-bytes", "100", "--retention-hours", "1"]
    config, store, _ = parse([*base, "--sample-share", "0.5", "--redact", "a+", "--writer", "pod/1"])
    assert config.sample_share == 0.5 and config.redaction_patterns == ("a+",) and store.writer == "pod-1"
    with pytest.raises(InputError, match="--sample-share"):
        parse([*base, "--sample-share", "1.5"])
    with pytest.raises(InputError, match="--redact"):
        parse([*base, "--sample-share", "0.5", "--redact", "("])


def test_streams_the_sglang_simulators_answers_and_keeps_what_the_client_read(tmp_path: Path) -> None:
    """The SGLang simulator as the upstream: a streamed chat answer reaches the client as the server's events, and the
    record keeps exactly the text the client assembled from them."""
    from specdec_operator.simulator import SimulatorServer
    from specdec_operator.simulator.model import load_profile, shipped_profiles

    profile = load_profile(shipped_profiles()[0])

    async def scenario() -> tuple[str, str, int]:
        async with SimulatorServer(profile, time_scale=50, seed=3, load_seconds=0) as up_url:
            proxy = make_proxy(up_url, tmp_path, include_responses=True)
            async with running(proxy) as url, aiohttp.ClientSession() as s:
                ask = {"model": "m", "messages": [{"role": "user", "content": "count to ten"}], "max_tokens": 24, "stream": True}
                async with s.post(f"{url}/v1/chat/completions", json=ask) as r:
                    assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
                    raw = await r.read()
        text = ""
        for line in raw.decode().splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for choice in json.loads(line[6:]).get("choices") or []:
                    text += (choice.get("delta") or {}).get("content") or ""
        return text, records(tmp_path)[0]["response"][0], raw.count(b"data: ")

    assembled, kept, events = asyncio.run(scenario())
    assert assembled and kept == assembled
    assert events > 2  # the answer came as events, not one document


def test_a_volume_short_of_space_drops_the_oldest_files_within_the_cap(tmp_path: Path) -> None:
    free = [1 << 30]
    store = CaptureStore(tmp_path, "pod-a", 1 << 20, 3600.0, segment_bytes=1024, disk_free=lambda _: free[0])
    for i in range(40):
        store.write({"prompt": f"{i:03d} " + "y" * 100})
    assert store.stored_bytes() > 4000 and store.enforce().cap_bytes == 0  # far within the cap, space to spare
    before = len(store.files())
    free[0] = 1500  # the volume (smaller than the cap) is nearly full: 2 files' worth (2,048 bytes) must stay free
    deleted = store.enforce()
    assert deleted.cap_bytes > 0 and len(store.files()) < before
    names = [p.name for p, _, _ in store.files()]
    assert names == sorted(names) and store.files()[-1][0].read_text().count("039 ") == 1  # the newest records stay


def test_headers_stay_as_sent_and_a_client_that_leaves_mid_stream_costs_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    upstream = Upstream(chunk_pause=0.2)

    async def scenario() -> tuple[int, int]:
        async with serving(upstream.app) as up_url:
            proxy = make_proxy(up_url, tmp_path, include_responses=True)
            async with running(proxy) as url, aiohttp.ClientSession() as s:
                # A body without a Content-Type reaches the server without one.
                async with s.post(f"{url}/health", data=b"raw", skip_auto_headers=["Content-Type"]) as r:
                    await r.read()
                # A client that reads the first event and leaves.
                r = await s.post(f"{url}/v1/chat/completions", json=chat("leaving early", stream=True))
                await r.content.readany()
                r.close()
                await asyncio.sleep(0.5)
                async with s.post(f"{url}/v1/chat/completions", json=chat("still served")) as r:
                    after = r.status
            return after, len(records(tmp_path))

    with caplog.at_level(logging.INFO):
        after, kept = asyncio.run(scenario())
    assert "Content-Type" not in upstream.seen[0]["headers"] and upstream.seen[0]["body"] == b"raw"
    assert after == 200
    assert kept == 1  # the answer the client left is not kept (it never completed); the next one is
    # The proxy logged no error (the test's upstream does: the proxy closed its connection when the client left,
    # which is what stops a real server generating for nobody).
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    tracebacks = ["".join(traceback.format_exception(*r.exc_info)) if r.exc_info else r.getMessage() for r in errors]
    assert tracebacks and all("test_capture_proxy.py" in t and "capture/proxy.py" not in t for t in tracebacks), tracebacks
