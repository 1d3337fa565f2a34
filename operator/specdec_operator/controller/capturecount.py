"""The captured conversations as the operator reads them (spec.retraining.capture, docs/capture.md): a scrape of the
Ready capture proxies' /metrics (port 9091), at most once a minute per resource, before the step (a slow proxy holds
no step slot).

Every proxy counts the whole claim (capture/count.py), so the replicas' figures are the same count read a few seconds
apart: the claim's count is the highest figure among the proxies that answered, not a sum. No proxy Ready, none
reachable, or none that has counted the claim yet: not known (None), never 0 (a 0 would make the training rule wait
for traffic that may be there, and an unknown count is not a reason to start a Job either: reconcile/retrain.py).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from ..api import SpeculativeServerSpec
from ..api_retraining import capture_on
from ..capture.proxy import COUNT_PATH, STORED_CONVERSATIONS
from ..reconcile.capture_objects import ADMIN_PORT, capture_name
from ..reconcile.pods import is_ready, live
from .config import Endpoints
from .state import Captured, Key, ResourceState

LOG = logging.getLogger("specdec.operator")
# The count in status changes with the traffic: read more often, every read would write the status (and the write
# wakes the resource's loop again). Training's minSamples is a matter of minutes, not seconds.
COUNT_EVERY_S = 60.0
RETRY_S = 10.0  # after no proxy answered (a proxy that has just started may not have counted yet)


def counted_pods(pods: list[dict[str, Any]]) -> dict[str, str | None]:
    """The capture proxies to read: the Ready ones not being deleted (pod name -> pod IP)."""
    return {p["metadata"]["name"]: (p.get("status") or {}).get("podIP") for p in live(pods) if is_ready(p)}


def claim_conversations(figures: list[float | None]) -> int | None:
    """The claim's conversations from the proxies' figures (None: that proxy did not answer or has not counted yet)."""
    known = [f for f in figures if f is not None]
    return int(max(known)) if known else None


def stored_conversations(text: str) -> float | None:
    """specdec_capture_stored_conversations from a proxy's /metrics text (None when absent or not Prometheus text)."""
    try:
        for family in text_string_to_metric_families(text):
            if family.name == STORED_CONVERSATIONS:
                return next((s.value for s in family.samples), None)
    except ValueError:
        return None
    return None


async def read_proxy(session: aiohttp.ClientSession, url: str | None, timeout: float) -> float | None:
    """One proxy's figure: None when it has no address yet, cannot be reached, or answers no count."""
    if url is None:
        return None
    try:
        async with session.get(url.rstrip("/") + "/metrics", timeout=aiohttp.ClientTimeout(total=timeout)) as answer:
            if answer.status != 200:
                return None
            return stored_conversations(await answer.text())
    except (TimeoutError, aiohttp.ClientError):
        return None


async def read_proxy_since(session: aiohttp.ClientSession, url: str | None, since: str, timeout: float) -> float | None:
    """One proxy's conversations captured since ``since`` (its /count): None when it cannot say."""
    if url is None:
        return None
    try:
        async with session.get(url.rstrip("/") + COUNT_PATH, params={"since": since}, timeout=aiohttp.ClientTimeout(total=timeout)) as answer:
            if answer.status != 200:
                return None
            found = (await answer.json()).get("conversations")
    except (TimeoutError, aiohttp.ClientError, ValueError, AttributeError):
        return None
    return float(found) if isinstance(found, int) and not isinstance(found, bool) else None


def last_job_start(body: Mapping[str, Any]) -> str | None:
    """status.retraining.training.startedAt: when the last training Job started (None before the first)."""
    training = (((body.get("status") or {}).get("retraining") or {}).get("training")) or {}
    started = training.get("startedAt")
    return started if isinstance(started, str) and started else None


class CaptureCounts:
    """Reads each resource's captured conversations when due, and remembers the last read in its ResourceState."""

    def __init__(self, endpoints: Endpoints, timeout: float) -> None:
        self.endpoints = endpoints
        self.timeout = timeout
        self.clock: Callable[[], float] = time.monotonic
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def url(self, key: Key, pod: str, pod_ip: str | None) -> str | None:
        namespace, name = key
        return self.endpoints.pod_url(namespace, pod, pod_ip, capture_name(name), port=ADMIN_PORT)

    async def read(self, key: Key, pods: Mapping[str, str | None]) -> int | None:
        """The claim's conversations from ``pods`` (name -> IP), read concurrently."""
        if not pods:
            return None
        session = self.session()
        names = sorted(pods)
        figures = await asyncio.gather(*(read_proxy(session, self.url(key, pod, pods[pod]), self.timeout) for pod in names))
        return claim_conversations(list(figures))

    async def read_since(self, key: Key, pods: Mapping[str, str | None], since: str) -> int | None:
        """The conversations captured since ``since`` from ``pods``: the highest figure, as for the whole count."""
        session = self.session()
        figures = await asyncio.gather(*(read_proxy_since(session, self.url(key, pod, pods[pod]), since, self.timeout) for pod in sorted(pods)))
        return claim_conversations(list(figures))

    async def due(
        self, key: Key, state: ResourceState, spec: SpeculativeServerSpec | None, pods: list[dict[str, Any]], since: str | None = None
    ) -> int | None:
        """The count for this step: read again when due (a known count a minute after it was read, an unknown one
        10 s after, at once while no proxy was Ready or a new Job started), else the last read. None while capture is
        off (the step then counts none: reconcile/training.samples_of). ``since``: the last training Job's start;
        the conversations captured since then land in state.captured.since_start."""
        if spec is None or capture_on(getattr(spec, "retraining", None)) is None:
            state.captured = None
            return None
        now = self.clock()
        if state.captured is not None and now < state.captured.next_read_at and state.captured.since == since:
            return state.captured.conversations
        ready = counted_pods(pods)
        if not ready:  # nothing to ask; a proxy that becomes Ready wakes the loop
            captured = Captured(-math.inf, None, "no capture proxy is Ready", since)
        else:
            conversations = await self.read(key, ready)
            since_start = await self.read_since(key, ready, since) if since is not None and conversations is not None else None
            if conversations is not None:
                captured = Captured(now + COUNT_EVERY_S, conversations, "counted", since, since_start)
            else:  # asked again soon, but not at every step: proxies that do not answer hold it up to the timeout
                captured = Captured(now + RETRY_S, None, f"none of the {len(ready)} Ready capture proxies answered a count on /metrics", since)
        if state.captured is None or captured.note != state.captured.note:
            LOG.info(
                "%s/%s: captured conversations %s",
                *key,
                captured.conversations if captured.conversations is not None else f"not known: {captured.note}",
            )
        state.captured = captured
        return captured.conversations


def count_wait(state: ResourceState, now: float) -> float | None:
    """The longest wait before the next step while capture is on: until the count is due again (at most a minute)."""
    if state.captured is None:
        return None
    if state.captured.next_read_at == -math.inf:  # no proxy Ready: its pod's events wake the loop, not a timer
        return COUNT_EVERY_S
    return min(COUNT_EVERY_S, max(1.0, state.captured.next_read_at - now))
