"""A probe's attempts (pure): what a probe that could not measure decides (ProbeFailed, DatasetInvalid), whether a
transient failure is measured again and after how long, and the notes a result carries of the earlier attempts and
of a restart. The probe scheduler (controller/probescheduler.py) runs the attempts and calls these."""

from __future__ import annotations

from ..api import Decision, ProbeStatus, Reason
from ..textutil import clip


def probe_failed_status(revision: str, message: str) -> ProbeStatus:
    """The decision of a probe that could not measure: never a promotion."""
    return ProbeStatus(decision=Decision.ROLLBACK, reason=Reason.PROBE_FAILED, message=message, rounds=0, revision=revision)


def dataset_invalid(revision: str, message: str) -> ProbeStatus:
    """A workload's dataset could not be read or parsed: the probe did not run, nothing is promoted."""
    return ProbeStatus(
        decision=Decision.ROLLBACK,
        reason=Reason.DATASET_INVALID,
        message=f"{message} (the probe did not run; fix the dataset, then change the spec or recreate the resource to probe again)",
        rounds=0,
        revision=revision,
    )


def dataset_unreadable(revision: str, exc: Exception) -> ProbeStatus:
    """The API refused to read a dataset (RBAC, unreachable): no probe, no promotion."""
    one_line = " ".join(str(exc).split())[:200]
    return dataset_invalid(revision, f"dataset: reading it failed: {type(exc).__name__}: {one_line}")


def retry_delay(attempt: int, backoff: float) -> float:
    """Seconds before attempt ``attempt + 2`` of a probe that failed transiently: backoff, doubled each time."""
    return backoff * (2**attempt)


def next_attempt_in(transient: bool, attempt: int, attempts: int, backoff: float) -> float | None:
    """Seconds until a probe is measured again from the start, or None when attempt ``attempt + 1`` (of ``attempts``)
    stands: only a transient failure (a connection reset, a 5xx, a timeout, a preempted pod) is tried again, a bounded
    number of times."""
    if not transient or attempt + 1 >= attempts:
        return None
    return retry_delay(attempt, backoff)


def with_run_notes(status: ProbeStatus, resumed: int, failures: list[str]) -> ProbeStatus:
    """The result with what status should say of how it was reached: the rounds measured before a restart, and the
    earlier attempts of a probe that failed every time."""
    message = status.message
    if resumed:
        message = clip(f"{message} (resumed after a restart: {resumed} round(s) measured before it count)")
    if failures and status.reason == Reason.PROBE_FAILED:
        message = clip(f"{message} (after {len(failures) + 1} attempts; the earlier ones: {'; '.join(failures)})")
    return status if message == status.message else status.model_copy(update={"message": message})
