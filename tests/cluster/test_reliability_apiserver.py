"""API server faults: kube-apiserver and etcd restarted under a running operator; expired watches (410 Gone).

The session's local control plane is restarted component by component (hack/devcluster `restart`; etcd keeps
its data). The operator process must survive every fault, reconnect its watches and converge: resources created
or edited after the fault are reconciled to a decision, and nothing decided before the fault is decided again.

410 Gone: etcd is compacted to its current revision and the API server restarted, so its watch cache starts empty
at the newest revision and every watch resumed from an older resourceVersion is answered 410 (the test shows that
with a watch of its own). Kopf must relist instead of stalling.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from hack import devcluster
from tests.support.operator_process import (
    GROUP,
    LLAMA_EAGLE3_SCRIPT,
    PLURAL,
    VERSION,
    compatible_annotations,
    event_reasons,
    example,
    status,
    wait_phase,
)
from tests.support.operator_replicas import DECIDED, Cluster

pytestmark = pytest.mark.cluster


def cluster_name(kube_cluster: Any) -> str:
    """The devcluster name of the session's cluster (also when reused through SPECDEC_KUBECONFIG)."""
    if kube_cluster.name != "external":
        return kube_cluster.name
    directory = Path(kube_cluster.directory)
    if devcluster.cluster_dir(directory.name) == directory and devcluster.status(directory.name).get("state") == "up":
        return directory.name
    pytest.skip("the cluster from SPECDEC_KUBECONFIG is not a devcluster this test can restart")


def etcd_url(name: str) -> str:
    return f"http://127.0.0.1:{json.loads((devcluster.cluster_dir(name) / 'state.json').read_text())['ports']['etcd']}"


def etcd_call(name: str, path: str, body: dict) -> dict:
    """etcd's v3 JSON gateway (the same API etcdctl speaks over gRPC)."""
    request = urllib.request.Request(etcd_url(name) + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as resp:
        return json.loads(resp.read())


def decide(c: Cluster, name: str) -> dict:
    # Decided on scripted evidence (LLAMA_EAGLE3_SCRIPT): these tests are about an operator surviving API faults, not
    # about measuring, so a busy machine (the restarts' own load included) cannot turn a decision Inconclusive.
    c.script(name, **LLAMA_EAGLE3_SCRIPT)
    c.create(example("llama31-8b-eagle3.yaml", name, c.namespace, annotations=compatible_annotations()))
    return wait_phase(c.custom, c.namespace, name, DECIDED, timeout=120)


def test_apiserver_and_etcd_restarts_under_the_operator_it_reconnects_and_converges(cluster: Cluster, kube_cluster: Any) -> None:
    name = cluster_name(kube_cluster)
    for resource in ("before", "after-apiserver", "after-etcd"):
        cluster.serve(resource)
    op = cluster.replica()
    op.start()
    assert decide(cluster, "before")["phase"] == "Promoted"

    devcluster.restart(name, ["kube-apiserver"], down_seconds=5)
    assert op.proc.poll() is None, "the operator exited while the API server was down"
    # Watches work again: a new resource is reconciled, an edit of the decided one is observed and changes nothing.
    assert decide(cluster, "after-apiserver")["phase"] == "Promoted"
    cluster.custom.patch_namespaced_custom_object(GROUP, VERSION, cluster.namespace, PLURAL, "before", {"spec": {"monitor": {"window": 9}}})
    deadline = time.monotonic() + 30
    while status(cluster.custom, cluster.namespace, "before").get("observedGeneration") != 2:
        assert time.monotonic() < deadline, "the edit made after the API server restart was never observed"
        time.sleep(0.2)

    devcluster.restart(name, ["etcd"], down_seconds=5)
    assert op.proc.poll() is None, "the operator exited while etcd was down"
    assert decide(cluster, "after-etcd")["phase"] == "Promoted"

    for resource in ("before", "after-apiserver", "after-etcd"):
        reasons = event_reasons(cluster.core, cluster.namespace, resource)
        assert reasons.count("ProbeStarted") == 1 and reasons.count("SpeedupConfirmed") == 1, (resource, reasons)
        assert status(cluster.custom, cluster.namespace, resource)["phase"] == "Promoted"
    assert sorted(d.metadata.name for d in cluster.apps.list_namespaced_deployment(cluster.namespace).items) == sorted(
        f"{r}-{v}" for r in ("before", "after-apiserver", "after-etcd") for v in ("base", "spec")
    )
    assert op.proc.poll() is None


def test_expired_watches_410_gone_are_relisted(cluster: Cluster, kube_cluster: Any) -> None:
    from kubernetes import client

    name = cluster_name(kube_cluster)
    for resource in ("early", "late"):
        cluster.serve(resource)
    op = cluster.replica()
    op.start()
    assert decide(cluster, "early")["phase"] == "Promoted"
    custom = client.CustomObjectsApi(cluster.custom.api_client)
    stale = custom.list_namespaced_custom_object(GROUP, VERSION, cluster.namespace, PLURAL)["metadata"]["resourceVersion"]
    # Move history on, then compact it away and restart the API server (its watch cache starts empty).
    cluster.custom.patch_namespaced_custom_object(GROUP, VERSION, cluster.namespace, PLURAL, "early", {"metadata": {"labels": {"touched": "yes"}}})
    revision = int(etcd_call(name, "/v3/kv/range", {"key": base64.b64encode(b"/").decode()})["header"]["revision"])
    etcd_call(name, "/v3/kv/compaction", {"revision": str(revision), "physical": True})
    devcluster.restart(name, ["kube-apiserver"], down_seconds=2)

    # The condition the operator faces: a watch from the old resourceVersion is answered 410 Gone.
    response = custom.list_namespaced_custom_object(
        GROUP, VERSION, cluster.namespace, PLURAL, watch=True, resource_version=stale, timeout_seconds=5, _preload_content=False, _request_timeout=15
    )
    first = json.loads(next(line for line in response.data.decode().splitlines() if line.strip()))
    assert first["type"] == "ERROR" and first["object"]["code"] == 410, first

    assert op.proc.poll() is None
    assert decide(cluster, "late")["phase"] == "Promoted"
    reasons = event_reasons(cluster.core, cluster.namespace, "early")
    assert reasons.count("ProbeStarted") == 1 and status(cluster.custom, cluster.namespace, "early")["phase"] == "Promoted"
