"""The speedup probe: is the speculative server faster than its base, for this traffic, on this machine?

``run_probe`` alternates paired rounds of base and speculative server through SGLang's native /generate, puts a
Student-t interval on the log speedup after each round, and decides promote or rollback with a reason.
``scrape_metrics`` reads SGLang's Prometheus metrics (for the operator's drift monitor). See docs/probe.md.
"""

from .client import Measurement, ProbeRequestError, measure, parse_workload
from .metrics import parse_sglang_metrics, scrape_metrics
from .run import ProbeResult, WorkloadOutcome, run_probe

__all__ = [
    "Measurement",
    "ProbeRequestError",
    "ProbeResult",
    "WorkloadOutcome",
    "measure",
    "parse_sglang_metrics",
    "parse_workload",
    "run_probe",
    "scrape_metrics",
]
