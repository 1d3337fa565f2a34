"""The drift rule: roll back exactly after `window` consecutive scrapes below the floor; no flapping."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from specdec_operator.api import MonitorStatus
from specdec_operator.monitor import Sample, observe, sample_from_metrics


def run(values, *, floor=1.5, window=3, counters=True):
    """Feed accept lengths (None = failed scrape) through the rule; return the index of the rollback scrape."""
    status, previous = None, None
    for i, value in enumerate(values):
        if value is None:
            sample = Sample(time=f"t{i}", error="connection refused")
        else:
            # A working server: the counters move between scrapes.
            sample = Sample(
                time=f"t{i}",
                accept_length=value,
                verify_calls=100.0 * (i + 1) if counters else None,
                generated_tokens=250.0 * (i + 1) if counters else None,
            )
        verdict = observe(status, sample, floor=floor, window=window, previous=previous)
        status, previous = verdict.status, sample
        if verdict.drifted:
            return i, status
    return None, status


def test_abrupt_drop_rolls_back_on_the_window_th_low_scrape() -> None:
    index, status = run([2.9, 2.8, 1.0, 1.0, 1.0, 1.0], floor=1.5, window=3)
    assert index == 4
    assert status.below_floor_count == 3 and status.accept_length == 1.0


def test_gradual_decline_rolls_back_only_once_it_stays_below() -> None:
    values = [2.9, 2.5, 2.1, 1.7, 1.49, 1.45, 1.4, 1.3]
    index, _ = run(values, floor=1.5, window=3)
    assert index == 6


def test_noise_around_the_floor_never_rolls_back_while_a_good_scrape_interrupts() -> None:
    values = [1.4, 1.45, 1.6, 1.3, 1.2, 1.55, 1.4, 1.49, 1.5] * 5
    index, status = run(values, floor=1.5, window=3)
    assert index is None
    assert status.below_floor_count == 0  # the last scrape (1.5) is at the floor: not below


def test_failed_scrapes_neither_count_nor_reset() -> None:
    index, _ = run([1.2, None, 1.2, None, None, 1.2], floor=1.5, window=3)
    assert index == 5
    index, status = run([None] * 20, floor=1.5, window=3)
    assert index is None and status.below_floor_count == 0


def test_idle_server_stale_gauge_is_not_evidence() -> None:
    floor, window = 1.5, 2
    low = Sample(time="t0", accept_length=1.1, verify_calls=50.0, generated_tokens=60.0)
    v1 = observe(None, low, floor=floor, window=window)
    assert v1.evidence and v1.status.below_floor_count == 1
    same = Sample(time="t1", accept_length=1.1, verify_calls=50.0, generated_tokens=60.0)
    v2 = observe(v1.status, same, floor=floor, window=window, previous=low)
    assert not v2.evidence and not v2.drifted and v2.status.below_floor_count == 1
    moved = Sample(time="t2", accept_length=1.1, verify_calls=70.0, generated_tokens=82.0)
    v3 = observe(v2.status, moved, floor=floor, window=window, previous=same)
    assert v3.drifted


def test_an_adaptive_server_serving_without_drafting_is_not_evidence() -> None:
    """Load-aware speculation: at a batch size with steps 0, tokens are generated but no verify step runs; the
    accept-length gauge is the last drafted batch's and says nothing about the drafter now."""
    floor, window = 1.5, 1
    drafted = Sample(time="t0", accept_length=2.5, verify_calls=50.0, generated_tokens=130.0)
    first = observe(None, drafted, floor=floor, window=window)
    not_drafting = Sample(time="t1", accept_length=1.2, verify_calls=50.0, generated_tokens=9000.0)
    verdict = observe(first.status, not_drafting, floor=floor, window=window, previous=drafted)
    assert not verdict.evidence and not verdict.drifted
    # Without the verify-call counter, moving tokens still count (an older server that exports no counter).
    bare = observe(
        first.status,
        Sample(time="t2", accept_length=1.2, generated_tokens=9500.0),
        floor=floor,
        window=window,
        previous=Sample(time="t1", accept_length=2.5, generated_tokens=9000.0),
    )
    assert bare.evidence and bare.drifted


def test_impossible_values_below_one_are_not_evidence() -> None:
    v = observe(MonitorStatus(below_floor_count=2), Sample(time="t", accept_length=0.0), floor=1.5, window=3)
    assert not v.evidence and not v.drifted and v.status.below_floor_count == 2


def test_sample_from_metrics_reads_sglang_names() -> None:
    s = sample_from_metrics(
        {"sglang:spec_accept_length": 2.25, "sglang:gen_throughput": 812.0, "sglang:spec_verify_calls_total": 10, "sglang:generation_tokens": 31},
        "2026-01-01T00:00:00Z",
    )
    assert s.accept_length == 2.25 and s.throughput == 812.0 and s.verify_calls == 10 and s.generated_tokens == 31


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(st.one_of(st.none(), st.floats(min_value=1.0, max_value=4.0)), min_size=1, max_size=60),
    floor=st.floats(min_value=1.05, max_value=3.0),
    window=st.integers(min_value=1, max_value=6),
)
def test_rollback_exactly_when_the_window_rule_says(values, floor, window) -> None:
    """Reference: the first index where the last `window` evidence-carrying scrapes were all below the floor."""
    expected, run_length = None, 0
    for i, v in enumerate(values):
        if v is None:
            continue
        run_length = run_length + 1 if v < floor else 0
        if run_length >= window:
            expected = i
            break
    index, _ = run(values, floor=floor, window=window)
    assert index == expected
