"""The local control plane behaves like a GPU cluster: tests of the harness itself (tests/support/kube.py,
hack/devcluster, hack/kwok/).

Real kube-scheduler placement by GPU count, labels and taints; real controller-manager (Deployments, Jobs,
EndpointSlices, garbage collection, service accounts); kwok Stages scripted by ``specdec.test/*`` annotations.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from typing import Any

import pytest

from tests.support.kube import devcluster, wait_until

pytestmark = pytest.mark.cluster

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
BLACKWELL_AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "nvidia.com/gpu.family", "operator": "In", "values": ["blackwell"]}]}]
        }
    }
}


def container(name: str = "main", gpus: int | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": name, "image": "registry.example/specdec/test:1"}
    if gpus is not None:
        spec["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    return spec


def pod(name: str, annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    spec.setdefault("containers", [container()])
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": spec,
    }


def deployment(name: str, replicas: int, template_spec: dict[str, Any], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels, "annotations": annotations or {}}, "spec": template_spec},
        },
    }


def condition(obj: Any, kind: str) -> Any:
    for cond in obj.status.conditions or []:
        if cond.type == kind:
            return cond
    return None


def pods_of(core_v1: Any, namespace: str, app: str) -> list[Any]:
    return core_v1.list_namespaced_pod(namespace, label_selector=f"app={app}").items


# ------------------------------------------------------------------------------------------------------------
# Nodes


def test_fake_nodes_carry_gpu_feature_discovery_labels_capacity_and_taints(core_v1):
    nodes = {node.metadata.name: node for node in core_v1.list_node().items}
    gpu_nodes = {n: node for n, node in nodes.items() if "nvidia.com/gpu" in (node.status.capacity or {})}
    families = sorted(node.metadata.labels["nvidia.com/gpu.family"] for node in gpu_nodes.values())
    products = {node.metadata.labels["nvidia.com/gpu.product"] for node in gpu_nodes.values()}

    assert families.count("blackwell") >= 2 and families.count("hopper") >= 1
    assert {"NVIDIA-B200", "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition", "NVIDIA-H200"} <= products
    for node in gpu_nodes.values():
        labels = node.metadata.labels
        assert node.status.allocatable["nvidia.com/gpu"] == "8" == labels["nvidia.com/gpu.count"]
        assert any(t.key == "nvidia.com/gpu" and t.effect == "NoSchedule" for t in node.spec.taints or [])
        expected_major = {"NVIDIA-B200": "10", "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition": "12", "NVIDIA-H200": "9"}[
            labels["nvidia.com/gpu.product"]
        ]
        assert labels["nvidia.com/gpu.compute.major"] == expected_major
        assert labels["nvidia.com/gpu.compute.minor"] == "0"
        assert condition(node, "Ready").status == "True"
    cpu_only = [node for n, node in nodes.items() if n not in gpu_nodes]
    assert cpu_only and all(not node.spec.taints for node in cpu_only)
    assert all(condition(node, "Ready").status == "True" for node in cpu_only)


def test_control_plane_reports_the_pinned_kubernetes_version(core_v1):
    from kubernetes import client

    pinned = devcluster.versions()["KUBERNETES_VERSION"]
    assert client.VersionApi(core_v1.api_client).get_code().git_version == pinned


# ------------------------------------------------------------------------------------------------------------
# Scheduling by GPUs, affinity and taints (the real kube-scheduler)


def test_eight_gpu_deployment_with_blackwell_affinity_lands_on_blackwell_node_and_serves(core_v1, apps_v1, discovery_v1, namespace):
    spec = {"containers": [container(gpus=8)], "affinity": BLACKWELL_AFFINITY, "tolerations": [GPU_TOLERATION]}
    apps_v1.create_namespaced_deployment(namespace, deployment("target", 1, spec))
    core_v1.create_namespaced_service(
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "target"},
            "spec": {"selector": {"app": "target"}, "ports": [{"port": 30000, "name": "http"}]},
        },
    )

    wait_until(
        lambda: apps_v1.read_namespaced_deployment(namespace=namespace, name="target").status.available_replicas == 1,
        message="Deployment target available",
    )
    (running,) = pods_of(core_v1, namespace, "target")
    node = core_v1.read_node(running.spec.node_name)
    assert node.metadata.labels["nvidia.com/gpu.family"] == "blackwell"
    assert condition(running, "Ready").status == "True"
    assert running.status.pod_ip

    # The EndpointSlice controller publishes the ready pod behind the Service.
    def ready_endpoints():
        slices = discovery_v1.list_namespaced_endpoint_slice(namespace, label_selector="kubernetes.io/service-name=target").items
        return [address for s in slices for e in (s.endpoints or []) if e.conditions.ready for address in e.addresses]

    assert wait_until(ready_endpoints, message="ready endpoint for Service target") == [running.status.pod_ip]
    assert core_v1.read_namespaced_service("target", namespace).spec.cluster_ip.startswith("10.96.")


def test_nine_gpus_stay_pending_with_the_schedulers_reason(core_v1, namespace):
    spec = {"containers": [container(gpus=9)], "tolerations": [GPU_TOLERATION]}
    core_v1.create_namespaced_pod(namespace, pod("too-big", **spec))

    def unschedulable():
        pod_now = core_v1.read_namespaced_pod("too-big", namespace)
        scheduled = condition(pod_now, "PodScheduled")
        return pod_now if scheduled and scheduled.reason == "Unschedulable" else None

    # The scheduler's own verdict on the pod (its PodScheduled condition), and the pod as it left it: no node, and
    # kept Pending (an unschedulable pod is tried again only when the cluster changes).
    after = wait_until(unschedulable, message="PodScheduled=False/Unschedulable")
    assert "Insufficient nvidia.com/gpu" in condition(after, "PodScheduled").message
    assert after.status.phase == "Pending" and not after.spec.node_name


def test_pods_without_the_gpu_toleration_never_land_on_gpu_nodes(core_v1, apps_v1, namespace):
    apps_v1.create_namespaced_deployment(namespace, deployment("plain", 6, {"containers": [container()]}))
    wait_until(lambda: apps_v1.read_namespaced_deployment("plain", namespace).status.ready_replicas == 6, message="6 ready replicas")
    for placed in pods_of(core_v1, namespace, "plain"):
        assert "nvidia.com/gpu.family" not in core_v1.read_node(placed.spec.node_name).metadata.labels

    # Asking for a Blackwell node without tolerating its taint is refused by the scheduler, not ignored.
    core_v1.create_namespaced_pod(namespace, pod("no-toleration", affinity=BLACKWELL_AFFINITY))

    def unschedulable():
        scheduled = condition(core_v1.read_namespaced_pod("no-toleration", namespace), "PodScheduled")
        return scheduled if scheduled and scheduled.reason == "Unschedulable" else None

    assert "untolerated taint" in wait_until(unschedulable, message="Unschedulable").message


# ------------------------------------------------------------------------------------------------------------
# Controllers (the real kube-controller-manager)


def test_deleting_an_owner_garbage_collects_its_children(core_v1, apps_v1, namespace):
    apps_v1.create_namespaced_deployment(namespace, deployment("owner", 2, {"containers": [container()]}))
    wait_until(lambda: len(pods_of(core_v1, namespace, "owner")) == 2, message="2 pods")
    assert len(apps_v1.list_namespaced_replica_set(namespace).items) == 1
    # A ConfigMap owned by the Deployment, as an operator would own what it renders.
    owner = apps_v1.read_namespaced_deployment("owner", namespace)
    core_v1.create_namespaced_config_map(
        namespace,
        {
            "metadata": {
                "name": "owned",
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "Deployment",
                        "name": "owner",
                        "uid": owner.metadata.uid,
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "data": {"k": "v"},
        },
    )

    apps_v1.delete_namespaced_deployment("owner", namespace, propagation_policy="Background")

    def all_gone():
        return (
            not apps_v1.list_namespaced_replica_set(namespace).items
            and not pods_of(core_v1, namespace, "owner")
            and all(cm.metadata.name != "owned" for cm in core_v1.list_namespaced_config_map(namespace).items)
        )

    wait_until(all_gone, timeout=60, message="ReplicaSet, pods and ConfigMap garbage-collected")


def test_job_completes(batch_v1, namespace):
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train"},
        "spec": {
            "completions": 2,
            "parallelism": 2,
            "template": {
                "metadata": {"annotations": {"specdec.test/run-for": "1s"}},
                "spec": {"restartPolicy": "Never", "containers": [container()]},
            },
        },
    }
    batch_v1.create_namespaced_job(namespace, job)
    done = wait_until(lambda: condition(batch_v1.read_namespaced_job("train", namespace), "Complete"), message="Job Complete")
    assert done.status == "True"
    assert batch_v1.read_namespaced_job("train", namespace).status.succeeded == 2


def test_job_pod_exit_code_fails_the_job(core_v1, batch_v1, namespace):
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "broken"},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": {"specdec.test/exit-code": "7", "specdec.test/message": "disk full"}},
                "spec": {"restartPolicy": "Never", "containers": [container()]},
            },
        },
    }
    batch_v1.create_namespaced_job(namespace, job)
    failed = wait_until(lambda: condition(batch_v1.read_namespaced_job("broken", namespace), "Failed"), message="Job Failed")
    assert failed.reason == "BackoffLimitExceeded"
    (job_pod,) = core_v1.list_namespaced_pod(namespace, label_selector="job-name=broken").items
    terminated = job_pod.status.container_statuses[0].state.terminated
    assert job_pod.status.phase == "Failed"
    assert (terminated.exit_code, terminated.message) == (7, "disk full")


def test_service_accounts_rbac_and_tokens(core_v1, rbac_v1, namespace, kubectl):
    core_v1.create_namespaced_service_account(namespace, {"metadata": {"name": "reader"}})
    as_reader = ["auth", "can-i", "list", "pods", f"--as=system:serviceaccount:{namespace}:reader"]
    assert kubectl(*as_reader, check=False).stdout.strip() == "no"

    rbac_v1.create_namespaced_role(
        namespace,
        {
            "metadata": {"name": "pod-reader"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}],
        },
    )
    rbac_v1.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "reader"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
        },
    )
    wait_until(lambda: kubectl(*as_reader, check=False).stdout.strip() == "yes", message="RBAC grant visible")
    assert kubectl("auth", "can-i", "delete", "pods", f"--as=system:serviceaccount:{namespace}:reader", check=False).stdout.strip() == "no"

    # Bound tokens are signed by the apiserver and accepted by it (TokenRequest + TokenReview).
    token = kubectl("create", "token", "reader").stdout.strip()
    server = kubectl("config", "view", "--minify", "-o", "jsonpath={.clusters[0].cluster.server}").stdout
    identity = kubectl(
        "auth", "whoami", "-o", "json", f"--server={server}", f"--token={token}", "--insecure-skip-tls-verify", "--kubeconfig=/dev/null"
    ).stdout
    assert json.loads(identity)["status"]["userInfo"]["username"] == f"system:serviceaccount:{namespace}:reader"


# ------------------------------------------------------------------------------------------------------------
# kwok Stages scripted by specdec.test/* annotations


@pytest.mark.parametrize("restart_policy", ["Never", "Always"])
def test_init_container_exit_code_and_termination_message(core_v1, namespace, restart_policy):
    report = json.dumps({"compatible": False, "reason": "draft vocab 32000 != target vocab 128256"})
    annotations = {"specdec.test/init-exit-code": "3", "specdec.test/init-message": report, "specdec.test/init-container": "validate"}
    spec = {
        "restartPolicy": restart_policy,
        "initContainers": [container("fetch"), container("validate"), container("warmup")],
        "containers": [container()],
    }
    core_v1.create_namespaced_pod(namespace, pod("checked", annotations, **spec))

    def init_statuses():
        statuses = core_v1.read_namespaced_pod("checked", namespace).status.init_container_statuses
        return {s.name: s for s in statuses} if statuses else None

    statuses = wait_until(init_statuses, message="init container statuses")
    assert statuses["fetch"].state.terminated.exit_code == 0
    assert statuses["warmup"].state.waiting.reason == "PodInitializing"
    validate = statuses["validate"]
    if restart_policy == "Never":
        outcome = validate.state.terminated
    else:  # the kubelet would restart it: the failure is in lastState, the container backs off
        outcome = validate.last_state.terminated
        assert validate.state.waiting.reason == "CrashLoopBackOff" and validate.restart_count >= 1
    assert outcome.exit_code == 3 and json.loads(outcome.message) == json.loads(report)

    checked = core_v1.read_namespaced_pod("checked", namespace)
    assert checked.status.phase == ("Failed" if restart_policy == "Never" else "Pending")
    assert condition(checked, "Initialized").status == "False"
    assert checked.status.container_statuses[0].state.waiting.reason == "PodInitializing"


def test_init_container_success_message_after_a_delay(core_v1, namespace):
    annotations = {"specdec.test/init-after": "2s", "specdec.test/init-message": '{"compatible": true}'}
    core_v1.create_namespaced_pod(namespace, pod("validated", annotations, initContainers=[container("validate")]))
    created = time.monotonic()
    running = wait_until(
        lambda: (p := core_v1.read_namespaced_pod("validated", namespace)).status.phase == "Running" and p, message="Running after init"
    )
    assert time.monotonic() - created >= 1.5
    (validate,) = running.status.init_container_statuses
    assert validate.state.terminated.exit_code == 0
    assert json.loads(validate.state.terminated.message) == {"compatible": True}
    assert condition(running, "Ready").status == "True"


def test_crash_looping_container_reports_restarts_and_back_off(core_v1, namespace):
    annotations = {
        "specdec.test/crash-loop": "true",
        "specdec.test/crash-container": "server",
        "specdec.test/exit-code": "137",
        "specdec.test/message": "CUDA out of memory",
    }
    spec = {"containers": [container("server"), container("metrics")]}
    core_v1.create_namespaced_pod(namespace, pod("crashy", annotations, **spec))

    def restarted_twice():
        statuses = core_v1.read_namespaced_pod("crashy", namespace).status.container_statuses or []
        server = next((s for s in statuses if s.name == "server"), None)
        return server if server and server.restart_count >= 2 else None

    server = wait_until(restarted_twice, timeout=20, message="two restarts")
    assert server.state.waiting.reason == "CrashLoopBackOff" and not server.ready
    assert (server.last_state.terminated.exit_code, server.last_state.terminated.message) == (137, "CUDA out of memory")
    crashy = core_v1.read_namespaced_pod("crashy", namespace)
    assert crashy.status.phase == "Running" and condition(crashy, "Ready").status == "False"
    metrics = next(s for s in crashy.status.container_statuses if s.name == "metrics")
    assert metrics.state.running and metrics.restart_count == 0


def test_readiness_only_after_the_requested_delay(core_v1, apps_v1, namespace):
    spec = {"containers": [container(gpus=8)], "affinity": BLACKWELL_AFFINITY, "tolerations": [GPU_TOLERATION]}
    apps_v1.create_namespaced_deployment(namespace, deployment("loading", 1, spec, annotations={"specdec.test/ready-after": "4s"}))

    def running_pod():
        pods = pods_of(core_v1, namespace, "loading")
        return pods[0] if pods and pods[0].status.phase == "Running" else None

    started = wait_until(running_pod, message="pod Running")
    assert condition(started, "Ready").status == "False"
    assert apps_v1.read_namespaced_deployment("loading", namespace).status.ready_replicas in (None, 0)

    ready = wait_until(lambda: (p := running_pod()) and condition(p, "Ready").status == "True" and p, timeout=20, message="Ready")
    became_ready = condition(ready, "Ready").last_transition_time
    container_started = ready.status.container_statuses[0].state.running.started_at
    assert 3.0 <= (became_ready - container_started).total_seconds() <= 8.0
    wait_until(lambda: apps_v1.read_namespaced_deployment("loading", namespace).status.ready_replicas == 1, message="Deployment ready")


def test_when_label_limits_scripted_outcomes_to_matching_pods(core_v1, namespace):
    # The operator copies spec.podMetadata.annotations onto both servers' pods; when-label picks one of them.
    annotations = {
        "specdec.test/crash-loop": "true",
        "specdec.test/when-label": "specdec.io/variant=speculative",
        "specdec.test/init-exit-code": "1",
        "specdec.test/init-container": "validate",
    }
    for variant in ("base", "speculative"):
        manifest = pod(variant, annotations, initContainers=[container("validate")])
        manifest["metadata"]["labels"] = {"specdec.io/variant": variant}
        core_v1.create_namespaced_pod(namespace, manifest)
    # A pod without the named init container is not affected by the init scripting.
    core_v1.create_namespaced_pod(namespace, pod("no-init", {"specdec.test/init-exit-code": "1", "specdec.test/init-container": "validate"}))

    speculative = wait_until(
        lambda: (p := core_v1.read_namespaced_pod("speculative", namespace)).status.init_container_statuses and p,
        message="speculative pod initialised",
    )
    assert speculative.status.init_container_statuses[0].last_state.terminated.exit_code == 1
    # A positive control: a pod that the same crash-loop annotations do reach (labelled speculative, no init container
    # to fail first) restarts every 2 s.
    crashing = pod("crashing", annotations)
    crashing["metadata"]["labels"] = {"specdec.io/variant": "speculative"}
    core_v1.create_namespaced_pod(namespace, crashing)
    for name in ("base", "no-init"):
        ready = wait_until(lambda: condition(core_v1.read_namespaced_pod(name, namespace), "Ready"), message=f"{name} Ready condition")
        wait_until(lambda: condition(core_v1.read_namespaced_pod(name, namespace), "Ready").status == "True", message=f"{name} Ready")
        assert ready

    def restarts(name: str) -> int:
        statuses = core_v1.read_namespaced_pod(name, namespace).status.container_statuses
        return statuses[0].restart_count if statuses else 0

    # Two crash-loop periods with base Ready: the control restarted twice meanwhile, base not once.
    before = restarts("crashing")
    wait_until(lambda: restarts("crashing") >= before + 2, timeout=30, message="the control pod crash-looping twice")
    base = core_v1.read_namespaced_pod("base", namespace)
    assert base.status.container_statuses[0].restart_count == 0 and base.status.phase == "Running"


# ------------------------------------------------------------------------------------------------------------
# The supervisor itself


def test_devcluster_up_is_reused_and_down_leaves_no_process(kube_cluster):
    name = f"pytest-lifecycle-{os.getpid()}"
    try:
        first = devcluster.up(name, tie_to_parent=True)
        again = devcluster.up(name, tie_to_parent=True)
        assert again == first and again.kubeconfig.is_file()
        report = devcluster.status(name)
        assert report["state"] == "up"
        pids = [info["pid"] for info in report["components"].values()]
        assert all(pids) and len(set(pids)) == len(devcluster.COMPONENTS)
        assert first.kubectl("get", "nodes", "-o", "name").stdout.count("node/") >= 5
    finally:
        assert devcluster.down(name, purge=True)
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or _zombie(pid), f"process {pid} survived down()"
    assert devcluster.status(name)["state"] == "absent"
    assert all(devcluster._port_free(port) for port in first.ports.values())


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_missing_tools_give_a_one_line_instruction(tmp_path):
    env = dict(os.environ, SPECDEC_TOOLS_DIR=str(tmp_path), SPECDEC_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run(
        [sys.executable, "-m", "hack.devcluster", "up", "--name", "nothing-here"],
        env=env,
        cwd=devcluster.REPO_DIR,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().count("\n") == 0 and "run `make tools`" in proc.stderr


# ------------------------------------------------------------------------------------------------------------
# hack/tools.sh (fast paths only: the builds themselves are what `make tools` does before the suite)

TOOLS_SH = devcluster.HACK_DIR / "tools.sh"


def run_tools(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(TOOLS_SH), *args], env={**os.environ, **env}, capture_output=True, text=True, timeout=120)


def test_tools_sh_is_idempotent_and_check_reports_missing_tools(tmp_path):
    built = devcluster.tools_dir()
    assert run_tools("--check", SPECDEC_TOOLS_DIR=str(built)).returncode == 0
    start = time.monotonic()
    again = run_tools(SPECDEC_TOOLS_DIR=str(built))
    assert again.returncode == 0 and "up to date" in again.stderr and time.monotonic() - start < 5

    empty = run_tools("--check", SPECDEC_TOOLS_DIR=str(tmp_path / "none"))
    assert empty.returncode == 1 and "run: make tools" in empty.stderr
    assert run_tools("--print-dir", SPECDEC_TOOLS_DIR=str(tmp_path)).stdout.strip() == str(tmp_path)


def test_tools_sh_reuses_fitting_binaries_from_path(tmp_path):
    target = tmp_path / "bin"
    result = run_tools(SPECDEC_TOOLS_DIR=str(target), PATH=f"{devcluster.tools_dir()}{os.pathsep}{os.environ['PATH']}")
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("reusing ") == len(devcluster.REQUIRED_TOOLS) + 1  # + helm
    for tool in (*devcluster.REQUIRED_TOOLS, "helm"):
        assert (target / tool).resolve() == (devcluster.tools_dir() / tool).resolve()
    assert run_tools("--check", SPECDEC_TOOLS_DIR=str(target)).returncode == 0


def test_tools_sh_refuses_go_modules_that_disagree_with_versions_env(tmp_path):
    hack = tmp_path / "hack"
    shutil.copytree(devcluster.HACK_DIR / "go", hack / "go")
    shutil.copy2(TOOLS_SH, hack / "tools.sh")
    pinned = devcluster.versions()["HELM_VERSION"]
    pins = (devcluster.HACK_DIR / "versions.env").read_text()
    (hack / "versions.env").write_text(pins.replace(f"HELM_VERSION={pinned}", "HELM_VERSION=v4.0.0-unpinned"))
    result = subprocess.run(
        [str(hack / "tools.sh")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "SPECDEC_TOOLS_DIR": str(tmp_path / "bin"), "SPECDEC_TOOLS_REUSE": "0"},
    )
    assert result.returncode == 1
    assert "pins 'helm.sh/helm/v4 v4.0.0-unpinned'" in result.stderr and "update both" in result.stderr
    assert not (tmp_path / "bin" / "helm").exists()
