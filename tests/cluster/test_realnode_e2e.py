"""End to end on a real node, from a real registry: the chart, the operator, the validator and the servers run in
real containers, installed the way a team that mirrors the release installs them.

Unlike test_operator_e2e.py (kwok pods, whose outcomes are scripted), everything here runs on the real node of
hack/devcluster (containerd + runc, kubelet v1.35, kube-proxy, CoreDNS; hack/devcluster/realnode.py), as a user would
run it: `make release` builds the images from this checkout (`make images-local`: buildah, over a Debian base made by
mmdebstrap) and pushes them and the chart (an OCI artifact, `helm push`) to a CNCF distribution registry started on
127.0.0.1 (tests/support/registry.py) that, like a private mirror, answers only with credentials (`buildah login`,
`helm registry login`); the operator is installed with `helm install oci://...` from it, and the node's containerd
pulls the operator, validator and simulator images from it with the pods' imagePullSecrets: the chart's for the
operator, its operator-wide server pod defaults for the tenant's pods (nothing is imported with `ctr`). The model
volume is a hostPath directory holding tiny model directories written by tests/support/model_dirs.py. The SGLang servers
are the sglang-simulator image (`specdec simulate`, a SIMULATOR of SGLang's HTTP API: no GPU, no model).

The steps depend on each other and run in file order, on one cluster for the module. This machine kind can run
real containers (checked by realnode.can_run_containers()), so these tests are required: on a machine that
cannot, they FAIL with the reason. SPECDEC_SKIP_REAL_NODE=1 skips them explicitly (a laptop without root).
"""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from hack import devcluster
from hack.devcluster import realnode
from specdec_operator import SGLANG_VERSION
from tests.support import model_dirs as md
from tests.support import registry as reg
from tests.support.operator_process import logged_events, step_after_now

REPO = Path(__file__).resolve().parents[2]

# The first test also pays for the images (a cold `make images-local` takes about 6 minutes on 2 loaded cores).
# One process at a time may run the real node (it takes the machine's containerd, cgroups and iptables chains):
# under pytest-xdist every test of this module runs on the same worker.
pytestmark = [pytest.mark.cluster, pytest.mark.realnode, pytest.mark.timeout(1800), pytest.mark.xdist_group("realnode")]

GROUP, VERSION, PLURAL = "specdec.io", "v1alpha1", "speculativeservers"
RELEASE, OPERATOR_NS, NS = "specdec", "specdec-system", "realnode-e2e"
ON_NODE = {"specdec.io/real-node": "true"}
TIMINGS: dict[str, float] = {}
STATE: dict[str, Any] = {}


def _images_env() -> dict[str, str]:
    env = {}
    for line in (REPO / "images" / "images.env").read_text().splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            key, value = line.strip().split("=", 1)
            env[key] = value
    return env


IMAGES = _images_env()
CHART_VERSION = yaml.safe_load((REPO / "charts" / "specdec-operator" / "Chart.yaml").read_text())["version"]
PROJECT_VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def mirrored(image: str, tag: str) -> str:
    """Where `make release` put an image: $REGISTRY/<last path element>:<tag>."""
    return f"{STATE['registry'].host}/specdec/{IMAGES[image].rsplit('/', 1)[-1]}:{IMAGES[tag]}"


def simulator_ref() -> str:
    return mirrored("SIMULATOR_IMAGE", "SIMULATOR_TAG")


def chart_args() -> list[str]:
    """The released chart, as `helm install`/`upgrade` name it: from the registry (plain HTTP on 127.0.0.1)."""
    return [f"oci://{STATE['registry'].host}/specdec/charts/specdec-operator", "--version", CHART_VERSION, "--plain-http"]


def wait(predicate: Any, timeout: float, message: str, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while True:
        try:
            result = predicate()
            if result:
                return result
        except Exception as error:
            last = error
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {message}" + (f" (last error: {last})" if last else ""), pytrace=False)
        time.sleep(interval)


# ---------------------------------------------------------------------------------------------------------
# The cluster, the images, the API clients


@pytest.fixture(scope="module")
def registry(tmp_path_factory: Any) -> Any:
    """The CNCF distribution registry on 127.0.0.1, for the module (hack/tools.sh group registry)."""
    if os.environ.get("SPECDEC_SKIP_REAL_NODE") == "1":
        pytest.skip("SPECDEC_SKIP_REAL_NODE=1: real-node tests skipped on request")
    binary = devcluster.tools_dir() / "registry"
    if not os.access(binary, os.X_OK):
        pytest.fail(f"{binary} missing: run `hack/tools.sh registry` (make test builds it)", pytrace=False)
    try:
        started = reg.start(binary, tmp_path_factory.mktemp("registry"), user=("specdec-ci", secrets.token_hex(12)))
    except reg.RegistryError as error:
        pytest.fail(str(error), pytrace=False)
    STATE["registry"] = started
    # The tools' own logins, in a file of the test's (not the machine user's): buildah reads REGISTRY_AUTH_FILE, helm
    # HELM_REGISTRY_CONFIG (both the docker config.json format).
    auth = tmp_path_factory.mktemp("auth") / "auth.json"
    STATE["auth_env"] = {"REGISTRY_AUTH_FILE": str(auth), "HELM_REGISTRY_CONFIG": str(auth)}
    name, password = started.user
    for login in (
        ["buildah", "login", "--authfile", str(auth), "--tls-verify=false", "--username", name, "--password-stdin", started.host],
        [
            str(devcluster.tools_dir() / "helm"),
            "registry",
            "login",
            "--registry-config",
            str(auth),
            "--plain-http",
            "--username",
            name,
            "--password-stdin",
            started.host,
        ],
    ):
        proc = subprocess.run(login, input=password, capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            started.stop()
            pytest.fail(f"{login[0]} login to the test registry failed: {proc.stderr.strip()}", pytrace=False)
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def node_cluster(registry: Any, tmp_path_factory: Any) -> Any:
    if os.environ.get("SPECDEC_SKIP_REAL_NODE") == "1":
        pytest.skip("SPECDEC_SKIP_REAL_NODE=1: real-node tests skipped on request")
    why = realnode.can_run_containers()
    if why:
        pytest.fail(
            f"this machine cannot run the real-node tests: {why} (they are required in CI; SPECDEC_SKIP_REAL_NODE=1 skips them elsewhere)",
            pytrace=False,
        )
    tools = devcluster.tools_dir()
    missing = devcluster.missing_tools(tools) + realnode.missing_node_tools(tools)
    if missing:
        pytest.fail(f"tools missing in {tools} ({', '.join(missing)}): run `make tools REAL_NODE=1`", pytrace=False)
    started = time.monotonic()
    dist = tmp_path_factory.mktemp("release")
    release = [
        "make",
        "--no-print-directory",
        "release",
        f"REGISTRY={registry.host}/specdec",
        "RELEASE_BUILD=images-local",
        "RELEASE_IMAGES=operator simulator",
        "RELEASE_PLAIN_HTTP=1",
        f"RELEASE_DIST={dist}",
    ]
    build = subprocess.run(release, cwd=REPO, capture_output=True, text=True, timeout=1800, env={**os.environ, **STATE["auth_env"]})
    if build.returncode != 0:
        pytest.fail(f"{' '.join(release)} failed:\n{(build.stdout + build.stderr)[-3000:]}", pytrace=False)
    TIMINGS["make release (make images-local, push images and chart, plugin files)"] = time.monotonic() - started
    STATE["dist"] = dist
    STATE["release"] = build.stdout + build.stderr
    # The plugin from the release's krew archive, unpacked as krew does (its store, a link on PATH); its launcher's first
    # run installs the wheel with pip into a virtualenv. Started now, so that it runs while the cluster comes up.
    plugin = tmp_path_factory.mktemp("krew")
    subprocess.run(["tar", "-xzf", str(dist / f"kubectl-specdec-{PROJECT_VERSION}.tar.gz"), "-C", str(plugin)], check=True)
    (plugin / "bin").mkdir()
    (plugin / "bin" / "kubectl-specdec").symlink_to(plugin / "kubectl-specdec")
    plugin_env = {**os.environ, "SPECDEC_PLUGIN_HOME": str(plugin / "home"), "PATH": f"{plugin / 'bin'}:{os.environ['PATH']}"}
    STATE["plugin_env"] = plugin_env
    STATE["plugin_install"] = subprocess.Popen(
        ["kubectl-specdec", "--help"], env=plugin_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    devcluster.reap_orphans()
    name = f"pytest-rn-{os.getpid()}"
    started = time.monotonic()
    try:
        cluster = devcluster.up(name, tie_to_parent=True, real_node=True, log=lambda m: print(f"devcluster: {m}"))
    except devcluster.ClusterError as error:
        devcluster.down(name, purge=True)
        pytest.fail(f"could not start the cluster with a real node: {error}", pytrace=False)
    TIMINGS["cluster up with the real node"] = time.monotonic() - started
    # The node pulls from the registry (plain HTTP: a hosts.toml for it); nothing is imported with `ctr`.
    devcluster.trust_registry(cluster, registry.host)
    models = Path(tempfile.mkdtemp(prefix="specdec-realnode-models-"))
    models.chmod(0o755)  # the validator runs as UID 65532
    md.make_target(models / "llama", md.LLAMA_31_8B, tokenizer_config=md.LLAMA_31_TOKENIZER)
    md.make_drafter(models / "llama-eagle3", md.llama31_8b_drafter_config())
    md.make_drafter(models / "kimi-eagle3", md.kimi_drafter_config())
    # A compatible drafter whose config.json is 3.9 MB (under the validator's 4 MiB cap): parsing it takes ~25 MB
    # more than the validator's usual ~12 MB, so a 24Mi limit kills it and the usual drafter fits.
    bloated = md.make_drafter(models / "llama-eagle3-bloated", md.llama31_8b_drafter_config())
    config = json.loads((bloated / "config.json").read_text())
    config["specdec_test_padding"] = [0] * 1_950_000
    (bloated / "config.json").write_text(json.dumps(config, separators=(",", ":")))
    STATE["models"] = models
    try:
        yield cluster
    finally:
        if STATE["plugin_install"].poll() is None:
            STATE["plugin_install"].kill()
        devcluster.down(name, purge=True)
        shutil.rmtree(models, ignore_errors=True)
        if TIMINGS:
            print("\nreal-node timings:\n" + "\n".join(f"  {k}: {v:.1f}s" for k, v in TIMINGS.items()))


@pytest.fixture(scope="module")
def api(node_cluster: Any) -> Any:
    from kubernetes import client, config

    api_client = config.new_client_from_config(config_file=str(node_cluster.kubeconfig))
    yield {
        "core": client.CoreV1Api(api_client),
        "apps": client.AppsV1Api(api_client),
        "custom": client.CustomObjectsApi(api_client),
        "discovery": client.DiscoveryV1Api(api_client),
    }
    api_client.close()


def helm(cluster: Any, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {**cluster.env(), **STATE["auth_env"]}  # helm's login to the registry
    proc = subprocess.run([str(cluster.helm_path), *args], env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"helm {' '.join(args)}: {proc.stderr.strip() or proc.stdout.strip()}"
    return proc


PULL_SECRET = "mirror-pull"
HELM_VALUES = {
    "nodeSelector": ON_NODE,
    # The operator pod's pull secret, and every server pod's and validator's (operator-wide defaults): the SpeculativeServers
    # of this module name none themselves.
    "imagePullSecrets": [{"name": PULL_SECRET}],
    "operator": {"extraArgs": ["--reconcile-interval=2"], "serverPodDefaults": {"imagePullSecrets": [{"name": PULL_SECRET}]}},
    "livenessProbe": {"initialDelaySeconds": 5, "periodSeconds": 5, "timeoutSeconds": 3, "failureThreshold": 4},
}


def helm_values(extra_args: list[str] | None = None) -> str:
    values = json.loads(json.dumps(HELM_VALUES))
    values["operator"]["extraArgs"] += extra_args or []
    path = STATE["models"].parent / f"specdec-realnode-values-{os.getpid()}.yaml"
    path.write_text(yaml.safe_dump(values))
    return str(path)


# ---------------------------------------------------------------------------------------------------------
# Pods and clients on the real node

CLIENT = r"""
import json, socket, sys, urllib.parse, urllib.request
out = []
for req in json.loads(sys.argv[1]):
    host = urllib.parse.urlsplit(req["url"]).hostname
    entry = {"url": req["url"]}
    try:
        entry["address"] = socket.gethostbyname(host)
        data = json.dumps(req["body"]).encode() if "body" in req else None
        r = urllib.request.Request(req["url"], data=data, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(r, timeout=30) as resp:
            entry["status"] = resp.status
            body = resp.read().decode(errors="replace")
            if "grep" in req:
                body = "\n".join(line for line in body.splitlines() if req["grep"] in line)
            if "keys" in req:
                body = json.dumps({k: json.loads(body).get(k) for k in req["keys"]})
            entry["body"] = body[: req.get("keep", 300)]
    except Exception as exc:
        entry["error"] = f"{type(exc).__name__}: {exc}"
    out.append(entry)
report = json.dumps(out)
# The kubelet keeps only the last 4096 bytes of a termination message: say so instead of handing back a torn JSON.
if len(report.encode()) > 4000:
    report = json.dumps([{"error": f"report of {len(report)} bytes does not fit the termination message: narrow it with grep or keys"}])
open("/dev/termination-log", "w").write(report)
print(json.dumps(out))
"""


def pull_secret(api: Any, namespace: str) -> None:
    """The docker-registry Secret of the test registry's user in ``namespace``, as a team creates it for its mirror."""
    registry = STATE["registry"]
    token = base64.b64encode(":".join(registry.user).encode()).decode()
    config = json.dumps({"auths": {registry.host: {"auth": token}}})
    api["core"].create_namespaced_secret(
        namespace,
        {
            "metadata": {"name": PULL_SECRET},
            "type": "kubernetes.io/dockerconfigjson",
            "data": {".dockerconfigjson": base64.b64encode(config.encode()).decode()},
        },
    )


def run_client(api: Any, name: str, requests: list[dict[str, Any]], namespace: str = NS) -> list[dict[str, Any]]:
    """A pod on the real node that makes HTTP requests (through cluster DNS and Services) and reports them. It runs the
    operator image's python3, so that the simulator image is first pulled by the servers' pods, with the operator-wide
    pull secret only."""
    core = api["core"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": ON_NODE,
            "imagePullSecrets": [{"name": PULL_SECRET}],
            "automountServiceAccountToken": False,
            "containers": [
                {
                    "name": "client",
                    "image": mirrored("OPERATOR_IMAGE", "OPERATOR_TAG"),
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["python3", "-c", CLIENT, json.dumps(requests)],
                    "resources": {"limits": {"cpu": "500m", "memory": "128Mi"}},
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": 65532,
                        "readOnlyRootFilesystem": True,
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
        },
    }
    core.create_namespaced_pod(namespace, pod)
    done = wait(
        lambda: (p := core.read_namespaced_pod(name, namespace)).status.phase in ("Succeeded", "Failed") and p,
        timeout=120,
        message=f"client pod {name} to finish",
    )
    term = done.status.container_statuses[0].state.terminated
    core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    assert done.status.phase == "Succeeded", f"client pod {name}: {term.reason} {term.message}"
    return json.loads(term.message)


def container_spec(cluster: Any, container_id: str) -> dict[str, Any]:
    """The OCI runtime spec containerd gave a container (what runc really ran it with)."""
    proc = devcluster.node_ctr(cluster, "containers", "info", container_id.split("://", 1)[-1])
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["Spec"]


def validator_spec(cluster: Any, api: Any, pod_name: str) -> dict[str, Any]:
    """container_spec of the pod's validator, which the kubelet keeps restarting (its dead container is removed)."""
    for _ in range(40):
        pod = api["core"].read_namespaced_pod(pod_name, NS)
        container_id = pod.status.init_container_statuses[0].container_id
        if container_id:
            proc = devcluster.node_ctr(cluster, "containers", "info", container_id.split("://", 1)[-1])
            if proc.returncode == 0:
                return json.loads(proc.stdout)["Spec"]
        time.sleep(0.5)
    pytest.fail(f"no validator container of {pod_name} found in containerd", pytrace=False)


def server(name: str, drafter: str, *, target: str = "llama", env: dict[str, str] | None = None) -> dict[str, Any]:
    # Time scale 5, not faster: each simulator pod has half a core (cpu: 500m), and at 20 its own event loop, not
    # its model, set the pace of some rounds (one CI run's intervals were [0.47, 4.8] and the probe Inconclusive).
    sim_env = {"SIMULATOR_TIME_SCALE": "5", "SIMULATOR_LOAD_SECONDS": "4", **(env or {})}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SpeculativeServer",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "image": simulator_ref(),
            # The simulator's image names no SGLang release (issue 34): the spec says which command line it takes.
            "sglangVersion": SGLANG_VERSION,
            "model": {"volume": {"hostPath": {"path": str(STATE["models"]), "type": "Directory"}}},
            "target": {"path": target, "contextLength": 8192},
            "drafter": {"path": drafter, "numSteps": 3, "eagleTopk": 1},
            "resources": {"gpus": 1, "gpuFamily": "hopper", "shmSize": "64Mi", "cpu": "500m", "memory": "512Mi"},
            "nodeSelector": ON_NODE,
            "sglang": {"maxRunningRequests": 64, "env": [{"name": k, "value": v} for k, v in sim_env.items()]},
            "rollout": {
                "policy": "WeightedMix",
                "maxRounds": 10,
                "workloads": [
                    {"name": "chat", "concurrency": 1, "inputTokens": 128, "outputTokens": 64, "requests": 8, "weight": 3},
                    {"name": "batch-8", "concurrency": 8, "inputTokens": 128, "outputTokens": 64, "requests": 16, "weight": 1},
                ],
            },
            "monitor": {"interval": 15, "acceptLengthFloor": 1.5, "window": 4},
        },
    }


def status(api: Any, name: str) -> dict[str, Any]:
    return api["custom"].get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name).get("status") or {}


def wait_phase(api: Any, name: str, phases: set[str], timeout: float) -> dict[str, Any]:
    return wait(
        lambda: (st := status(api, name)).get("phase") in phases and st,
        timeout=timeout,
        message=f"{name} in {sorted(phases)} (phase now {status(api, name).get('phase')}: {status(api, name).get('message')})",
    )


def pods(api: Any, name: str, variant: str) -> list[Any]:
    return api["core"].list_namespaced_pod(NS, label_selector=f"app.kubernetes.io/instance={name},specdec.io/variant={variant}").items


def operator_pod(api: Any) -> Any:
    items = api["core"].list_namespaced_pod(OPERATOR_NS, label_selector="app.kubernetes.io/component=operator").items
    return items[0] if len(items) == 1 else None


def events(api: Any, name: str) -> list[str]:
    out = []
    for e in api["core"].list_namespaced_event(NS).items:
        if e.involved_object.kind == "SpeculativeServer" and e.involved_object.name == name:
            out += [e.reason] * max(1, e.count or 1)
    return out


def liveness_probes(api: Any, pod_name: str, result: str) -> int:
    """Liveness probes of the pod's containers that the real node's kubelet ran with that result ("successful",
    "failed"): its prober_probe_total, read through the API server's node proxy."""
    text = api["core"].connect_get_node_proxy_with_path(realnode.NODE_NAME, "metrics/probes")
    return sum(
        int(float(line.rsplit(" ", 1)[1]))
        for line in text.splitlines()
        if line.startswith("prober_probe_total{") and 'probe_type="Liveness"' in line and f'pod="{pod_name}"' in line and f'result="{result}"' in line
    )


def metrics_text(api: Any, client_name: str) -> str:
    service = f"{RELEASE}-specdec-operator-metrics.{OPERATOR_NS}.svc"
    (result,) = run_client(api, client_name, [{"url": f"http://{service}:9090/metrics", "grep": "# TYPE specdec_", "keep": 3000}])
    assert result.get("status") == 200, result
    return result["body"]


def pushed() -> dict[str, str]:
    """What `make release` says it pushed (dist/release/release.txt): reference -> digest."""
    out = {}
    for line in (STATE["dist"] / "release.txt").read_text().splitlines():
        kind, ref = line.split(" ", 1)
        if kind in ("image", "chart"):
            name, digest = ref.rsplit("@", 1)
            out[name] = digest
    return out


def node_images(cluster: Any) -> list[str]:
    proc = devcluster.node_ctr(cluster, "images", "ls", "-q")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


# ---------------------------------------------------------------------------------------------------------
# Tests, in order


def test_make_release_pushed_the_images_and_the_chart_to_the_registry(node_cluster: Any, registry: Any, api: Any) -> None:
    release = pushed()
    operator, simulator = mirrored("OPERATOR_IMAGE", "OPERATOR_TAG"), simulator_ref()
    chart = f"oci://{registry.host}/specdec/charts/specdec-operator:{CHART_VERSION}"
    assert set(release) == {operator, simulator, chart}, release
    assert registry.catalog() == ["specdec/charts/specdec-operator", "specdec/sglang-simulator", "specdec/specdec-operator"]
    # Each digest `make release` recorded is the one the registry resolves the tag to.
    for ref in (operator, simulator):
        repository, tag = ref.removeprefix(f"{registry.host}/").rsplit(":", 1)
        digest, manifest = registry.manifest(repository, tag)
        assert digest == release[ref], (ref, digest, release[ref])
        assert manifest["mediaType"] == "application/vnd.oci.image.manifest.v1+json" and manifest["layers"], manifest
    digest, manifest = registry.manifest("specdec/charts/specdec-operator", CHART_VERSION)
    assert digest == release[chart]
    # A Helm chart as an OCI artifact: its config is the chart's metadata, its one layer the packaged chart.
    assert manifest["config"]["mediaType"] == "application/vnd.cncf.helm.config.v1+json", manifest  # type: ignore[index]
    assert [layer["mediaType"] for layer in manifest["layers"]] == ["application/vnd.cncf.helm.chart.content.v1.tar+gzip"]  # type: ignore[union-attr]
    # The released chart pulls the operator (and so the validator) from the mirror; nothing else in it moved.
    shown = subprocess.run(
        [str(node_cluster.helm_path), "show", "values", *chart_args()],
        env={**node_cluster.env(), **STATE["auth_env"]},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    # helm prints what it pulled ("Pulled: ...", "Digest: ...") before the values.
    values = yaml.safe_load("\n".join(line for line in shown.stdout.splitlines() if not line.startswith(("Pulled: ", "Digest: "))))
    checkout = yaml.safe_load((REPO / "charts" / "specdec-operator" / "values.yaml").read_text())
    assert values["image"]["repository"] == operator.rsplit(":", 1)[0]
    assert {**values, "image": checkout["image"]} == checkout
    # Nothing on the node yet but its own pause image: what runs next is pulled from the registry.
    assert [ref for ref in node_images(node_cluster) if "specdec-operator" in ref or "sglang-simulator" in ref] == []
    # The registry wants credentials: the kubelet's pull of a pod without a pull secret is refused.
    assert registry.get("/v2/", auth=False)[0] == 401
    api["core"].create_namespace({"metadata": {"name": NS}})
    wait(lambda: api["core"].read_namespaced_service_account("default", NS), 30, "default ServiceAccount")
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "no-pull-secret"},
        "spec": {
            "nodeSelector": ON_NODE,
            "automountServiceAccountToken": False,
            "containers": [{"name": "c", "image": operator, "command": ["true"], "securityContext": {"runAsUser": 65532, "runAsNonRoot": True}}],
        },
    }
    api["core"].create_namespaced_pod(NS, pod)
    waiting = wait(
        lambda: (
            (cs := (api["core"].read_namespaced_pod("no-pull-secret", NS).status.container_statuses or [None])[0])
            and cs.state.waiting
            and cs.state.waiting.reason in ("ErrImagePull", "ImagePullBackOff")
            and cs.state.waiting
        ),
        120,
        "the kubelet to report the refused pull",
    )
    assert re.search(r"401|unauthorized", waiting.message or "", re.IGNORECASE), waiting.message
    api["core"].delete_namespaced_pod("no-pull-secret", NS, grace_period_seconds=0)


def test_helm_install_runs_the_operator_image_on_the_real_node(node_cluster: Any, api: Any) -> None:
    node = api["core"].read_node(realnode.NODE_NAME)
    assert node.status.allocatable["nvidia.com/gpu"] == realnode.GPU_COUNT
    assert node.status.node_info.kubelet_version.startswith("v1.35.")
    assert node.status.node_info.container_runtime_version.startswith("containerd://1.")
    wait(lambda: api["core"].read_namespaced_service_account("default", NS), 30, "default ServiceAccount")
    # The mirror's pull secret in the operator's namespace and in the tenant's, as docs/install.md says.
    api["core"].create_namespace({"metadata": {"name": OPERATOR_NS}})
    for namespace in (OPERATOR_NS, NS):
        pull_secret(api, namespace)
    started = time.monotonic()
    helm(
        node_cluster,
        "install",
        RELEASE,
        *chart_args(),
        "--namespace",
        OPERATOR_NS,
        "--create-namespace",
        "--values",
        helm_values(),
        "--wait",
        "--timeout",
        "5m",
    )
    pod = wait(
        lambda: (p := operator_pod(api)) and p.status.container_statuses and p.status.container_statuses[0].ready and p, 120, "operator pod Ready"
    )
    TIMINGS["helm install oci:// -> operator Ready (image pulled from the registry)"] = time.monotonic() - started
    assert pod.spec.node_name == realnode.NODE_NAME
    # The kubelet pulled the operator image from the registry: the digest it runs is the one `make release` pushed.
    operator = mirrored("OPERATOR_IMAGE", "OPERATOR_TAG")
    (cs,) = pod.status.container_statuses
    assert pod.spec.containers[0].image == operator
    assert cs.image_id == f"{operator.rsplit(':', 1)[0]}@{pushed()[operator]}", cs.image_id
    spec = container_spec(node_cluster, pod.status.container_statuses[0].container_id)
    assert spec["process"]["user"]["uid"] == 65532 and spec["root"]["readonly"] is True
    assert spec["process"]["args"][:2] == ["specdec", "run"]
    # In the cluster, nothing maps Services to URLs: the operator reaches the servers by cluster DNS.
    assert not any(arg.startswith("--endpoints") for arg in spec["process"]["args"])
    # The liveness endpoint and the metrics, as the kubelet's probe and Prometheus see them: the pod's address,
    # and the metrics Service by its cluster DNS name.
    (health,) = run_client(api, "client-healthz", [{"url": f"http://{pod.status.pod_ip}:8080/healthz"}])
    assert health.get("status") == 200, health
    assert "# TYPE specdec_probes_total counter" in metrics_text(api, "client-metrics")
    # The kubelet runs the liveness probe (period 5 s here): three more of them, each answered, counted by the kubelet
    # itself, and the container was not restarted.
    seen = liveness_probes(api, pod.metadata.name, "successful")
    wait(lambda: liveness_probes(api, pod.metadata.name, "successful") >= seen + 3, 60, "three more liveness probes of the operator")
    assert liveness_probes(api, pod.metadata.name, "failed") == 0
    pod = operator_pod(api)
    assert pod.status.container_statuses[0].restart_count == 0 and pod.status.container_statuses[0].ready
    STATE["operator_pod"] = pod.metadata.name


def test_an_incompatible_drafter_is_invalid_from_the_real_validator(node_cluster: Any, api: Any) -> None:
    started = time.monotonic()
    api["custom"].create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, server("kimi-on-llama", "kimi-eagle3"))
    st = wait_phase(api, "kimi-on-llama", {"Invalid", "Promoted", "RolledBack", "Failed"}, timeout=180)
    TIMINGS["apply -> Invalid (real validator container)"] = time.monotonic() - started
    assert st["phase"] == "Invalid", st
    codes = [f["code"] for f in st["validation"]["findings"]]
    assert "HiddenSizeMismatch" in codes, codes
    (pod,) = pods(api, "kimi-on-llama", "speculative")
    init = pod.status.init_container_statuses[0]
    term = init.state.terminated or init.last_state.terminated
    assert term.exit_code == 1
    assert json.loads(term.message)["compatible"] is False
    # The validator runs from the mirrored operator image, in the tenant's namespace (the chart's default), with the
    # operator-wide pull secret (the resource names none).
    operator = mirrored("OPERATOR_IMAGE", "OPERATOR_TAG")
    assert pod.spec.init_containers[0].image == operator
    assert [s.name for s in pod.spec.image_pull_secrets or []] == [PULL_SECRET]
    assert init.image_id == f"{operator.rsplit(':', 1)[0]}@{pushed()[operator]}", init.image_id
    spec = validator_spec(node_cluster, api, pod.metadata.name)
    assert spec["process"]["user"]["uid"] == 65532 and spec["root"]["readonly"] is True
    assert spec["process"]["args"][:2] == ["specdec", "validate"]
    assert not (pod.status.container_statuses or [None])[0] or not pod.status.container_statuses[0].ready
    api["custom"].delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "kimi-on-llama")


def test_a_missing_model_directory_is_a_validator_input_error_naming_the_path(node_cluster: Any, api: Any) -> None:
    api["custom"].create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, server("missing", "no-such-drafter"))
    st = wait_phase(api, "missing", {"Invalid", "Promoted", "RolledBack", "Failed"}, timeout=180)
    assert st["phase"] == "Invalid", st
    (finding,) = [f for f in st["validation"]["findings"] if f["code"] == "ValidatorInputError"]
    assert "no-such-drafter" in finding["message"] and "no such directory" in finding["message"], finding
    (pod,) = pods(api, "missing", "speculative")
    init = pod.status.init_container_statuses[0]
    assert (init.state.terminated or init.last_state.terminated).exit_code == 2
    api["custom"].delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "missing")

    # The whole model volume missing: a hostPath without a type is created empty by the runtime, and the validator
    # names the target directory it cannot find. (With `type: Directory` the kubelet refuses to mount it instead:
    # FailedMount events, which the operator names as VolumeNotMounted: tests/cluster/test_realnode_stuck.py.)
    absent = STATE["models"].parent / f"specdec-realnode-absent-{os.getpid()}"
    cr = server("novolume", "llama-eagle3")
    cr["spec"]["model"]["volume"] = {"hostPath": {"path": str(absent)}}
    try:
        api["custom"].create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, cr)
        st = wait_phase(api, "novolume", {"Invalid", "Promoted", "RolledBack", "Failed"}, timeout=180)
        assert st["phase"] == "Invalid", st
        (finding,) = [f for f in st["validation"]["findings"] if f["code"] == "ValidatorInputError"]
        assert "llama" in finding["message"] and "no such directory" in finding["message"], finding
        api["custom"].delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "novolume")
    finally:
        shutil.rmtree(absent, ignore_errors=True)


def test_a_compatible_drafter_is_probed_over_cluster_dns_and_promoted(node_cluster: Any, api: Any) -> None:
    started = time.monotonic()
    api["custom"].create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, server("llama", "llama-eagle3"))
    st = wait_phase(api, "llama", {"Invalid", "Promoted", "RolledBack", "Failed"}, timeout=420)
    TIMINGS["apply -> Promoted (validator, two simulator pods, probe)"] = time.monotonic() - started
    assert st["phase"] == "Promoted", st
    assert st["activeVariant"] == "speculative" and st["speedup"] > 1.0
    for variant in ("base", "speculative"):
        (pod,) = pods(api, "llama", variant)
        assert pod.spec.node_name == realnode.NODE_NAME
        (cs,) = pod.status.container_statuses
        assert cs.ready and cs.started and cs.restart_count == 0
        # The kubelet's startup probe held the pod un-Ready while the simulator "loaded" (503 on /health for 4 s).
        ready = next(c for c in pod.status.conditions if c.type == "Ready")
        assert (ready.last_transition_time - cs.state.running.started_at).total_seconds() >= 4
        spec = container_spec(node_cluster, cs.container_id)
        assert spec["root"]["readonly"] is True
        assert spec["process"]["args"][:2] == ["sglang", "serve"]
    # The stable Service routes to the speculative pod: real traffic through its cluster DNS name.
    (spec_pod,) = pods(api, "llama", "speculative")
    url = f"http://llama.{NS}.svc:30000"
    info, gen = run_client(
        api,
        "client-promoted",
        [
            {"url": f"{url}/server_info", "keys": ["speculative_algorithm"]},
            {"url": f"{url}/generate", "body": {"text": "hello", "sampling_params": {"max_new_tokens": 8}}, "keys": ["text"], "keep": 1000},
        ],
    )
    assert info.get("status") == 200 and json.loads(info["body"]).get("speculative_algorithm") == "EAGLE3", info
    assert gen.get("status") == 200 and "text" in json.loads(gen["body"]), gen
    assert info["address"] == api["core"].read_namespaced_service("llama", NS).spec.cluster_ip
    slices = api["discovery"].list_namespaced_endpoint_slice(NS, label_selector="kubernetes.io/service-name=llama")
    assert {a for s in slices.items for e in s.endpoints or [] for a in e.addresses} == {spec_pod.status.pod_ip}
    STATE["decided"] = status(api, "llama")
    # The simulator image came from the registry too, first pulled by these servers' pods with the operator-wide pull
    # secret only: every image of this module on the node is a mirrored one.
    simulator = simulator_ref()
    assert [s.name for s in pod.spec.image_pull_secrets or []] == [PULL_SECRET]
    assert cs.image_id == f"{simulator.rsplit(':', 1)[0]}@{pushed()[simulator]}", cs.image_id
    named = [ref for ref in node_images(node_cluster) if not ref.startswith("sha256:") and "pause" not in ref]
    assert named and all(ref.startswith(f"{STATE['registry'].host}/specdec/") for ref in named), named


def test_the_released_kubectl_plugin_reads_the_decision_through_kubectl(node_cluster: Any, api: Any) -> None:
    """The plugin from the release's krew archive (no checkout): kubectl finds kubectl-specdec on PATH."""
    install = STATE["plugin_install"]
    output, _ = install.communicate(timeout=600)
    assert install.returncode == 0, output[-2000:]
    assert "usage: kubectl specdec" in output
    env = {**node_cluster.env(), "PATH": f"{STATE['plugin_env']['PATH'].split(':', 1)[0]}:{node_cluster.env()['PATH']}"}
    env["SPECDEC_PLUGIN_HOME"] = STATE["plugin_env"]["SPECDEC_PLUGIN_HOME"]
    listed = subprocess.run([str(node_cluster.kubectl_path), "plugin", "list"], env=env, capture_output=True, text=True, timeout=60)
    assert "kubectl-specdec" in listed.stdout, listed.stdout + listed.stderr
    shown = subprocess.run(
        [str(node_cluster.kubectl_path), "specdec", "status", "llama", "-n", NS], env=env, capture_output=True, text=True, timeout=120
    )
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert shown.stdout.startswith("llama: Promoted"), shown.stdout


def test_the_operator_pod_killed_is_restarted_by_the_kubelet_without_a_second_decision(node_cluster: Any, api: Any) -> None:
    before = status(api, "llama")
    probes_before = events(api, "llama").count("ProbeStarted")
    pod = operator_pod(api)
    (cs,) = pod.status.container_statuses
    task = devcluster.node_ctr(node_cluster, "tasks", "ls")
    pid = next(int(line.split()[1]) for line in task.stdout.splitlines()[1:] if line.split()[0] == cs.container_id.split("://", 1)[-1])
    os.kill(pid, signal.SIGKILL)
    restarted = wait(
        lambda: (p := operator_pod(api)) and p.status.container_statuses[0].restart_count >= 1 and p.status.container_statuses[0].ready and p,
        120,
        "the kubelet to restart the operator",
    )
    assert restarted.metadata.name == pod.metadata.name  # the same pod: restarted in place, not replaced
    assert restarted.status.container_statuses[0].last_state.terminated.exit_code == 137
    # Steps of the restarted operator, seen (an edit of spec.monitor.window each, its observedGeneration), decide
    # nothing again: neither its status nor its log (the restarted container's) has a second probe.
    after = step_after_now(api["custom"], NS, "llama", timeout=120)
    assert after["phase"] == "Promoted" and after.get("probe") == before.get("probe")
    log = api["core"].read_namespaced_pod_log(restarted.metadata.name, OPERATOR_NS)
    assert logged_events(log, "llama", "ProbeStarted") == 0, log[-3000:]
    assert events(api, "llama").count("ProbeStarted") == probes_before


def test_a_drafter_that_stops_paying_is_rolled_back_and_traffic_returns_to_base(node_cluster: Any, api: Any) -> None:
    spec = api["custom"].get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "llama")["spec"]
    env = [e for e in spec["sglang"]["env"] if e["name"] != "SIMULATOR_ACCEPT_LENGTH"]
    env.append({"name": "SIMULATOR_ACCEPT_LENGTH", "value": "1.0"})  # a drafter whose tokens are never accepted
    started = time.monotonic()
    api["custom"].patch_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "llama", {"spec": {"sglang": {"env": env}}})
    st = wait(lambda: (s := status(api, "llama")).get("phase") == "RolledBack" and s, 420, "llama rolled back after the drafter change")
    TIMINGS["change -> RolledBack (new revision re-validated and re-probed)"] = time.monotonic() - started
    assert st["activeVariant"] == "base"
    assert api["core"].read_namespaced_service("llama", NS).spec.selector["specdec.io/variant"] == "base"
    (info,) = run_client(api, "client-rolled-back", [{"url": f"http://llama.{NS}.svc:30000/server_info", "keys": ["speculative_algorithm"]}])
    assert info.get("status") == 200, info
    assert json.loads(info["body"]).get("speculative_algorithm") in (None, "", "None"), info
    api["custom"].delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "llama")
    wait(lambda: not api["core"].list_namespaced_pod(NS, label_selector="app.kubernetes.io/instance=llama").items, 120, "llama's pods gone")


def test_a_validator_over_its_memory_limit_is_oom_killed_and_reported(node_cluster: Any, api: Any) -> None:
    helm(
        node_cluster,
        "upgrade",
        RELEASE,
        *chart_args(),
        "--namespace",
        OPERATOR_NS,
        "--values",
        helm_values(["--validator-memory-limit=24Mi"]),
        "--wait",
        "--timeout",
        "5m",
    )
    wait(lambda: (p := operator_pod(api)) and p.status.container_statuses[0].ready and p, 120, "upgraded operator")
    api["custom"].create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, server("oom", "llama-eagle3-bloated"))
    st = wait_phase(api, "oom", {"Invalid", "Promoted", "RolledBack", "Failed"}, timeout=240)
    assert st["phase"] == "Invalid", st
    (finding,) = [f for f in st["validation"]["findings"] if f["code"] == "ValidatorOOMKilled"]
    assert "memory limit" in finding["message"]
    (pod,) = pods(api, "oom", "speculative")
    init = pod.status.init_container_statuses[0]
    term = init.state.terminated or init.last_state.terminated
    assert term.reason == "OOMKilled" and term.exit_code == 137
    assert pod.spec.init_containers[0].resources.limits["memory"] == "24Mi"
    api["custom"].delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "oom")


def test_helm_uninstall_removes_the_operator(node_cluster: Any, api: Any) -> None:
    helm(node_cluster, "uninstall", RELEASE, "--namespace", OPERATOR_NS, "--wait", "--timeout", "3m")
    wait(lambda: not api["core"].list_namespaced_pod(OPERATOR_NS).items, 120, "operator pods gone")
    assert not api["apps"].list_namespaced_deployment(OPERATOR_NS).items


def test_cluster_down_leaves_nothing_on_the_machine(node_cluster: Any) -> None:
    started = time.monotonic()
    assert devcluster.down(node_cluster.name, purge=False)
    TIMINGS["down (real node and control plane)"] = time.monotonic() - started
    assert realnode.leftovers(node_cluster.name, node_cluster.directory) == []
