"""Steering by hand: the annotations (steering.py) and `kubectl specdec` (kubectl_specdec.py)."""

from datetime import UTC, datetime

import pytest

from specdec_operator import steering
from specdec_operator.api import SpeculativeServerStatus, WorkloadResult
from specdec_operator.cli.kubectl_specdec import annotation_patch, curve_measurement, describe, draw_curve, main


def test_nothing_asked():
    asked = steering.read({"unrelated": "x"})
    assert asked == steering.Steering() and not asked.any


def test_retry_is_one_shot_per_token():
    assert steering.read({steering.RETRY: "t1"}).retry == "t1"
    assert steering.read({steering.RETRY: "t1"}, retried="t1").retry is None
    assert steering.read({steering.RETRY: "t2"}, retried="t1").retry == "t2"


def test_abort_wins_over_promote_and_reasons_are_one_bounded_line():
    asked = steering.read({steering.ABORT: "latency\nregression", steering.PROMOTE: "trust me"})
    assert asked.abort == "latency regression" and asked.promote is None
    assert steering.read({steering.PROMOTE: ""}).promote == "promoted by hand"
    assert len(steering.read({steering.PROMOTE: "x" * 1000}).promote or "") == steering.MAX_REASON


@pytest.mark.parametrize(("value", "paused"), [("true", True), ("yes", True), ("false", False), ("", False), ("0", False)])
def test_paused_values(value, paused):
    assert steering.read({steering.PAUSED: value}).paused is paused


def test_patches_each_verb_asks_for():
    now = datetime(2026, 12, 4, 10, 0, tzinfo=UTC)
    assert annotation_patch("retry", now=now) == {"metadata": {"annotations": {steering.RETRY: "2026-12-04T10:00:00.000000Z"}}}
    assert annotation_patch("abort", "slow") == {"metadata": {"annotations": {steering.ABORT: "slow", steering.PROMOTE: None}}}
    assert annotation_patch("promote", "ok") == {"metadata": {"annotations": {steering.PROMOTE: "ok", steering.ABORT: None}}}
    assert annotation_patch("pause") == {"metadata": {"annotations": {steering.PAUSED: "true"}}}
    assert annotation_patch("resume")["metadata"]["annotations"] == {steering.PAUSED: None, steering.ABORT: None, steering.PROMOTE: None}
    # What the patch asks for is what the operator reads back.
    annotations = {k: v for k, v in annotation_patch("promote", "ok")["metadata"]["annotations"].items() if v is not None}
    assert steering.read(annotations).promote == "ok"


def workload(name, concurrency, speedup, low, high):
    return WorkloadResult.model_validate({"name": name, "concurrency": concurrency, "speedup": speedup, "speedupLow": low, "speedupHigh": high})


def test_curve_draws_points_intervals_the_one_line_and_the_break_even():
    points = [workload("c1", 1, 1.8, 1.7, 1.9), workload("c16", 16, 1.2, 1.1, 1.3), workload("c128", 128, 0.5, 0.4, 0.6)]
    text = draw_curve(points, break_even=40.0)
    rows = text.splitlines()
    assert any(r.startswith(" 1.00x") and "-" in r and "X" in r for r in rows), text
    assert sum(r.count("o") for r in rows[:-2]) == 3
    assert "|" in text
    # The highest point is in an upper row, the lowest in a lower one; the axis names the concurrencies.
    first_o = [i for i, r in enumerate(rows) if "o" in r[7:]]
    assert first_o[0] < first_o[-1]
    assert "128" in rows[-2] and "16" in rows[-2]


def test_curve_without_points():
    assert draw_curve([workload("w", 1, None, None, None)]) == "(no measured workloads)"


def test_status_text_prefers_the_plain_probe_of_a_load_aware_decision():
    status = SpeculativeServerStatus.model_validate(
        {
            "phase": "Promoted",
            "reason": "LoadAwareSpeedup",
            "activeVariant": "speculative",
            "probe": {
                "decision": "promote",
                "reason": "LoadAwareSpeedup",
                "speedup": 1.01,
                "revision": "r1",
                "workloads": [{"name": "adaptive", "concurrency": 8, "speedup": 1.01}],
                "loadAware": {
                    "plainProbe": {
                        "workloads": [
                            {"name": "interactive", "concurrency": 1, "speedup": 1.6, "speedupLow": 1.5, "speedupHigh": 1.7},
                            {"name": "batch", "concurrency": 64, "speedup": 0.7, "speedupLow": 0.6, "speedupHigh": 0.8},
                        ],
                        "breakEven": {"concurrency": 24.0, "summary": "24 [16, 40]"},
                    }
                },
            },
        }
    )
    measurement = curve_measurement(status)
    assert measurement is not None and [w.name for w in measurement.workloads or []] == ["interactive", "batch"]
    text = describe("demo", status, {steering.PAUSED: "true"})
    assert "demo: Promoted (LoadAwareSpeedup), serving speculative" in text
    assert "by hand: specdec.io/paused=true (paused)" in text
    assert "break-even concurrency: 24 [16, 40]" in text
    assert "[1.50, 1.70]" in text


def test_status_text_before_a_probe():
    assert "no speedup measured yet" in describe("demo", SpeculativeServerStatus.model_validate({"phase": "Validating"}), {})


def test_promote_without_a_reason_is_refused_before_any_api_call(capsys):
    assert main(["promote", "demo"]) == 2
    assert "--reason is required" in capsys.readouterr().err


def test_missing_kubeconfig_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    assert main(["retry", "demo"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot load the kubeconfig" in err
