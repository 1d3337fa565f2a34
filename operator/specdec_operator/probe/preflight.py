"""Before the first round: every server answers, serves the same model, and the arms' acceptance counters have a
baseline; after each round: an arm's acceptance from its own /metrics. Facts only (probe/evidence.py ProbeFailure);
the decision is reconcile/'s."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import aiohttp

from ..api import Workload
from ..engines import Engine, SpecMetrics, counter_window
from .client import ProbeRequestError, get_json
from .evidence import FailureKind, ProbeFailure
from .metrics import scrape_metrics
from .traffic import WorkloadTraffic

BASE, DEFAULT_ARM = "base", "speculative"


def arm_label(arm: str) -> str:
    """How warnings name an arm: "speculative" (the one arm of a plain probe) or "speculative server <arm>"."""
    return arm if arm == DEFAULT_ARM else f"speculative server {arm}"


@dataclass
class ServerAcceptance:
    """One speculative server's own acceptance length during the probe, from its /metrics: SGLang's gauge, or for an
    engine that exports counters (vLLM) 1 + accepted / drafts since the preflight's scrape (and per draft position,
    ``position_rates``). Never a lifetime ratio: the server may have served before the probe. ``label``: how warnings
    name the server ("speculative", or "speculative server <arm>" in a race)."""

    engine: Engine
    label: str = "speculative"
    baseline: SpecMetrics | None = None
    position_rates: list[float] | None = None

    async def _scrape(self, session: aiohttp.ClientSession, url: str, warnings: list[str]) -> SpecMetrics | None:
        try:
            metrics = await scrape_metrics(session, url, only=self.engine.metric_names, engine=self.engine)
        except ProbeRequestError as exc:
            note = f"{self.label} /metrics unavailable ({exc}); acceptance comes from responses only"
            if note not in warnings:
                warnings.append(note)
            return None
        return self.engine.read_metrics(metrics)

    async def start(self, session: aiohttp.ClientSession, url: str, warnings: list[str]) -> None:
        """The counters before the first request (a gauge needs no baseline)."""
        if not self.engine.acceptance_from_counters:
            return
        found = await self._scrape(session, url, warnings)
        self.baseline = found if found is not None and found.counts_acceptance else None
        if found is not None and self.baseline is None:  # vLLM exports the counters only with --speculative-config
            warnings.append(f"{self.label} /metrics has no {self.engine.metric_prefix}spec_decode counters: is it speculating?")

    async def read(self, session: aiohttp.ClientSession, url: str, warnings: list[str]) -> float | None:
        found = await self._scrape(session, url, warnings)
        if found is None:
            return None
        if not found.counts_acceptance:
            return found.accept_length if found.accept_length and found.accept_length > 0 else None
        window = counter_window(self.baseline, found) if self.baseline is not None else None
        if window is None:
            return None
        self.position_rates = list(window.position_rates) if window.position_rates is not None else None
        return window.accept_length


@dataclass
class ServerFacts:
    """What the preflight read of the servers: each one's max_running_requests (by "base" or arm name), the warnings."""

    caps: dict[str, int | None]
    warnings: list[str]


async def preflight(
    session: aiohttp.ClientSession,
    base_url: str,
    arms: Mapping[str, str],
    wls: Sequence[Workload],
    timeout: float,
    engine: Engine,
    traffic: Mapping[str, WorkloadTraffic],
) -> ServerFacts | ProbeFailure:
    """Every server (the base first, then each arm) answers the engine's info endpoint, all serve one model name (the
    traffic is sent in it); their max_running_requests and what a cap below a workload's concurrency means; whether
    each arm speculates. A ProbeFailure (the fact) when a server does not answer or the model names differ."""
    infos = {}
    for server, url in [(BASE, base_url), *arms.items()]:
        try:
            infos[server] = engine.server_info(await get_json(session, url + engine.info_path, timeout=min(30.0, timeout)))
        except ProbeRequestError as exc:
            return ProbeFailure(FailureKind.UNREACHABLE, str(exc), exc.transient, server=server)
    models = {server: info.model for server, info in infos.items()}
    if len(set(models.values())) > 1:
        return ProbeFailure(FailureKind.MODEL_MISMATCH, models=tuple(models.items()))
    model = next(iter(models.values()))
    for t in traffic.values():
        t.model = model or t.model
    facts = ServerFacts({server: info.max_running_requests for server, info in infos.items()}, [])
    for server in [*arms, BASE]:
        cap, label = facts.caps[server], arm_label(server) if server != BASE else BASE
        for w in wls:
            if cap is not None and cap < w.concurrency:
                facts.warnings.append(
                    f"{label} max_running_requests={cap} is below workload {w.name}'s concurrency {w.concurrency}: "
                    f"SGLang queues the rest (speculative SGLang defaults to 48 unless --max-running-requests "
                    f"is passed)"
                )
    for arm in arms:
        if infos[arm].speculating is False:
            facts.warnings.append(f"{arm_label(arm)} {engine.info_path} reports no speculative_algorithm: is it speculating?")
    return facts
