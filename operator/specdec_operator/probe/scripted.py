"""Scripted evidence: what a probe would have measured, written down, for tests and demos that are about what the
operator does with a decision rather than about measuring.

A probe measured in real time against simulators decides on the host's timing, so a busy machine can turn a 2x
drafter into an Inconclusive one; a test of the lifecycle (promotion, rollback, a restart mid-probe, the fleet walk)
should not depend on that. With ``specdec run --probe-script FILE`` the probe of a resource the script names feeds the
same decision (reconcile/race.py), round by round, with evidence built from the script instead of from requests, and
everything after it (status, Events, the Service switch, the evidence kept for a restart) is the operator's own.
Resources the script does not name are measured for real. The measuring itself is tested in real time elsewhere
(tests/unit/test_probe*.py, the `timing` tests).

The script is YAML or JSON, read when each probe starts (so a test may add entries while the operator runs)::

    <namespace>/<name> | <name>:
      speedup: 2.0             # or per workload: {chat: 2.1, batch-32: 0.8}
      noise: 0.03              # standard deviation of each round's log speedup (default 0.03)
      acceptLength: 2.4        # the drafter's acceptance length (default: none measured)
      secondsPerRound: 0.5     # how long a round takes (default 0.2: the probe's progress is visible)
      checkOutputs: true       # still compare the greedy completions on the real servers (rollout.outputCheck,
                               # outputs.py) after the scripted rounds (default false: no server need answer)
      arms:                    # a race (run_probe's ``arms``): each arm's own script, the same fields but arms
                               # (checkOutputs, when an arm's entry does not say, is its probe's);
        eagle3-k4: {speedup: 2.2}  # an arm not named here takes the entry's own (with its noise seeded by the arm).
                               # A race of spec.candidates: each candidate's probe takes the entry named after
                               # the candidate (eagle3, ngram, ...), as an arm of that name would

A round's two measurements are deterministic for a given resource, workload and round (the noise is seeded by them),
so the same script gives the same decision on every machine.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from ..errors import InputError
from .evidence import Measured

BASE_TOK_S = 1000.0  # the scripted base server's tok/s (only ratios matter to the decision)
DEFAULT_NOISE = 0.03
DEFAULT_SECONDS_PER_ROUND = 0.2
DEFAULT_ARM = "speculative"  # the arm of a probe of one speculative server
DF = 30.0  # degrees of freedom of a scripted measurement's variance (a measurement of ~40 time blocks)


@dataclass(frozen=True)
class ScriptedProbe:
    """The script of one resource's probe."""

    key: str
    speedup: float | Mapping[str, float] | None  # None: only its arms are scripted
    noise: float = DEFAULT_NOISE
    accept_length: float | None = None
    seconds_per_round: float = DEFAULT_SECONDS_PER_ROUND
    arms: Mapping[str, ScriptedProbe] = field(default_factory=dict)
    check_outputs: bool = False  # the output check runs against the real servers (a scripted speed, real outputs)

    def for_arm(self, arm: str) -> ScriptedProbe:
        """The script of one arm of a probe: its own entry under ``arms``, else this one (the arm "speculative" as it
        is; another with the arm in its key, so its rounds' noise is its own)."""
        found = self.arms.get(arm) or (self if arm == DEFAULT_ARM else replace(self, key=f"{self.key}/{arm}", arms={}))
        if found.speedup is None:
            raise InputError(f"probe script {self.key}: no speedup for arm {arm!r}; give the entry a speedup or the arm one under arms")
        return found

    def speedup_of(self, workload: str) -> float:
        if self.speedup is None:
            raise InputError(f"probe script {self.key}: no speedup; give one (a number, or one per workload)")
        if isinstance(self.speedup, Mapping):
            if workload not in self.speedup:
                raise InputError(f"probe script {self.key}: no speedup for workload {workload!r}; give one per workload or a single number")
            return float(self.speedup[workload])
        return float(self.speedup)

    def pair(self, workload: str, rnd: int) -> tuple[Measured, Measured]:
        """(speculative, base) of one round: each log tok/s with variance noise^2 / 2, so their difference (the round's
        log speedup) has the script's noise; the speculative one off its mean by a seeded draw of that noise."""
        seed = int.from_bytes(hashlib.sha256(f"{self.key}/{workload}/{rnd}".encode()).digest()[:8], "big")
        shift = random.Random(seed).gauss(0.0, self.noise)
        var = self.noise * self.noise / 2.0
        base = Measured(BASE_TOK_S, math.log(BASE_TOK_S), var, DF)
        tok_s = BASE_TOK_S * self.speedup_of(workload) * math.exp(shift)
        return Measured(tok_s, math.log(tok_s), var, DF), base


def load_script(path: str | Path) -> dict[str, ScriptedProbe]:
    """The scripted probes in ``path``, by key; InputError naming the file and the entry on a bad one."""
    source = Path(path)
    try:
        doc = yaml.safe_load(source.read_text(encoding="utf-8")) or {}
    except OSError as exc:
        raise InputError(f"--probe-script {source}: cannot read it ({exc.strerror or exc})") from None
    except yaml.YAMLError as exc:
        raise InputError(f"--probe-script {source}: not YAML or JSON ({str(exc).splitlines()[0]})") from None
    if not isinstance(doc, Mapping):
        raise InputError(f"--probe-script {source}: a mapping of <namespace>/<name> or <name> to a probe's script is expected")
    return {str(key): _entry(source, str(key), value) for key, value in doc.items()}


def _entry(source: Path, key: str, value: Any, *, nested: bool = False, check_outputs_default: bool = False) -> ScriptedProbe:
    where = f"--probe-script {source}: {key}"
    arms = value.get("arms") if isinstance(value, Mapping) and not nested else None
    if not isinstance(value, Mapping) or ("speedup" not in value and not arms):
        raise InputError(f"{where}: give at least speedup (a number, or one per workload)")
    if arms is not None and (not isinstance(arms, Mapping) or not arms):
        raise InputError(f"{where}: arms: a mapping of an arm's name to its script ({{speedup, noise, acceptLength, secondsPerRound, checkOutputs}})")
    speedup = value.get("speedup")
    if isinstance(speedup, Mapping):
        if not speedup or not all(_positive(v) for v in speedup.values()):
            raise InputError(f"{where}: speedup: every workload's speedup must be a number > 0")
        speedup = {str(k): float(v) for k, v in speedup.items()}
    elif speedup is not None and not _positive(speedup):
        raise InputError(f"{where}: speedup {speedup!r}: must be a number > 0")
    noise = value.get("noise", DEFAULT_NOISE)
    if not isinstance(noise, (int, float)) or isinstance(noise, bool) or not 0 < noise < 1:
        raise InputError(f"{where}: noise {noise!r}: must be a number in (0, 1)")
    accept = value.get("acceptLength")
    if accept is not None and not (_positive(accept) and accept >= 1.0):
        raise InputError(f"{where}: acceptLength {accept!r}: must be a number >= 1.0")
    seconds = value.get("secondsPerRound", DEFAULT_SECONDS_PER_ROUND)
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or seconds < 0:
        raise InputError(f"{where}: secondsPerRound {seconds!r}: must be a number >= 0")
    check_outputs = value.get("checkOutputs", check_outputs_default)  # an arm's entry takes its probe's unless it says
    if not isinstance(check_outputs, bool):
        raise InputError(f"{where}: checkOutputs {check_outputs!r}: must be true or false")
    known = {"speedup", "noise", "acceptLength", "secondsPerRound", "checkOutputs"} | (set() if nested else {"arms"})
    unknown = sorted(set(value) - known)
    if unknown:
        raise InputError(f"{where}: unknown field(s) {', '.join(unknown)} ({', '.join(sorted(known))})")
    scripted = {
        str(arm): _entry(source, f"{key}/{arm}", entry, nested=True, check_outputs_default=check_outputs) for arm, entry in (arms or {}).items()
    }
    return ScriptedProbe(key, speedup, float(noise), float(accept) if accept is not None else None, float(seconds), scripted, check_outputs)


def _positive(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def scripted_for(script: Mapping[str, ScriptedProbe], namespace: str, name: str) -> ScriptedProbe | None:
    """The script of resource ``namespace/name`` (its full key first, then its name alone), or None."""
    return script.get(f"{namespace}/{name}") or script.get(name)
