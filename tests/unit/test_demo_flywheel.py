"""`make demo`'s retraining loop (issue 36, item 5): the training Job the operator renders for the flywheel's resource,
run with the demo's simulated execute (hack/flywheel_job.py) on records the real capture store wrote, publishes what
the operator's reader accepts; the slot's router finds the revision a rendered speculative server serves; the probe
script's figures come from the profiles (hack/demo_flywheel.py)."""

import json

import pytest

from hack import demo_flywheel as df
from hack import flywheel_job as fj
from hack.job_mapping import VolumeDirs
from hack.job_pod import run_containers
from specdec_operator import trainjob
from specdec_operator.api import SpeculativeServerStatus
from specdec_operator.capture.store import CaptureStore
from specdec_operator.engines import engine_for
from specdec_operator.manifests import ManifestSettings, pod_template
from specdec_operator.probe.datasets import parse_dataset
from specdec_operator.reconcile import revision
from specdec_operator.resource import parse_spec
from specdec_operator.simulator import revisions as rv

NS = "specdec-demo"
JOB = f"{df.NAME}-train-1"
ANNOTATIONS = {"specdec.test/init-exit-code": "0"}
WORKLOADS = [{"name": "chat", "concurrency": 1, "inputTokens": 128, "outputTokens": 64, "requests": 4}]


def spec():
    return parse_spec(df.resource(NS, "demo-class", ANNOTATIONS, WORKLOADS)["spec"], check_rules=True)


def capture(directory, kinds):
    """Records as `specdec capture` writes them: one chat request per kind in ``kinds``, oldest first."""
    store = CaptureStore(directory, writer="demo", max_bytes=1 << 24, retention_seconds=3600)
    for i, kind in enumerate(kinds):
        prompt = df.PROMPTS[kind][i % len(df.PROMPTS[kind])] + f" (request {i})"
        store.write({"endpoint": "chat", "model": "default", "messages": [{"role": "user", "content": prompt}]})
    store.close()


def run_job(tmp_path, kinds):
    """The operator's Job for the flywheel, its pod's containers run with SimulatedExecute; the runner's record."""
    s = spec()
    data = trainjob.TrainingData(capture_claim=f"{df.NAME}-capture", revisions_claim=f"{df.NAME}-revisions")
    job = trainjob.training_job(df.NAME, NS, "uid-1", s, s.retraining.training, data, 1, "Drift")
    assert job["metadata"]["name"] == JOB
    pod = {"metadata": {"name": f"{JOB}-x", "namespace": NS, "labels": {"job-name": JOB}}, "spec": job["spec"]["template"]["spec"]}
    root = tmp_path / "root"
    capture(root / "claims" / NS / f"{df.NAME}-capture", kinds)
    dirs = VolumeDirs(root, named={"model": tmp_path / "models"})
    return run_containers(pod, tmp_path / "work", dirs, fj.SimulatedExecute(delay=0)), root / "claims" / NS / f"{df.NAME}-revisions" / JOB


def as_pods(message):
    """The Job's pod as the API server returns it once the runner wrote the publish container's termination."""
    return [{"status": {"containerStatuses": [{"name": "publish", "state": {"terminated": {"exitCode": 0, "message": message}}}]}}]


def test_a_job_on_shifted_traffic_learns_code_and_passes_the_operator_s_offline_gate(tmp_path):
    record, published = run_job(tmp_path, ["chat"] * 40 + ["code"] * 80)
    assert record["outcome"] == "Succeeded", record
    assert [c["name"] for c in record["containers"]][-1] == "publish"
    # It learns the new kind and keeps the old one: half of maxSamples is the newest (code), half spread over the older
    # traffic (a third of it chat).
    assert json.loads((published / rv.REVISION_FILE).read_text())["trainedOn"] == ["code", "chat"]
    assert (published / "COMPLETE").is_file() and not list(published.parent.glob(".*partial"))
    message = json.loads(record["terminationMessage"])
    assert message["schema"] == 1 and message["revision"] == message["path"] == JOB
    assert message["heldout"] > 0 and message["trainSamples"] + message["heldout"] == fj.MAX_SAMPLES  # maxSamples in all
    # The held-out slice beside the revision (the operator's race reads it as a File workload), in the Chat format.
    assert len(parse_dataset((published / "heldout.jsonl").read_text(), source="heldout.jsonl", fmt="Chat")) == message["heldout"]
    assert message["offline"]["revision"]["acceptLength"] > message["offline"]["serving"]["acceptLength"]
    report = revision.read_report(as_pods(record["terminationMessage"]), JOB)
    assert not isinstance(report, str)
    assert revision.offline_gate(report, spec().retraining.training.min_acceptance_gain)[0] is None


def test_a_job_on_the_same_traffic_learns_nothing_new_and_loses_offline(tmp_path):
    """The retrained drafter that is not better: trained on chat again, equal offline, refused by the margin."""
    record, _ = run_job(tmp_path, ["chat"] * 80)
    report = revision.read_report(as_pods(record["terminationMessage"]), JOB)
    assert report.offline == report.serving_offline
    assert revision.offline_gate(report, spec().retraining.training.min_acceptance_gain)[0] == revision.BELOW_MARGIN


def test_a_job_without_captured_chat_fails_at_gather_with_exit_2(tmp_path):
    record, published = run_job(tmp_path, [])
    assert record["outcome"] == "Failed" and record["containers"][-1] == {**record["containers"][-1], "name": "gather", "exitCode": 2}
    assert not published.exists()


def test_the_router_finds_the_revision_a_rendered_speculative_server_serves():
    s = spec()
    status = SpeculativeServerStatus.model_validate({"retraining": {"serving": JOB, "revisions": [{"name": JOB, "outcome": "Promoted"}]}})
    served = revision.effective_spec(s, status, df.NAME)
    for drafter_spec, want in ((s, None), (served, JOB)):
        argv = engine_for(drafter_spec).render_argv(drafter_spec, "speculative")
        template = pod_template(df.NAME, drafter_spec, "speculative", argv, "r1", ManifestSettings())
        assert df.template_revision({"spec": {"template": template}}) == want
    assert df.template_revision(None) is None


def test_the_probe_script_follows_the_traffic_and_the_revision_races_as_its_candidate():
    chat_drafter, code_revision = fj.drafter(["chat"]), fj.drafter(["code"])
    before = df.script_entry(chat_drafter, {}, "chat")
    assert before["speedup"] > 2 and before["acceptLength"] == 2.8 and "arms" not in before
    after = df.script_entry(chat_drafter, {JOB: code_revision}, "code")
    assert after["speedup"] < 1 and after["acceptLength"] == rv.UNTRAINED_ACCEPT_LENGTH
    assert after["arms"] == {revision.candidate_name(JOB): {**before, "noise": 0.05}}


def test_the_script_entry_is_merged_into_the_races_script(tmp_path):
    path = tmp_path / "script.yaml"
    path.write_text("specdec-demo/race: {speedup: 1.5}\n")
    df.write_script_entry(path, f"{NS}/{df.NAME}", {"speedup": 2.0})
    import yaml

    assert yaml.safe_load(path.read_text()) == {"specdec-demo/race": {"speedup": 1.5}, f"{NS}/{df.NAME}": {"speedup": 2.0}}


@pytest.mark.parametrize(
    ("status", "want"),
    [
        (
            {
                "phase": "Promoted",
                "activeVariant": "speculative",
                "retraining": {"serving": JOB, "revisions": [{"name": JOB, "outcome": "Promoted"}]},
            },
            JOB,
        ),
        ({"phase": "Promoted", "activeVariant": "speculative", "retraining": {"revisions": [{"name": JOB, "outcome": "Racing"}]}}, None),
        ({"phase": "RolledBack", "activeVariant": "base", "retraining": {"serving": JOB, "revisions": [{"name": JOB, "outcome": "Promoted"}]}}, None),
    ],
)
def test_promoted_revision_needs_the_win_the_serving_and_the_stable_service(status, want):
    assert df.promoted_revision(status) == want
