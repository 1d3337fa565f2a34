"""`specdec probe`, and the probe as the benchmarks and tests call it: probe/ measures, reconcile/race.py decides.

The probe's loop (probe/run.py) sits below reconcile/ and cannot import the decision; this module, above both, binds
them, so the command, the benchmarks and the operator (controller/probescheduler.py) measure and decide one way.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from ..probe import cli as probe_cli
from ..probe.run import ProbeResult
from ..probe.run import run_probe as measure_and_decide
from ..reconcile.race import decide


async def run_probe(*args: Any, **kwargs: Any) -> ProbeResult:
    """probe/run.py ``run_probe`` with reconcile/race.py's ``decide`` (same arguments otherwise)."""
    kwargs.setdefault("decide", decide)
    return await measure_and_decide(*args, **kwargs)


main = partial(probe_cli.main, decide=decide)
