"""Read a server's Prometheus metrics (``/metrics``: SGLang's with ``--enable-metrics``, vLLM's always)."""

from __future__ import annotations

from collections import defaultdict

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from ..engines import Engine, engine_for
from .client import ProbeRequestError, transient_status


def parse_sglang_metrics(
    text: str, prefix: str = "sglang:", only: frozenset[str] | None = None, *, keep_labels: tuple[str, ...] = (), reduce: str = "mean"
) -> dict[str, float]:
    """Sample name -> value, combined over label sets (one per TP rank, or per model/priority, or per engine core).

    Every TP rank's scheduler reports the same gauges (``sglang:spec_accept_length``, ``num_running_reqs``,
    ...) under its own ``tp_rank`` label; the mean is the server's value (``reduce="mean"``). vLLM counts per
    engine core; their sum is the server's (``reduce="sum"``). ``keep_labels``: labels kept apart, the key then
    ``name{label="value"}`` (vLLM's per-position counter). Histogram buckets are skipped (``_sum`` and ``_count``
    are kept). Raises ValueError on text that is not Prometheus exposition.
    ``only``: parse just these sample names (the other lines are dropped unparsed; a caller after one gauge
    does not pay for the whole exposition).
    """
    sums: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    # Bucket samples are most of SGLang's exposition and are skipped anyway: drop them before parsing (half
    # the parser's time; the probe scrapes after every round).
    if only is not None:
        text = "\n".join(line for line in text.split("\n") if line.split("{", 1)[0].split(" ", 1)[0] in only)
    else:
        text = "\n".join(line for line in text.split("\n") if "_bucket{" not in line.split(" ", 1)[0])
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.startswith(prefix) or sample.name.endswith("_bucket"):
                continue
            if sample.name.endswith("_created"):
                continue
            kept = ",".join(f'{label}="{sample.labels[label]}"' for label in keep_labels if label in sample.labels)
            key = f"{sample.name}{{{kept}}}" if kept else sample.name
            sums[key] += float(sample.value)
            counts[key] += 1
    if reduce == "sum":
        return dict(sums)
    return {name: sums[name] / counts[name] for name in sums}


def parse_engine_metrics(text: str, engine: Engine, only: frozenset[str] | None = None) -> dict[str, float]:
    """A scrape parsed the way ``engine`` reports (its prefix, the labels it keeps apart, mean or sum over the rest)."""
    return parse_sglang_metrics(text, engine.metric_prefix, only, keep_labels=engine.metric_labels, reduce=engine.metric_reduce)


async def scrape_metrics(
    session: aiohttp.ClientSession | None,
    base_url: str,
    *,
    timeout: float = 10.0,
    only: frozenset[str] | None = None,
    engine: Engine | None = None,
) -> dict[str, float]:
    """GET ``{base_url}/metrics`` and parse it as ``engine`` reports (:func:`parse_engine_metrics`; default SGLang).

    ``session`` may be None (a short-lived one is opened). Raises ProbeRequestError when the endpoint is
    unreachable, answers non-200 (e.g. SGLang started without ``--enable-metrics``) or is not Prometheus text.
    """
    url = base_url.rstrip("/") + "/metrics"

    async def fetch(s: aiohttp.ClientSession) -> str:
        try:
            async with s.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                if resp.status != 200:
                    raise ProbeRequestError(
                        f"{url}: HTTP {resp.status} (is the server run with --enable-metrics?)", transient=transient_status(resp.status)
                    )
                return await resp.text()
        except TimeoutError:
            raise ProbeRequestError(f"{url}: timed out after {timeout:g}s", transient=True) from None
        except aiohttp.ClientError as exc:
            raise ProbeRequestError(f"{url}: {type(exc).__name__}: {exc}", transient=True) from None

    if session is None:
        async with aiohttp.ClientSession() as own:
            text = await fetch(own)
    else:
        text = await fetch(session)
    try:
        return parse_engine_metrics(text, engine or engine_for(None), only)
    except ValueError as exc:
        raise ProbeRequestError(f"{url}: not Prometheus text ({exc})") from None
