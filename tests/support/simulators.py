"""In-process SGLang simulators for tests that run the operator as a process, and production traffic against them.

The operator under test (a subprocess) reaches the simulators over loopback; they run on one background asyncio
loop so that the test itself can stay synchronous.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

from specdec_operator.simulator import Profile, SimulatorServer, load_profile

TIME_SCALE = 20.0  # simulated seconds per wall second, unless a test asks for another


class Simulators:
    """In-process SGLang simulators on one background asyncio loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="simulators", daemon=True)
        self.thread.start()
        self.servers: list[SimulatorServer] = []

    def run(self, coro: Any, timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start(self, profile: str | Profile, time_scale: float = TIME_SCALE, seed: int = 7, port: int = 0) -> SimulatorServer:
        """A simulator of a shipped profile (by name) or of a Profile; ``port`` 0 binds a free one."""

        async def go() -> SimulatorServer:
            loaded = load_profile(profile) if isinstance(profile, str) else profile
            server = SimulatorServer(loaded, port=port, time_scale=time_scale, seed=seed, load_seconds=0)
            await server.start()
            return server

        server = self.run(go())
        self.servers.append(server)
        return server

    def stop(self, server: SimulatorServer) -> None:
        self.run(server.stop(), timeout=10)
        self.servers.remove(server)

    def close(self) -> None:
        """Stop every simulator, then the loop; a simulator that did not stop is reported after the others stopped."""
        failed = []
        for server in self.servers:
            try:
                self.run(server.stop(), timeout=10)
            except Exception as error:  # raised below, once the loop is stopped
                failed.append(f"{server.sim.profile.name}: {type(error).__name__}: {error}")
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        if failed:
            raise RuntimeError(f"simulators that did not stop: {'; '.join(failed)}")


@contextlib.contextmanager
def generate_traffic(url: str, tokens: int) -> Iterator[None]:
    """Production traffic while the block runs: one client sending /generate to ``url`` back to back.

    Each request has a prompt of ``tokens`` words and asks for ``tokens`` new tokens; a request the server refuses
    or drops (an HTTP error, a refused or reset connection, a timeout) is retried after 0.2 s (the server may be dying
    or restarting: that is what the tests look at). Anything else stops the traffic and fails the block.
    """
    stop = threading.Event()
    body = json.dumps({"text": "hello " * tokens, "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True}}).encode()
    request = urllib.request.Request(url + "/generate", data=body, headers={"Content-Type": "application/json"})
    failed: list[BaseException] = []

    def send() -> None:
        try:
            while not stop.is_set():
                try:
                    urllib.request.urlopen(request, timeout=10).read()
                except (OSError, http.client.HTTPException):  # urllib's URLError and HTTPError are OSErrors
                    time.sleep(0.2)
        except Exception as error:  # raised in the test's thread when the block ends
            failed.append(error)

    worker = threading.Thread(target=send, name="traffic", daemon=True)
    worker.start()
    try:
        yield
    finally:
        stop.set()
        worker.join(5)
    if failed:
        raise AssertionError(f"the traffic to {url} stopped: {type(failed[0]).__name__}: {failed[0]}") from failed[0]
