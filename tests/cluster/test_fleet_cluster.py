"""Fleets and multi-node servers on the real control plane: `kubectl scale` through the scale subresource, and
the real LeaderWorkerSet controller (sigs.k8s.io/lws built by hack/tools.sh lws, run by devcluster.start_lws) creating the leader and worker pods
of a group that manifests.leader_worker_set rendered, with their ranks, on distinct nodes."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from hack import devcluster
from specdec_operator import API_GROUP, API_VERSION, KIND, PLURAL
from specdec_operator import manifests as m
from specdec_operator import sglang as sglang_args
from specdec_operator.resource import parse_spec
from tests.support.kube import wait_until
from tests.support.multinode import kubelet_expand

pytestmark = pytest.mark.cluster

SPEC = {
    "image": "lmsysorg/sglang:v0.5.23-cu130",
    "model": {"volume": {"hostPath": {"path": "/models"}}},
    "target": {"path": "moonshotai/Kimi-K2.5"},
    "drafter": {"path": "eagle3/kimi"},
}


def test_kubectl_scale_sets_spec_replicas_and_reads_the_status(kubectl, custom_objects: Any, namespace: str) -> None:
    body = {"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": KIND, "metadata": {"name": "fleet"}, "spec": copy.deepcopy(SPEC)}
    created = custom_objects.create_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, body)
    assert created["spec"]["replicas"] == 1 and created["spec"]["rollout"]["maxSurge"] == 0 and created["spec"]["rollout"]["maxUnavailable"] == 1
    assert created["spec"]["resources"]["nodes"] == 1

    kubectl("scale", f"{PLURAL}/fleet", "--replicas=6")
    assert custom_objects.get_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, "fleet")["spec"]["replicas"] == 6

    # What the operator writes, read back through the scale subresource (HPA and KEDA read the same).
    selector = m.fleet_selector("fleet")
    status = {"replicas": 5, "readyReplicas": 4, "speculativeReplicas": 2, "rolloutProgress": "2/6 speculative", "selector": selector}
    custom_objects.patch_namespaced_custom_object_status(API_GROUP, API_VERSION, namespace, PLURAL, "fleet", {"status": status})
    scale = json.loads(kubectl("get", f"{PLURAL}/fleet", "--subresource=scale", "-o", "json").stdout)
    assert scale["kind"] == "Scale" and scale["spec"]["replicas"] == 6
    assert scale["status"] == {"replicas": 5, "selector": selector}
    assert "2/6 speculative" in kubectl("get", f"{PLURAL}/fleet").stdout  # the Fleet printer column

    # The API server refuses both walk limits at 0, and a negative scale.
    refused = kubectl("patch", f"{PLURAL}/fleet", "--type=merge", "-p", '{"spec":{"rollout":{"maxUnavailable":0}}}', check=False)
    assert refused.returncode != 0 and "must not both be 0" in refused.stderr
    refused = kubectl("scale", f"{PLURAL}/fleet", "--replicas=-1", check=False)
    assert refused.returncode != 0


@pytest.fixture(scope="session")
def lws_controller(kube_cluster: devcluster.Cluster) -> devcluster.Cluster:
    if kube_cluster.name == "external":
        if kube_cluster.kubectl("get", f"crd/{m.LWS_CRD_NAME}", check=False).returncode != 0:
            pytest.fail(
                "the SPECDEC_KUBECONFIG cluster has no LeaderWorkerSet controller: start it with python -m hack.devcluster up --lws", pytrace=False
            )
        return kube_cluster
    if devcluster.lws_tool_missing(kube_cluster.tools):  # `make test` builds it: a missing one is a setup error
        pytest.fail(
            f"the LeaderWorkerSet controller is not built in {kube_cluster.tools}: run `hack/tools.sh lws` (or `make tools LWS=1`)", pytrace=False
        )
    try:
        devcluster.start_lws(kube_cluster, tie_to_parent=True)
    except devcluster.ClusterError as error:
        pytest.fail(f"could not start the LeaderWorkerSet controller: {error}", pytrace=False)
    return kube_cluster


def test_the_leaderworkerset_controller_runs_a_rendered_two_node_group_with_its_ranks_on_distinct_nodes(
    lws_controller: devcluster.Cluster, custom_objects: Any, core_v1: Any, namespace: str, server_parser
) -> None:
    from sglang.srt.server_args import ServerArgs

    # 4 GPUs per node and two nodes for two groups: two ranks of one group would fit on one node, so only the
    # anti-affinity keeps them apart (each node then holds one rank of each group).
    two_nodes = {"key": "kubernetes.io/hostname", "operator": "In", "values": ["b200-0", "b200-1"]}
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [two_nodes]}]}}}
    spec = parse_spec({**copy.deepcopy(SPEC), "resources": {"gpus": 4, "nodes": 2}, "affinity": affinity}, check_rules=True)
    obj = m.leader_worker_set(
        "kimi",
        namespace,
        spec,
        "speculative",
        leader_command=sglang_args.render_argv(spec, "speculative"),
        worker_command=sglang_args.render_argv(spec, "speculative", worker=True),
        replicas=2,
        revision="rev1",
    )
    custom_objects.create_namespaced_custom_object("leaderworkerset.x-k8s.io", "v1", namespace, "leaderworkersets", obj)

    def pods():
        found = core_v1.list_namespaced_pod(namespace, label_selector=f"{m.LWS_LABEL_NAME}=kimi-spec").items
        return found if len(found) == 4 and all(p.spec.node_name for p in found) else None

    found = wait_until(pods, timeout=60, message="4 scheduled pods of LeaderWorkerSet kimi-spec")
    groups: dict[str, list] = {}
    for pod in found:
        groups.setdefault(pod.metadata.labels[m.LWS_LABEL_GROUP_INDEX], []).append(pod)
    assert sorted(groups) == ["0", "1"]
    for index, members in groups.items():
        by_rank = {int(p.metadata.labels[m.LWS_LABEL_WORKER_INDEX]): p for p in members}
        assert sorted(by_rank) == [0, 1], f"group {index}: ranks {sorted(by_rank)}"
        leader, worker = by_rank[0], by_rank[1]
        assert leader.metadata.labels[m.LABEL_ROLE] == "leader" and worker.metadata.labels[m.LABEL_ROLE] == "worker"
        # Distinct nodes, both Blackwell.
        assert leader.spec.node_name != worker.spec.node_name
        for pod in members:
            assert core_v1.read_node(pod.spec.node_name).metadata.labels["nvidia.com/gpu.family"] == "blackwell"
            # The API server merged matchLabelKeys with the group key the webhook had set: the anti-affinity is
            # against this group's pods.
            (term,) = pod.spec.affinity.pod_anti_affinity.required_during_scheduling_ignored_during_execution
            group_key = pod.metadata.labels[m.LWS_LABEL_GROUP_KEY]
            assert any(
                e.key == m.LWS_LABEL_GROUP_KEY and e.operator == "In" and e.values == [group_key] for e in term.label_selector.match_expressions
            )
        # The controller's webhook injected the rank and the leader's address; the kubelet's expansion of our
        # command with them is a command line SGLang accepts, with the rank of the pod.
        for rank, pod in by_rank.items():
            (container,) = [c for c in pod.spec.containers if c.name == m.SERVER_CONTAINER]
            env = {e.name: e.value for e in container.env if e.value is not None}
            assert env["LWS_WORKER_INDEX"] == str(rank) and env["LWS_GROUP_SIZE"] == "2"
            # subdomainPolicy UniquePerReplica: the group's own headless Service, named after its leader.
            assert env["LWS_LEADER_ADDRESS"] == f"kimi-spec-{index}.kimi-spec-{index}.{namespace}"
            argv = kubelet_expand(container.command, env)
            flags = argv[len(sglang_args.RELEASES[spec.sglang_version].entrypoint) :]
            args = ServerArgs.from_cli_args(server_parser.parse_args(flags))
            assert (args.nnodes, args.node_rank, args.tp_size) == (2, rank, 8)
            assert args.dist_init_addr == f"{env['LWS_LEADER_ADDRESS']}:{sglang_args.DIST_INIT_PORT}"

    # kwok runs the containers: the controller counts both groups Ready.
    def ready():
        status = (
            custom_objects.get_namespaced_custom_object("leaderworkerset.x-k8s.io", "v1", namespace, "leaderworkersets", "kimi-spec").get("status")
            or {}
        )
        return status.get("readyReplicas") == 2

    wait_until(ready, timeout=60, message="LeaderWorkerSet kimi-spec readyReplicas 2")
    # Each group's headless Service resolves its leader before the leader is Ready (the workers must reach it to
    # join, and the leader is Ready only once they have).
    for index in ("0", "1"):
        svc = core_v1.read_namespaced_service(f"kimi-spec-{index}", namespace)
        assert svc.spec.cluster_ip == "None" and svc.spec.publish_not_ready_addresses
        assert svc.spec.selector == {m.LWS_LABEL_NAME: "kimi-spec", m.LWS_LABEL_GROUP_INDEX: index}


# ---------------------------------------------------------------------------------------------------------
# A fleet walked by the operator (a `specdec run` process; its probe and monitor reach simulators through the
# endpoints file), checked from the API server's own watch streams, not from the operator.

FLEET = "fleet"
READY_AFTER = "2s"  # kwok: containers Running at once, Ready after this long (a model loading)


class Recorder:
    """Watches pods, Services and the SpeculativeServer from one resourceVersion and keeps every event; replayed in
    resourceVersion order (etcd's one revision counter orders events across kinds), it tells what existed together."""

    def __init__(self, core_v1: Any, custom_objects: Any, namespace: str) -> None:
        import threading

        from kubernetes import watch

        self.events: list[tuple[int, str, str, Any]] = []
        self.errors: list[str] = []
        self.stopped = False
        self.lock = threading.Lock()
        self.watches = [watch.Watch() for _ in range(3)]
        streams = [
            ("pod", self.watches[0], core_v1.list_namespaced_pod, (namespace,)),
            ("svc", self.watches[1], core_v1.list_namespaced_service, (namespace,)),
            ("cr", self.watches[2], custom_objects.list_namespaced_custom_object, (API_GROUP, API_VERSION, namespace, PLURAL)),
        ]
        self.threads = []
        for kind, w, fn, args in streams:
            listed = fn(*args)  # each stream from its own list (a custom resource's watch cache has its own window)
            start = listed["metadata"]["resourceVersion"] if isinstance(listed, dict) else listed.metadata.resource_version
            # What exists already is where the replay starts (a recorder started mid-life of a fleet), each object
            # as of its own last change.
            for obj in listed["items"] if isinstance(listed, dict) else listed.items:
                found = self._data(kind, obj)
                if found is not None:
                    self.events.append((int(found[1]), kind, "ADDED", found[0]))
            self.threads.append(threading.Thread(target=self._run, args=(kind, w, fn, args, start), daemon=True))
        for thread in self.threads:
            thread.start()

    def _run(self, kind: str, w: Any, fn: Any, args: tuple, start: str) -> None:
        try:
            self._stream(kind, w, fn, args, start)
        except Exception as error:  # reported by stop()
            if not self.stopped:
                self.errors.append(f"{kind} watch: {error}")

    @staticmethod
    def _data(kind: str, obj: Any) -> tuple[Any, str] | None:
        """What the replay keeps of one object, and its resourceVersion (None: not one the replay follows)."""
        if kind == "pod":
            gpus = any(m.GPU_RESOURCE in ((c.resources.limits or {}) | (c.resources.requests or {})) for c in obj.spec.containers)
            ready = any(c.type == "Ready" and c.status == "True" for c in (obj.status.conditions or []))
            template_hash = (obj.metadata.annotations or {}).get(m.ANNOTATION_TEMPLATE_HASH)
            data = (obj.metadata.uid, gpus, ready and not obj.metadata.deletion_timestamp, dict(obj.metadata.labels or {}), template_hash)
            return data, obj.metadata.resource_version
        if kind == "svc":
            if obj.metadata.name != FLEET:
                return None
            return dict(obj.spec.selector or {}), obj.metadata.resource_version
        return (obj.get("status") or {}).get("phase"), obj["metadata"]["resourceVersion"]

    def _stream(self, kind: str, w: Any, fn: Any, args: tuple, start: str) -> None:
        for event in w.stream(fn, *args, resource_version=start, timeout_seconds=3600):
            found = self._data(kind, event["object"])
            if found is None:
                continue
            with self.lock:
                self.events.append((int(found[1]), kind, event["type"], found[0]))

    def stop(self) -> None:
        self.stopped = True
        for w in self.watches:
            w.stop()
        assert not self.errors, self.errors

    def replay(self, after_phases: set[str]) -> tuple[int, int]:
        """The most servers holding or asking for GPUs at once (pods that exist, terminating ones included), and the
        fewest Ready servers the stable Service selected while the phase was in after_phases."""
        with self.lock:
            events = sorted(self.events, key=lambda e: e[0])
        pods: dict[str, tuple] = {}
        selector: dict[str, str] | None = None
        phase = None
        most, fewest = 0, 10**9
        for _, kind, kind_of_event, data in events:
            if kind == "pod":
                if kind_of_event == "DELETED":
                    pods.pop(data[0], None)
                else:
                    pods[data[0]] = data
            elif kind == "svc":
                selector = data
            else:
                phase = data
            most = max(most, sum(1 for p in pods.values() if p[1]))
            if phase in after_phases and selector:
                fewest = min(fewest, sum(1 for p in pods.values() if p[2] and all(p[3].get(k) == v for k, v in selector.items())))
        assert fewest < 10**9, f"the watch streams never showed the phase {sorted(after_phases)}"
        return most, fewest


def fleet_cr(namespace: str, replicas: int, annotations: dict[str, str] | None = None, **changes: Any) -> dict:
    from tests.support.operator_process import compatible_annotations, example

    annotations = annotations or {**compatible_annotations(ready_after=READY_AFTER)}
    return example(
        "llama31-8b-eagle3.yaml",
        FLEET,
        namespace,
        annotations=annotations,
        replicas=replicas,
        resources__gpus=8,
        resources__gpuFamily="blackwell",
        rollout__keepBaseWarm=False,
        **changes,
    )


def start_fleet(
    operator: Any,
    sims: Any,
    custom_objects: Any,
    core_v1: Any,
    namespace: str,
    replicas: int,
    annotations: dict[str, str] | None = None,
    **changes: Any,
) -> tuple[Any, Any, Recorder]:
    from tests.support.operator_process import LLAMA_EAGLE3_SCRIPT

    base = sims.start("llama31-8b-base", time_scale=2.0)
    spec_sim = sims.start("llama31-8b-eagle3", time_scale=2.0)
    operator.map(f"{FLEET}-base", base.url)
    operator.map(f"{FLEET}-spec", spec_sim.url)
    # The canary's probe decides on scripted evidence (the profile's truth, about 2x): these tests are about the walk
    # that follows a decision, not about measuring, so a busy machine cannot turn it Inconclusive. The drift monitor
    # still reads the simulators' real /metrics.
    operator.script(FLEET, **LLAMA_EAGLE3_SCRIPT)
    operator.start()
    recorder = Recorder(core_v1, custom_objects, namespace)
    cr = fleet_cr(namespace, replicas, annotations, **changes)
    custom_objects.create_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, cr)
    return base, spec_sim, recorder


def fleet_status(custom_objects: Any, namespace: str) -> dict:
    return custom_objects.get_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, FLEET).get("status") or {}


def rolled_out(custom_objects: Any, namespace: str, reason: str = "RolledOut") -> dict | None:
    st = fleet_status(custom_objects, namespace)
    cond = next((c for c in st.get("conditions") or [] if c["type"] == "RolledOut"), None)
    return st if cond is not None and cond["reason"] == reason and cond["status"] == "True" else None


def server_pods(core_v1: Any, namespace: str) -> dict[str, int]:
    counts = {"base": 0, "speculative": 0}
    for pod in core_v1.list_namespaced_pod(namespace, label_selector=f"{m.LABEL_INSTANCE}={FLEET}").items:
        counts[pod.metadata.labels[m.LABEL_VARIANT]] += 1
    return counts


def test_a_six_server_fleet_is_promoted_without_a_seventh_servers_gpus_and_never_below_five_serving(
    operator: Any, sims: Any, custom_objects: Any, core_v1: Any, namespace: str
) -> None:
    from tests.support.operator_process import event_reasons

    _, _, recorder = start_fleet(operator, sims, custom_objects, core_v1, namespace, 6)
    try:
        st = wait_until(lambda: rolled_out(custom_objects, namespace), timeout=240, message="the fleet rolled out")
    finally:
        recorder.stop()
    assert st["phase"] == "Promoted" and st["rolloutProgress"] == "6/6 speculative" and st["readyReplicas"] == 6
    assert "[ScriptedEvidence: " in st["probe"]["message"], st["probe"]["message"]  # start_fleet's script decided it
    assert server_pods(core_v1, namespace) == {"base": 0, "speculative": 6}
    assert core_v1.read_namespaced_service(FLEET, namespace).spec.selector[m.LABEL_VARIANT] == "speculative"
    most, fewest = recorder.replay({"Promoted"})
    assert most <= 6, f"{most} servers held or asked for GPUs at once (maxSurge 0, 6 replicas)"
    assert fewest >= 5, f"only {fewest} Ready servers behind the stable Service during the walk (maxUnavailable 1)"
    # While probed, the canary serves beside the 5 base servers (docs/operator.md, "The canary"): six servers, none
    # more. How many of them were Ready is not asserted: the probe starts once the canary and one base server are
    # Ready (reconcile/pods.py), so it depends on how fast kwok readied the base pods (2 of 6 beside a busy machine).
    assert recorder.replay({"Probing"})[0] == 6
    reasons = wait_until(lambda: (r := event_reasons(core_v1, namespace, FLEET)).count("WalkFinished") and r, timeout=10, message="WalkFinished")
    assert reasons.count("SpeedupConfirmed") == 1 and reasons.count("WalkStarted") == 1 and reasons.count("WalkFinished") == 1


def wait_speculative(custom_objects: Any, namespace: str, at_least: int, timeout: float = 120) -> dict:
    return wait_until(
        lambda: (
            (st := fleet_status(custom_objects, namespace)).get("phase") == "Promoted" and (st.get("speculativeReplicas") or 0) >= at_least and st
        ),
        timeout=timeout,
        message=f"{at_least} speculative servers Ready",
    )


def test_an_operator_killed_at_several_steps_of_the_walk_resumes_with_no_duplicate_pods_and_one_decision(
    operator: Any, sims: Any, custom_objects: Any, core_v1: Any, namespace: str
) -> None:
    from tests.support.operator_process import event_reasons

    _, _, recorder = start_fleet(operator, sims, custom_objects, core_v1, namespace, 6)
    try:
        # Events are posted right after the status write that they announce: a kill in that millisecond loses them
        # (never repeats them). The kills here come after the decision's Events, at later steps of the walk.
        wait_until(lambda: {"SpeedupConfirmed", "WalkStarted"} <= set(event_reasons(core_v1, namespace, FLEET)), timeout=180, message="decision")
        for step in (2, 4, 5):
            wait_speculative(custom_objects, namespace, step, timeout=180)
            operator.kill()
            operator.start()
        st = wait_until(lambda: rolled_out(custom_objects, namespace), timeout=180, message="the fleet rolled out")
    finally:
        recorder.stop()
    assert st["rolloutProgress"] == "6/6 speculative" and server_pods(core_v1, namespace) == {"base": 0, "speculative": 6}
    most, fewest = recorder.replay({"Promoted"})
    assert most <= 6 and fewest >= 5, (most, fewest)
    reasons = wait_until(lambda: (r := event_reasons(core_v1, namespace, FLEET)).count("WalkFinished") and r, timeout=10, message="WalkFinished")
    assert reasons.count("SpeedupConfirmed") == 1 and reasons.count("ProbeStarted") == 1  # decided once, before the kills
    assert reasons.count("WalkStarted") == 1 and reasons.count("WalkFinished") == 1


# The drift must be seen (two scrapes 5 s apart) before the walk reaches 6. With every pod Ready 2 s after it starts,
# beside 3 workers and a Go build the walk once went from 3 to 6 first: a race the machine's speed decided. Here the
# speculative pods are Ready only 20 s after they start (kwok, when-label: the base pods at once), so the five steps
# from the first speculative server to six take 100 s at least, against the monitor's 10 to 15 s; the probe's decision
# is scripted (start_fleet), and the walk back to the base is not slowed.
SLOW_SPECULATIVE_PODS = "20s"


def test_a_drift_mid_walk_walks_the_fleet_back_to_the_base_at_once(
    operator: Any, sims: Any, custom_objects: Any, core_v1: Any, namespace: str
) -> None:
    from tests.support.operator_process import compatible_annotations, event_reasons
    from tests.support.simulators import generate_traffic

    slow = {**compatible_annotations(ready_after=SLOW_SPECULATIVE_PODS), "specdec.test/when-label": f"{m.LABEL_VARIANT}=speculative"}
    _, spec_sim, recorder = start_fleet(operator, sims, custom_objects, core_v1, namespace, 6, slow, monitor__interval=5, monitor__window=2)
    try:
        wait_speculative(custom_objects, namespace, 1, timeout=180)
        spec_sim.sim.engine.set_accept_length_mean(1.0)  # the drafter stops being accepted while traffic flows
        with generate_traffic(spec_sim.url, tokens=32):
            st = wait_until(
                lambda: (s := fleet_status(custom_objects, namespace)).get("phase") == "RolledBack" and s, timeout=60, message="drift rollback"
            )
        assert st["reason"] == "AcceptanceDrift" and 1 <= st["speculativeReplicas"] < 6, st
        st = wait_until(lambda: rolled_out(custom_objects, namespace), timeout=180, message="the fleet back on the base")
    finally:
        recorder.stop()
    assert st["rolloutProgress"] == "0/6 speculative" and server_pods(core_v1, namespace) == {"base": 6, "speculative": 0}
    assert core_v1.read_namespaced_service(FLEET, namespace).spec.selector[m.LABEL_VARIANT] == "base"
    most, fewest = recorder.replay({"Promoted", "RolledBack"})
    assert most <= 6 and fewest >= 5, (most, fewest)
    reasons = wait_until(lambda: (r := event_reasons(core_v1, namespace, FLEET)).count("WalkFinished") and r, timeout=10, message="WalkFinished")
    assert reasons.count("AcceptanceDrift") == 1 and reasons.count("WalkStarted") == 2 and reasons.count("WalkFinished") == 1


def test_kubectl_scale_during_a_walk_changes_its_goal(operator: Any, sims: Any, custom_objects: Any, core_v1: Any, namespace: str, kubectl) -> None:
    _, _, recorder = start_fleet(operator, sims, custom_objects, core_v1, namespace, 6)
    try:
        wait_speculative(custom_objects, namespace, 2, timeout=180)
        kubectl("scale", f"{PLURAL}/{FLEET}", "--replicas=4")
        st = wait_until(lambda: rolled_out(custom_objects, namespace), timeout=180, message="the fleet rolled out at 4")
    finally:
        recorder.stop()
    assert st["rolloutProgress"] == "4/4 speculative" and st["replicas"] == 4
    assert server_pods(core_v1, namespace) == {"base": 0, "speculative": 4}
    scale = json.loads(kubectl("get", f"{PLURAL}/{FLEET}", "--subresource=scale", "-o", "json").stdout)
    assert scale["status"] == {"replicas": 4, "selector": m.fleet_selector(FLEET)}
    most, _ = recorder.replay({"Promoted"})
    assert most <= 6


def arrived(custom_objects: Any, core_v1: Any, namespace: str, replicas: int) -> dict | None:
    """A fleet rolled out; a one-server resource (no walk) promoted with only its speculative server left."""
    if replicas >= 2:
        return rolled_out(custom_objects, namespace)
    st = fleet_status(custom_objects, namespace)
    settled = st.get("phase") == "Promoted" and st.get("speculativeReplicas") == 1 and st.get("readyReplicas") == 1
    return st if settled and server_pods(core_v1, namespace) == {"base": 0, "speculative": 1} else None


@pytest.mark.parametrize("replicas", [4, 1])
def test_a_new_drafter_of_a_walked_fleet_walks_back_before_any_speculative_pod_of_the_new_template_exists(
    operator: Any, sims: Any, custom_objects: Any, core_v1: Any, apps_v1: Any, namespace: str, replicas: int
) -> None:
    """4 replicas: never fewer than 3 Ready behind the stable Service. 1 replica (keepBaseWarm false, so only the
    promoted speculative server runs): the base loads first and the old speculative server answers until then."""
    from tests.support.operator_process import event_reasons

    max_unavailable = 1
    _, _, first = start_fleet(operator, sims, custom_objects, core_v1, namespace, replicas)
    try:
        wait_until(lambda: arrived(custom_objects, core_v1, namespace, replicas), timeout=240, message="the fleet rolled out")
    finally:
        first.stop()
    old_revision = fleet_status(custom_objects, namespace)["probe"]["revision"]
    old_hash = apps_v1.read_namespaced_deployment(f"{FLEET}-spec", namespace).spec.template.metadata.annotations[m.ANNOTATION_TEMPLATE_HASH]
    recorder = Recorder(core_v1, custom_objects, namespace)
    try:
        custom_objects.patch_namespaced_custom_object(
            API_GROUP, API_VERSION, namespace, PLURAL, FLEET, {"spec": {"drafter": {"path": "eagle3/llama-v2"}}}
        )
        st = wait_until(
            lambda: (s := arrived(custom_objects, core_v1, namespace, replicas)) and s["probe"]["revision"] != old_revision and s,
            timeout=300,
            message="the new revision rolled out",
        )
    finally:
        recorder.stop()
    assert st["phase"] == "Promoted" and st["rolloutProgress"] == f"{replicas}/{replicas} speculative"
    assert server_pods(core_v1, namespace) == {"base": 0, "speculative": replicas}

    # Replayed from the API server's watch streams, in resourceVersion order.
    with recorder.lock:
        events = sorted(recorder.events, key=lambda e: e[0])
    pods: dict[str, tuple] = {}
    selector: dict[str, str] | None = None
    fewest, most, walk_back_finished, phases = 10**9, 0, False, []
    for _, kind, kind_of_event, data in events:
        if kind == "pod":
            if kind_of_event == "DELETED":
                pods.pop(data[0], None)
            else:
                pods[data[0]] = data
        elif kind == "svc":
            selector = data
        elif not phases or phases[-1] != data:
            phases.append(data)
        speculative = [p for p in pods.values() if p[3].get(m.LABEL_VARIANT) == "speculative"]
        old = [p for p in speculative if p[4] == old_hash]
        new = [p for p in speculative if p[4] != old_hash]
        assert not (old and new), f"speculative pods of the old and the new template existed together: {len(old)} old, {len(new)} new"
        if new:
            walk_back_finished = True
        assert not (old and walk_back_finished), "a speculative pod of the old template came back"
        most = max(most, sum(1 for p in pods.values() if p[1]))
        if selector:
            fewest = min(fewest, sum(1 for p in pods.values() if p[2] and all(p[3].get(k) == v for k, v in selector.items())))
    assert walk_back_finished
    floor = max(1, replicas - max_unavailable)
    assert fewest >= floor, f"only {fewest} Ready servers behind the stable Service during the revision change"
    budget = replicas if replicas >= 2 else 2  # maxSurge 0; a one-server trial runs two servers
    assert most <= budget, f"{most} servers held or asked for GPUs at once"
    assert phases[:2] == ["Promoted", "Deploying"] and "Probing" in phases and phases[-1] == "Promoted", phases
    reasons = event_reasons(core_v1, namespace, FLEET)
    assert reasons.count("SpeedupConfirmed") == 2
    if replicas >= 2:
        assert reasons.count("WalkStarted") >= 3  # out; back; out again


def test_a_new_base_image_of_a_six_server_fleet_never_leaves_fewer_than_five_ready_servers(
    operator: Any, custom_objects: Any, core_v1: Any, apps_v1: Any, namespace: str
) -> None:
    """A fleet whose drafter is incompatible serves from 6 base servers. A new image changes the base template
    (the Deployment's RollingUpdate, maxSurge 0 / maxUnavailable 1) and makes a new revision whose canary takes a
    base server (maxSurge 0). The walk to the canary waits for the base rollout: counted from the API server's watch
    of pods (kwok's stages make each new pod Ready 2 s after it runs), never fewer than 5 Ready servers."""
    from tests.support.operator_process import example

    verdict = json.dumps({"compatible": False, "findings": [{"severity": "error", "code": "HiddenSizeMismatch", "message": "4096 != 7168"}]})
    annotations = {"specdec.test/init-exit-code": "1", "specdec.test/init-message": verdict, "specdec.test/ready-after": READY_AFTER}
    cr = example("llama31-8b-eagle3.yaml", FLEET, namespace, annotations=annotations, replicas=6, resources__gpus=8, resources__gpuFamily="blackwell")
    operator.start()
    custom_objects.create_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, cr)

    def at_rest() -> dict | None:
        st = fleet_status(custom_objects, namespace)
        return st if st.get("phase") == "Invalid" and st.get("readyReplicas") == 6 and server_pods(core_v1, namespace)["speculative"] == 0 else None

    first = wait_until(at_rest, timeout=180, message="6 Ready base servers beside an Invalid drafter")
    old_hash = apps_v1.read_namespaced_deployment(f"{FLEET}-base", namespace).spec.template.metadata.annotations[m.ANNOTATION_TEMPLATE_HASH]
    recorder = Recorder(core_v1, custom_objects, namespace)
    new_image = "mirror.example/lmsysorg/sglang:v0.5.23-cu130"
    try:
        patched = custom_objects.patch_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, FLEET, {"spec": {"image": new_image}})

        def rolled_and_decided() -> dict | None:
            st = at_rest()
            if st is None or st["validation"].get("revision") == first["validation"]["revision"]:
                return None
            base = core_v1.list_namespaced_pod(namespace, label_selector=f"{m.LABEL_INSTANCE}={FLEET},{m.LABEL_VARIANT}=base").items
            return st if len(base) == 6 and all(p.spec.containers[0].image == new_image for p in base) else None

        wait_until(rolled_and_decided, timeout=300, message="the base rolled to the new image and the new revision was validated")
    finally:
        recorder.stop()

    # Replayed from the pods' watch stream, in resourceVersion order: Ready servers (not being deleted) at every event
    # after the patch (the pods listed before it come in one by one, each at its own last change).
    with recorder.lock:
        events = sorted(recorder.events, key=lambda e: e[0])
    pods: dict[str, tuple] = {}
    fewest, mixed, canaries, counted = 10**9, False, set(), 0
    for version, kind, kind_of_event, data in events:
        if kind != "pod":
            continue
        if kind_of_event == "DELETED":
            pods.pop(data[0], None)
        else:
            pods[data[0]] = data
        if version < int(patched["metadata"]["resourceVersion"]):
            continue
        counted += 1
        fewest = min(fewest, sum(1 for p in pods.values() if p[2]))
        base_hashes = {p[4] for p in pods.values() if p[3].get(m.LABEL_VARIANT) == "base"}
        mixed |= old_hash in base_hashes and len(base_hashes) > 1
        canaries |= {p[0] for p in pods.values() if p[3].get(m.LABEL_VARIANT) == "speculative"}
    assert mixed, "the base servers were never of two templates at once: not a rolling update"
    assert canaries, "the new revision never got its canary"
    assert counted >= 20, f"only {counted} pod events after the image change"
    assert fewest >= 5, f"only {fewest} Ready servers during the base image change (6 replicas, maxUnavailable 1)"


def test_a_new_base_image_while_the_canary_is_probed_never_leaves_fewer_than_five_ready_servers(
    operator: Any, sims: Any, custom_objects: Any, core_v1: Any, apps_v1: Any, namespace: str
) -> None:
    """A new image while a 6-server fleet's canary is probed (5 base servers and the canary, maxSurge 0): the canary is
    recreated at once (the 5 base servers keep the floor) and the base template waits until the new canary is Ready
    (a replicas-only write), then rolls. From the API server's watch of pods: never fewer than 5 Ready servers."""
    from tests.support.operator_process import compatible_annotations, example

    # Slow simulators: the probe of the first revision is still measuring when the image changes.
    base = sims.start("llama31-8b-base", time_scale=0.2)
    spec_sim = sims.start("llama31-8b-eagle3", time_scale=0.2)
    operator.map(f"{FLEET}-base", base.url)
    operator.map(f"{FLEET}-spec", spec_sim.url)
    operator.start()
    cr = example(
        "llama31-8b-eagle3.yaml",
        FLEET,
        namespace,
        annotations=compatible_annotations(ready_after=READY_AFTER),
        replicas=6,
        resources__gpus=8,
        resources__gpuFamily="blackwell",
        rollout__keepBaseWarm=False,
    )
    custom_objects.create_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, cr)

    def probing() -> dict | None:
        st = fleet_status(custom_objects, namespace)
        return st if st.get("phase") == "Probing" and st.get("readyReplicas") == 6 and st.get("speculativeReplicas") == 1 else None

    first = wait_until(probing, timeout=180, message="the canary probed beside 5 base servers")
    old_base = apps_v1.read_namespaced_deployment(f"{FLEET}-base", namespace).spec.template.metadata.annotations[m.ANNOTATION_TEMPLATE_HASH]
    recorder = Recorder(core_v1, custom_objects, namespace)
    new_image = "mirror.example/lmsysorg/sglang:v0.5.23-cu130"
    try:
        patched = custom_objects.patch_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, FLEET, {"spec": {"image": new_image}})

        def rolled() -> bool:
            pods = core_v1.list_namespaced_pod(namespace, label_selector=f"{m.LABEL_INSTANCE}={FLEET}").items
            live = [p for p in pods if not p.metadata.deletion_timestamp]
            ready = [p for p in live if any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])]
            return len(live) == 6 and len(ready) == 6 and all(p.spec.containers[0].image == new_image for p in live)

        wait_until(rolled, timeout=300, message="every server of the fleet on the new image and Ready")
    finally:
        recorder.stop()
    assert fleet_status(custom_objects, namespace)["probe"].get("revision") != first["probe"].get("revision")

    with recorder.lock:
        events = sorted(recorder.events, key=lambda e: e[0])
    pods: dict[str, tuple] = {}
    fewest, canary_back_before_base_rolled = 10**9, None
    for version, kind, kind_of_event, data in events:
        if kind != "pod":
            continue
        if kind_of_event == "DELETED":
            pods.pop(data[0], None)
        else:
            pods[data[0]] = data
        if version < int(patched["metadata"]["resourceVersion"]):
            continue
        fewest = min(fewest, sum(1 for p in pods.values() if p[2]))
        base_hashes = {p[4] for p in pods.values() if p[3].get(m.LABEL_VARIANT) == "base"}
        if canary_back_before_base_rolled is None and base_hashes != {old_base}:
            # The first base pod of the new template: the new canary was Ready by then.
            canary_back_before_base_rolled = any(p[2] for p in pods.values() if p[3].get(m.LABEL_VARIANT) == "speculative")
    assert canary_back_before_base_rolled, "the base rolled before the new canary was Ready"
    assert fewest >= 5, f"only {fewest} Ready servers during the image change of a probed fleet"
