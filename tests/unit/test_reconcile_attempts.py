"""A probe's attempts (reconcile/attempts.py): what a probe that could not measure decides, when a transient failure
is measured again, and the notes status gets of earlier attempts and of a restart."""

from __future__ import annotations

from specdec_operator.api import ProbeStatus
from specdec_operator.reconcile.attempts import dataset_invalid, dataset_unreadable, next_attempt_in, probe_failed_status, with_run_notes


def test_a_probe_that_could_not_measure_is_never_promoted() -> None:
    failed = probe_failed_status("rev1", "probe failed: connection refused")
    assert (failed.decision, failed.reason, failed.rounds, failed.revision) == ("rollback", "ProbeFailed", 0, "rev1")
    invalid = dataset_invalid("rev1", "dataset configmap/chat key chat.jsonl: line 3: not JSON")
    assert (invalid.decision, invalid.reason) == ("rollback", "DatasetInvalid")
    assert invalid.message == (
        "dataset configmap/chat key chat.jsonl: line 3: not JSON (the probe did not run; fix the dataset, then change the spec "
        "or recreate the resource to probe again)"
    )
    refused = dataset_unreadable("rev1", PermissionError('configmaps "chat" is forbidden:\n  User cannot get'))
    assert refused.reason == "DatasetInvalid" and 'dataset: reading it failed: PermissionError: configmaps "chat" is forbidden: User' in (
        refused.message or ""
    )


def test_only_a_transient_failure_is_measured_again_a_bounded_number_of_times_with_a_doubling_backoff() -> None:
    assert [next_attempt_in(True, attempt, 3, 30.0) for attempt in range(3)] == [30.0, 60.0, None]
    assert next_attempt_in(False, 0, 3, 30.0) is None  # a decision, or a failure a retry cannot clear
    assert next_attempt_in(True, 0, 1, 30.0) is None  # one attempt in all


def test_the_notes_say_what_a_restart_kept_and_what_the_earlier_attempts_met() -> None:
    decided = ProbeStatus(decision="promote", reason="SpeedupConfirmed", message="c1 2x", rounds=4)
    assert with_run_notes(decided, 0, []) is decided
    resumed = with_run_notes(decided, 2, ["reset"])  # earlier attempts are named only when the last one failed too
    assert resumed.message == "c1 2x (resumed after a restart: 2 round(s) measured before it count)"
    failed = probe_failed_status("rev1", "probe failed: 503")
    noted = with_run_notes(failed, 0, ["probe failed: reset", "probe failed: timeout"])
    assert noted.message == "probe failed: 503 (after 3 attempts; the earlier ones: probe failed: reset; probe failed: timeout)"
    assert failed.message == "probe failed: 503"  # the result it was given is left as it was
