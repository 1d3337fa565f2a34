"""The File prompt source's reader: its pod manifest, its judgement of the pod's status, and `specdec dataset-serve`
itself over real HTTP (a subprocess reading real files). The operator's side on a real control plane is
tests/cluster/test_datasets_volume_cluster.py."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from specdec_operator import manifests as m
from specdec_operator.api import Workload
from specdec_operator.cli import COMMANDS
from specdec_operator.controller.datasetreader import reader_state
from specdec_operator.errors import InputError
from specdec_operator.manifests import READER_MOUNT, READER_PORT, describe_file, reader_pod
from specdec_operator.probe.datasets import parse_dataset, to_jsonl
from specdec_operator.resource import parse_spec

ROOT = Path(__file__).resolve().parents[2]


def _spec(**extra: Any) -> Any:
    cr = yaml.safe_load((ROOT / "examples" / "llama31-8b-eagle3.yaml").read_text())
    cr["spec"].update(extra)
    return parse_spec(cr["spec"], check_rules=True)


def _workload(file: dict[str, Any] | None, source: str = "File", **prompts: Any) -> Workload:
    return Workload.model_validate(
        {"name": "team-chat", "concurrency": 1, "requests": 1, "prompts": {"source": source, **({"file": file} if file else {}), **prompts}}
    )


def test_the_reader_pod_mounts_the_model_volume_read_only_as_the_servers_do_and_asks_for_no_gpu():
    spec = _spec(nodeSelector={"pool": "h100"})
    settings = m.ManifestSettings(validator_image="registry.example/specdec-operator:9.9")
    w = _workload({"path": "datasets/chat.jsonl"}, format="Chat")
    pod = reader_pod("llama31-8b", "team-a", "uid-1234", w, spec, settings)
    assert pod["metadata"]["name"] == "llama31-8b-dataset-team-chat" and pod["metadata"]["namespace"] == "team-a"
    owner = pod["metadata"]["ownerReferences"][0]
    assert owner["uid"] == "uid-1234" and owner["kind"] == "SpeculativeServer" and owner["name"] == "llama31-8b" and owner["controller"]
    pod_spec = pod["spec"]
    # The same volume source the servers mount (here the example's hostPath), mounted read-only.
    server = m.pod_template("llama31-8b", spec, "base", ["sglang"], "r1", settings)["spec"]
    server_volume = next(v for v in server["volumes"] if v["name"] == m.MODEL_VOLUME)
    (volume,) = pod_spec["volumes"]
    assert {k: v for k, v in volume.items() if k != "name"} == {k: v for k, v in server_volume.items() if k != "name"}
    (container,) = pod_spec["containers"]
    assert container["volumeMounts"] == [{"name": volume["name"], "mountPath": READER_MOUNT, "readOnly": True}]
    assert container["image"] == "registry.example/specdec-operator:9.9"
    assert container["command"][:2] == ["specdec", "dataset-serve"] and "dataset-serve" in COMMANDS
    args = container["command"]
    assert args[args.index("--file") + 1] == f"{READER_MOUNT}/datasets/chat.jsonl"
    assert args[args.index("--format") + 1] == "Chat"
    assert args[args.index("--source") + 1] == "dataset file datasets/chat.jsonl on the model volume"
    assert args[args.index("--port") + 1] == str(READER_PORT)
    assert m.GPU_RESOURCE not in json.dumps(container["resources"])
    assert container["resources"]["limits"]["memory"] == "1Gi"
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] and security["runAsNonRoot"] and not security["allowPrivilegeEscalation"]
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert pod_spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod_spec["automountServiceAccountToken"] is False and pod_spec["restartPolicy"] == "Never"
    # Where the servers run (a hostPath exists on those nodes): their node selector and GPU family affinity.
    assert pod_spec["nodeSelector"] == {"pool": "h100"} and pod_spec["affinity"] == server["affinity"]
    # Never taken for a server pod: not in the fleet selector (HPA) nor in the operator's managed-pod index.
    labels = pod["metadata"]["labels"]
    selector = dict(kv.split("=") for kv in m.fleet_selector("llama31-8b").split(","))
    assert not selector.items() <= labels.items()
    assert m.LABEL_MANAGED_BY not in labels


def test_the_reader_pod_of_a_claim_mounts_that_claim_read_only_and_names_it():
    w = _workload({"path": "prompts.jsonl", "claimName": "team-data"})
    pod = reader_pod("llama31-8b", "team-a", "u", w, _spec(), m.ManifestSettings())
    assert pod["spec"]["volumes"][0]["persistentVolumeClaim"] == {"claimName": "team-data", "readOnly": True}
    assert describe_file(w) == "dataset file prompts.jsonl on claim team-data"
    with pytest.raises(ValueError, match="not File"):
        reader_pod("llama31-8b", "team-a", "u", _workload(None, source="Default"), _spec(), m.ManifestSettings())


@pytest.mark.parametrize(
    "prompts, problem",
    [
        ({"source": "File"}, "prompts.file is required with source File"),
        ({"source": "Default", "file": {"path": "a.jsonl"}}, "prompts.file is required with source File"),
        ({"source": "File", "file": {"path": "../etc/passwd"}}, "'..'"),
    ],
)
def test_the_api_refuses_a_file_source_without_a_file_a_file_elsewhere_and_dotdot(prompts, problem):
    workloads = [{"name": "w", "concurrency": 1, "requests": 1, "prompts": prompts}]
    with pytest.raises(InputError, match=problem):
        _spec(rollout={"workloads": workloads})


@pytest.mark.parametrize("path", ["/etc/passwd", "chat\nline.jsonl"])
def test_an_absolute_path_or_one_with_control_characters_is_refused(path):
    workloads = [{"name": "w", "concurrency": 1, "requests": 1, "prompts": {"source": "File", "file": {"path": path}}}]
    with pytest.raises(InputError, match="file.path"):
        _spec(rollout={"workloads": workloads})


def _pod(**status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "x-dataset-team-chat"}, "status": status}


def test_the_pods_status_is_judged_ready_waiting_or_failed_with_a_message_naming_the_claim():
    w = _workload({"path": "p.jsonl", "claimName": "team-data"})
    assert reader_state(None, w, "ns")[0] == "waiting"
    missing = _pod(
        phase="Pending",
        conditions=[
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": '0/3 nodes are available: persistentvolumeclaim "team-data" not found. preemption: 0/3 nodes are available.',
            }
        ],
    )
    state, message = reader_state(missing, w, "ns")
    assert state == "failed" and "PersistentVolumeClaim ns/team-data not found" in message and "p.jsonl" in message
    unbound = _pod(
        phase="Pending",
        conditions=[{"type": "PodScheduled", "status": "False", "message": "pod has unbound immediate PersistentVolumeClaims"}],
    )
    state, message = reader_state(unbound, w, "ns")
    assert state == "waiting" and "unbound" in message
    pulling = _pod(phase="Pending", containerStatuses=[{"state": {"waiting": {"reason": "ImagePullBackOff", "message": "not found"}}}])
    assert reader_state(pulling, w, "ns") == ("waiting", "container ImagePullBackOff: not found")
    ended = _pod(phase="Failed", containerStatuses=[{"state": {"terminated": {"reason": "OOMKilled"}}}])
    state, message = reader_state(ended, w, "ns")
    assert state == "failed" and "OOMKilled" in message and "\n" not in message
    ready = _pod(phase="Running", podIP="10.0.0.7", conditions=[{"type": "Ready", "status": "True"}])
    assert reader_state(ready, w, "ns")[0] == "ready"


# --- `specdec dataset-serve`, a real process over real HTTP


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read().decode()


@pytest.fixture
def serve(tmp_path: Path):
    procs: list[subprocess.Popen] = []

    def start(path: Path, *extra: str) -> str:
        port = _free_port()
        cmd = [sys.executable, "-m", "specdec_operator.cli", "dataset-serve", "--file", str(path), "--host", "127.0.0.1", "--port", str(port), *extra]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if _get(url + "/health")[0] == 200:
                    return url
            except OSError:
                time.sleep(0.1)
        proc.kill()
        raise AssertionError(f"dataset-serve did not listen: {proc.communicate()[0]!r}")

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(10)


def test_dataset_serve_serves_the_normalised_prompts_of_each_format(serve, tmp_path: Path):
    sharegpt = tmp_path / "sharegpt.json"
    sharegpt.write_text(
        json.dumps(
            [
                {"conversations": [{"from": "human", "value": "Explain TCP."}, {"from": "gpt", "value": "TCP is..."}]},
                {"conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "Sort [3, 1]."}]},
            ]
        )
    )
    url = serve(sharegpt, "--format", "ShareGPT")
    status, kind, body = _get(url + "/dataset")
    assert status == 200 and kind.startswith("application/x-ndjson")
    expected = parse_dataset(sharegpt.read_text(), source="x", fmt="ShareGPT")
    assert body == to_jsonl(expected)
    # The normalised form parses back to the same prompts (what the operator does with it).
    assert parse_dataset(body, source="y") == expected
    assert json.loads(body.splitlines()[0]) == {"messages": [{"role": "user", "content": "Explain TCP."}]}
    assert json.loads(_get(url + "/health")[2]) == {"read": True, "valid": True, "prompts": 2}


def test_dataset_serve_answers_a_malformed_line_or_a_missing_file_with_one_line_naming_the_source(serve, tmp_path: Path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "fine"}\n\n{"prompt": "cut off\n')
    url = serve(bad, "--source", "dataset file chat/bad.jsonl on claim team-data")
    status, kind, body = _get(url + "/dataset")
    assert status == 422 and kind.startswith("text/plain")
    assert body.startswith("dataset file chat/bad.jsonl on claim team-data line 3: not JSON") and "\n" not in body
    assert json.loads(_get(url + "/health")[2])["valid"] is False  # Ready all the same: the verdict is the answer

    url = serve(tmp_path / "absent.jsonl", "--source", "dataset file absent.jsonl on the model volume")
    status, _, body = _get(url + "/dataset")
    assert (
        status == 422 and body == "dataset file absent.jsonl on the model volume: no such file; check the path (it is relative to the volume's root)"
    )

    url = serve(tmp_path)  # a directory
    status, _, body = _get(url + "/dataset")
    assert status == 422 and "is a directory" in body


def test_dataset_serve_with_an_unknown_format_is_a_usage_error_not_a_traceback(tmp_path: Path):
    done = subprocess.run(
        [sys.executable, "-m", "specdec_operator.cli", "dataset-serve", "--file", str(tmp_path / "x"), "--format", "Csv"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "invalid choice: 'Csv'" in done.stderr and "Traceback" not in done.stderr


def test_the_local_probe_still_reads_a_dataset_file(tmp_path: Path):
    from specdec_operator.probe.datasets import load_dataset_file

    path = tmp_path / "p.jsonl"
    path.write_text(to_jsonl(parse_dataset('{"prompt": "a"}\n{"prompt": "b"}\n', source="s")))
    assert [p.text for p in load_dataset_file(path)] == ["a", "b"]
    with pytest.raises(InputError, match=f"dataset {tmp_path}/none.jsonl: no such file"):
        load_dataset_file(tmp_path / "none.jsonl")
