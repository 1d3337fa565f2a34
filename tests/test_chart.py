"""The Helm chart (charts/specdec-operator), rendered and linted with the real helm binary.

Pure-render tests need only helm (`make tools`); every rendered manifest is validated against the Kubernetes
schemas of the control plane's release (kubernetes-validate, strict). The cluster tests (marked `cluster`, at
the end) install the chart into the local control plane, prove its RBAC with `kubectl auth can-i`, and run the
operator from the checkout under the chart's ServiceAccount with every API request recorded.
"""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kube import wait_until

ROOT = pathlib.Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "specdec-operator"


def kubernetes_version() -> str:
    """The control plane's release (hack/versions.env KUBERNETES_VERSION) as kubernetes-validate wants it."""
    for line in (ROOT / "hack" / "versions.env").read_text().splitlines():
        if line.startswith("KUBERNETES_VERSION="):
            return line.split("=", 1)[1].strip().lstrip("v")
    raise AssertionError("KUBERNETES_VERSION missing from hack/versions.env")


# Value sets the chart must render and lint with. Each is a realistic install.
VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "namespaced-ha": {
        "watch": {"allNamespaces": False, "namespaces": ["team-a", "team-b"]},
        "replicaCount": 2,
        "podDisruptionBudget": {"enabled": True, "maxUnavailable": 1},
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "specdec-operator"}},
            }
        ],
    },
    "namespaced-release-namespace": {"watch": {"allNamespaces": False, "namespaces": []}},
    "observability": {
        "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
        "prometheusRule": {"enabled": True, "alertLabels": {"team": "inference"}, "operatorDownFor": "3m"},
        "grafanaDashboard": {"enabled": True, "annotations": {"grafana_folder": "Inference"}},
    },
    "customized": {
        "image": {"repository": "registry.example.com/mirror/specdec-operator", "digest": "sha256:" + "ab" * 32, "pullPolicy": "Always"},
        "imagePullSecrets": [{"name": "mirror-pull"}],
        "operator": {
            "validatorImage": "registry.example.com/mirror/specdec-operator:0.1.0",
            "verbose": True,
            "extraArgs": ["--reconcile-interval=5"],
            "extraEnv": [{"name": "TZ", "value": "UTC"}],
            "healthPort": 18080,
            "metricsPort": 19090,
        },
        "peering": {"enabled": True, "name": "specdec-prod"},
        "podLabels": {"team": "inference"},
        "podAnnotations": {"example.com/owner": "ml-platform"},
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "control", "effect": "NoSchedule"}],
        "priorityClassName": "system-cluster-critical",
        "serviceAccount": {"annotations": {"example.com/role": "specdec"}},
        "fullnameOverride": "specdec",
    },
    "bring-your-own-rbac": {
        "rbac": {"create": False},
        "serviceAccount": {"create": False, "name": "platform-specdec"},
        "peering": {"enabled": False},
        "metrics": {"service": {"enabled": False, "type": "ClusterIP", "port": 9090, "annotations": {}}},
    },
}


def _values_file(tmp_path: pathlib.Path, name: str) -> pathlib.Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(VALUE_SETS[name]))
    return path


def helm(helm_bin: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([helm_bin, *args], capture_output=True, text=True, timeout=120)
    if check and proc.returncode != 0:
        pytest.fail(f"helm {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}", pytrace=False)
    return proc


def render(
    helm_bin: str, values: pathlib.Path | None = None, *extra: str, namespace: str = "specdec-system", crds: bool = False
) -> list[dict[str, Any]]:
    args = ["template", "specdec", str(CHART), "--namespace", namespace, *extra]
    if crds:
        args.append("--include-crds")
    if values is not None:
        args += ["--values", str(values)]
    out = helm(helm_bin, *args).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


@pytest.fixture(params=sorted(VALUE_SETS))
def rendered(request, helm_bin, tmp_path) -> tuple[str, list[dict[str, Any]]]:
    name = request.param
    return name, render(helm_bin, _values_file(tmp_path, name), crds=True)


# -------------------------------------------------------------------------------------------------------------
# Lint, schema, validation


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_helm_lint_strict(helm_bin, tmp_path, name):
    proc = helm(helm_bin, "lint", "--strict", str(CHART), "--namespace", "specdec-system", "--values", str(_values_file(tmp_path, name)), check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 chart(s) failed" in proc.stdout


def test_every_rendered_manifest_validates_against_the_kubernetes_schemas(rendered):
    import kubernetes_validate

    name, docs = rendered
    version = kubernetes_version()
    checked = 0
    for doc in docs:
        if doc["apiVersion"].startswith(("monitoring.coreos.com/", "kopf.dev/")):
            continue  # custom kinds: checked by the ServiceMonitor/PrometheusRule and peering tests
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"[{name}] {doc['kind']}/{doc['metadata']['name']}: {exc.message}", pytrace=False)
        checked += 1
    assert checked >= 4, f"[{name}] only {checked} manifests rendered"  # 3 CRDs + the Deployment at least


YAMLLINT_RENDERED = """
extends: default
rules:
  document-start: disable
  line-length: {max: 240}
  comments: {min-spaces-from-content: 1}
  indentation: {indent-sequences: whatever}
"""


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_rendered_yaml_is_clean(helm_bin, tmp_path, name):
    """What users read in `helm template` and dist/install.yaml: no trailing spaces, stray blank lines, bad
    indentation or duplicate keys (yamllint)."""
    from yamllint import linter
    from yamllint.config import YamlLintConfig

    text = helm(helm_bin, "template", "specdec", str(CHART), "--namespace", "specdec-system", "--values", str(_values_file(tmp_path, name))).stdout
    problems = [f"{p.line}: {p.desc}" for p in linter.run(text, YamlLintConfig(YAMLLINT_RENDERED))]
    assert not problems, problems


def test_validation_would_catch_a_broken_manifest(helm_bin):
    """Guard for the test above: the validator really is strict for this Kubernetes version."""
    import kubernetes_validate

    deployment = one(render(helm_bin), "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["securityContxt"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, kubernetes_version(), strict=True)


def _leaf_paths(node: Any, prefix: str = "") -> Iterator[str]:
    """Dotted paths of values.yaml down to scalars, lists and free-form maps."""
    if isinstance(node, dict) and node:
        for key, value in node.items():
            yield from _leaf_paths(value, f"{prefix}.{key}" if prefix else key)
    else:
        yield prefix


def _schema_at(schema: dict[str, Any], path: str) -> dict[str, Any] | None:
    node = schema
    for key in path.split("."):
        props = node.get("properties")
        if props is None:
            return node if node.get("type") == "object" else None  # a free-form map covers what is below it
        if key not in props:
            return None
        node = props[key]
    return node


def test_schema_describes_every_value_and_nothing_else():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())
    missing = [p for p in _leaf_paths(values) if _schema_at(schema, p) is None]
    assert not missing, f"values without a schema: {missing}"

    def walk(node: dict[str, Any], prefix: str) -> Iterator[tuple[str, dict[str, Any]]]:
        for key, sub in node.get("properties", {}).items():
            path = f"{prefix}.{key}" if prefix else key
            yield path, sub
            yield from walk(sub, path)

    undocumented = [p for p, sub in walk(schema, "") if not sub.get("description")]
    assert not undocumented, f"schema properties without a description: {undocumented}"
    phantom = []
    for path, _ in walk(schema, ""):
        node: Any = values
        for key in path.split("."):
            if not isinstance(node, dict) or key not in node:
                node = KeyError
                break
            node = node[key]
        if node is KeyError and path != "global":
            phantom.append(path)
    assert not phantom, f"schema properties that values.yaml does not have: {phantom}"


@pytest.mark.parametrize(
    "setting,message",
    [
        ("bogus=1", "additional properties 'bogus'"),
        ("replicaCount=two", "replicaCount"),
        ("image.pullPolicy=Sometimes", "pullPolicy"),
        ("watch.namespaces[0]=Not_A_Namespace", "namespaces"),
        ("operator.metricsPort=70000", "metricsPort"),
        ("image.digest=latest", "digest"),
    ],
)
def test_schema_refuses_bad_values(helm_bin, setting, message):
    proc = helm(helm_bin, "template", "x", str(CHART), "--set", setting, check=False)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr


def test_readme_lists_every_value():
    readme = (CHART / "README.md").read_text()
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    listed = set(re.findall(r"^\| `([^`]+)` \|", readme, flags=re.M))
    missing = [p for p in _leaf_paths(values) if p not in listed]
    assert not missing, f"charts/specdec-operator/README.md does not list: {missing}"
    stale = sorted(p for p in listed if _schema_at(json.loads((CHART / "values.schema.json").read_text()), p) is None)
    assert not stale, f"README lists values that do not exist: {stale}"


# -------------------------------------------------------------------------------------------------------------
# CRDs


def test_chart_crds_are_the_generated_crd_and_kopfs_peering_crds(helm_bin):
    files = sorted(p.name for p in (CHART / "crds").iterdir())
    assert files == ["kopf.dev_clusterkopfpeerings.yaml", "kopf.dev_kopfpeerings.yaml", "specdec.io_speculativeservers.yaml"]
    generated = (ROOT / "crds" / "specdec.io_speculativeservers.yaml").read_text()
    assert (CHART / "crds" / "specdec.io_speculativeservers.yaml").read_text() == generated, "run `make crd`"
    crds = {d["metadata"]["name"]: d for d in by_kind(render(helm_bin, crds=True), "CustomResourceDefinition")}
    assert set(crds) == {"speculativeservers.specdec.io", "clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"}
    assert crds["clusterkopfpeerings.kopf.dev"]["spec"]["scope"] == "Cluster"
    assert crds["kopfpeerings.kopf.dev"]["spec"]["scope"] == "Namespaced"
    for name in ("clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"):
        version = crds[name]["spec"]["versions"][0]
        assert (version["name"], version["served"], version["storage"]) == ("v1", True, True)
        # Kopf writes its keep-alives into .status of the main resource (no status subresource).
        assert "subresources" not in version
        assert version["schema"]["openAPIV3Schema"]["properties"]["status"]["x-kubernetes-preserve-unknown-fields"]


def test_chart_creates_the_peering_objects_kopf_waits_for(helm_bin, tmp_path):
    """With --peering Kopf starts paused until the named peering object exists; the chart creates it."""
    cluster = render(helm_bin)
    (peering,) = by_kind(cluster, "ClusterKopfPeering")
    assert peering["apiVersion"] == "kopf.dev/v1"
    assert _flags(_container(cluster))["--peering"] == [peering["metadata"]["name"]]
    namespaced = render(helm_bin, _values_file(tmp_path, "namespaced-ha"))
    assert by_kind(namespaced, "ClusterKopfPeering") == []
    peerings = by_kind(namespaced, "KopfPeering")
    assert sorted(p["metadata"]["namespace"] for p in peerings) == ["team-a", "team-b"]
    assert {p["metadata"]["name"] for p in peerings} == {"specdec-specdec-operator"}
    standalone = render(helm_bin, _values_file(tmp_path, "bring-your-own-rbac"))
    assert by_kind(standalone, "ClusterKopfPeering") == by_kind(standalone, "KopfPeering") == []


def test_peering_crds_match_what_kopf_looks_for():
    """Kopf finds its peering resources by group/plural: the CRDs must carry exactly those names."""
    from kopf._cogs.structs import references

    wanted = {(s.group, s.version, s.any_name) for s in (references.CLUSTER_PEERINGS_K, references.NAMESPACED_PEERINGS_K)}
    shipped = set()
    for path in (CHART / "crds").glob("kopf.dev_*.yaml"):
        crd = yaml.safe_load(path.read_text())
        for version in crd["spec"]["versions"]:
            shipped.add((crd["spec"]["group"], version["name"], crd["spec"]["names"]["plural"]))
    assert shipped == wanted


# -------------------------------------------------------------------------------------------------------------
# The operator Deployment


def _container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["operator"]
    return pod["containers"][0]


def test_operator_pod_is_locked_down(rendered):
    name, docs = rendered
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    container = _container(docs)
    sc = container["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"]["drop"] == ["ALL"] and "add" not in sc["capabilities"]
    assert sc.get("privileged", False) is False
    psc = pod["securityContext"]
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] != 0
    assert psc["seccompProfile"]["type"] == "RuntimeDefault"
    assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")
    assert {"requests", "limits"} <= set(container["resources"])
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(container["resources"][kind]), f"[{name}] {kind}"
    # The only writable path is the /tmp emptyDir.
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounts == {"/tmp": "tmp"}
    assert {v["name"]: "emptyDir" in v for v in pod["volumes"]} == {"tmp": True}


def _flags(container: dict[str, Any]) -> dict[str, list[str]]:
    flags: dict[str, list[str]] = {}
    for arg in container["args"]:
        key, _, value = arg.partition("=")
        flags.setdefault(key, []).append(value)
    return flags


def test_liveness_and_metrics_ports_agree_with_the_operator_flags(rendered):
    name, docs = rendered
    container = _container(docs)
    flags = _flags(container)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    liveness = flags["--liveness"][0]
    assert liveness == f"http://0.0.0.0:{ports['health']}/healthz"
    probe = container["livenessProbe"]["httpGet"]
    assert probe["path"] == "/healthz" and probe["port"] == "health"
    assert flags["--metrics-port"] == [str(ports["metrics"])]
    services = [s for s in by_kind(docs, "Service") if s["metadata"]["name"].endswith("-metrics")]
    if VALUE_SETS[name].get("metrics", {}).get("service", {}).get("enabled", True):
        (service,) = services
        assert service["spec"]["ports"][0]["targetPort"] == "metrics"
        pod_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= pod_labels.items()
    else:
        assert services == []


def test_watch_mode_flags(helm_bin, tmp_path):
    cluster = _flags(_container(render(helm_bin)))
    assert "--all-namespaces" in cluster and "--namespace" not in cluster
    namespaced = _flags(_container(render(helm_bin, _values_file(tmp_path, "namespaced-ha"))))
    assert "--all-namespaces" not in namespaced
    assert namespaced["--namespace"] == ["team-a", "team-b"]
    default_ns = _flags(_container(render(helm_bin, _values_file(tmp_path, "namespaced-release-namespace"), namespace="inference")))
    assert default_ns["--namespace"] == ["inference"]


def test_image_peering_and_validator_image(helm_bin, tmp_path):
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    default = _container(render(helm_bin))
    image = f"{values['image']['repository']}:{chart['appVersion']}"
    assert default["image"] == image
    flags = _flags(default)
    assert flags["--validator-image"] == [image], "the init container defaults to the operator image"
    assert flags["--peering"] == ["specdec-specdec-operator"]
    env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in default["env"]}
    assert env["POD_ID"] == "metadata.name", "Kopf's peering identity must tell replicas apart"

    custom = _container(render(helm_bin, _values_file(tmp_path, "customized")))
    assert custom["image"] == "registry.example.com/mirror/specdec-operator@sha256:" + "ab" * 32
    flags = _flags(custom)
    assert flags["--validator-image"] == ["registry.example.com/mirror/specdec-operator:0.1.0"]
    assert flags["--peering"] == ["specdec-prod"]
    assert "--verbose" in flags and flags["--reconcile-interval"] == ["5"]
    assert {"name": "TZ", "value": "UTC"} in custom["env"]

    standalone = _flags(_container(render(helm_bin, _values_file(tmp_path, "bring-your-own-rbac"))))
    assert "--peering" not in standalone and "--standalone" in standalone


def test_more_than_one_replica_rolls_and_has_a_disruption_budget(helm_bin, tmp_path):
    docs = render(helm_bin, _values_file(tmp_path, "namespaced-ha"))
    deployment = one(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    single = one(render(helm_bin), "Deployment")
    assert single["spec"]["strategy"]["type"] == "Recreate"
    assert by_kind(render(helm_bin), "PodDisruptionBudget") == []


# -------------------------------------------------------------------------------------------------------------
# RBAC (static). The cluster tests prove the same rules with `kubectl auth can-i`.

# What the operator does with the API, as measured by the end-to-end test below: (apiGroup, resource) -> verbs.
OPERATOR_NAMESPACED_USAGE: dict[tuple[str, str], set[str]] = {
    ("specdec.io", "speculativeservers"): {"list", "watch", "patch"},
    ("specdec.io", "speculativeservers/status"): {"patch"},
    ("apps", "deployments"): {"get", "list", "watch", "create", "patch", "delete"},
    ("leaderworkerset.x-k8s.io", "leaderworkersets"): {"get", "list", "watch", "create", "patch", "delete"},
    ("", "services"): {"get", "list", "watch", "create", "patch"},
    ("", "configmaps"): {"get", "list", "watch", "create", "patch"},
    ("", "pods"): {"list", "watch", "create", "delete"},  # create, delete: a File dataset's reader pod
    ("", "events"): {"create"},
}
CRD_DISCOVERY: dict[tuple[str, str], set[str]] = {("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"}}
# Namespaced mode only: Kopf lists namespaces to resolve --namespace patterns (serving all, it does not).
NAMESPACE_DISCOVERY: dict[tuple[str, str], set[str]] = {("", "namespaces"): {"list", "watch"}}
DISCOVERY_USAGE = {**CRD_DISCOVERY, **NAMESPACE_DISCOVERY}
PEERING_VERBS = {"list", "watch", "patch"}  # the chart creates the peering object itself; patch names it


def grants(rules: list[dict[str, Any]]) -> dict[tuple[str, str], set[str]]:
    """Flatten RBAC rules into (apiGroup, resource) -> verbs (resourceNames-restricted verbs included)."""
    out: dict[tuple[str, str], set[str]] = {}
    for rule in rules:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
    return out


def all_rules(docs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for doc in docs:
        if doc["kind"] in ("Role", "ClusterRole"):
            for rule in doc.get("rules", []):
                yield f"{doc['kind']}/{doc['metadata']['name']}", rule


def test_no_wildcards_no_secrets_no_escalation_and_configmaps_only_to_own(rendered):
    name, docs = rendered
    for owner, rule in all_rules(docs):
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule.get(field, []), f"[{name}] {owner}: wildcard in {field}"
        assert "nonResourceURLs" not in rule
        resources = {r.split("/")[0] for r in rule["resources"]}
        if "configmaps" in resources:  # the adaptive table the operator owns: applied, read before taking the name, watched
            assert set(rule["verbs"]) <= {"get", "list", "watch", "create", "patch"}, f"[{name}] {owner}: {rule}"
        assert not resources & {
            "secrets",
            "serviceaccounts",
            "roles",
            "rolebindings",
            "clusterroles",
            "clusterrolebindings",
            "nodes",
        }, f"[{name}] {owner}: {rule}"
        assert not set(rule["verbs"]) & {"escalate", "bind", "impersonate", "deletecollection"}


def test_cluster_wide_rbac_is_exactly_the_operator_usage(helm_bin):
    docs = render(helm_bin)
    assert by_kind(docs, "Role") == [] and by_kind(docs, "RoleBinding") == []
    role = one(docs, "ClusterRole")
    expected = {**OPERATOR_NAMESPACED_USAGE, **CRD_DISCOVERY, ("kopf.dev", "clusterkopfpeerings"): PEERING_VERBS}
    assert grants(role["rules"]) == expected
    # Peering writes go to the one named peering object only.
    for rule in role["rules"]:
        if rule["apiGroups"] == ["kopf.dev"] and "patch" in rule["verbs"]:
            assert rule["resourceNames"] == ["specdec-specdec-operator"]
    binding = one(docs, "ClusterRoleBinding")
    sa = one(docs, "ServiceAccount")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": "specdec-system"}]
    assert one(docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == sa["metadata"]["name"]


def test_namespaced_rbac_grants_only_the_watched_namespaces(helm_bin, tmp_path):
    docs = render(helm_bin, _values_file(tmp_path, "namespaced-ha"))
    roles = {r["metadata"]["namespace"]: r for r in by_kind(docs, "Role")}
    assert set(roles) == {"team-a", "team-b"}
    for _ns, role in roles.items():
        assert grants(role["rules"]) == {**OPERATOR_NAMESPACED_USAGE, ("kopf.dev", "kopfpeerings"): PEERING_VERBS}
    bindings = {b["metadata"]["namespace"]: b for b in by_kind(docs, "RoleBinding")}
    assert set(bindings) == set(roles)
    for binding in bindings.values():
        assert binding["subjects"][0]["namespace"] == "specdec-system"
    # Cluster-scoped: only read access for Kopf's discovery.
    discovery = one(docs, "ClusterRole")
    assert grants(discovery["rules"]) == DISCOVERY_USAGE
    assert one(docs, "ClusterRoleBinding")["roleRef"]["name"] == discovery["metadata"]["name"]


def test_owner_reference_enforcement_adds_only_finalizers_update(helm_bin):
    plain = grants(one(render(helm_bin), "ClusterRole")["rules"])
    openshift = grants(one(render(helm_bin, None, "--set", "rbac.ownerReferencesPermissionEnforcement=true"), "ClusterRole")["rules"])
    assert openshift == {**plain, ("specdec.io", "speculativeservers/finalizers"): {"update"}}


def test_rbac_and_serviceaccount_can_be_brought_by_the_user(helm_bin, tmp_path):
    docs = render(helm_bin, _values_file(tmp_path, "bring-your-own-rbac"))
    for kind in ("Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding", "ServiceAccount"):
        assert by_kind(docs, kind) == [], kind
    assert one(docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "platform-specdec"
    proc = helm(helm_bin, "template", "x", str(CHART), "--set", "serviceAccount.create=false", check=False)
    assert proc.returncode != 0 and "serviceAccount.name" in proc.stderr


# -------------------------------------------------------------------------------------------------------------
# Observability: ServiceMonitor, PrometheusRule, Grafana dashboard


def _metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects, from promql-parser's syntax tree (raises on bad syntax)."""
    import promql_parser

    names: set[str] = set()

    def walk(node: Any) -> None:
        kind = type(node).__name__
        if kind == "VectorSelector":
            names.add(node.name)
            return
        for attr in ("lhs", "rhs", "expr", "vector_selector", "param", "args"):
            child = getattr(node, attr, None)
            if child is None:
                continue
            if isinstance(child, (list, tuple)):
                for item in child:
                    walk(item)
            elif type(child).__module__ == "promql_parser":
                walk(child)

    walk(promql_parser.parse(expr))
    return names


def _operator_metric_names() -> set[str]:
    """Series names the operator exposes, read from its own prometheus-client registry."""
    from specdec_operator.metrics import OperatorMetrics

    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}
    names: set[str] = set()
    for family in OperatorMetrics().registry.collect():
        names.add(family.name)
        names.update(family.name + suffix for suffix in suffixes.get(family.type, ()))
    return names


def test_servicemonitor_scrapes_the_metrics_service(helm_bin, tmp_path):
    docs = render(helm_bin, _values_file(tmp_path, "observability"))
    monitor = one(docs, "ServiceMonitor")
    service = next(s for s in by_kind(docs, "Service") if s["metadata"]["name"].endswith("-metrics"))
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [service["metadata"]["namespace"]]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["honorLabels"] is True
    proc = helm(helm_bin, "template", "x", str(CHART), "--set", "serviceMonitor.enabled=true", "--set", "metrics.service.enabled=false", check=False)
    assert proc.returncode != 0 and "metrics.service.enabled" in proc.stderr


def test_alerts_cover_rollbacks_drift_probe_failures_and_operator_down(helm_bin, tmp_path):
    docs = render(helm_bin, _values_file(tmp_path, "observability"))
    rule = one(docs, "PrometheusRule")
    (group,) = rule["spec"]["groups"]
    alerts = {r["alert"]: r for r in group["rules"]}
    assert set(alerts) == {"SpecdecServerRolledBack", "SpecdecAcceptanceDrift", "SpecdecProbeFailures", "SpecdecOperatorDown"}
    service = next(s for s in by_kind(docs, "Service") if s["metadata"]["name"].endswith("-metrics"))
    exposed = _operator_metric_names()
    for name, alert in alerts.items():
        assert alert["labels"]["severity"] in {"warning", "critical"}
        assert alert["labels"]["team"] == "inference", "alertLabels reach every alert"
        assert alert["annotations"]["summary"] and alert["annotations"]["description"]
        metrics = _metric_names(alert["expr"])
        # Every operator series is selected through the metrics Service's scrape job.
        assert f'job="{service["metadata"]["name"]}"' in alert["expr"], name
        unknown = {m for m in metrics if m != "up"} - exposed
        assert not unknown, f"{name} selects series the operator does not expose: {unknown}"
    assert alerts["SpecdecOperatorDown"]["for"] == "3m"
    assert 'reason="AcceptanceDrift"' in alerts["SpecdecAcceptanceDrift"]["expr"]
    assert 'reason!="AcceptanceDrift"' in alerts["SpecdecServerRolledBack"]["expr"], "one alert per rollback"
    assert "absent(" in alerts["SpecdecOperatorDown"]["expr"]


def test_dashboard_shows_speedup_acceptance_variant_and_rollbacks(helm_bin, tmp_path):
    docs = render(helm_bin, _values_file(tmp_path, "observability"))
    configmap = one(docs, "ConfigMap")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["metadata"]["annotations"] == {"grafana_folder": "Inference"}
    (key,) = configmap["data"]
    dashboard = json.loads(configmap["data"][key])
    assert dashboard == json.loads((CHART / "dashboards" / "specdec-operator.json").read_text())
    titles = " | ".join(p["title"].lower() for p in dashboard["panels"])
    for topic in ("speedup", "acceptance", "active variant", "rollbacks"):
        assert topic in titles, topic
    exposed = _operator_metric_names()
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            # Grafana's macros are not PromQL; substitute what Grafana would.
            expr = target["expr"].replace("$__range", "6h").replace("$__rate_interval", "1m")
            metrics = _metric_names(expr)
            assert metrics, f"{panel['title']}: no metric in {expr}"
            assert metrics <= exposed, f"{panel['title']} queries series the operator does not expose"


def test_notes_say_where_to_look(helm_bin):
    proc = helm(helm_bin, "install", "specdec", str(CHART), "--namespace", "ops", "--dry-run=client")
    notes = proc.stdout.split("NOTES:", 1)[1]
    assert "kubectl -n ops rollout status deployment/specdec-specdec-operator" in notes
    assert "in every namespace" in notes
    assert "crds" in notes.lower(), "NOTES must remind that helm does not upgrade CRDs"


# -------------------------------------------------------------------------------------------------------------
# Plain manifests (make manifests)


def test_make_manifests_renders_an_installable_file(tools_dir, tmp_path):
    import kubernetes_validate

    proc = subprocess.run(
        ["bash", str(ROOT / "hack" / "manifests.sh")],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "SPECDEC_TOOLS_DIR": str(tools_dir), "DIST_DIR": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all((tmp_path / "install.yaml").read_text()) if d]
    kinds = [d["kind"] for d in docs]
    # kubectl applies in file order: CRDs, then the Namespace, then what lives in it.
    assert kinds[:4] == ["CustomResourceDefinition"] * 3 + ["Namespace"]
    assert {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Service", "Deployment"} <= set(kinds[4:])
    namespace = docs[3]["metadata"]
    assert namespace["name"] == "specdec-system"
    assert namespace["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    for doc in docs:
        if doc["apiVersion"] != "kopf.dev/v1":
            kubernetes_validate.validate(doc, kubernetes_version(), strict=True)
        if doc["kind"] != "CustomResourceDefinition" and doc["kind"] != "Namespace":
            assert doc["metadata"]["name"].startswith("specdec-operator")
            assert doc["metadata"].get("namespace", "specdec-system") == "specdec-system"
    generated = yaml.safe_load((ROOT / "crds" / "specdec.io_speculativeservers.yaml").read_text())
    assert generated in docs, "dist/install.yaml must carry the generated CRD"
    crds_only = [d for d in yaml.safe_load_all((tmp_path / "crds.yaml").read_text()) if d]
    assert crds_only == docs[:3]


def test_make_manifests_passes_settings_to_helm_and_checks_the_namespace(tools_dir, tmp_path):
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "SPECDEC_TOOLS_DIR": str(tools_dir),
        "DIST_DIR": str(tmp_path),
        "NAMESPACE": "inference-system",
    }
    script = str(ROOT / "hack" / "manifests.sh")
    proc = subprocess.run(["bash", script, "--set", "watch.allNamespaces=false"], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all((tmp_path / "install.yaml").read_text()) if d]
    roles = [d for d in docs if d["kind"] == "Role"]
    assert [r["metadata"]["namespace"] for r in roles] == ["inference-system"]
    bad = subprocess.run(["bash", script], capture_output=True, text=True, timeout=60, env={**env, "NAMESPACE": "Not_Valid"})
    assert bad.returncode != 0
    assert bad.stderr.strip().count("\n") == 0 and "NAMESPACE" in bad.stderr


# =============================================================================================================
# On the local control plane: install, Pod Security admission, `kubectl auth can-i`, and the operator from the
# checkout running under the chart's ServiceAccount.

GROUP, VERSION, PLURAL = "specdec.io", "v1alpha1", "speculativeservers"


def _helm_install(kube_cluster: Any, helm_bin: str, release: str, namespace: str, *sets: str) -> None:
    proc = subprocess.run(
        [
            helm_bin,
            "install",
            release,
            str(CHART),
            "--namespace",
            namespace,
            "--wait",
            "--timeout",
            "90s",
            *[arg for s in sets for arg in ("--set", s)],
        ],
        capture_output=True,
        text=True,
        timeout=150,
        env=kube_cluster.env(),
    )
    if proc.returncode != 0:
        pytest.fail(f"helm install {release} failed: {proc.stderr.strip()}", pytrace=False)


def _helm_uninstall(kube_cluster: Any, helm_bin: str, release: str, namespace: str) -> None:
    subprocess.run(
        [helm_bin, "uninstall", release, "--namespace", namespace, "--wait", "--timeout", "60s"],
        capture_output=True,
        text=True,
        timeout=90,
        env=kube_cluster.env(),
    )


def _make_namespace(core_v1: Any, prefix: str, labels: dict[str, str] | None = None) -> str:
    import uuid

    from kubernetes import client

    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    core_v1.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels={"specdec.test/namespace": "true", **(labels or {})})))
    return name


class Release(dict):
    """What a test needs to know about an installed release."""

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self['namespace']}:{self['serviceaccount']}"


@pytest.fixture(scope="module")
def cluster_release(kube_cluster, kube_client, core_v1, helm_bin) -> Iterator[Release]:
    """The chart installed with its defaults (cluster-wide) into a namespace enforcing `restricted` pod security."""
    import uuid

    namespace = _make_namespace(core_v1, "specdec-system", {"pod-security.kubernetes.io/enforce": "restricted"})
    release = f"chart-{uuid.uuid4().hex[:5]}"
    _helm_install(kube_cluster, helm_bin, release, namespace)
    fullname = f"{release}-specdec-operator"
    try:
        yield Release(namespace=namespace, release=release, fullname=fullname, serviceaccount=fullname, peering=fullname)
    finally:
        _helm_uninstall(kube_cluster, helm_bin, release, namespace)
        core_v1.delete_namespace(namespace, propagation_policy="Background")


def can_i(kube_cluster: Any, user: str, verb: str, resource: str, namespace: str | None, subresource: str | None = None) -> bool:
    """`kubectl auth can-i VERB RESOURCE --as=USER` (namespace None: across all namespaces / cluster scope)."""
    args = ["auth", "can-i", verb, resource, f"--as={user}"]
    args += ["--namespace", namespace] if namespace else ["--all-namespaces"]
    if subresource:
        args.append(f"--subresource={subresource}")
    proc = kube_cluster.kubectl(*args, check=False)
    answer = proc.stdout.strip()
    assert answer in ("yes", "no"), f"kubectl {' '.join(args)}: {proc.stdout} {proc.stderr}"
    return answer == "yes"


def _resource_arg(group: str, resource: str) -> tuple[str, str | None]:
    base, _, sub = resource.partition("/")
    return (f"{base}.{group}" if group else base), (sub or None)


def can_i_matrix(kube_cluster: Any, user: str, checks: list[tuple[str, str, str | None]]) -> dict:
    """Answer many can-i questions (verb, resource-arg, namespace) concurrently."""
    from concurrent.futures import ThreadPoolExecutor

    def ask(check: tuple[str, str, str | None]) -> bool:
        verb, resource, namespace = check
        base, _, sub = resource.partition("|")
        return can_i(kube_cluster, user, verb, base, namespace, sub or None)

    with ThreadPoolExecutor(8) as pool:
        return dict(zip(checks, pool.map(ask, checks)))


# Things the operator never needs: each must be refused (resource argument for kubectl, '|subresource').
FORBIDDEN = [
    *[(verb, "secrets", ns) for verb in ("get", "list", "watch", "create", "update", "patch", "delete") for ns in ("default", None)],
    ("*", "*", None),
    ("*", "*", "default"),
    ("get", "*", "default"),
    ("*", "deployments.apps", "default"),
    ("delete", "configmaps", "default"),
    ("update", "configmaps", "default"),
    ("patch", "pods", "default"),
    ("update", "pods", "default"),
    ("create", "pods|exec", "default"),
    ("get", "pods|log", "default"),
    ("get", "services|proxy", "default"),
    ("deletecollection", "deployments.apps", "default"),
    ("deletecollection", "services", "default"),
    ("update", "deployments.apps", "default"),
    ("delete", "services", "default"),
    ("update", "services", "default"),
    ("get", "pods", "default"),
    ("create", "events.events.k8s.io", "default"),
    ("update", "speculativeservers.specdec.io|status", "default"),
    ("create", "speculativeservers.specdec.io", "default"),
    ("delete", "speculativeservers.specdec.io", "default"),
    ("update", "speculativeservers.specdec.io", "default"),
    ("create", "customresourcedefinitions.apiextensions.k8s.io", None),
    ("delete", "customresourcedefinitions.apiextensions.k8s.io", None),
    ("patch", "customresourcedefinitions.apiextensions.k8s.io", None),
    ("create", "namespaces", None),
    ("delete", "namespaces", None),
    ("list", "nodes", None),
    ("get", "persistentvolumeclaims", "default"),
    ("create", "jobs.batch", "default"),
    ("create", "serviceaccounts|token", "default"),
    ("create", "rolebindings.rbac.authorization.k8s.io", "default"),
    ("bind", "clusterroles.rbac.authorization.k8s.io", None),
    ("escalate", "clusterroles.rbac.authorization.k8s.io", None),
    ("impersonate", "users", None),
    ("impersonate", "serviceaccounts", "default"),
    ("create", "clusterkopfpeerings.kopf.dev", None),
    ("delete", "clusterkopfpeerings.kopf.dev", None),
    ("get", "clusterkopfpeerings.kopf.dev/someone-else", None),
    ("patch", "clusterkopfpeerings.kopf.dev/someone-else", None),
]


# Groups whose CRD the test cluster does not serve: `kubectl auth can-i` cannot resolve their resources without
# discovery (it answers no), so their grants are checked statically only (test_cluster_wide_rbac_is_exactly_the_operator_usage).
NOT_SERVED_HERE = {"leaderworkerset.x-k8s.io"}


def _usage_checks(usage: dict[tuple[str, str], set[str]], namespaces: list[str | None]) -> list:
    checks = []
    for (group, resource), verbs in usage.items():
        if group in NOT_SERVED_HERE:
            continue
        base, sub = _resource_arg(group, resource)
        for verb in sorted(verbs):
            for ns in namespaces:
                checks.append((verb, f"{base}|{sub}" if sub else base, ns))
    return checks


@pytest.mark.cluster
def test_operator_pod_passes_restricted_pod_security_admission(cluster_release, kube_cluster, core_v1, helm_bin):
    """The namespace enforces the `restricted` Pod Security Standard: the operator's pod is admitted."""
    ns = cluster_release["namespace"]
    pods = wait_until(
        lambda: core_v1.list_namespaced_pod(ns, label_selector="app.kubernetes.io/component=operator").items, timeout=30, message="operator pod"
    )
    assert pods[0].spec.service_account_name == cluster_release["serviceaccount"]
    # Guard: the same namespace refuses a relaxed copy of that pod, so the admission above meant something.
    deployment = one(render(helm_bin, None, "--set", "securityContext.allowPrivilegeEscalation=true", namespace=ns), "Deployment")
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "relaxed", "namespace": ns},
        "spec": {**deployment["spec"]["template"]["spec"], "serviceAccountName": cluster_release["serviceaccount"]},
    }
    proc = kube_cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False)
    assert proc.returncode != 0 and "violates PodSecurity" in proc.stderr, proc.stderr


@pytest.mark.cluster
def test_cluster_wide_rbac_can_i_matrix(cluster_release, kube_cluster):
    user = cluster_release.user
    peering = cluster_release["peering"]
    allowed = _usage_checks(OPERATOR_NAMESPACED_USAGE, ["default", "some-team", None])
    allowed += _usage_checks(CRD_DISCOVERY, [None])
    allowed += [(v, "clusterkopfpeerings.kopf.dev", None) for v in ("list", "watch")]
    allowed += [("patch", f"clusterkopfpeerings.kopf.dev/{peering}", None)]
    forbidden = FORBIDDEN + [("list", "namespaces", None), ("get", "namespaces", None)]
    answers = can_i_matrix(kube_cluster, user, allowed + forbidden)
    refused = [c for c in allowed if not answers[c]]
    assert not refused, f"the operator's ServiceAccount lacks: {refused}"
    granted = [c for c in forbidden if answers[c]]
    assert not granted, f"the operator's ServiceAccount may do what it never needs: {granted}"


@pytest.mark.cluster
def test_namespaced_rbac_can_i_matrix_and_operator_run(kube_cluster, kube_client, core_v1, apps_v1, custom_objects, helm_bin, tmp_path):
    """Namespaced mode: `kubectl auth can-i` in the served namespace (yes) and elsewhere (no); then the operator
    under that ServiceAccount serves a resource there with nothing refused, using the namespaces grant."""
    import uuid

    home = _make_namespace(core_v1, "specdec-ops")
    served = _make_namespace(core_v1, "team-a")
    other = _make_namespace(core_v1, "team-b")
    release = f"ns-{uuid.uuid4().hex[:5]}"
    _helm_install(kube_cluster, helm_bin, release, home, "watch.allNamespaces=false", f"watch.namespaces={{{served}}}")
    try:
        user = f"system:serviceaccount:{home}:{release}-specdec-operator"
        allowed = _usage_checks(OPERATOR_NAMESPACED_USAGE, [served])
        allowed += _usage_checks(DISCOVERY_USAGE, [None])
        allowed += [(v, "kopfpeerings.kopf.dev", served) for v in ("list", "watch")]
        allowed += [("patch", f"kopfpeerings.kopf.dev/{release}-specdec-operator", served)]
        refused_expected = _usage_checks(OPERATOR_NAMESPACED_USAGE, [other, home, None])
        refused_expected += [("list", "clusterkopfpeerings.kopf.dev", None), ("list", "kopfpeerings.kopf.dev", other)]
        refused_expected += [c for c in FORBIDDEN if c[2] is not None] + [(v, r, served) for v, r, ns in FORBIDDEN if ns == "default"]
        answers = can_i_matrix(kube_cluster, user, allowed + refused_expected)
        assert not [c for c in allowed if not answers[c]], "missing in the served namespace"
        assert not [c for c in refused_expected if answers[c]], "granted outside the served namespace"

        fullname = f"{release}-specdec-operator"
        operator = OperatorUnderServiceAccount(
            kube_cluster,
            core_v1,
            apps_v1,
            Release(namespace=home, release=release, fullname=fullname, serviceaccount=fullname, peering=fullname),
            tmp_path,
            [],
        )
        try:
            assert f"--namespace={served}" in operator.chart_args
            custom_objects.create_namespaced_custom_object(GROUP, VERSION, served, PLURAL, _compatible_example("llama", served))

            def served_with_children() -> bool:
                operator.check_running()
                st = custom_objects.get_namespaced_custom_object(GROUP, VERSION, served, PLURAL, "llama").get("status")
                names = {d.metadata.name for d in apps_v1.list_namespaced_deployment(served).items}
                return bool(st and st.get("phase")) and names == {"llama-base", "llama-spec"}

            wait_until(served_with_children, timeout=60, interval=0.5, message="status and Deployments")
            custom_objects.delete_namespaced_custom_object(GROUP, VERSION, served, PLURAL, "llama")
            wait_until(
                lambda: not custom_objects.list_namespaced_custom_object(GROUP, VERSION, served, PLURAL)["items"],
                timeout=60,
                message="the resource gone",
            )
        finally:
            operator.stop()
        operator.assert_nothing_refused()
        used = operator.used()
        # Kopf resolves --namespace patterns by listing and watching namespaces: the grant is needed here.
        assert {("list", "", "namespaces"), ("watch", "", "namespaces"), ("patch", "kopf.dev", "kopfpeerings")} <= used
        assert not {k for k in used if k[2] == "clusterkopfpeerings"}
        wait_until(lambda: not core_v1.list_namespaced_pod(served).items, timeout=60, message="pods gone")
    finally:
        _helm_uninstall(kube_cluster, helm_bin, release, home)
        for ns in (home, served, other):
            core_v1.delete_namespace(ns, propagation_policy="Background")


# -------------------------------------------------------------------------------------------------------------
# The operator from the checkout under the chart's ServiceAccount, every API request recorded.


class RecordingProxy:
    """A plain-HTTP reverse proxy in front of the kube-apiserver that records every request the operator makes.

    The operator's kubeconfig points here with the ServiceAccount's bearer token; the proxy forwards each request
    unchanged (TLS to the API server, streaming watches chunk by chunk) and records (method, path, query,
    status). The API server authenticates and authorizes the token: the proxy adds no privilege.
    """

    def __init__(self, upstream: str, ca_data: bytes) -> None:
        import asyncio
        import ssl
        import threading

        self.upstream = upstream.rstrip("/")
        self.ssl = ssl.create_default_context(cadata=ca_data.decode())
        self.records: list[tuple[str, str, str, int]] = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="api-recorder", daemon=True)
        self.thread.start()
        self.url = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(30)

    async def _start(self) -> str:
        import aiohttp
        from aiohttp import web

        self.session = aiohttp.ClientSession(auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None))
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self.runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def _forward(self, request: Any) -> Any:
        import aiohttp
        from aiohttp import web

        hop = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}
        headers = {k: v for k, v in request.headers.items() if k.lower() not in hop}
        body = await request.read()
        async with self.session.request(
            request.method, self.upstream + request.path_qs, headers=headers, data=body or None, ssl=self.ssl
        ) as upstream:
            self.records.append((request.method, request.path, request.query_string, upstream.status))
            response = web.StreamResponse(status=upstream.status, headers={k: v for k, v in upstream.headers.items() if k.lower() not in hop})
            await response.prepare(request)
            try:
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
            except (ConnectionError, aiohttp.ClientError):
                pass  # the operator closed a watch, or the proxy is shutting down
            return response

    def close(self) -> None:
        import asyncio

        async def stop() -> None:
            await self.session.close()  # ends the forwarded watches first, so the handlers return
            await self.runner.cleanup()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def api_request_kinds(method: str, path: str, query: str, status: int) -> list[tuple[str, str, str]]:
    """What the RBAC authorizer checked for one request: a server-side apply (PATCH) that created the object
    (201) was also authorized as create."""
    kind = api_request_kind(method, path, query)
    if kind is None:
        return []
    return [kind, ("create", kind[1], kind[2])] if method == "PATCH" and status == 201 else [kind]


def api_request_kind(method: str, path: str, query: str) -> tuple[str, str, str] | None:
    """(verb, apiGroup, resource[/subresource]) of a resource request, as the RBAC authorizer sees it.

    None for discovery and other non-resource URLs (/api, /apis, /apis/<group>/<version>, /version, ...).
    """
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["api"] and len(parts) >= 3:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 4:
        group, rest = parts[1], parts[3:]
    else:
        return None
    if rest[0] == "namespaces" and len(rest) >= 3:
        rest = rest[2:]  # a namespaced resource: drop "namespaces/<ns>"
    resource, name, sub = rest[0], (rest[1] if len(rest) > 1 else None), (rest[2] if len(rest) > 2 else None)
    watch = re.search(r"(^|&)watch=(true|1)($|&)", query) is not None
    verb = {
        "GET": "watch" if watch else ("get" if name else "list"),
        "POST": "create",
        "PUT": "update",
        "PATCH": "patch",
        "DELETE": "delete" if name else "deletecollection",
    }[method]
    return verb, group, f"{resource}/{sub}" if sub else resource


def test_api_request_kind_maps_paths_like_the_authorizer():
    assert api_request_kind("GET", "/apis/specdec.io/v1alpha1/speculativeservers", "watch=true&x=1") == ("watch", "specdec.io", "speculativeservers")
    assert api_request_kind("PATCH", "/apis/specdec.io/v1alpha1/namespaces/a/speculativeservers/s/status", "") == (
        "patch",
        "specdec.io",
        "speculativeservers/status",
    )
    assert api_request_kind("GET", "/api/v1/namespaces/a/pods", "labelSelector=x") == ("list", "", "pods")
    assert api_request_kind("GET", "/api/v1/namespaces", "") == ("list", "", "namespaces")
    assert api_request_kind("GET", "/api/v1/namespaces/a", "") == ("get", "", "namespaces")
    assert api_request_kind("POST", "/api/v1/namespaces/a/events", "") == ("create", "", "events")
    assert api_request_kind("DELETE", "/apis/apps/v1/namespaces/a/deployments", "") == ("deletecollection", "apps", "deployments")
    assert api_request_kind("GET", "/apis/apps/v1", "") is None
    assert api_request_kind("GET", "/api", "") is None
    assert api_request_kinds("PATCH", "/apis/apps/v1/namespaces/a/deployments/d", "fieldManager=x", 201) == [
        ("patch", "apps", "deployments"),
        ("create", "apps", "deployments"),
    ]
    assert api_request_kinds("PATCH", "/apis/apps/v1/namespaces/a/deployments/d", "", 200) == [("patch", "apps", "deployments")]


def _service_account_kubeconfig(core_v1: Any, release: Release, server: str, path: pathlib.Path) -> None:
    """A kubeconfig holding a bound token of the release's ServiceAccount (TokenRequest API), for `server`."""
    from kubernetes import client

    token = core_v1.create_namespaced_service_account_token(
        release["serviceaccount"],
        release["namespace"],
        client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)),
    ).status.token
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "operator",
                "clusters": [{"name": "local", "cluster": {"server": server}}],
                "users": [{"name": release["serviceaccount"], "user": {"token": token}}],
                "contexts": [{"name": "operator", "context": {"cluster": "local", "user": release["serviceaccount"]}}],
            }
        )
    )


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class OperatorUnderServiceAccount:
    """`specdec run` from the checkout with the arguments the chart gives its container, authenticated as the
    chart's ServiceAccount (a bound token from the TokenRequest API), every API request through a RecordingProxy.

    Only what an out-of-cluster run needs differs from the Deployment: loopback liveness and metrics ports, and
    an --endpoints mapping to simulators instead of cluster DNS.
    """

    def __init__(
        self,
        kube_cluster: Any,
        core_v1: Any,
        apps_v1: Any,
        release: Release,
        workdir: pathlib.Path,
        extra_args: list[str],
        pod_id: str = "checkout-operator",
    ) -> None:
        import base64
        import os
        import sys

        admin = yaml.safe_load(pathlib.Path(kube_cluster.kubeconfig).read_text())
        cluster = admin["clusters"][0]["cluster"]
        ca = (
            base64.b64decode(cluster["certificate-authority-data"])
            if "certificate-authority-data" in cluster
            else pathlib.Path(cluster["certificate-authority"]).read_bytes()
        )
        self.proxy = RecordingProxy(cluster["server"], ca)
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        kubeconfig = workdir / "operator.kubeconfig"
        _service_account_kubeconfig(core_v1, release, self.proxy.url, kubeconfig)
        deployment = apps_v1.read_namespaced_deployment(release["fullname"], release["namespace"])
        self.chart_args = list(deployment.spec.template.spec.containers[0].args)
        self.health, self.metrics = _free_port(), _free_port()
        args = [a for a in self.chart_args if not a.startswith(("--liveness=", "--metrics-port="))]
        args += [
            f"--liveness=http://127.0.0.1:{self.health}/healthz",
            f"--metrics-port={self.metrics}",
            "--metrics-address=127.0.0.1",
            "--reconcile-interval=1",
            *extra_args,
        ]
        env = {**os.environ, "KUBECONFIG": str(kubeconfig), "POD_ID": pod_id}
        env.pop("KUBERNETES_SERVICE_HOST", None)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "specdec_operator.cli", "run", *args],
            stdout=open(workdir / "operator.log", "w"),
            stderr=subprocess.STDOUT,
            env=env,
            cwd=workdir,
        )
        wait_until(self._alive, timeout=60, interval=0.5, message="the operator's liveness endpoint")

    def log(self) -> str:
        return (self.workdir / "operator.log").read_text()

    def check_running(self) -> None:
        assert self.process.poll() is None, f"operator exited {self.process.returncode}:\n{self.log()}"

    def _alive(self) -> bool:
        import urllib.request

        self.check_running()
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{self.health}/healthz", timeout=2).status == 200
        except OSError:
            return False

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.proxy.close()

    def used(self) -> set[tuple[str, str, str]]:
        return {k for record in self.proxy.records for k in api_request_kinds(*record)}

    def assert_nothing_refused(self) -> None:
        refused = [r for r in self.proxy.records if r[3] in (401, 403)]
        assert not refused, f"refused requests: {refused[:10]}"
        assert "Forbidden" not in self.log() and "Not enough permissions" not in self.log(), self.log()

    def request_table(self) -> str:
        counts: dict[tuple[str, str, str], int] = {}
        for record in self.proxy.records:
            for key in api_request_kinds(*record):
                counts[key] = counts.get(key, 0) + 1
        return "\n".join(
            f"  {n:5d}  {k[0]:<7} {k[1] or 'core'}/{k[2]}" for k, n in sorted(counts.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0]))
        )


def _compatible_example(name: str, namespace: str) -> dict[str, Any]:
    cr = yaml.safe_load((ROOT / "examples" / "llama31-8b-eagle3.yaml").read_text())
    cr["metadata"] = {"name": name, "namespace": namespace}
    # kwok plays the kubelet: the validator init container reports a compatible pair, the servers get Ready.
    cr["spec"]["podMetadata"] = {
        "annotations": {
            "specdec.test/init-exit-code": "0",
            "specdec.test/init-message": json.dumps({"compatible": True, "findings": []}),
            "specdec.test/ready-after": "1s",
        }
    }
    return cr


@pytest.mark.cluster
@pytest.mark.slow
def test_operator_runs_an_example_end_to_end_under_the_chart_serviceaccount(
    cluster_release, kube_cluster, core_v1, apps_v1, custom_objects, tmp_path
):
    """`specdec run` from the checkout, as the chart runs it and authenticated as the chart's ServiceAccount,
    takes the Llama example through validation, deployment, a probe against SGLang simulators, promotion, and
    deletion. Every API request goes through a recording proxy: none may be refused (the RBAC suffices), and
    every permission the chart grants must have been used (the RBAC is minimal)."""
    import urllib.request

    from simulators import Simulators

    # Two simulators stand in for the base and speculative SGLang servers (no GPU here).
    simulators = Simulators()
    sims = [simulators.start("llama31-8b-base", seed=11), simulators.start("llama31-8b-eagle3", seed=11)]
    namespace = _make_namespace(core_v1, "sa-e2e")
    name = "llama31-8b"
    (tmp_path / "endpoints.yaml").write_text(yaml.safe_dump({f"{namespace}/{name}-base": sims[0].url, f"{namespace}/{name}-spec": sims[1].url}))
    operator = None
    try:
        operator = OperatorUnderServiceAccount(
            kube_cluster, core_v1, apps_v1, cluster_release, tmp_path, ["--endpoints", str(tmp_path / "endpoints.yaml")]
        )
        assert "--all-namespaces" in operator.chart_args
        assert f"--peering={cluster_release['peering']}" in operator.chart_args
        custom_objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, _compatible_example(name, namespace))

        def decided() -> dict | None:
            operator.check_running()
            st = custom_objects.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name).get("status")
            return st if st and st.get("phase") in ("Promoted", "RolledBack", "Invalid", "Failed") else None

        status = wait_until(decided, timeout=150, interval=0.5, message="a decision")
        assert status["phase"] == "Promoted", f"{status.get('reason')}: {status.get('message')}"
        stable = core_v1.read_namespaced_service(name, namespace)
        assert stable.spec.selector["specdec.io/variant"] == "speculative"
        assert {e.reason for e in core_v1.list_namespaced_event(namespace).items if e.involved_object.kind == "SpeculativeServer"} >= {
            "DrafterCompatible",
            "ProbeStarted",
        }
        # The peering object carries this replica's keep-alive.
        peering = custom_objects.get_cluster_custom_object("kopf.dev", "v1", "clusterkopfpeerings", cluster_release["peering"])
        assert "checkout-operator" in (peering.get("status") or {})
        scraped = urllib.request.urlopen(f"http://127.0.0.1:{operator.metrics}/metrics", timeout=5).read().decode()
        assert f'specdec_active_variant{{name="{name}",namespace="{namespace}",variant="speculative"}} 1.0' in scraped

        # Deleting the resource: the operator releases its finalizer, the garbage collector removes the children
        # and their pods (whose simulated GPUs the next test's servers need).
        custom_objects.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        wait_until(
            lambda: not custom_objects.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"],
            timeout=60,
            message="the resource gone",
        )
        wait_until(
            lambda: not apps_v1.list_namespaced_deployment(namespace).items and not core_v1.list_namespaced_pod(namespace).items,
            timeout=60,
            message="children garbage-collected",
        )
    finally:
        if operator is not None:
            operator.stop()
        simulators.close()
        core_v1.delete_namespace(namespace, propagation_policy="Background")

    # Sufficient: the API server refused nothing the operator asked for.
    operator.assert_nothing_refused()
    # Minimal: every granted permission was used.
    print("\nAPI requests by verb and resource (operator under the chart's ServiceAccount, cluster-wide):")
    print(operator.request_table())
    granted = {
        (verb, group, resource)
        for (group, resource), verbs in {**OPERATOR_NAMESPACED_USAGE, **CRD_DISCOVERY, ("kopf.dev", "clusterkopfpeerings"): PEERING_VERBS}.items()
        for verb in verbs
    }
    used = operator.used()
    # Writing the adaptive table happens only in a load-aware trial (a drafter that wins at low load and loses at
    # high), which this example is not: tests/test_operator_e2e.py's load-aware test exercises those three verbs.
    load_aware_only = {("get", "", "configmaps"), ("create", "", "configmaps"), ("patch", "", "configmaps")}
    # LeaderWorkerSets are used only for multi-node specs in a cluster with their CRD, which this one is not (Kopf
    # watches nothing there without it): tests/test_multinode_cluster.py applies and watches them.
    multi_node_only = {(verb, "leaderworkerset.x-k8s.io", "leaderworkersets") for verb in ("get", "list", "watch", "create", "patch", "delete")}
    # A File prompt dataset's reader pod is created and deleted only when a workload names one, which this example
    # does not: tests/test_datasets_volume_cluster.py creates and deletes them.
    file_dataset_only = {("create", "", "pods"), ("delete", "", "pods")}
    # Deleting Deployments happens only when resources.nodes changes from 1 to more (reconcile/retire.py), which
    # this example does not do: tests/test_multinode_cluster.py's nodes-change test does.
    nodes_change_only = {("delete", "apps", "deployments")}
    unused = granted - used - load_aware_only - multi_node_only - file_dataset_only - nodes_change_only
    assert not unused, f"granted but never used (remove them from the chart): {unused}"
    assert used <= granted, f"used but not in the chart's usage table: {used - granted}"


@pytest.mark.cluster
def test_plain_manifests_install_with_kubectl(kube_cluster, kube_client, core_v1, apps_v1, tools_dir, tmp_path):
    """dist/install.yaml as docs/install.md applies it: CRDs first, then the rest; the operator pod is admitted in
    a namespace enforcing the `restricted` Pod Security Standard."""
    import uuid

    namespace = f"specdec-plain-{uuid.uuid4().hex[:5]}"
    proc = subprocess.run(
        ["bash", str(ROOT / "hack" / "manifests.sh")],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "SPECDEC_TOOLS_DIR": str(tools_dir), "DIST_DIR": str(tmp_path), "NAMESPACE": namespace},
    )
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all((tmp_path / "install.yaml").read_text()) if d]
    try:
        kube_cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(tmp_path / "crds.yaml"))
        kube_cluster.kubectl(
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            *[f"crd/{d['metadata']['name']}" for d in docs if d["kind"] == "CustomResourceDefinition"],
        )
        applied = kube_cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(tmp_path / "install.yaml"), check=False)
        assert applied.returncode == 0, applied.stderr
        assert core_v1.read_namespace(namespace).metadata.labels["pod-security.kubernetes.io/enforce"] == "restricted"
        pods = wait_until(
            lambda: core_v1.list_namespaced_pod(namespace, label_selector="app.kubernetes.io/component=operator").items,
            timeout=30,
            message="the operator pod admitted",
        )
        assert pods[0].spec.service_account_name == "specdec-operator"
        assert can_i(kube_cluster, f"system:serviceaccount:{namespace}:specdec-operator", "patch", "deployments.apps", "anywhere")
    finally:
        # Everything but the CRDs: deleting those would delete every SpeculativeServer of the session's cluster.
        for doc in reversed(docs):
            if doc["kind"] not in ("CustomResourceDefinition", "Namespace"):
                kube_cluster.kubectl("delete", "--ignore-not-found", "--wait=false", "-f", "-", input=json.dumps(doc), check=False)
        core_v1.delete_namespace(namespace, propagation_policy="Background")


@pytest.mark.cluster
@pytest.mark.slow
def test_two_replicas_elect_one_through_the_charts_peering(cluster_release, kube_cluster, core_v1, apps_v1, tmp_path):
    """Two operators with the chart's arguments and ServiceAccount: the younger one pauses in favour of the older,
    and takes over when the older one stops. The chart's peering object and RBAC are all Kopf's peering needs."""
    import time

    first = OperatorUnderServiceAccount(kube_cluster, core_v1, apps_v1, cluster_release, tmp_path / "a", [], pod_id="replica-a")
    second = None
    try:
        wait_until(
            lambda: "replica-a" in (_peering_status(kube_cluster, cluster_release) or {}),
            timeout=30,
            message="replica-a's keep-alive in the peering object",
        )
        second = OperatorUnderServiceAccount(kube_cluster, core_v1, apps_v1, cluster_release, tmp_path / "b", [], pod_id="replica-b")
        # replica-b starts paused (mandatory peering) and stays so while replica-a, older and so of higher
        # priority, keeps its keep-alive: it announces itself in the peering but never resumes.
        wait_until(
            lambda: "replica-b" in _peering_status(kube_cluster, cluster_release), timeout=30, message="replica-b's keep-alive in the peering object"
        )
        peers = _peering_status(kube_cluster, cluster_release)
        assert peers["replica-a"]["priority"] > peers["replica-b"]["priority"], peers
        time.sleep(3)
        assert "Resuming operations" not in second.log(), f"{peers}\n{second.log()}"
        assert "Pausing" not in first.log()
        stopped = time.monotonic()
        first.stop()  # a graceful stop removes replica-a from the peering at once
        wait_until(lambda: "Resuming operations" in second.log(), timeout=30, message="replica-b taking over")
        print(f"\ntakeover after a graceful stop of the active replica: {time.monotonic() - stopped:.1f}s")
        assert set(_peering_status(kube_cluster, cluster_release)) == {"replica-b"}
    finally:
        if first.process.poll() is None:
            first.stop()
        if second is not None:
            second.stop()
    for replica in (first, second):
        replica.assert_nothing_refused()


def _peering_status(kube_cluster: Any, release: Release) -> dict[str, Any]:
    proc = kube_cluster.kubectl("get", "clusterkopfpeering", release["peering"], "-o", "json")
    return json.loads(proc.stdout).get("status") or {}
