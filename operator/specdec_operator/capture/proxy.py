"""The capture proxy (`specdec capture`): forwards every request to the servers unchanged and keeps a sampled share
of the chat/completions requests as JSON lines (docs/capture.md).

The forwarding path does only what it must: read the request's body (it is forwarded as it came), draw the sample,
stream the answer back chunk by chunk as it arrives (kept aside only for a sampled request whose answer is wanted).
Everything else happens after the answer has gone: a sampled record is queued (a full queue drops it, counted) and
one writer task redacts it (the patterns, then the team's redaction service when one is named) and writes it in a
thread. The text of a request or an answer never reaches a log line or a metric: they carry counts and bytes only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ..textutil import parse_time
from .count import ClaimCount, RecordCounter
from .record import CAPTURED_PATHS, Redactor, Sampler, answer_text, opted_out, request_fields
from .store import CaptureStore, Deleted

log = logging.getLogger("specdec.capture")

# Headers of one connection, not of the request (RFC 9110 7.6.1); Host is the proxy's own.
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "transfer-encoding", "upgrade", "host"}
)
QUEUE_LIMIT = 1000
MAX_KEPT_ANSWER = 4 << 20  # an answer kept for a record beyond this is not kept (the record goes without it)
REDACTION_TIMEOUT_S = 5.0
ENFORCE_EVERY_S = 60.0
COUNT_EVERY_S = 10.0  # the claim's count is at most this old (the operator reads it at most once a minute)
STORED_RECORDS = "specdec_capture_stored_records"
STORED_CONVERSATIONS = "specdec_capture_stored_conversations"
COUNT_PATH = "/count"  # on the admin port, beside /metrics: ?since=RFC3339 (the operator's controller/capturecount.py)


def forwardable(headers: CIMultiDictProxy[str] | CIMultiDict[str]) -> CIMultiDict[str]:
    """The headers as they came, less the hop-by-hop ones (repeated headers kept, in order)."""
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in HOP_BY_HOP)


class CaptureMetrics:
    """Counts and bytes only (no label ever carries a request's content)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("specdec_capture_requests", "Requests forwarded", registry=r)
        self.sampled = Counter("specdec_capture_sampled", "Chat/completions requests drawn for capture", registry=r)
        self.opted_out = Counter("specdec_capture_opted_out", "Chat/completions requests the client kept out (X-Specdec-Capture: off)", registry=r)
        self.skipped = Counter("specdec_capture_skipped", "Sampled requests not written, by cause", ["cause"], registry=r)
        self.upstream_errors = Counter("specdec_capture_upstream_errors", "Requests the servers could not be reached for (answered 502)", registry=r)
        self.records = Counter("specdec_capture_records_written", "Records written", registry=r)
        self.bytes_written = Counter("specdec_capture_written_bytes", "Bytes of records written", registry=r)
        self.bytes_deleted = Counter("specdec_capture_deleted_bytes", "Bytes of records deleted, by cause (cap, retention)", ["cause"], registry=r)
        self.stored = Gauge("specdec_capture_stored_bytes", "Bytes of records stored now (every writer's files)", registry=r)

        self.claim = ClaimCountCollector()
        r.register(self.claim)

    def deleted(self, deleted: Deleted) -> None:
        if deleted.cap_bytes:
            self.bytes_deleted.labels("cap").inc(deleted.cap_bytes)
        if deleted.retention_bytes:
            self.bytes_deleted.labels("retention").inc(deleted.retention_bytes)


class ClaimCountCollector(Collector):
    """The claim's records and usable conversations now (count.py), as gauges: absent until this proxy has counted
    the claim once (a proxy that just started has not read it yet; a 0 would say the claim is empty)."""

    def __init__(self) -> None:
        self.count: ClaimCount | None = None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        count = self.count
        if count is None:
            return
        yield GaugeMetricFamily(STORED_RECORDS, "Records on the claim now (every writer's files)", value=count.records)
        yield GaugeMetricFamily(
            STORED_CONVERSATIONS, "Chat conversations on the claim now that a training Job can use (repeats included)", value=count.conversations
        )


@dataclass(frozen=True)
class CaptureConfig:
    upstream: str  # http://<name>-serving.<namespace>.svc:30000
    sample_share: float
    include_responses: bool = False
    redaction_patterns: tuple[str, ...] = ()
    redaction_replacement: str = "[REDACTED]"
    redaction_url: str | None = None
    seed: int | None = None


class CaptureProxy:
    def __init__(self, config: CaptureConfig, store: CaptureStore) -> None:
        self.config = config
        self.store = store
        self.upstream = config.upstream.rstrip("/")
        self.sampler = Sampler(config.sample_share, config.seed)
        self.redactor = Redactor.of(config.redaction_patterns, config.redaction_replacement)
        self.metrics = CaptureMetrics()
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(QUEUE_LIMIT)
        self.session: aiohttp.ClientSession | None = None
        self.counter = RecordCounter(store.directory)
        self._counting = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []

    # -- the apps: traffic on one port, /metrics and /healthz on another

    def traffic_app(self) -> web.Application:
        app = web.Application(client_max_size=64 << 20)
        app.router.add_route("*", "/{tail:.*}", self.forward)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    def admin_app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get(COUNT_PATH, self._count_since)
        return app

    async def _count_since(self, request: web.Request) -> web.Response:
        """GET /count?since=RFC3339: the usable conversations on the claim captured at or after that time, as of the
        last count (JSON). The training rule's "new since the last Job started" (reconcile/retrain.py): the claim's
        whole count can fall while new conversations arrive, when retention or the cap deletes old files."""
        since = parse_time(request.query.get("since"))
        if since is None:
            return web.json_response({"error": "query parameter since must be an RFC 3339 time, e.g. ?since=2026-12-07T06:00:00Z"}, status=400)
        if self.metrics.claim.count is None:  # not counted yet: a 0 would say none were captured
            return web.json_response({"error": "the claim has not been counted yet; ask again in a few seconds"}, status=503)
        async with self._counting:
            conversations = self.counter.conversations_since(since.timestamp())
        return web.json_response({"since": request.query["since"], "conversations": conversations})

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.metrics.registry), headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _start(self, app: web.Application) -> None:
        # No decompression: the answer's bytes go back exactly as the server sent them. No total timeout: a long
        # generation is not an error; a server that does not accept the connection is (10 s).
        timeout = aiohttp.ClientTimeout(total=None, connect=10)
        self.session = aiohttp.ClientSession(timeout=timeout, auto_decompress=False, connector=aiohttp.TCPConnector(limit=0))
        self._tasks = [
            asyncio.create_task(self._write_records()),
            asyncio.create_task(self._enforce_periodically()),
            asyncio.create_task(self._count_periodically()),
        ]
        log.info(
            "capture proxy forwarding to %s, sample share %s, responses %s", self.upstream, self.config.sample_share, self.config.include_responses
        )

    async def _stop(self, app: web.Application) -> None:
        await self.queue.join()  # the records of answered requests are written before the pod goes
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.session is not None:
            await self.session.close()
        await asyncio.to_thread(self.store.close)

    # -- forwarding

    async def forward(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.metrics.requests.inc()
        endpoint = CAPTURED_PATHS.get(request.path) if request.method == "POST" else None
        capture = False
        if endpoint is not None:
            if opted_out(request.headers):
                self.metrics.opted_out.inc()
            elif self.sampler.draw():
                self.metrics.sampled.inc()
                capture = True
        assert self.session is not None
        kept: bytearray | None = bytearray() if capture and self.config.include_responses else None
        headers = forwardable(request.headers)
        response: web.StreamResponse | None = None
        try:
            async with self.session.request(
                request.method,
                self.upstream + request.rel_url.raw_path_qs,
                headers=headers,
                data=body or None,
                allow_redirects=False,
                # Unchanged: no Content-Type where the client sent none (aiohttp would add application/octet-stream).
                skip_auto_headers=() if "Content-Type" in headers else ("Content-Type",),
            ) as upstream:
                response = web.StreamResponse(status=upstream.status, reason=upstream.reason, headers=forwardable(upstream.headers))
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                    if kept is not None:
                        kept += chunk
                        if len(kept) > MAX_KEPT_ANSWER:
                            kept = None
                await response.write_eof()
                status, streamed = upstream.status, upstream.headers.get("Content-Type", "").startswith("text/event-stream")
        except (TimeoutError, aiohttp.ClientError, ConnectionResetError) as exc:
            # Nothing of the request is logged: the error's class only. Before the answer started the client gets a 502;
            # after it, the answer ends where it broke (the server or the client went away). Neither is captured.
            if capture:
                self.metrics.skipped.labels("upstream_error").inc()
            if response is not None:
                log.info("answer cut short: %s", type(exc).__name__)
                return response
            self.metrics.upstream_errors.inc()
            log.warning("upstream unreachable: %s", type(exc).__name__)
            return web.json_response({"error": {"message": "the capture proxy could not reach the servers", "type": "bad_gateway"}}, status=502)
        if capture and endpoint is not None:
            self._enqueue(endpoint, body, status, bytes(kept) if kept is not None else None, streamed)
        return response

    def _enqueue(self, endpoint: str, body: bytes, status: int, answer: bytes | None, streamed: bool) -> None:
        if status >= 400:
            self.metrics.skipped.labels("answer_status").inc()
            return
        fields = request_fields(endpoint, body)
        if fields is None:
            self.metrics.skipped.labels("not_json").inc()
            return
        record = {"time": datetime.now(UTC).isoformat(timespec="milliseconds"), **fields}
        if self.config.include_responses and answer is not None:
            texts = answer_text(endpoint, answer, streamed)
            if texts is not None:
                record["response"] = texts
        try:
            self.queue.put_nowait(record)
        except asyncio.QueueFull:
            self.metrics.skipped.labels("queue_full").inc()

    # -- writing, off the request path

    async def _write_records(self) -> None:
        while True:
            record = await self.queue.get()
            try:
                redacted = await self._redact(record)
                if redacted is None:
                    self.metrics.skipped.labels("redaction_failed").inc()
                    continue
                written, deleted = await asyncio.to_thread(self.store.write, redacted)
                self.metrics.records.inc()
                self.metrics.bytes_written.inc(written)
                self.metrics.deleted(deleted)
            except OSError as exc:  # a full or read-only volume: the record is lost, serving is not touched
                self.metrics.skipped.labels("write_failed").inc()
                log.warning("record not written: %s", type(exc).__name__)
            finally:
                self.queue.task_done()

    async def _redact(self, record: dict[str, Any]) -> dict[str, Any] | None:
        record = self.redactor.apply(record)
        if not self.config.redaction_url:
            return record
        assert self.session is not None
        try:
            timeout = aiohttp.ClientTimeout(total=REDACTION_TIMEOUT_S)
            async with self.session.post(self.config.redaction_url, json=record, timeout=timeout) as answer:
                if answer.status != 200:
                    log.warning("redaction service answered %d: record dropped", answer.status)
                    return None
                redacted = await answer.json(content_type=None)
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            log.warning("redaction service failed (%s): record dropped", type(exc).__name__)
            return None
        return redacted if isinstance(redacted, dict) else None

    async def _enforce_periodically(self) -> None:
        while True:
            await self.enforce()
            await asyncio.sleep(ENFORCE_EVERY_S)

    async def enforce(self) -> None:
        """The cap and the retention over every writer's files; the stored total for the gauge."""
        started = time.monotonic()
        deleted = await asyncio.to_thread(self.store.enforce)
        self.metrics.deleted(deleted)
        self.metrics.stored.set(await asyncio.to_thread(self.store.stored_bytes))
        if deleted.cap_bytes or deleted.retention_bytes:
            log.info(
                "deleted %d bytes over the cap and %d past retention (%.3f s)", deleted.cap_bytes, deleted.retention_bytes, time.monotonic() - started
            )

    async def _count_periodically(self) -> None:
        while True:
            try:
                await self.count()
            except OSError as exc:  # an unreadable volume: the last count stays (the operator shows its age by the scrape)
                log.warning("records not counted: %s", type(exc).__name__)
            await asyncio.sleep(COUNT_EVERY_S)

    async def count(self) -> ClaimCount:
        """Count the claim (what was appended since the last count, every writer's; files deleted by any replica
        leave it) and publish it on /metrics."""
        async with self._counting:
            counted = await asyncio.to_thread(self.counter.count)
        self.metrics.claim.count = counted
        return counted


@contextlib.asynccontextmanager
async def running(proxy: CaptureProxy, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[str]:
    """The proxy's traffic app on this event loop (tests, the benchmark): yields its URL; leaving the block stops it
    as a pod stops (in-flight requests finish, queued records are written)."""
    runner = web.AppRunner(proxy.traffic_app(), access_log=None, handle_signals=False, shutdown_timeout=2.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1]
    try:
        yield f"http://{host}:{bound}"
    finally:
        await runner.cleanup()
