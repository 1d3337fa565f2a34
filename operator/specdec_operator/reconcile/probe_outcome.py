"""The probe's facts that are not rounds, turned into a decision: pure, and the only place besides reconcile/race.py
that sets a probe's Reason.

The probe (probe/run.py) only measures: when a server cannot be measured, the time budget runs out or the greedy
outputs differ, it records the fact on the evidence (probe/evidence.py ``RunFacts``) and asks the decision again.
reconcile/race.py ``decide`` calls these functions, so the operator, ``specdec probe`` and the benchmarks get every
Reason from the same code:

* :func:`probe_failed` - ProbeFailed: an unreachable server, servers of different model names, a failed request, an
  unforeseen error (transient when a later attempt may clear it).
* :func:`time_budget_spent` - Inconclusive: the probe's time budget ran out before the decision.
* :func:`with_output_check` - OutputMismatch: the checked arm's greedy completions match the base's on less than the
  minimum share of their tokens; the speed decision is kept in the message.
* :func:`with_notes` - the messages' notes on how the decision came about (where a drafter's acceptance was read; a
  round budget too small for any promotion).
"""

from __future__ import annotations

from collections.abc import Mapping

from ..api import Decision, Reason
from ..probe.decide import PROMOTE_MIN_ROUNDS
from ..probe.evidence import ArmState, Decided, FailureKind, OutputFacts, ProbeFailure, TimeBudgetSpent

__all__ = ["probe_failed", "server_label", "time_budget_spent", "with_notes", "with_output_check"]

DEFAULT_ARM = "speculative"  # the arm of a probe of one speculative server (the operator's)


def server_label(server: str) -> str:
    """How messages name a server: "base server", "speculative server" (the one arm of a plain probe), or
    "speculative server <arm>"."""
    return f"{server} server" if server in ("base", DEFAULT_ARM) else f"speculative server {server}"


def probe_failed(failure: ProbeFailure) -> Decided:
    """ProbeFailed from what went wrong; ``transient`` when the fact says a later attempt may clear it."""
    if failure.kind is FailureKind.UNREACHABLE:
        message = f"{server_label(failure.server or 'base')} unreachable: {failure.detail}"
    elif failure.kind is FailureKind.MODEL_MISMATCH:
        names = ", ".join(f"{server} {model!r}" for server, model in failure.models)
        message = f"the servers serve different model names ({names}): the same prompts cannot go to {'both' if len(failure.models) <= 2 else 'all'}"
    else:  # REQUEST, ERROR: the client's own words
        message = f"probe failed: {failure.detail}"
    return Decided(Decision.ROLLBACK, Reason.PROBE_FAILED, message, None, {}, transient=failure.transient)


def time_budget_spent(spent: TimeBudgetSpent, states: Mapping[str, ArmState], detail: str) -> Decided:
    """Inconclusive: the probe's time ran out while the decision still asked for rounds (``detail``: the intervals so far)."""
    message = f"probe time budget of {spent.seconds:g}s spent after {spent.complete_rounds} complete round(s): {detail}"
    return Decided(Decision.ROLLBACK, Reason.INCONCLUSIVE, message, None, states)


def with_output_check(decided: Decided, outputs: OutputFacts) -> Decided:
    """The decision once the checked arm's outputs are compared: rollback (OutputMismatch) below the threshold, with the
    speed decision in the message; otherwise the speed decision unchanged."""
    rate = outputs.match_rate
    if rate is None or rate >= outputs.min_match_rate:
        return decided
    message = (
        f"output mismatch: the {server_label(outputs.arm)}'s greedy completions match the base's on {rate:.1%} of their tokens "
        f"(mean share before the first difference over {outputs.compared} prompts, {outputs.identical} identical; "
        f"first differences at tokens {sorted(outputs.first_differences)[:8]}) < minMatchRate {outputs.min_match_rate:g}: speculative "
        f"decoding changed what the model says (check the drafter's target and vocabulary mapping)"
    )
    if decided.decision == Decision.PROMOTE:
        message += f"; the speed measurement alone would have promoted ({decided.message})"
    else:
        message += f"; speed: {decided.message}"
    return Decided(Decision.ROLLBACK, Reason.OUTPUT_MISMATCH, message, None, decided.arms)


def with_notes(decided: Decided, accept_read: Mapping[str, str], max_rounds: int) -> Decided:
    """A drafter stopped at its first measurement says where its acceptance was read ("after 4 request(s) of workload
    chat"); an inconclusive decision says when the round budget was too small for a promotion at all."""
    message = decided.message
    if decided.reason is Reason.DRAFTER_NOT_ACCEPTING and accept_read:
        single = len(decided.arms) <= 1
        message += " (" + "; ".join(where if single else f"{arm}: {where}" for arm, where in accept_read.items()) + ")"
    if decided.reason is Reason.INCONCLUSIVE and max_rounds < PROMOTE_MIN_ROUNDS:
        message += f" (max rounds {max_rounds} < {PROMOTE_MIN_ROUNDS}: no promotion without both orders of the servers)"
    if message == decided.message:
        return decided
    return Decided(decided.decision, decided.reason, message, decided.winner, decided.arms, decided.transient)
