"""One generation request from its admission to the engine to its last byte, whole or streamed, with its fault.

/generate and the OpenAI endpoints share :class:`Generation`, the only code that waits on the engine's emissions;
they differ in their bodies (formats.py) and in how a streamed fault looks on the wire:

- /generate streams one event per emission (a speculative step's k tokens arrive in one event at SGLang's
  ``stream_interval`` 1) and ends with ``data: [DONE]``. The stream is written from the engine's step itself
  (:func:`_stream_generate_from_engine`: one task switch fewer per event than through a queue); only a stall,
  which must pause the stream, goes through the request's queue.
  From half-way: truncated closes the connection; malformed replaces every event but the last with a cut one.
- The OpenAI endpoints stream delta chunks through the queue. Half-way, once: truncated closes the connection,
  malformed sends one cut chunk before the event, a stall waits and then finishes unless the client has left.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator

from aiohttp import web

from .faults import Fault, close_connection, past_halfway, whole_response
from .formats import DONE_EVENT, GenerateFormat, OpenAIFormat, sse_event
from .inputs import GenerationInput
from .model import Emission, Engine
from .tokens import OutputTape

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


class LiveRequests:
    """The requests being answered, whose connections a server's death or stop aborts."""

    def __init__(self) -> None:
        self._requests: dict[int, web.BaseRequest] = {}  # keyed by id(): Request objects are unhashable

    @contextlib.contextmanager
    def track(self, request: web.BaseRequest) -> Iterator[None]:
        self._requests[id(request)] = request
        try:
            yield
        finally:
            self._requests.pop(id(request), None)

    def abort_all(self) -> None:
        for live in list(self._requests.values()):
            if live.transport is not None:
                live.transport.abort()


class Generation:
    """A request admitted to the engine, as the HTTP handler answering it sees it."""

    def __init__(self, engine: Engine, tape: OutputTape, ask: GenerationInput) -> None:
        self.ask = ask
        self.req = engine.submit(ask.prompt_tokens, ask.max_new_tokens, ask.stream_interval, kind=ask.kind, repetition=ask.repetition)
        tape.ensure(self.req.max_new_tokens)  # what the engine generates: at least one token, whatever was asked

    async def emissions(self) -> AsyncIterator[Emission]:
        """What the engine emits for the request, in order, up to the finishing emission."""
        while True:
            em = await self.req.out.get()
            yield em
            if em.finished:
                return

    async def final(self) -> Emission:
        """The finishing emission, which a response that is not streamed waits for."""
        async for em in self.emissions():
            last = em
        return last

    def deliver_to(self, sink: Callable[[Emission], None]) -> None:
        """Hand every emission to ``sink`` synchronously from the engine's step, the ones already queued first."""
        self.req.sink = sink
        # The prefill can finish while the response headers are being sent.
        while not self.req.out.empty():
            sink(self.req.out.get_nowait())

    def cancel(self) -> None:
        """The client is gone: the engine drops the request at its next step."""
        self.req.cancelled = True


async def respond_generate(
    request: web.Request, generation: Generation, fmt: GenerateFormat, fault: Fault, stall_seconds: float
) -> web.StreamResponse:
    if not generation.ask.stream:
        return await whole_response(request, fmt.body(await generation.final()), fault, stall_seconds)
    resp = web.StreamResponse(headers=SSE_HEADERS)
    resp.enable_chunked_encoding()  # _stream_generate_from_engine writes the chunks to the transport itself
    await resp.prepare(request)
    if fault is Fault.STALL:
        return await _stream_generate_stalled(resp, generation, fmt, stall_seconds)
    return await _stream_generate_from_engine(request, resp, generation, fmt, fault)


async def _stream_generate_from_engine(
    request: web.Request, resp: web.StreamResponse, generation: Generation, fmt: GenerateFormat, fault: Fault
) -> web.StreamResponse:
    """Write each event as an HTTP chunk from the engine's step: no task wake-up per event."""
    transport = request.transport
    if transport is None:  # the client left while the headers were sent
        generation.cancel()
        return resp
    done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    max_new_tokens = generation.req.max_new_tokens

    def write(data: bytes) -> None:
        transport.write(b"%x\r\n%b\r\n" % (len(data), data))

    def sink(em: Emission) -> None:
        if done.done():
            return
        if transport.is_closing():
            generation.cancel()
            done.set_result(False)
            return
        if fault is not Fault.NONE and past_halfway(em, max_new_tokens):
            if fault is Fault.TRUNCATED:
                generation.cancel()
                transport.close()
                done.set_result(False)
                return
            if fault is Fault.MALFORMED:
                write(fmt.malformed_event(em))
                return
        write(sse_event(fmt.body(em)))
        if em.finished:
            write(DONE_EVENT)
            done.set_result(True)

    generation.deliver_to(sink)
    try:
        completed = await done
    except asyncio.CancelledError:
        generation.cancel()
        raise
    if completed:
        try:
            await resp.write_eof()
        except ConnectionResetError:  # the client left right after [DONE]
            pass
    return resp


async def _stream_generate_stalled(resp: web.StreamResponse, generation: Generation, fmt: GenerateFormat, stall_seconds: float) -> web.StreamResponse:
    """Stream through the request's queue, which lets the stream pause half-way: the stall fault."""
    stalled = False
    try:
        async for em in generation.emissions():
            if not stalled and past_halfway(em, generation.req.max_new_tokens):
                stalled = True
                await asyncio.sleep(stall_seconds)
            await resp.write(sse_event(fmt.body(em)))
        await resp.write(DONE_EVENT)
        await resp.write_eof()
    except ConnectionResetError:  # the client gave up on the stalled stream: what a stall is for
        generation.cancel()
    return resp


async def respond_openai(request: web.Request, generation: Generation, fmt: OpenAIFormat, fault: Fault, stall_seconds: float) -> web.StreamResponse:
    if not generation.ask.stream:
        return await whole_response(request, fmt.body(await generation.final()), fault, stall_seconds)
    resp = web.StreamResponse(headers=SSE_HEADERS)
    await resp.prepare(request)
    faulted = False
    async for em in generation.emissions():
        if not faulted and fault is not Fault.NONE and past_halfway(em, generation.req.max_new_tokens):
            faulted = True
            if fault is Fault.TRUNCATED:
                generation.cancel()
                close_connection(request)
                return resp
            if fault is Fault.MALFORMED:
                await resp.write(fmt.malformed_chunk())
            if fault is Fault.STALL:
                await asyncio.sleep(stall_seconds)
                if request.transport is None or request.transport.is_closing():
                    generation.cancel()
                    return resp
        await resp.write(fmt.chunk(em))
    if fmt.include_usage:
        await resp.write(fmt.usage_chunk())
    await resp.write(DONE_EVENT)
    await resp.write_eof()
    return resp
