"""The speedup probe: is the speculative server faster than its base, for this traffic, on this machine?

``run.run_probe`` alternates paired rounds of base and speculative server through the engine's API and keeps the
evidence; the decision after each round is reconcile/race.py's (cli/probe.py binds the two: ``specdec probe``, the
benchmarks and the tests call that ``run_probe``).
``scrape_metrics`` reads SGLang's Prometheus metrics (for the operator's drift monitor). See docs/probe.md.
"""

from .client import Measurement, ProbeRequestError, measure, parse_workload
from .metrics import parse_sglang_metrics, scrape_metrics
from .run import ProbeResult, WorkloadOutcome

__all__ = [
    "Measurement",
    "ProbeRequestError",
    "ProbeResult",
    "WorkloadOutcome",
    "measure",
    "parse_sglang_metrics",
    "parse_workload",
    "scrape_metrics",
]
