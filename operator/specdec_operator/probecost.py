"""What a probe decision cost: the GPUs its two servers declare times the probe's time (GPU-seconds), and, for servers
that are CPU processes (vLLM's CPU build: the real-engine tier), their cores times it (core-seconds).

The API has no CPU server: spec.resources.gpus is at least 1 and every server pod requests it as nvidia.com/gpu
(manifests._server_resources), so status.probe carries GPU-seconds only. Cores are declared to `specdec probe`
(--base-cores, --speculative-cores), which measures servers the operator did not make.
"""

from __future__ import annotations

from typing import Any

from .api import Resources, SpeculativeServerSpec
from .errors import InputError


def server_gpus(resources: Resources) -> int:
    """GPUs one server requests: resources.gpus in each of its resources.nodes pods (nvidia.com/gpu limits and requests)."""
    return resources.gpus * resources.nodes


def probed_gpus(spec: SpeculativeServerSpec) -> int:
    """GPUs the probe holds: one base server and one speculative server (in a fleet, the canary and the base server
    behind `<name>-base` that answers), both of spec.resources."""
    return 2 * server_gpus(spec.resources)


def unit_seconds(units: float | None, seconds: float | None) -> float | None:
    """``units`` (GPUs or cores) held for ``seconds``; None when either is unknown (never 0 for unknown)."""
    if units is None or seconds is None:
        return None
    return round(units * max(0.0, seconds), 3)


def decision_seconds(*parts: float | None) -> float | None:
    """A decision made of several probes (load-aware: the plain one, then the adaptive server's) cost their sum; None
    when any is unknown (a plain probe recorded by an operator that did not count), rather than a sum that looks whole."""
    if not parts or any(p is None for p in parts):
        return None
    return round(sum(p for p in parts if p is not None), 3)


def _pair(flag: str, base: float | None, speculative: float | None) -> float | None:
    if (base is None) != (speculative is None):
        raise InputError(f"--base-{flag} and --speculative-{flag}: give both (what each server holds) or neither ({flag[:-1]}-seconds unknown)")
    for side, value in (("base", base), ("speculative", speculative)):
        if value is not None and not value >= 0:
            raise InputError(f"--{side}-{flag} {value!r}: must be >= 0 (0: a server that holds none)")
    return None if base is None or speculative is None else base + speculative


def cli_cost(
    wall_seconds: float | None,
    base_gpus: float | None = None,
    speculative_gpus: float | None = None,
    base_cores: float | None = None,
    speculative_cores: float | None = None,
) -> dict[str, Any]:
    """The cost keys of the `specdec probe --json` document ("candidate" is the speculative server there)."""
    gpus = _pair("gpus", base_gpus, speculative_gpus)
    cores = _pair("cores", base_cores, speculative_cores)
    return {
        "base_gpus": base_gpus,
        "candidate_gpus": speculative_gpus,
        "gpu_seconds": unit_seconds(gpus, wall_seconds),
        "base_cores": base_cores,
        "candidate_cores": speculative_cores,
        "core_seconds": unit_seconds(cores, wall_seconds),
    }


def render_cost(cost: dict[str, Any], wall_seconds: float | None) -> str:
    """One line for `specdec probe`'s text output."""
    wall = f"{wall_seconds:.1f} s" if wall_seconds is not None else "unknown time"
    parts = []
    if cost["gpu_seconds"] is not None:
        parts.append(f"{cost['gpu_seconds']:g} GPU-seconds ({cost['base_gpus']:g} + {cost['candidate_gpus']:g} GPUs)")
    else:
        parts.append("GPU-seconds unknown (--base-gpus, --speculative-gpus)")
    if cost["core_seconds"] is not None:
        parts.append(f"{cost['core_seconds']:g} core-seconds ({cost['base_cores']:g} + {cost['candidate_cores']:g} cores)")
    return f"cost: {', '.join(parts)} over {wall}"
