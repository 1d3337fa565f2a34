"""The command lines of etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .state import POD_CIDR, SERVICE_CIDR


def _etcd_command(directory: Path, ports: dict[str, int], tools: Path) -> list[str]:
    data = directory / "etcd-data"
    etcd_url = f"http://127.0.0.1:{ports['etcd']}"
    peer_url = f"http://127.0.0.1:{ports['etcd-peer']}"
    return [
        str(tools / "etcd"),
        "--name=default",
        f"--data-dir={data}",
        f"--listen-client-urls={etcd_url}",
        f"--advertise-client-urls={etcd_url}",
        f"--listen-peer-urls={peer_url}",
        f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=default={peer_url}",
        "--initial-cluster-state=new",
        # A throwaway test store: skipping fsync makes writes cheap on slow disks.
        "--unsafe-no-fsync=true",
        "--quota-backend-bytes=2147483648",
        "--log-level=warn",
    ]


def _apiserver_command(directory: Path, ports: dict[str, int], tools: Path, apiserver_args: Sequence[str], node_ip: str | None) -> list[str]:
    pki = directory / "pki"
    etcd_url = f"http://127.0.0.1:{ports['etcd']}"
    if node_ip:
        # A real node: pods reach the API server through the `kubernetes` Service, whose endpoint is this
        # address (a loopback address cannot be one), and the API server reaches the kubelet.
        apiserver_network = [
            "--bind-address=0.0.0.0",
            f"--advertise-address={node_ip}",
            f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
            f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
            "--kubelet-preferred-address-types=InternalIP",
        ]
    else:
        apiserver_network = [
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            # The 'kubernetes' Service cannot point at a loopback address; nothing in the cluster needs it.
            "--endpoint-reconciler-type=none",
        ]
    return [
        str(tools / "kube-apiserver"),
        f"--etcd-servers={etcd_url}",
        *apiserver_network,
        f"--secure-port={ports['kube-apiserver']}",
        f"--cert-dir={directory / 'apiserver-certs'}",
        f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        "--authorization-mode=Node,RBAC",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        "--allow-privileged=true",
        "--profiling=false",
        # e.g. an audit log: benchmarks/scale.py --audit attributes the API server's requests to their clients.
        *apiserver_args,
        "--v=1",
    ]


def _commands(
    directory: Path,
    ports: dict[str, int],
    tools: Path,
    controller_manager_args: Sequence[str] = (),
    apiserver_args: Sequence[str] = (),
    node_ip: str | None = None,
) -> dict[str, list[str]]:
    pki = directory / "pki"
    component_kubeconfig = {c: directory / f"{c}.kubeconfig" for c in ("controller-manager", "scheduler", "kwok")}
    return {
        "etcd": _etcd_command(directory, ports, tools),
        "kube-apiserver": _apiserver_command(directory, ports, tools, apiserver_args, node_ip),
        "kube-controller-manager": [
            str(tools / "kube-controller-manager"),
            f"--kubeconfig={component_kubeconfig['controller-manager']}",
            f"--authentication-kubeconfig={component_kubeconfig['controller-manager']}",
            f"--authorization-kubeconfig={component_kubeconfig['controller-manager']}",
            "--bind-address=127.0.0.1",
            f"--secure-port={ports['kube-controller-manager']}",
            f"--cert-dir={directory / 'controller-manager-certs'}",
            "--leader-elect=false",
            "--controllers=*",
            # Each controller uses its own service account, as in a real cluster (RBAC is exercised).
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}",
            f"--cluster-signing-cert-file={pki / 'ca.crt'}",
            f"--cluster-signing-key-file={pki / 'ca.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            # The defaults (client QPS 20 per controller, 5 deployment/replicaset workers) unless the caller adds
            # flags: benchmarks/scale.py --tuned-control-plane does, for 2,000 Deployments (docs/scale.md).
            *controller_manager_args,
            "--profiling=false",
            "--v=1",
        ],
        "kube-scheduler": [
            str(tools / "kube-scheduler"),
            f"--kubeconfig={component_kubeconfig['scheduler']}",
            f"--authentication-kubeconfig={component_kubeconfig['scheduler']}",
            f"--authorization-kubeconfig={component_kubeconfig['scheduler']}",
            "--bind-address=127.0.0.1",
            f"--secure-port={ports['kube-scheduler']}",
            f"--cert-dir={directory / 'scheduler-certs'}",
            "--leader-elect=false",
            "--profiling=false",
            "--v=1",
        ],
        "kwok": [
            str(tools / "kwok"),
            f"--kubeconfig={component_kubeconfig['kwok']}",
            f"--config={directory / 'kwok-stages.yaml'}",
            "--manage-all-nodes=false",
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            f"--server-address=127.0.0.1:{ports['kwok']}",
            "--node-lease-duration-seconds=40",
            f"--cidr={POD_CIDR}",
            "--node-ip=10.200.0.1",
        ],
    }
