"""Each stuck cause on the real node, as a kubelet shows it (issue 25): a hostPath `type: Directory` that does not
exist, an image that cannot be pulled (the server's, and the validator's), a server that exits at start (the
speculative one, and the base), a pod that cannot be scheduled. Each ends with its named reason in status (the condition's reason and waitingFor), and,
with spec.progressDeadlineSeconds 60, in its outcome: phase Failed with ProgressDeadlineExceeded where the base
itself waits, RolledBack where only the speculative side waits, with the base still answering HTTP through its
stable Service.

The six SpeculativeServers run side by side on one cluster for the module (tests/support/stuck_causes.py: the
cluster, the simulator image, the two operators, the recorder); the module's wall time is one deadline and the
set-up. Like test_realnode_e2e.py these tests are required on a machine that can run real containers, and
SPECDEC_SKIP_REAL_NODE=1 skips them explicitly.
"""

from __future__ import annotations

import os
import shutil
import time
from typing import Any

import pytest

from hack import devcluster
from tests.support import stuck_causes as sc

pytestmark = [pytest.mark.cluster, pytest.mark.realnode, pytest.mark.timeout(1800), pytest.mark.xdist_group("realnode")]

TIMINGS: dict[str, float] = {}


@pytest.fixture(scope="module")
def node_cluster() -> Any:
    if os.environ.get("SPECDEC_SKIP_REAL_NODE") == "1":
        pytest.skip("SPECDEC_SKIP_REAL_NODE=1: real-node tests skipped on request")
    name = f"pytest-stuck-{os.getpid()}"
    try:
        cluster, timings = sc.start_real_node(name, log=lambda m: print(m))
    except sc.SetupError as error:
        pytest.fail(f"{error} (the real-node tests are required in CI; SPECDEC_SKIP_REAL_NODE=1 skips them elsewhere)", pytrace=False)
    TIMINGS.update(timings)
    try:
        yield cluster
    finally:
        started = time.monotonic()
        devcluster.down(name, purge=True)
        TIMINGS["down"] = time.monotonic() - started
        print("\nreal-node stuck-cause timings:\n" + "\n".join(f"  {k}: {v:.1f}s" for k, v in TIMINGS.items()))


@pytest.fixture(scope="module")
def api(node_cluster: Any) -> Any:
    from kubernetes import client, config

    api_client = config.new_client_from_config(config_file=str(node_cluster.kubeconfig))
    yield {"core": client.CoreV1Api(api_client), "custom": client.CustomObjectsApi(api_client)}
    api_client.close()


@pytest.fixture(scope="module")
def seen(node_cluster: Any, api: Any, tmp_path_factory: Any) -> Any:
    """Every cause applied at once; what status said, and when, until each wait ended (or 240 s)."""
    models, absent = sc.models_dir()
    ops = sc.operators(str(node_cluster.kubeconfig), tmp_path_factory.mktemp("operators"))
    for namespace in ops:
        api["core"].create_namespace({"metadata": {"name": namespace}})
    for namespace in ops:
        deadline = time.monotonic() + 30
        while not api["core"].list_namespaced_service_account(namespace).items and time.monotonic() < deadline:
            time.sleep(0.2)
    for op in ops.values():
        op.start()
    causes = list(sc.CAUSES)
    try:
        started = time.monotonic()
        result = sc.apply_and_record(api["custom"], causes, [sc.server_cr(c, models, absent) for c in causes])
        TIMINGS["apply -> every wait ended"] = time.monotonic() - started
        yield result
    finally:
        for op in ops.values():
            op.stop()
        if os.environ.get("SPECDEC_E2E_LOGS"):
            print("\n".join(op.logs() for op in ops.values()))
        shutil.rmtree(models, ignore_errors=True)


def _id(cause: sc.Cause) -> str:
    return f"{cause.name}-{cause.reason}"


@pytest.mark.parametrize("cause", sc.CAUSES, ids=_id)
def test_the_cause_is_named_in_status_and_the_wait_ends_at_the_deadline(seen: Any, api: Any, cause: sc.Cause) -> None:
    record = seen[cause.name]
    assert record.reason_at is not None, f"{cause.condition} never had reason {cause.reason}; waitingFor went {record.waiting_for}"
    for words in cause.says:
        assert words in record.condition["message"], f"{words!r} not in the {cause.condition} message: {record.condition['message']}"
    assert cause.waiting_for in record.waiting_for, f"waitingFor never said {cause.waiting_for!r}: {record.waiting_for}"
    assert record.ended_at is not None, f"{cause.name} did not end its wait in 240 s; waitingFor went {record.waiting_for}"
    final = record.final
    assert final["phase"] == cause.phase
    if cause.reason == "CrashLoop":
        assert sc.MISSING_PROFILE in final["message"], final["message"]  # the server's last words
    if cause.reason == "CrashLoop" and cause.phase == "RolledBack":
        # A crash-looping speculative server is given up after 3 restarts (ProbeFailed) or at the deadline,
        # whichever comes first.
        assert final["reason"] in ("ProbeFailed", "ProgressDeadlineExceeded"), final
    else:
        assert final["reason"] == "ProgressDeadlineExceeded", final
        assert f"no progress for {sc.DEADLINE_S}s" in final["message"] and cause.waiting_for in final["message"], final["message"]
        # Not before the deadline: it counts from the last change of what the resource waits for.
        assert record.ended_at >= sc.DEADLINE_S
    # Warning Events on the SpeculativeServer: the cause when the condition turned to it, and the end of the wait.
    warnings = {
        e.reason
        for e in api["core"].list_namespaced_event(cause.namespace).items
        if e.involved_object.kind == "SpeculativeServer" and e.involved_object.name == cause.name and e.type == "Warning"
    }
    assert cause.reason in warnings, warnings
    if final["reason"] == "ProgressDeadlineExceeded":
        assert "ProgressDeadlineExceeded" in warnings, warnings


def test_where_only_the_speculative_side_waits_the_base_keeps_serving(seen: Any, api: Any) -> None:
    serving = [c for c in sc.CAUSES if c.base_serves]
    for cause in serving:
        final = seen[cause.name].final
        assert final.get("activeVariant") == "base", final
        service = api["core"].read_namespaced_service(cause.name, cause.namespace)
        assert service.spec.selector["specdec.io/variant"] == "base"
    urls = [f"http://{c.name}.{c.namespace}.svc:30000/health" for c in serving]
    answers = sc.http_status_from_the_node(api["core"], sc.STUCK, urls)
    assert answers == {url: 200 for url in urls}, answers
    # ... and the loser holds no GPU: the speculative server is scaled to 0 once rolled back.
    for cause in serving:
        pods = api["core"].list_namespaced_pod(
            cause.namespace, label_selector=f"app.kubernetes.io/instance={cause.name},specdec.io/variant=speculative"
        )
        deadline = time.monotonic() + 60
        while pods.items and time.monotonic() < deadline:
            time.sleep(1)
            pods = api["core"].list_namespaced_pod(
                cause.namespace, label_selector=f"app.kubernetes.io/instance={cause.name},specdec.io/variant=speculative"
            )
        assert not pods.items, f"{cause.name}: speculative pods left after the rollback"


def test_every_cause_was_named_within_seconds(seen: Any) -> None:
    """The named reason reaches status long before the deadline (numbers: docs/benchmarks/stuck-causes.md)."""
    for cause in sc.CAUSES:
        record = seen[cause.name]
        assert record.reason_at is not None and record.reason_at < sc.DEADLINE_S - 15, (cause.name, record.reason_at)
