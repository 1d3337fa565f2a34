"""The LeaderWorkerSet controller (optional: multi-node servers), run against a devcluster."""

from __future__ import annotations

import base64
import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .health import _get_ok, _tail
from .pki import _kubeconfig, _openssl
from .processes import _alive, _exit_reason, _free_ports, _port_free, _spawn, _stop_pid
from .state import PORT_BLOCK, PORT_NAMES, Cluster, ClusterError, _locked, _read_state, _write_state, tools_dir

# The real controller (sigs.k8s.io/lws, built by `hack/tools.sh lws` from the tools module, hack/go/kube) runs as a local process like
# the other components. Its webhooks are not optional: the pod webhook is what labels each pod of a group with its
# worker index and group key and injects LWS_LEADER_ADDRESS / LWS_WORKER_INDEX / LWS_GROUP_SIZE, so they stay on
# (ENABLE_WEBHOOKS=false would leave the pods without their ranks). In a cluster the API server reaches them
# through a Service; here there is no pod network to the host, so the webhook configurations name the local
# process by URL (https://127.0.0.1:PORT/...), with a serving certificate for 127.0.0.1 signed by the cluster's CA
# (the controller's own certificate rotation, which writes a Secret for a Service DNS name, is turned off).
LWS_COMPONENT = "lws-controller"
# The release's CRD, which `hack/tools.sh lws` copies from the same module into the tools directory.
LWS_CRD_FILE_NAME = "leaderworkerset.x-k8s.io_leaderworkersets.yaml"
LWS_CRD_NAME = "leaderworkersets.leaderworkerset.x-k8s.io"

# (configuration name, webhook name, path, API group, resource, operations): the controller's own webhooks
# (config/webhook/manifests.yaml of its release), less the DisaggregatedSet ones.
_LWS_WEBHOOKS = {
    "mutating": (
        (
            "mleaderworkerset.kb.io",
            "/mutate-leaderworkerset-x-k8s-io-v1-leaderworkerset",
            "leaderworkerset.x-k8s.io",
            "leaderworkersets",
            ["CREATE", "UPDATE"],
        ),
        ("mpod.kb.io", "/mutate--v1-pod", "", "pods", ["CREATE"]),
    ),
    "validating": (
        (
            "vleaderworkerset.kb.io",
            "/validate-leaderworkerset-x-k8s-io-v1-leaderworkerset",
            "leaderworkerset.x-k8s.io",
            "leaderworkersets",
            ["CREATE", "UPDATE"],
        ),
        ("vpod.kb.io", "/validate--v1-pod", "", "pods", ["CREATE", "UPDATE"]),
    ),
}

# The controller also runs its DisaggregatedSet controller, whose watches need those kinds to exist; nothing
# here creates one, so minimal CRDs stand in for their full ones (2.8 MB of schema).
_DISAGGREGATED_KINDS = (("DisaggregatedSet", "disaggregatedsets"), ("DisaggregatedSetRoleScaler", "disaggregatedsetrolescalers"))


def lws_crd_file(tools: Path | None = None) -> Path:
    """The LeaderWorkerSet CRD of the release the controller was built from."""
    return (tools or tools_dir()) / LWS_CRD_FILE_NAME


def lws_tool_missing(tools: Path | None = None) -> bool:
    """True when the LeaderWorkerSet controller or its CRD is not built (run `hack/tools.sh lws`)."""
    return not os.access((tools or tools_dir()) / LWS_COMPONENT, os.X_OK) or not lws_crd_file(tools).is_file()


def _stub_crd(kind: str, plural: str) -> dict:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.disaggregatedset.x-k8s.io"},
        "spec": {
            "group": "disaggregatedset.x-k8s.io",
            "scope": "Namespaced",
            "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural, "singular": kind.lower()},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                }
            ],
        },
    }


def _webhook_configurations(port: int, ca_bundle: str) -> list[dict]:
    out = []
    for kind, hooks in _LWS_WEBHOOKS.items():
        webhooks = []
        for name, path, group, resource, operations in hooks:
            hook: dict[str, Any] = {
                "name": name,
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Fail",
                "timeoutSeconds": 10,
                "clientConfig": {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca_bundle},
                "rules": [{"apiGroups": [group], "apiVersions": ["v1"], "operations": operations, "resources": [resource]}],
            }
            if resource == "pods":
                # Only the pods of LeaderWorkerSets (the webhook ignores every other pod): the rest of the cluster
                # keeps working while the controller is down.
                hook["objectSelector"] = {"matchExpressions": [{"key": "leaderworkerset.sigs.k8s.io/name", "operator": "Exists"}]}
            webhooks.append(hook)
        out.append(
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "MutatingWebhookConfiguration" if kind == "mutating" else "ValidatingWebhookConfiguration",
                "metadata": {"name": f"specdec-dev-lws-{kind}"},
                "webhooks": webhooks,
            }
        )
    return out


def _lws_pki(pki: Path) -> Path:
    """The controller's client identity and its webhook serving certificate (127.0.0.1), once per cluster."""
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    serving = pki / "lws-webhook"
    for stem, subject, profile in (("lws", "/O=system:masters/CN=lws-controller", "client"), ("lws-webhook/tls", "/CN=lws-webhook", "server")):
        if (pki / f"{stem}.crt").exists():
            continue
        (pki / stem).parent.mkdir(parents=True, exist_ok=True)
        _openssl("req", "-new", *ec, "-keyout", f"{stem}.key", "-out", f"{stem}.csr", "-subj", subject, "-config", "openssl.cnf", cwd=pki)
        _openssl(
            "x509", "-req", "-in", f"{stem}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-set_serial", str(int.from_bytes(os.urandom(8), "big")), "-days", "3650", "-out", f"{stem}.crt",
            "-extfile", "openssl.cnf", "-extensions", profile, cwd=pki,
        )  # fmt: skip
        (pki / f"{stem}.csr").unlink()
    return serving


def _lws_ports(ports: dict[str, int]) -> tuple[int, int]:
    """The webhook and health ports: the two after the control plane's in the cluster's own block when free.

    Clusters started side by side (pytest-xdist workers) have blocks of their own; a search of the whole range
    could hand two of them the same free port before either controller binds it.
    """
    if set(PORT_NAMES) <= set(ports):
        base = min(ports[name] for name in PORT_NAMES)
        spare = [base + len(PORT_NAMES), base + len(PORT_NAMES) + 1]
        if spare[-1] < base + PORT_BLOCK and all(_port_free(p) for p in spare):
            return spare[0], spare[1]
    webhook, health = _free_ports(2, set(ports.values()))
    return webhook, health


def start_lws(cluster: Cluster, *, tie_to_parent: bool = False, timeout: float = 120.0, log: Callable[[str], None] | None = None) -> None:
    """Install the LeaderWorkerSet CRD and run the real controller against ``cluster`` (a no-op when it runs).

    Raises ClusterError with a one-line reason (e.g. the controller is not built: `hack/tools.sh lws`).
    """
    say = log or (lambda message: None)
    tools = Path(cluster.tools)
    if lws_tool_missing(tools):
        raise ClusterError(f"the LeaderWorkerSet controller is not built in {tools}: run `hack/tools.sh lws` (or `make tools LWS=1`)")
    directory = cluster.directory
    started = time.monotonic()
    deadline = started + timeout
    with _locked(cluster.name):
        state = _read_state(cluster.name)
        pids = state.setdefault("pids", {})
        lws_state = state.get("lws") or {}
        if LWS_COMPONENT in pids and _alive(int(pids[LWS_COMPONENT]), directory) and _get_ok(f"http://127.0.0.1:{lws_state.get('health')}/readyz"):
            return
        pki = directory / "pki"
        serving = _lws_pki(pki)
        webhook_port, health_port = _lws_ports({k: int(v) for k, v in (state.get("ports") or {}).items()})
        (directory / "lws.kubeconfig").write_text(_kubeconfig(cluster.server, pki, "lws", f"specdec-{cluster.name}", embed=False))
        config = {
            "apiVersion": "config.lws.x-k8s.io/v1alpha1",
            "kind": "Configuration",
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(serving)},
            "metrics": {"bindAddress": "0"},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        }
        (directory / "lws-config.yaml").write_text(json.dumps(config, indent=2) + "\n")
        # The CRD first (server-side: its schema is larger than the last-applied annotation may be).
        crds = [_stub_crd(kind, plural) for kind, plural in _DISAGGREGATED_KINDS]
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(lws_crd_file(tools)), timeout=120)
        cluster.kubectl(
            "apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": crds})
        )
        cluster.wait_established([LWS_CRD_NAME] + [f"{plural}.disaggregatedset.x-k8s.io" for _, plural in _DISAGGREGATED_KINDS])
        if LWS_COMPONENT in pids:
            _stop_pid(int(pids.pop(LWS_COMPONENT)), directory)
        command = [
            str(tools / LWS_COMPONENT),
            f"--config={directory / 'lws-config.yaml'}",
            f"--kubeconfig={directory / 'lws.kubeconfig'}",
            "--zap-log-level=info",
        ]
        logs = directory / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        pids[LWS_COMPONENT] = _spawn(command, logs / f"{LWS_COMPONENT}.log", directory, tie_to_parent)
        state["lws"] = {"webhook": webhook_port, "health": health_port}
        _write_state(cluster.name, state)
        pid = int(pids[LWS_COMPONENT])
        while not _get_ok(f"http://127.0.0.1:{health_port}/readyz"):
            if not _alive(pid, directory):
                raise ClusterError(f"{LWS_COMPONENT} {_exit_reason(pid)}: {_tail(logs / f'{LWS_COMPONENT}.log')}")
            if time.monotonic() > deadline:
                raise ClusterError(f"timed out waiting for {LWS_COMPONENT} (log: {logs / f'{LWS_COMPONENT}.log'})")
            time.sleep(0.2)
        # The webhook server listens once the controller's certificates are loaded; then point the API server at it.
        while True:
            try:
                with socket.create_connection(("127.0.0.1", webhook_port), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise ClusterError(f"{LWS_COMPONENT} never served its webhooks on 127.0.0.1:{webhook_port}") from None
                time.sleep(0.2)
        ca_bundle = base64.b64encode((pki / "ca.crt").read_bytes()).decode()
        hooks = _webhook_configurations(webhook_port, ca_bundle)
        cluster.kubectl(
            "apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": hooks})
        )
    say(f"{LWS_COMPONENT} ready after {time.monotonic() - started:.1f}s (webhooks at https://127.0.0.1:{webhook_port})")


def stop_lws(cluster: Cluster, *, timeout: float = 120.0) -> None:
    """Undo start_lws: the webhook configurations, the controller process and the CRDs (every LeaderWorkerSet in
    the cluster goes with its CRD). A no-op where none of them is there."""
    deadline = time.monotonic() + timeout
    with _locked(cluster.name):
        hooks = [f"{kind}webhookconfiguration/specdec-dev-lws-{kind}" for kind in _LWS_WEBHOOKS]
        cluster.kubectl("delete", "--ignore-not-found", *hooks, timeout=60)
        state = _read_state(cluster.name)
        pids = state.get("pids") or {}
        if LWS_COMPONENT in pids:
            _stop_pid(int(pids.pop(LWS_COMPONENT)), cluster.directory)
            state.pop("lws", None)
            _write_state(cluster.name, state)
        crds = [f"crd/{LWS_CRD_NAME}"] + [f"crd/{plural}.disaggregatedset.x-k8s.io" for _, plural in _DISAGGREGATED_KINDS]
        cluster.kubectl("delete", "--ignore-not-found", "--wait=false", *crds, timeout=60)
        while cluster.kubectl("get", crds[0], check=False).returncode == 0:
            if time.monotonic() > deadline:
                raise ClusterError(f"the CRD {LWS_CRD_NAME} was not deleted within {timeout:.0f}s")
            time.sleep(0.5)
