"""A fleet rolled onto the drafter: time from the decision to the last speculative server Ready, per replica step,
measured against the pods' own times (creationTimestamp, status.startTime, the Ready condition's
lastTransitionTime), and the operator's API writes per step.

Starts its own local control plane (hack/devcluster, cluster `fleet-bench`, removed afterwards), the operator
as a `specdec run` process (as tests/cluster/test_operator_e2e.py does: --endpoints maps the Services to two simulators
on loopback, --reconcile-interval 1), and one SpeculativeServer of --replicas Blackwell 8-GPU servers with
rollout.maxSurge 0, maxUnavailable 1, keepBaseWarm false. kwok makes a pod Ready --ready-after after its
containers start (a model load of that length). API writes are the operator's own count
(specdec_api_request_duration_seconds_count by verb and resource, every request of kubewriter.py); Kopf's watch
and its own patches are not in it.

Usage: .venv/bin/python benchmarks/fleet_rollout.py [--replicas 8] [--ready-after 2s]
"""

from __future__ import annotations

import argparse
import itertools
import re
import sys
import tempfile
import time
import urllib.request
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "operator")]

from kubernetes import client, config

from hack import devcluster

GROUP, VERSION, PLURAL, NAME = "specdec.io", "v1alpha1", "speculativeservers", "fleet"


def ts(value: str | datetime | None) -> float:
    if value is None:
        return float("nan")
    if isinstance(value, datetime):
        return value.timestamp()
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def api_writes(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    counts: dict[str, float] = {}
    for line in text.splitlines():
        found = re.match(r"specdec_api_request_duration_seconds_count\{(.*)\} (\S+)", line)
        if found:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', found.group(1)))
            counts[f"{labels.get('verb')} {labels.get('resource')}"] = float(found.group(2))
    return counts


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--ready-after", default="2s")
    args = parser.parse_args()

    from test_operator_e2e import Operator, compatible_annotations, example, free_port

    from tests.support.simulators import Simulators

    cluster = devcluster.up("fleet-bench", tie_to_parent=True)
    sims = Simulators()
    operator = None
    try:
        cluster.kubectl("apply", "--server-side", "-f", str(REPO / "crds"))
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/speculativeservers.specdec.io")
        api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        namespace = "bench"
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
        while not core.list_namespaced_service_account(namespace).items:
            time.sleep(0.2)
        workdir = Path(tempfile.mkdtemp(prefix="fleet-bench-"))
        operator = Operator(str(cluster.kubeconfig), namespace, workdir)
        base, spec = sims.start("llama31-8b-base", time_scale=2.0), sims.start("llama31-8b-eagle3", time_scale=2.0)
        operator.map(f"{NAME}-base", base.url)
        operator.map(f"{NAME}-spec", spec.url)
        metrics_port = free_port()
        operator.extra_args = ["--metrics-port", str(metrics_port), "--metrics-address", "127.0.0.1"]
        operator.start()
        cr = example(
            "llama31-8b-eagle3.yaml",
            NAME,
            namespace,
            annotations=compatible_annotations(ready_after=args.ready_after),
            replicas=args.replicas,
            resources__gpus=8,
            resources__gpuFamily="blackwell",
            rollout__keepBaseWarm=False,
        )
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, cr)

        def status() -> dict:
            return custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, NAME).get("status") or {}

        deadline = time.monotonic() + 600
        while status().get("phase") != "Promoted":
            if time.monotonic() > deadline or status().get("phase") in ("RolledBack", "Invalid", "Failed"):
                raise SystemExit(f"not promoted: {status().get('phase')} {status().get('message')}")
            time.sleep(0.05)
        writes_at_decision = api_writes(metrics_port)
        while True:
            st = status()
            cond = next((c for c in st.get("conditions") or [] if c["type"] == "RolledOut"), {})
            if cond.get("status") == "True":
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"not rolled out: {st.get('rolloutProgress')} {st.get('message')}")
            time.sleep(0.2)
        writes_after = api_writes(metrics_port)

        decided = ts(st["probe"]["finishedAt"])
        pods = core.list_namespaced_pod(namespace, label_selector=f"app.kubernetes.io/instance={NAME},specdec.io/variant=speculative").items
        rows = []
        for pod in pods:
            ready = next(c for c in pod.status.conditions if c.type == "Ready")
            rows.append((ts(pod.metadata.creation_timestamp), ts(pod.status.start_time), ts(ready.last_transition_time), pod.metadata.name))
        rows.sort()
        print(f"fleet of {args.replicas} Blackwell 8-GPU servers, maxSurge 0, maxUnavailable 1, kwok Ready {args.ready_after} after start")
        print(f"decision (status.probe.finishedAt): {st['probe']['finishedAt']}, speedup {st['probe'].get('speedup')}")
        print("speculative pod            created  started  Ready   (seconds after the decision; the canary was created before it)")
        for created, started, ready_at, name in rows:
            print(f"  {name:26s} {created - decided:7.1f}  {started - decided:7.1f}  {ready_at - decided:6.1f}")
        new = rows[1:]  # the canary existed before the decision
        last_ready = max(r[2] for r in rows)
        rolled = ts(cond.get("lastTransitionTime"))
        print(f"decision -> last speculative pod Ready: {last_ready - decided:.1f} s; -> RolledOut True: {rolled - decided:.1f} s")
        if len(new) >= 2:
            steps = [b[2] - a[2] for a, b in itertools.pairwise(new)]
            print(f"per replica step (Ready to next Ready): mean {sum(steps) / len(steps):.2f} s, min {min(steps):.2f}, max {max(steps):.2f}")
            gaps = [r[0] - p[2] for p, r in itertools.pairwise(new)]
            print(f"  of which the operator's share (a Ready pod to the next pod created): mean {sum(gaps) / len(gaps):.2f} s")
        delta = {k: writes_after.get(k, 0) - writes_at_decision.get(k, 0) for k in writes_after}
        total = sum(delta.values())
        steps_made = args.replicas - 1
        print(f"operator API writes from the decision to RolledOut: {total:.0f} ({total / steps_made:.1f} per replica step, {steps_made} steps)")
        for key, value in sorted(delta.items()):
            if value:
                print(f"  {key}: {value:.0f}")
        return 0
    finally:
        if operator is not None:
            operator.stop()
        sims.close()
        devcluster.down("fleet-bench", purge=True)


if __name__ == "__main__":
    sys.exit(main())
