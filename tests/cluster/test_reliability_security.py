"""Security: what a user who can edit a SpeculativeServer can and cannot make the operator do.

- Secrets: an environment variable taken from a Secret (sglang.env[].valueFrom.secretKeyRef) reaches the server
  containers as that same reference. The operator never resolves it: the Secret's value appears nowhere the
  operator writes or says (its log, the resource's status and annotations, Events, Deployments, Services, pods).
- Traffic: the probe and the monitor talk only to the resource's own `<name>-base` / `<name>-spec` Services.
  A user cannot re-point them: pod labels from the spec cannot impersonate another resource's pods (the
  operator's labels win, so another resource's Services never select them), and a name that is not a valid
  Service name (dots: `attacker.example.com`) produces no Service and no probe, only a status saying why.

(tests/cluster/test_operator_e2e.py already covers a resource named after someone else's Service, and a URL-looking field
in the spec, which the structural schema prunes. RBAC and pod security are tested with the chart.)
"""

from __future__ import annotations

import json
import uuid

import pytest
from kubernetes.client.exceptions import ApiException

from tests.support.operator_process import GROUP, LLAMA_EAGLE3_SCRIPT, PLURAL, VERSION, compatible_annotations, example, wait_phase
from tests.support.operator_replicas import DECIDED, Cluster

pytestmark = pytest.mark.cluster


def everything_written(c: Cluster, names: list[str]) -> str:
    """The operator's log and every object it writes or touches in the namespace, as one string."""
    ns = c.namespace
    parts = [r.logs() for r in c.replicas]
    for name in names:
        parts.append(json.dumps(c.custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)))
    client = c.core.api_client
    for items in (
        c.apps.list_namespaced_deployment(ns).items,
        c.apps.list_namespaced_replica_set(ns).items,
        c.core.list_namespaced_service(ns).items,
        c.core.list_namespaced_pod(ns).items,
        c.core.list_namespaced_event(ns).items,
    ):
        parts += [json.dumps(client.sanitize_for_serialization(item)) for item in items]
    return "\n".join(parts)


def test_a_secret_reference_is_passed_through_and_its_value_never_logged_or_stored(cluster: Cluster) -> None:
    from kubernetes import client

    secret_value = f"hf_{uuid.uuid4().hex}"
    cluster.core.create_namespaced_secret(
        cluster.namespace, client.V1Secret(metadata=client.V1ObjectMeta(name="hf-token"), string_data={"token": secret_value})
    )
    name = "secretive"
    cluster.serve(name)
    # Decided on scripted evidence: the test is about where the Secret's value goes, not about measuring.
    cluster.script(name, **LLAMA_EAGLE3_SCRIPT)
    op = cluster.replica()
    op.start()
    cr = example("llama31-8b-eagle3.yaml", name, cluster.namespace, annotations=compatible_annotations())
    reference = {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}}
    cr["spec"].setdefault("sglang", {})["env"] = [reference, {"name": "NCCL_DEBUG", "value": "WARN"}]
    cluster.create(cr)
    st = wait_phase(cluster.custom, cluster.namespace, name, DECIDED, timeout=120)
    assert st["phase"] == "Promoted", st.get("message")

    for variant in ("base", "spec"):
        deployment = cluster.apps.read_namespaced_deployment(f"{name}-{variant}", cluster.namespace)
        server = next(c for c in deployment.spec.template.spec.containers if any(e.name == "HF_TOKEN" for e in c.env or []))
        env = {e.name: cluster.core.api_client.sanitize_for_serialization(e) for e in server.env}
        assert env["HF_TOKEN"] == reference, "the reference must reach the server container unchanged"
        assert env["NCCL_DEBUG"] == {"name": "NCCL_DEBUG", "value": "WARN"}
    assert secret_value not in everything_written(cluster, [name]), "the Secret's value was resolved and written somewhere"


def test_spec_labels_cannot_impersonate_another_resource_and_a_dotted_name_gets_no_service_and_no_probe(cluster: Cluster) -> None:
    for name in ("victim", "attacker"):
        cluster.serve(name)
        cluster.script(name, **LLAMA_EAGLE3_SCRIPT)  # decided on scripted evidence: the test is about where Services point
    op = cluster.replica()
    op.start()
    cluster.create(example("llama31-8b-eagle3.yaml", "victim", cluster.namespace, annotations=compatible_annotations()))
    # The attacker's pods claim to be the victim's speculative pods.
    attacker = example("llama31-8b-eagle3.yaml", "attacker", cluster.namespace, annotations=compatible_annotations())
    attacker["spec"]["podMetadata"]["labels"] = {
        "app.kubernetes.io/instance": "victim",
        "specdec.io/variant": "speculative",
        "app.kubernetes.io/managed-by": "specdec-operator",
    }
    cluster.create(attacker)
    # A name that is a valid resource name but no valid Service name: refused at admission (the CRD's root rule), so
    # nothing is made for it; reconcile/refused.py says the same for one admitted under an older CRD (unit tests).
    dotted = example("llama31-8b-eagle3.yaml", "attacker.example.com", cluster.namespace, annotations=compatible_annotations())
    with pytest.raises(ApiException) as refused:
        cluster.create(dotted)
    assert refused.value.status == 422 and "metadata.name attacker.example.com cannot name this server's Services" in refused.value.body

    for name in ("victim", "attacker"):  # decided either way: what matters is where the Services point
        assert wait_phase(cluster.custom, cluster.namespace, name, DECIDED, timeout=120)["phase"] in {"Promoted", "RolledBack"}
    for pod in cluster.core.list_namespaced_pod(cluster.namespace, label_selector="app.kubernetes.io/instance=attacker").items:
        assert pod.metadata.labels["app.kubernetes.io/instance"] == "attacker"
    # The victim's Services select only the victim's pods.
    victim_pods = {p.metadata.name for p in cluster.core.list_namespaced_pod(cluster.namespace).items if p.metadata.name.startswith("victim-")}
    for service in ("victim", "victim-base", "victim-spec"):
        selector = cluster.core.read_namespaced_service(service, cluster.namespace).spec.selector
        selected = {
            p.metadata.name
            for p in cluster.core.list_namespaced_pod(cluster.namespace, label_selector=",".join(f"{k}={v}" for k, v in selector.items())).items
        }
        assert selected <= victim_pods, f"{service} selects {selected - victim_pods}"
        # The stable Service serves; the loser's Service may select nothing (scaled to 0 unless kept warm).
        assert selected or service != "victim", "the victim's stable Service selects no pod"

    assert not [s for s in cluster.core.list_namespaced_service(cluster.namespace).items if s.metadata.name.startswith("attacker.")]
    assert not [d for d in cluster.apps.list_namespaced_deployment(cluster.namespace).items if d.metadata.name.startswith("attacker.")]
