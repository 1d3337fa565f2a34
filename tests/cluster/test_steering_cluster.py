"""`kubectl specdec` against the real API server: each verb patches the annotations the operator reads, and kubectl
finds the installed plugin on PATH."""

import copy
import os
import subprocess
import sys

import pytest

from specdec_operator import API_GROUP, API_VERSION, KIND, PLURAL, steering
from specdec_operator.cli.kubectl_specdec import main

pytestmark = pytest.mark.cluster


def test_the_plugin_steers_a_real_object_and_prints_its_status(kube_env, custom_objects, namespace, capsys, monkeypatch):
    """Each verb's annotations, read back as the operator reads them."""
    for key, value in kube_env.items():
        monkeypatch.setenv(key, value)
    spec = {
        "image": "lmsysorg/sglang:v0.5.23-cu130",
        "model": {"volume": {"hostPath": {"path": "/models"}}},
        "target": {"path": "meta-llama/Llama-3.1-8B-Instruct"},
        "drafter": {"path": "eagle3/llama"},
    }
    body = {"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": KIND, "metadata": {"name": "steer"}, "spec": copy.deepcopy(spec)}
    custom_objects.create_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, body)

    def annotations():
        obj = custom_objects.get_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, "steer")
        return obj["metadata"].get("annotations") or {}

    assert main(["abort", "steer", "-n", namespace, "--reason", "p99 latency regression"]) == 0
    assert steering.read(annotations()).abort == "p99 latency regression"
    assert main(["promote", "steer", "-n", namespace, "--reason", "measured by hand on the canary"]) == 0
    asked = steering.read(annotations())
    assert asked.promote == "measured by hand on the canary" and asked.abort is None
    # One server takes no walk steps: pause says it would do nothing there and writes nothing (issue 34).
    capsys.readouterr()
    assert main(["pause", "steer", "-n", namespace]) == 1 and not steering.read(annotations()).paused
    assert "does nothing to one server" in capsys.readouterr().err
    custom_objects.patch_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, "steer", {"spec": {"replicas": 2}})
    assert main(["pause", "steer", "-n", namespace]) == 0 and steering.read(annotations()).paused
    assert main(["retry", "steer", "-n", namespace]) == 0
    token = annotations()[steering.RETRY]
    assert steering.read(annotations()).retry == token and steering.read(annotations(), retried=token).retry is None
    assert main(["resume", "steer", "-n", namespace]) == 0
    assert set(annotations()) == {steering.RETRY}
    capsys.readouterr()
    assert main(["status", "steer", "-n", namespace]) == 0
    assert "steer:" in capsys.readouterr().out
    assert main(["status", "missing", "-n", namespace]) == 1
    assert "404" in capsys.readouterr().err

    # kubectl itself finds the installed `kubectl-specdec` on PATH (the package's console script) as a plugin.
    env = {**kube_env, "PATH": os.pathsep.join([os.path.dirname(sys.executable), kube_env.get("PATH", "")])}
    plugins = subprocess.run(["kubectl", "plugin", "list"], env=env, capture_output=True, text=True)
    assert "kubectl-specdec" in plugins.stdout, plugins.stdout + plugins.stderr
    shown = subprocess.run(["kubectl", "specdec", "status", "steer", "-n", namespace], env=env, capture_output=True, text=True)
    assert shown.returncode == 0 and "steer:" in shown.stdout, shown.stderr
