"""The Helm chart (charts/specdec-operator), rendered and linted with the real helm binary.

Pure-render tests need only helm (`make tools`); every rendered manifest is validated against the Kubernetes
schemas of the control plane's release (kubernetes-validate, strict). The cluster tests (tests/cluster/test_chart_cluster.py)
install the chart into the local control plane, prove its RBAC with `kubectl auth can-i`, and run the
operator from the checkout under the chart's ServiceAccount with every API request recorded.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.support.chart import (
    CHART,
    CRD_DISCOVERY,
    DISCOVERY_USAGE,
    OPERATOR_NAMESPACED_USAGE,
    PEERING_VERBS,
    ROOT,
    api_request_kind,
    api_request_kinds,
    by_kind,
    helm,
    one,
    render,
)


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
    "network-policy": {
        "watch": {"allNamespaces": False, "namespaces": ["team-a", "team-b"]},
        "networkPolicy": {
            "enabled": True,
            "extraIngress": [
                {"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress"}}}], "ports": [{"port": 30000}]}
            ],
        },
    },
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
            "serverPodDefaults": {
                "imagePullSecrets": [{"name": "mirror-pull"}],
                "priorityClassName": "inference",
                "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}],
                "securityContext": {"fsGroup": 65532},
            },
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


def test_network_policy_admits_the_operator_to_the_servers_and_readers_ports(helm_bin, tmp_path):
    """The rendering only: the dev node's bridge CNI does not enforce NetworkPolicies, so no cluster test can show a
    packet dropped or admitted. Selectors and ports are checked against what the chart and the operator render."""
    from specdec_operator import manifests as m
    from specdec_operator import trainjob
    from specdec_operator.reconcile import capture_objects
    from tests.support.world import World, llama_spec

    assert not by_kind(render(helm_bin), "NetworkPolicy"), "off by default"
    docs = render(helm_bin, _values_file(tmp_path, "network-policy"), namespace="ops")
    policies = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in by_kind(docs, "NetworkPolicy")}
    assert set(policies) == {(ns, f"specdec-specdec-operator-{kind}") for ns in ("team-a", "team-b") for kind in ("servers", "dataset-readers")}
    operator_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    world = World(llama_spec())
    world.step()
    for (_, policy_name), policy in policies.items():
        spec = policy["spec"]
        assert spec["policyTypes"] == ["Ingress"]
        rule = spec["ingress"][0]
        (peer,) = rule["from"]
        assert peer["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "ops"}}
        assert peer["podSelector"]["matchLabels"].items() <= operator_labels.items()
        selects = spec["podSelector"]["matchLabels"].items()
        if policy_name.endswith("-servers"):
            # Every server pod the operator renders, of both variants, and on the port its container listens on.
            for variant in ("base", "speculative"):
                template = world.template(variant)
                assert selects <= template["metadata"]["labels"].items(), variant
                (port,) = template["spec"]["containers"][0]["ports"]
                assert rule["ports"] == [{"protocol": "TCP", "port": port["containerPort"]}] == [{"protocol": "TCP", "port": m.DEFAULT_PORT}]
            # The capture proxies and training Jobs of the namespace reach the servers too (both forward or send
            # requests to them): the rule selects the labels the operator renders on their pods, and no server pod.
            (own,) = spec["ingress"][1]["from"]
            assert spec["ingress"][1]["ports"] == rule["ports"] and "namespaceSelector" not in own
            ((expression),) = own["podSelector"]["matchExpressions"]
            assert expression["key"] == "app.kubernetes.io/name" and expression["operator"] == "In"
            capture_pod = capture_objects.proxy_selector("llama")  # on every proxy pod (proxy_deployment)
            training_pod = trainjob.training_labels("llama", 1)
            assert {capture_pod[expression["key"]], training_pod[expression["key"]]} == set(expression["values"])
            for variant in ("base", "speculative"):
                assert world.template(variant)["metadata"]["labels"].get(expression["key"]) not in expression["values"]
            assert spec["ingress"][2:] == VALUE_SETS["network-policy"]["networkPolicy"]["extraIngress"]
            assert not selects <= operator_labels.items()
        else:
            assert selects <= m.reader_labels("llama").items() and rule["ports"] == [{"protocol": "TCP", "port": m.READER_PORT}]
            assert not selects <= world.template("base")["metadata"]["labels"].items()
    proc = helm(helm_bin, "template", "x", str(CHART), "--set", "networkPolicy.enabled=true", check=False)
    assert proc.returncode != 0 and "networkPolicy.namespaces must list the tenant namespaces" in proc.stderr
    explicit = render(helm_bin, None, "--set", "networkPolicy.enabled=true", "--set", "networkPolicy.namespaces={team-c}")
    assert {p["metadata"]["namespace"] for p in by_kind(explicit, "NetworkPolicy")} == {"team-c"}


def test_server_pod_defaults_reach_the_operator_as_its_flag(helm_bin, tmp_path):
    """operator.serverPodDefaults becomes `specdec run --server-pod-defaults`, which the operator's own parsers take."""
    from specdec_operator import poddefaults
    from specdec_operator.controller.runner import build_parser

    assert "--server-pod-defaults" not in _flags(_container(render(helm_bin))), "no defaults: no flag, resources render as before"
    custom = _container(render(helm_bin, _values_file(tmp_path, "customized")))
    (text,) = _flags(custom)["--server-pod-defaults"]
    args = build_parser().parse_args(custom["args"])
    defaults = poddefaults.parse(args.server_pod_defaults)
    assert defaults == poddefaults.ServerPodDefaults(
        image_pull_secrets=("mirror-pull",),
        priority_class_name="inference",
        tolerations=({"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"},),
        security_context={"fsGroup": 65532},
    )
    # Only some of them: the empty ones are left out of the merge.
    values = tmp_path / "some.yaml"
    values.write_text(yaml.safe_dump({"operator": {"serverPodDefaults": {"imagePullSecrets": [{"name": "mirror-pull"}]}}}))
    (text,) = _flags(_container(render(helm_bin, values)))["--server-pod-defaults"]
    assert poddefaults.parse(text) == poddefaults.ServerPodDefaults(image_pull_secrets=("mirror-pull",))


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
        if "configmaps" in resources:  # the ones the operator owns (adaptive table, probe evidence): applied, read, watched, deleted
            assert set(rule["verbs"]) <= {"get", "list", "watch", "create", "patch", "delete"}, f"[{name}] {owner}: {rule}"
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


def test_training_priority_class_is_below_serving_and_never_preempts(helm_bin):
    """The PriorityClass the training Jobs' pods name (trainjob.py): value from values (default -100, below the 0 of
    server pods that name none), preemptionPolicy Never, not the default; left out with create false."""
    from specdec_operator.trainjob import DEFAULT_PRIORITY_CLASS, PRIORITY_CLASS_VALUE

    default = one(render(helm_bin), "PriorityClass")
    assert default["metadata"]["name"] == DEFAULT_PRIORITY_CLASS
    assert default["value"] == PRIORITY_CLASS_VALUE == -100 and default["preemptionPolicy"] == "Never" and default["globalDefault"] is False
    assert one(render(helm_bin, None, "--set", "training.priorityClass.value=-5"), "PriorityClass")["value"] == -5
    assert by_kind(render(helm_bin, None, "--set", "training.priorityClass.create=false"), "PriorityClass") == []


def test_training_settings_reach_the_operator_as_its_flags(helm_bin):
    """training.image, cpuImage and clusterCap as `specdec run` flags the operator parses into TrainingJobSettings."""
    from specdec_operator.controller.runner import _training_settings, build_parser
    from specdec_operator.trainjob import TrainingJobSettings

    def settings(*sets: str) -> TrainingJobSettings:
        args = one(render(helm_bin, None, *[a for s in sets for a in ("--set", s)]), "Deployment")["spec"]["template"]["spec"]["containers"][0][
            "args"
        ]
        return _training_settings(build_parser().parse_args(args[1:]))

    assert settings() == TrainingJobSettings()  # the chart's defaults are the operator's
    assert settings("training.image=reg/t:2", "training.cpuImage=reg/t:2-cpu", "training.clusterCap=3") == TrainingJobSettings(
        image="reg/t:2", cpu_image="reg/t:2-cpu", cluster_cap=3
    )


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
    from specdec_operator.controller.metrics import OperatorMetrics

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
    assert set(alerts) == {
        "SpecdecServerRolledBack",
        "SpecdecAcceptanceDrift",
        "SpecdecProbeFailures",
        "SpecdecOperatorDown",
        "SpecdecProgressDeadlineExceeded",
        "SpecdecSpeculativeProgressDeadlineExceeded",
        "SpecdecServerInvalidOrFailed",
        "SpecdecIdleGpus",
    }
    service = next(s for s in by_kind(docs, "Service") if s["metadata"]["name"].endswith("-metrics"))
    exposed = _operator_metric_names()
    for name, alert in alerts.items():
        assert alert["labels"]["severity"] in {"info", "warning", "critical"}
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
    # A speculative side given up past its deadline (the base serves) does not page as if serving were down.
    assert 'variant="base"' in alerts["SpecdecProgressDeadlineExceeded"]["expr"]
    assert 'variant="speculative"' in alerts["SpecdecSpeculativeProgressDeadlineExceeded"]["expr"]
    assert alerts["SpecdecSpeculativeProgressDeadlineExceeded"]["labels"]["severity"] == "info"
    assert alerts["SpecdecServerInvalidOrFailed"]["for"] == "15m"


def _selected(expr: str, exposition: str) -> set[tuple[str, str, str]]:
    """(namespace, name, phase) of the series with value 1 that the alert's one selector picks, read with
    promql-parser's matchers from the operator's own exposition (the alert is `max by (...) (selector) > 0`)."""
    import promql_parser

    found: set[tuple[str, str, str]] = set()
    node = promql_parser.parse(expr)
    while type(node).__name__ != "VectorSelector":
        node = getattr(node, "lhs", None) or node.expr
    for line in exposition.splitlines():
        if not line.startswith(node.name + "{") or not line.endswith(" 1.0"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
        labels["job"] = "specdec-specdec-operator-metrics"  # added by the scrape
        ok = True
        for matcher in node.matchers.matchers:
            value = labels.get(matcher.name, "")
            op = str(matcher.op)
            if op.endswith("Equal") and "Not" not in op:
                ok &= value == matcher.value
            elif op.endswith("NotEqual"):
                ok &= value != matcher.value
            elif op.endswith("NotRe"):
                ok &= re.fullmatch(matcher.value, value) is None
            else:
                ok &= re.fullmatch(matcher.value, value) is not None
        if ok:
            found.add((labels["namespace"], labels["name"], labels["phase"]))
    return found


def test_the_invalid_or_failed_alert_selects_exactly_those_resources(helm_bin, tmp_path):
    from prometheus_client import generate_latest

    from specdec_operator.controller.metrics import OperatorMetrics

    rule = one(render(helm_bin, _values_file(tmp_path, "observability")), "PrometheusRule")
    alert = next(r for r in rule["spec"]["groups"][0]["rules"] if r["alert"] == "SpecdecServerInvalidOrFailed")
    metrics = OperatorMetrics()
    for name, phase in (("good", "Promoted"), ("lost", "RolledBack"), ("bad", "Invalid"), ("stuck", "Failed"), ("new", "Pending")):
        metrics.observe_status("ns", name, {"phase": phase})
    assert _selected(alert["expr"], generate_latest(metrics.registry).decode()) == {("ns", "bad", "Invalid"), ("ns", "stuck", "Failed")}


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


def test_make_manifests_renders_an_installable_file(helm_bin, tmp_path):
    import kubernetes_validate

    proc = subprocess.run(
        ["bash", str(ROOT / "hack" / "manifests.sh")],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "SPECDEC_TOOLS_DIR": os.path.dirname(helm_bin), "DIST_DIR": str(tmp_path)},
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
        if doc["kind"] == "PriorityClass":  # the training Jobs' class: its name is the operator's (trainjob.py)
            assert doc["metadata"]["name"] == "specdec-training"
        elif doc["kind"] != "CustomResourceDefinition" and doc["kind"] != "Namespace":
            assert doc["metadata"]["name"].startswith("specdec-operator")
            assert doc["metadata"].get("namespace", "specdec-system") == "specdec-system"
    generated = yaml.safe_load((ROOT / "crds" / "specdec.io_speculativeservers.yaml").read_text())
    assert generated in docs, "dist/install.yaml must carry the generated CRD"
    crds_only = [d for d in yaml.safe_load_all((tmp_path / "crds.yaml").read_text()) if d]
    assert crds_only == docs[:3]


def test_make_manifests_passes_settings_to_helm_and_checks_the_namespace(helm_bin, tmp_path):
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "SPECDEC_TOOLS_DIR": os.path.dirname(helm_bin),
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
