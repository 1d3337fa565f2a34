"""Operator-wide defaults of the server pods (issue 34, item 4): merged under each resource's spec.podTemplate, the
resource winning, lists merged; through the operator's own Runtime step (the chart's flag: tests/unit/test_chart.py)."""

from __future__ import annotations

import pytest

from specdec_operator import manifests as m
from specdec_operator import poddefaults
from specdec_operator.controller.config import OperatorConfig
from specdec_operator.controller.runtime import Runtime
from specdec_operator.errors import InputError
from specdec_operator.resource import parse_spec
from tests.support.runtime import Cluster, llama_spec

GPU_TAINT = {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}
DEFAULTS = poddefaults.parse(
    '{"imagePullSecrets": [{"name": "mirror-pull"}], "priorityClassName": "inference", '
    '"tolerations": [' + '{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}' + "], "
    '"securityContext": {"runAsNonRoot": true, "fsGroup": 65532, "seccompProfile": {"type": "RuntimeDefault"}}}'
)


def test_the_defaults_fill_what_a_resource_leaves_unset():
    spec = poddefaults.merged(parse_spec(llama_spec()), DEFAULTS)
    pt = spec.pod_template
    assert [r.name for r in pt.image_pull_secrets or []] == ["mirror-pull"]
    assert pt.priority_class_name == "inference"
    assert pt.tolerations == [GPU_TAINT]
    assert pt.security_context == {"runAsNonRoot": True, "fsGroup": 65532, "seccompProfile": {"type": "RuntimeDefault"}}


def test_the_resource_wins_and_lists_are_merged():
    own = llama_spec()
    own["podTemplate"] = {
        "imagePullSecrets": [{"name": "team-pull"}, {"name": "mirror-pull"}],
        "priorityClassName": "batch",
        "tolerations": [GPU_TAINT, {"key": "team", "operator": "Exists"}],
        "securityContext": {"fsGroup": 1000, "seLinuxOptions": {"level": "s0:c1"}},
    }
    pt = poddefaults.merged(parse_spec(own), DEFAULTS).pod_template
    assert [r.name for r in pt.image_pull_secrets or []] == ["team-pull", "mirror-pull"]  # merged, each name once
    assert pt.priority_class_name == "batch"  # the resource's
    assert pt.tolerations == [GPU_TAINT, {"key": "team", "operator": "Exists"}]  # the same toleration once
    assert pt.security_context == {
        "runAsNonRoot": True,
        "fsGroup": 1000,
        "seccompProfile": {"type": "RuntimeDefault"},
        "seLinuxOptions": {"level": "s0:c1"},
    }


def test_no_defaults_leave_the_spec_as_it_is():
    spec = parse_spec(llama_spec())
    assert poddefaults.merged(spec, poddefaults.parse("")) is spec
    assert (
        poddefaults.merged(spec, poddefaults.parse('{"imagePullSecrets": [], "priorityClassName": "", "tolerations": [], "securityContext": {}}'))
        is spec
    )


@pytest.mark.parametrize(
    "text, words",
    [
        ('{"nodeSelector": {"a": "b"}}', "nodeSelector is not an operator-wide default"),
        ('{"imagePullSecrets": [{"nom": "x"}]}', "--server-pod-defaults: imagePullSecrets.0.name"),
        ("[1, 2]", "must be a JSON object"),
        ("{", "not valid JSON"),
    ],
)
def test_bad_defaults_are_refused_in_one_line_naming_the_field(text, words):
    with pytest.raises(InputError) as info:
        poddefaults.parse(text)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_the_operator_renders_server_pods_with_the_defaults_merged():
    """Through Runtime.step: the spec the step renders is the merged one; the servers' Deployments carry it."""
    cluster = Cluster(llama_spec())
    cluster.runtime = Runtime(OperatorConfig(server_pod_defaults=DEFAULTS), cluster.metrics, writer=cluster.writer, probes=cluster.probes)  # type: ignore[arg-type]
    cluster.step()
    for variant in ("base", "speculative"):
        pod = cluster.writer.children[("Deployment", m.child_name("llama", variant))]["spec"]["template"]["spec"]
        assert pod["imagePullSecrets"] == [{"name": "mirror-pull"}]
        assert pod["priorityClassName"] == "inference"
        assert GPU_TAINT in pod["tolerations"] and {"key": m.GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
        assert pod["securityContext"]["fsGroup"] == 65532
    # The flag's value round-trips (what the chart renders is parsed the same way).
    assert poddefaults.parse(poddefaults.to_json(DEFAULTS)) == DEFAULTS
