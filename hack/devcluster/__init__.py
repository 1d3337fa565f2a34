"""A local Kubernetes control plane with simulated 8-GPU nodes, supervised by this package.

Real etcd, kube-apiserver, kube-controller-manager and kube-scheduler (built by ``hack/tools.sh``) and a
kwok controller that plays the kubelet of the fake nodes in ``hack/kwok/nodes.yaml``, following the Stages in
``hack/kwok/stages.yaml``. No containers, no Docker: every component is a local process.

Each cluster has a name and a directory ``~/.cache/specdec-operator/cluster/<name>/`` holding its certificates,
kubeconfig, logs, etcd data and a state file. Ports and certificates are kept across ``down``/``up``, so the
kubeconfig path and contents stay the same for a given name.

Command line (from the checkout's root)::

    python -m hack.devcluster up [--name specdec]       # start (or reuse) and print the kubeconfig path
    python -m hack.devcluster down [--name specdec] [--purge]
    python -m hack.devcluster status [--name specdec]

Python::

    from hack import devcluster
    cluster = devcluster.up("specdec")     # -> Cluster(kubeconfig=..., server=..., ...)
    cluster.kubectl("get", "nodes")
    devcluster.down("specdec")

Modules, in the order they build on each other: state (directories, pinned versions, ``Cluster``, the state
file and its lock), processes (spawning, stopping, ports), pki (certificates, kubeconfigs), commands (the
components' command lines), health (checks and waits), images (``ctr`` on the real node), node (the real node;
realnode.py holds its configuration and the machine clean-up), lws (the LeaderWorkerSet controller), lifecycle
(up, down, restart, status, reap_orphans) and cli.

Only the Python standard library is used, so it runs with any Python >= 3.10.
"""

from __future__ import annotations

from . import realnode
from .images import load_images, node_ctr, trust_registry
from .lifecycle import down, reap_orphans, restart, status, up
from .lws import LWS_COMPONENT, LWS_CRD_FILE_NAME, LWS_CRD_NAME, lws_crd_file, lws_tool_missing, start_lws, stop_lws
from .processes import _port_free
from .state import (
    COMPONENTS,
    DEFAULT_NAME,
    HACK_DIR,
    NODES_MANIFEST,
    PORT_BLOCK,
    PORT_NAMES,
    PORT_RANGE,
    REPO_DIR,
    REQUIRED_TOOLS,
    STAGES_MANIFEST,
    Cluster,
    ClusterError,
    _read_state,
    cache_dir,
    cluster_dir,
    missing_tools,
    tools_dir,
    versions,
)

__all__ = [
    "COMPONENTS",
    "DEFAULT_NAME",
    "HACK_DIR",
    "LWS_COMPONENT",
    "LWS_CRD_FILE_NAME",
    "LWS_CRD_NAME",
    "NODES_MANIFEST",
    "PORT_BLOCK",
    "PORT_NAMES",
    "PORT_RANGE",
    "REPO_DIR",
    "REQUIRED_TOOLS",
    "STAGES_MANIFEST",
    "Cluster",
    "ClusterError",
    "_port_free",
    "_read_state",
    "cache_dir",
    "cluster_dir",
    "down",
    "load_images",
    "lws_crd_file",
    "lws_tool_missing",
    "missing_tools",
    "node_ctr",
    "realnode",
    "reap_orphans",
    "restart",
    "start_lws",
    "status",
    "stop_lws",
    "tools_dir",
    "trust_registry",
    "up",
    "versions",
]
