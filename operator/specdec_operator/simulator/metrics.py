"""SGLang's ``sglang:*`` Prometheus metrics, rendered from the engine's state at scrape time (``/metrics``), and beside
them vLLM 0.32's ``vllm:spec_decode_*`` counters of the same drafts, so the probe and the monitor can read the
simulator in either engine's vocabulary (engines/)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

if TYPE_CHECKING:
    from .server import Simulator

TOKENIZER_LABELS = ["model_name", "engine_type"]


class SGLangMetrics:
    """A Prometheus collector of one simulated server's scheduler and tokenizer metrics."""

    def __init__(self, sim: Simulator) -> None:
        self.sim = sim

    def describe(self) -> list[Metric]:  # no eager collection on register
        return []

    def collect(self) -> Iterator[Metric]:
        yield from self._scheduler_gauges()
        yield from self._tokenizer_counters()
        yield from self._latency_histograms()
        yield from self._vllm_spec_counters()

    def _scheduler_gauges(self) -> Iterator[Metric]:
        sim, engine, profile = self.sim, self.sim.engine, self.sim.profile
        labels = ["model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            fam = GaugeMetricFamily(f"sglang:{name}", doc, labels=labels)
            # Every TP rank's scheduler reports; readers average over the label sets.
            for rank in range(profile.tp_size):
                fam.add_metric([sim.served_model_name, "unified", str(rank), "0", "0"], value)
            return fam

        running = len(engine.running)
        yield gauge("num_running_reqs", "The number of running requests.", running)
        yield gauge("num_queue_reqs", "The number of requests in the waiting queue.", len(engine.waiting))
        yield gauge("gen_throughput", "The generation throughput (token/s).", engine.last_gen_throughput)
        yield gauge("token_usage", "The token usage.", min(1.0, running / max(profile.max_running_requests, 1)))
        yield gauge("cache_hit_rate", "The prefix cache hit rate.", 0.0)
        if profile.speculative is not None:
            yield gauge("spec_accept_length", "The average acceptance length of speculative decoding.", engine.last_accept_length)
            yield gauge("spec_accept_rate", "The average acceptance rate of speculative decoding.", engine.last_accept_rate)
            if engine.adaptive is not None:
                # SGLang reports the active runtime state: the steps the last decode batch ran at, steps + 1 tokens.
                yield gauge("spec_num_steps", "Currently active speculative_num_steps.", engine.active_num_steps)
                yield gauge("spec_num_draft_tokens", "Currently active speculative_num_draft_tokens.", engine.active_num_steps + 1)
            else:
                yield gauge("spec_num_steps", "The number of speculative steps.", profile.speculative.num_steps)
                yield gauge("spec_num_draft_tokens", "The number of speculative draft tokens.", profile.speculative.num_draft_tokens)

    def _tokenizer_counters(self) -> Iterator[Metric]:
        engine = self.sim.engine
        for name, doc, value in (
            ("prompt_tokens", "Number of prefill tokens processed.", engine.prompt_tokens_total),
            ("generation_tokens", "Number of generation tokens processed.", engine.generation_tokens_total),
            ("num_requests", "The number of requests.", engine.requests_total),
            ("spec_verify_calls", "Number of speculative verify calls.", engine.verify_calls_total),
        ):
            fam = CounterMetricFamily(f"sglang:{name}", doc, labels=TOKENIZER_LABELS)
            fam.add_metric([self.sim.served_model_name, "unified"], value)
            yield fam

    def _vllm_spec_counters(self) -> Iterator[Metric]:
        """vllm/v1/spec_decode/metrics.py: per engine core (label engine), positions under their own label."""
        engine = self.sim.engine
        if self.sim.profile.speculative is None:
            return
        labels = ["model_name", "engine"]
        for name, doc, value in (
            ("spec_decode_num_drafts", "Number of spec decoding drafts.", engine.spec_decode.drafts),
            ("spec_decode_num_draft_tokens", "Number of draft tokens.", engine.spec_decode.draft_tokens),
            ("spec_decode_num_accepted_tokens", "Number of accepted tokens.", engine.spec_decode.accepted_tokens),
        ):
            fam = CounterMetricFamily(f"vllm:{name}", doc, labels=labels)
            fam.add_metric([self.sim.served_model_name, "0"], value)
            yield fam
        fam = CounterMetricFamily("vllm:spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position.", labels=[*labels, "position"])
        for position, value in enumerate(engine.spec_decode.accepted_per_position):
            fam.add_metric([self.sim.served_model_name, "0", str(position)], value)
        yield fam

    def _latency_histograms(self) -> Iterator[Metric]:
        engine = self.sim.engine
        for name, doc, hist in (
            ("time_to_first_token_seconds", "Histogram of time to first token in seconds.", engine.ttft_seconds),
            ("inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", engine.itl_seconds),
            ("e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds", engine.e2e_seconds),
        ):
            fam = HistogramMetricFamily(f"sglang:{name}", doc, labels=TOKENIZER_LABELS)
            buckets = [(b if b == "+Inf" else repr(float(b)), c) for b, c in hist.cumulative()]
            fam.add_metric([self.sim.served_model_name, "unified"], buckets, hist.sum)
            yield fam
