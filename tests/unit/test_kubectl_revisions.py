"""`kubectl specdec revisions` (cli/kubectl_revisions.py): the table of a resource's drafter revisions from its
status as a dict, the serving and pinned marks, and the patch --pin prints (issue 36, item 4)."""

import argparse
import json

import pytest
import yaml

from specdec_operator.cli import kubectl_revisions as kr
from specdec_operator.cli.kubectl_specdec import build_parser, main, show_revisions

SPEC = {"drafter": {"path": "eagle3/llama31-8b-chat"}, "retraining": {"training": {}}}


def row(n: int, outcome: str, **figures) -> dict:
    base = {"name": f"llama-train-{n}", "createdAt": f"2026-12-07T0{n}:10:00Z", "trigger": "Drift", "heldout": 40, "outcome": outcome}
    return {**base, **figures}


STATUS = {
    "phase": "Promoted",
    "retraining": {
        "serving": "llama-train-2",
        "revisions": [
            row(1, "Lost", offlineAcceptLength=2.9, servingOfflineAcceptLength=1.4, acceptLength=2.1, speedup=0.97, reason="SpeedupBelowThreshold"),
            row(2, "Promoted", offlineAcceptLength=3.1, servingOfflineAcceptLength=1.4, acceptLength=3.0, speedup=1.85, reason="SpeedupConfirmed"),
            row(3, "Pruned", reason="MaxRevisions"),
            {"name": "llama-train-4", "outcome": "Evaluated"},  # a row the operator wrote only part of
        ],
    },
}


def lines_of(table: str) -> dict[str, str]:
    """Each table line keyed by its revision column."""
    out = {}
    for line in table.splitlines():
        parts = line[3:].split()
        if parts and (parts[0] == kr.DRAFTER or parts[0].startswith("llama-train-")):
            out[parts[0]] = line
    return out


def test_the_table_lists_every_revision_with_its_figures_and_marks_the_serving_one():
    table = kr.revisions_table("llama", SPEC, STATUS)
    rows = lines_of(table)
    assert list(rows) == ["drafter", "llama-train-1", "llama-train-2", "llama-train-3", "llama-train-4"]
    assert rows["llama-train-2"].startswith("* ") and not rows["drafter"].startswith("*")
    assert rows["llama-train-2"].split()[1:] == [
        "llama-train-2",
        "2026-12-07",
        "02:10",
        "Drift",
        "3.10/1.40",
        "3.00",
        "1.85x",
        "Promoted",
        "SpeedupConfirmed",
    ]
    assert rows["llama-train-1"].split()[-4:] == ["2.10", "0.97x", "Lost", "SpeedupBelowThreshold"]
    assert rows["llama-train-4"][3:].split() == ["llama-train-4", "-", "-", "-", "-", "-", "Evaluated", "-"]
    assert "eagle3/llama31-8b-chat" in rows["drafter"]
    assert "P pinned: none; the operator chooses" in table


def test_the_pinned_revision_is_marked_and_spec_drafter_serves_when_serving_is_unset():
    spec = {**SPEC, "retraining": {"revision": "llama-train-1"}}
    status = {"retraining": {"revisions": STATUS["retraining"]["revisions"]}}  # serving unset: spec.drafter
    rows = lines_of(kr.revisions_table("llama", spec, status))
    assert rows["drafter"].startswith("* ") and rows["llama-train-1"].startswith("P ")
    both = lines_of(kr.revisions_table("llama", {**SPEC, "retraining": {"revision": "llama-train-2"}}, STATUS))
    assert both["llama-train-2"].startswith("*P")


def test_a_status_without_revisions_prints_an_empty_table():
    table = kr.revisions_table("llama", {}, {})
    assert "0 trained revision(s)" in table and list(lines_of(table)) == ["drafter"]
    assert kr.revision_rows({"retraining": {"revisions": "garbage"}}) == []


def test_a_pin_not_among_the_recorded_revisions_is_flagged_with_the_operator_s_words():
    table = kr.revisions_table("llama", {"retraining": {"revision": "llama-train-9"}}, STATUS)
    assert "P pinned: llama-train-9 (spec.retraining.revision, from Git) (not among the recorded revisions" in table
    refused = {"retraining": {**STATUS["retraining"], "pinRefused": "spec.retraining.revision 'llama-train-9' is not a revision"}}
    assert "  not honoured: spec.retraining.revision 'llama-train-9' is not a revision" in kr.revisions_table("llama", {}, refused)


def fragment(text: str) -> dict:
    """The manifest change --pin prints, parsed as YAML."""
    block = text.split("in Git:\n\n", 1)[1].split("\n\n", 1)[0]
    return yaml.safe_load("\n".join(line[2:] for line in block.splitlines()))


def test_pin_prints_the_manifest_change_the_merge_patch_and_the_kubectl_patch_line():
    text = kr.pin_instructions("llama", "inference", "llama-train-2", STATUS)
    assert fragment(text) == {"spec": {"retraining": {"revision": "llama-train-2"}}}
    merge = text.split("JSON merge patch:\n", 1)[1].splitlines()[0].strip()
    assert json.loads(merge) == {"spec": {"retraining": {"revision": "llama-train-2"}}}
    command = next(line.strip() for line in text.splitlines() if line.strip().startswith("kubectl patch"))
    assert (
        command
        == """kubectl patch speculativeservers.specdec.io llama -n inference --type merge -p '{"spec":{"retraining":{"revision":"llama-train-2"}}}'"""
    )
    assert "outcome Promoted, live acceptance 3.00, speedup 1.85x" in text
    assert "Nothing was changed" in text


def test_pin_the_drafter_unpin_and_a_lost_revision():
    assert fragment(kr.pin_instructions("llama", "ns", "drafter", STATUS)) == {"spec": {"retraining": {"revision": "drafter"}}}
    unpin = kr.pin_instructions("llama", "ns", None, STATUS)
    assert fragment(unpin) == {"spec": {"retraining": {"revision": None}}}
    assert json.loads(unpin.split("JSON merge patch:\n", 1)[1].splitlines()[0]) == {"spec": {"retraining": {"revision": None}}}
    lost = kr.pin_instructions("llama", "ns", "llama-train-1", STATUS)
    assert "lost its race (SpeedupBelowThreshold)" in lost


@pytest.mark.parametrize(
    ("revision", "says"),
    [
        ("llama-train-3", "its outcome is Pruned"),
        ("llama-train-9", "no such revision in status.retraining.revisions; one of: drafter, llama-train-1"),
    ],
)
def test_pin_refuses_a_revision_that_cannot_serve(revision, says):
    with pytest.raises(kr.PinRefused, match=says):
        kr.pin_instructions("llama", "ns", revision, STATUS)


def test_the_verb_prints_and_refuses_without_writing(capsys):
    obj = {"spec": SPEC, "status": STATUS}
    args = build_parser().parse_args(["revisions", "llama", "--pin", "llama-train-2"])
    assert show_revisions(args, "inference", obj) == 0
    assert "revision: llama-train-2" in capsys.readouterr().out
    assert show_revisions(argparse.Namespace(name="llama", pin="llama-train-3", unpin=False), "ns", obj) == 1
    assert capsys.readouterr().err.startswith("kubectl specdec revisions: error: --pin llama-train-3: its outcome is Pruned")
    assert show_revisions(build_parser().parse_args(["revisions", "llama"]), "ns", obj) == 0
    assert "llama-train-4" in capsys.readouterr().out


def test_pin_belongs_to_the_revisions_verb(capsys):
    assert main(["status", "llama", "--pin", "llama-train-2"]) == 2
    assert "--pin and --unpin belong to `kubectl specdec revisions`" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        build_parser().parse_args(["revisions", "llama", "--pin", "x", "--unpin"])


def test_the_rows_here_are_the_api_s_shape():
    """The status this file prints is what the API accepts (api_retraining_job.RevisionStatus): the names agree."""
    from specdec_operator.api_retraining import RetrainingStatus

    parsed = RetrainingStatus.model_validate(STATUS["retraining"])
    assert parsed.serving == "llama-train-2" and [r.outcome for r in parsed.revisions or []] == ["Lost", "Promoted", "Pruned", "Evaluated"]
    assert parsed.model_dump(by_alias=True, exclude_none=True)["revisions"][1] == STATUS["retraining"]["revisions"][1]
