"""One real node beside the kwok nodes of a devcluster: real containers on this machine.

``python -m hack.devcluster up --real-node`` (``make cluster-up REAL_NODE=1``) starts, after the control plane:

* containerd (Debian's 1.6, with runc and the CNI plugins from Debian) with its root, state, socket, runc root and
  CNI configuration under ``<cluster>/node/``; ``restrict_oom_score_adj`` (this VM has no CAP_SYS_RESOURCE) and
  the network namespaces under its state directory. Its sandbox ("pause") image is made here from the ``pause``
  binary of ``hack/tools.sh node`` (no registry is reachable) and imported.
* a CNI bridge (one /24 of 10.88.0.0/16 derived from the cluster name; host-local IPAM with its data dir under
  ``node/``; no masquerading: nothing leaves the machine).
* kubelet v1.35 (``hack/go/node``; v1.35 because containerd 1.6 lacks the CRI RuntimeConfig call of v1.36, and it
  is inside the skew of the v1.36 API server): ``failCgroupV1: false`` (the VM has cgroup v1), ``cgroupDriver:
  cgroupfs``, ``protectKernelDefaults: false`` -- with true it refuses to start here, because it would otherwise
  set kernel.panic_on_oops=1, kernel.panic=10 and vm.overcommit_memory=1 itself; so it does set them, and ``down``
  puts back the values it found (recorded in the state file before the kubelet starts).
* kube-proxy v1.35 in iptables mode (the VM has no IPVS), told not to touch conntrack sysctls or route_localnet.
* CoreDNS (v1.14, built with only the plugins it needs) as a host process serving ``cluster.local`` from the API,
  behind the Service ``kube-system/kube-dns`` (10.96.0.10), whose EndpointSlice points at the node's address.
* simulated GPUs: ``nvidia.com/gpu: 8`` patched into the node's status (the documented way of advertising an
  extended resource), and the NVIDIA GPU feature-discovery labels of an H200.

``down`` stops all of it and removes what it made on the machine: processes (kubelet, kube-proxy, CoreDNS,
containerd, its shims and every container process, found through the kubepods cgroups), mounts under ``node/``,
the bridge, iptables chains (``kube-proxy --cleanup``, then KUBE-*/CNI-* leftovers), the kubepods cgroups, the dead
shim sockets in /run/containerd, and the sysctls it changed. One real node per machine: kube-proxy's chains and the
kubepods cgroups are machine-wide.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import socket
import subprocess
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

NODE_NAME = "real-0"
CLUSTER_DNS = "10.96.0.10"
CLUSTER_DOMAIN = "cluster.local"
PAUSE_IMAGE = "specdec.local/pause:1"
NODE_LABELS = {
    "specdec.io/real-node": "true",
    "nvidia.com/gpu.present": "true",
    "nvidia.com/gpu.product": "NVIDIA-H200",
    "nvidia.com/gpu.family": "hopper",
    "nvidia.com/gpu.compute.major": "9",
    "nvidia.com/gpu.compute.minor": "0",
    "nvidia.com/gpu.memory": "143771",
    "nvidia.com/gpu.count": "8",
    "nvidia.com/gpu.simulated": "true",
}
GPU_COUNT = "8"
NODE_TOOLS = ("kubelet", "kube-proxy", "coredns", "pause")
SYSTEM_TOOLS = {"containerd": "containerd", "runc": "runc", "iptables": "iptables", "ip": "iproute2", "mount": "mount"}
CNI_DIR = Path("/usr/lib/cni")
# Start order; stopped in reverse.
COMPONENTS = ("containerd", "kube-proxy", "coredns", "kubelet")
PORT_NAMES = ("kubelet", "kubelet-healthz", "kube-proxy-healthz", "kube-proxy-metrics", "coredns", "coredns-health", "coredns-ready")
# Sysctls the kubelet, the bridge plugin or kube-proxy may change; recorded before and put back by `down`.
SYSCTLS = (
    "kernel/panic",
    "kernel/panic_on_oops",
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
    "net/ipv4/ip_forward",
    "net/ipv4/conf/all/route_localnet",
)
MACHINE_LOCK = Path("/run/specdec-operator-real-node")


class RealNodeError(Exception):
    """A problem with the real node, in one line with what to do about it."""


def node_dir(cluster_directory: Path) -> Path:
    return cluster_directory / "node"


# ------------------------------------------------------------------------------------------------------------
# What the machine must have


def can_run_containers() -> str | None:
    """None when this machine can run the real node, else one line saying why not (and what to install)."""
    if os.geteuid() != 0:
        return "the real node needs root (containerd, mounts, iptables, cgroups)"
    missing = [pkg for tool, pkg in SYSTEM_TOOLS.items() if shutil.which(tool) is None]
    if not (CNI_DIR / "bridge").exists() or not (CNI_DIR / "host-local").exists():
        missing.append("containernetworking-plugins")
    if missing:
        return f"missing on this machine: {', '.join(missing)} (apt-get install {' '.join(missing)})"
    if "overlay" not in Path("/proc/filesystems").read_text():
        return "the kernel has no overlay filesystem (containerd's overlayfs snapshotter needs it)"
    if not Path("/sys/fs/cgroup").is_dir():
        return "no cgroup filesystem at /sys/fs/cgroup"
    if not Path("/proc/sys/net/bridge").is_dir():
        return "the kernel has no bridge netfilter (br_netfilter): Services cannot reach pods on the bridge"
    return None


def missing_node_tools(tools: Path) -> list[str]:
    return [tool for tool in NODE_TOOLS if not os.access(tools / tool, os.X_OK)]


def node_ip() -> str:
    """The machine's address that pods reach it at: $SPECDEC_NODE_IP, else the first global IPv4 address."""
    if os.environ.get("SPECDEC_NODE_IP"):
        return os.environ["SPECDEC_NODE_IP"]
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        match = re.search(r"\binet (\d+\.\d+\.\d+\.\d+)/", line)
        if match and not re.match(r"10\.88\.", match.group(1)):
            return match.group(1)
    raise RealNodeError("no global IPv4 address on this machine for the real node (set SPECDEC_NODE_IP)")


def _subnet_index(name: str) -> int:
    return int(hashlib.sha256(name.encode()).hexdigest(), 16) % 250 + 1


def pod_subnet(name: str) -> str:
    return f"10.88.{_subnet_index(name)}.0/24"


def bridge_name(name: str) -> str:
    return f"sdcni{_subnet_index(name)}"


# ------------------------------------------------------------------------------------------------------------
# Configuration files


def _containerd_config(nd: Path) -> str:
    return f"""version = 2
root = "{nd}/containerd/root"
state = "{nd}/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs",
                    "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{nd}/containerd/containerd.sock"

[ttrpc]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{nd}/containerd/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # REQUIRED on this VM (no CAP_SYS_RESOURCE): without it every RunPodSandbox fails in runc.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  # Registry hosts are read from here at each pull (images.trust_registry writes a hosts.toml per registry): the
  # release test's plain-HTTP registry on 127.0.0.1. No file for a host: containerd's defaults (HTTPS).
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{nd}/containerd/certs.d"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_DIR}"
    conf_dir = "{nd}/cni/net.d"
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "{shutil.which("runc") or "/usr/sbin/runc"}"
        Root = "{nd}/runc"
"""


def _cni_config(name: str, nd: Path) -> str:
    return json.dumps(
        {
            "cniVersion": "0.4.0",
            "name": "specdec",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": bridge_name(name),
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": pod_subnet(name)}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(nd / "cni" / "ipam"),
                    },
                }
            ],
        },
        indent=2,
    )


def _kubelet_config(nd: Path, pki: Path, ports: dict[str, int], ip: str) -> str:
    return json.dumps(
        {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "containerRuntimeEndpoint": f"unix://{nd}/containerd/containerd.sock",
            "address": ip,
            "port": ports["kubelet"],
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": ports["kubelet-healthz"],
            "authentication": {"x509": {"clientCAFile": str(pki / "ca.crt")}, "webhook": {"enabled": False}, "anonymous": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "clusterDNS": [CLUSTER_DNS],
            "clusterDomain": CLUSTER_DOMAIN,
            # true makes the kubelet refuse to start on this machine (panic_on_oops=0 etc.); false lets it set them,
            # and `down` restores the values recorded before it started.
            "protectKernelDefaults": False,
            "failSwapOn": False,
            # A shared development machine: evict only when really out of resources, never GC images for disk use.
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False,
            "maxPods": 30,
            "podPidsLimit": 4096,
            "nodeStatusReportFrequency": "10s",
            "nodeStatusUpdateFrequency": "5s",
            "syncFrequency": "10s",
            "fileCheckFrequency": "10s",
            "resolvConf": "/etc/resolv.conf",
            "registerNode": True,
            "staticPodPath": "",
            "logging": {"verbosity": 1},
        },
        indent=2,
    )


def _kube_proxy_config(name: str, nd: Path, ports: dict[str, int]) -> str:
    return json.dumps(
        {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(nd / "kube-proxy.kubeconfig")},
            "mode": "iptables",
            "hostnameOverride": NODE_NAME,
            "clusterCIDR": pod_subnet(name),
            "healthzBindAddress": f"127.0.0.1:{ports['kube-proxy-healthz']}",
            "metricsBindAddress": f"127.0.0.1:{ports['kube-proxy-metrics']}",
            # Leave the machine's conntrack sysctls alone.
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
            # No NodePorts on 127.0.0.1 (that would set net.ipv4.conf.all.route_localnet=1).
            "iptables": {"localhostNodePorts": False, "masqueradeAll": False},
            "nodePortAddresses": ["primary"],
        },
        indent=2,
    )


def _corefile(nd: Path, ports: dict[str, int], ip: str) -> str:
    return f""".:{ports["coredns"]} {{
    bind {ip}
    errors
    health 127.0.0.1:{ports["coredns-health"]}
    ready 127.0.0.1:{ports["coredns-ready"]}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {nd / "coredns.kubeconfig"}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
    cache 5
    loadbalance
}}
"""


def _dns_objects(ip: str, port: int) -> str:
    """RBAC of CoreDNS' identity, the kube-dns Service and its EndpointSlice (the host process)."""
    objects = [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "specdec:coredns"},
            "rules": [
                {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"], "verbs": ["list", "watch"]},
                {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "specdec:coredns"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "specdec:coredns"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "specdec:coredns"}],
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": {"k8s-app": "kube-dns", "kubernetes.io/name": "CoreDNS"}},
            "spec": {
                "clusterIP": CLUSTER_DNS,
                "ports": [{"name": "dns", "port": 53, "protocol": "UDP"}, {"name": "dns-tcp", "port": 53, "protocol": "TCP"}],
            },
        },
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": "kube-dns-host",
                "namespace": "kube-system",
                "labels": {"kubernetes.io/service-name": "kube-dns", "endpointslice.kubernetes.io/managed-by": "devcluster.specdec.io"},
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": [ip], "conditions": {"ready": True}, "nodeName": NODE_NAME}],
            "ports": [{"name": "dns", "port": port, "protocol": "UDP"}, {"name": "dns-tcp", "port": port, "protocol": "TCP"}],
        },
    ]
    return "\n---\n".join(json.dumps(o) for o in objects)


# ------------------------------------------------------------------------------------------------------------
# The pause image, made here: one layer holding the static `pause` binary


def pause_archive(tools: Path, out: Path) -> Path:
    """An OCI image archive of ``pause`` (byte-identical for the same binary), for `ctr images import`."""
    binary = (tools / "pause").read_bytes()
    layer_tar = io.BytesIO()
    with tarfile.open(fileobj=layer_tar, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("pause")
        info.size, info.mode, info.mtime = len(binary), 0o755, 0
        tar.addfile(info, io.BytesIO(binary))
    diff_id = "sha256:" + hashlib.sha256(layer_tar.getvalue()).hexdigest()
    layer = gzip.compress(layer_tar.getvalue(), mtime=0)
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": ["/pause"], "User": "65535:65535"},
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        }
    ).encode()
    blobs = {}

    def blob(data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return f"sha256:{digest}"

    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": blob(config), "size": len(config)},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": blob(layer), "size": len(layer)}],
        }
    ).encode()
    index = json.dumps(
        {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": blob(manifest),
                    "size": len(manifest),
                    "annotations": {"org.opencontainers.image.ref.name": PAUSE_IMAGE},
                }
            ],
        }
    ).encode()
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w") as tar:

        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 0
            tar.addfile(info, io.BytesIO(data))

        add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        add("index.json", index)
        for digest, data in blobs.items():
            add(f"blobs/sha256/{digest}", data)
    return out


# ------------------------------------------------------------------------------------------------------------
# Machine state: sysctls, mounts, cgroups, network


def read_sysctls() -> dict[str, str]:
    values = {}
    for key in SYSCTLS:
        with contextlib.suppress(OSError):
            values[key] = Path("/proc/sys", key).read_text().strip()
    return values


def restore_sysctls(values: dict[str, str]) -> None:
    for key, value in values.items():
        path = Path("/proc/sys", key)
        with contextlib.suppress(OSError):
            if path.read_text().strip() != value:
                path.write_text(value + "\n")


def mounts_under(directory: Path) -> list[str]:
    """Mount points at or below ``directory`` (deepest first)."""
    prefix = str(directory).rstrip("/") + "/"
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].encode().decode("unicode_escape")
        if point.startswith(prefix) or point == prefix.rstrip("/"):
            points.append(point)
    return sorted(set(points), key=lambda p: (-p.count("/"), p))


def unmount_all(directory: Path) -> list[str]:
    left = []
    for _ in range(3):
        points = mounts_under(directory)
        if not points:
            return []
        for point in points:
            subprocess.run(["umount", "--lazy", point], capture_output=True)
        left = mounts_under(directory)
    return left


def kubepods_cgroups() -> list[Path]:
    """Every kubepods cgroup directory of every hierarchy, deepest first."""
    found = []
    root = Path("/sys/fs/cgroup")
    candidates = [root / "kubepods", root / "kubepods.slice"]
    for hierarchy in root.iterdir() if root.is_dir() else []:
        if hierarchy.is_dir() and not hierarchy.is_symlink():
            candidates += [hierarchy / "kubepods", hierarchy / "kubepods.slice"]
    for top in candidates:
        if top.is_dir():
            found += [Path(dirpath) for dirpath, _, _ in os.walk(top)]
    return sorted(set(found), key=lambda p: -len(p.parts))


def kill_cgroup_processes() -> int:
    killed = 0
    for group in kubepods_cgroups():
        for name in ("cgroup.procs", "tasks"):
            with contextlib.suppress(OSError):
                for pid in Path(group, name).read_text().split():
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(int(pid), 9)
                        killed += 1
    return killed


def remove_cgroups() -> list[Path]:
    left: list[Path] = []
    for _ in range(20):
        left = []
        for group in kubepods_cgroups():
            try:
                group.rmdir()
            except OSError:
                left.append(group)
        if not left:
            return []
        kill_cgroup_processes()
        time.sleep(0.25)
    return left


def iptables_leftovers() -> dict[str, list[str]]:
    """KUBE-*/CNI-* chains left in any table of iptables and ip6tables: {"iptables:nat": [chain, ...]}."""
    found: dict[str, list[str]] = {}
    for tool in ("iptables", "ip6tables"):
        if shutil.which(f"{tool}-save") is None:
            continue
        out = subprocess.run([f"{tool}-save"], capture_output=True, text=True).stdout
        table = ""
        for line in out.splitlines():
            if line.startswith("*"):
                table = line[1:]
            elif line.startswith(":") and re.match(r":(KUBE-|CNI-)", line):
                found.setdefault(f"{tool}:{table}", []).append(line[1:].split()[0])
    return found


def remove_iptables_leftovers() -> None:
    for tool in ("iptables", "ip6tables"):
        if shutil.which(f"{tool}-save") is None:
            continue
        out = subprocess.run([f"{tool}-save"], capture_output=True, text=True).stdout
        table = ""
        rules: list[tuple[str, str]] = []
        chains: dict[str, list[str]] = {}
        for line in out.splitlines():
            if line.startswith("*"):
                table = line[1:]
            elif line.startswith(":") and re.match(r":(KUBE-|CNI-)", line):
                chains.setdefault(table, []).append(line[1:].split()[0])
            elif line.startswith("-A ") and re.search(r"-j (KUBE-|CNI-)", line) and not re.match(r"-A (KUBE-|CNI-)", line):
                rules.append((table, line[3:]))
        for table, rule in rules:
            subprocess.run([tool, "-w", "-t", table, "-D", *_split_rule(rule)], capture_output=True)
        for table, names in chains.items():
            for chain in names:
                subprocess.run([tool, "-w", "-t", table, "-F", chain], capture_output=True)
            for chain in names:
                subprocess.run([tool, "-w", "-t", table, "-X", chain], capture_output=True)


def _split_rule(rule: str) -> list[str]:
    import shlex

    return shlex.split(rule)


def link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def remove_dead_shim_sockets() -> None:
    """containerd 1.6 puts its shims' sockets in /run/containerd/s whatever its state dir; drop the dead ones."""
    directory = Path("/run/containerd/s")
    if directory.is_dir():
        for sock in directory.iterdir():
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                try:
                    s.settimeout(1)
                    s.connect(str(sock))
                except OSError:
                    with contextlib.suppress(OSError):
                        sock.unlink()
    for path in (directory, Path("/run/containerd")):
        with contextlib.suppress(OSError):
            path.rmdir()


def leftovers(name: str, cluster_directory: Path) -> list[str]:
    """What the real node of ``name`` left on the machine (empty after a clean ``down``)."""
    out = []
    nd = node_dir(cluster_directory)
    if mounts_under(nd):
        out.append(f"mounts under {nd}: {mounts_under(nd)[:3]}")
    if link_exists(bridge_name(name)):
        out.append(f"bridge {bridge_name(name)}")
    chains = iptables_leftovers()
    if chains:
        out.append(f"iptables chains {chains}")
    groups = kubepods_cgroups()
    if groups:
        out.append(f"cgroups {[str(g) for g in groups[:3]]}")
    marker = f"{cluster_directory}/"
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                if marker + "node" in cmdline:
                    out.append(f"process {entry.name}: {cmdline[:100]}")
    return out


# ------------------------------------------------------------------------------------------------------------
# Machine-wide lock: one real node per machine


def claim_machine(cluster_directory: Path, alive: Callable[[Path], bool]) -> None:
    try:
        owner = Path(MACHINE_LOCK.read_text().strip())
    except OSError:
        owner = None
    if owner and owner != cluster_directory and alive(owner):
        raise RealNodeError(
            f"another real node runs on this machine (cluster directory {owner}): one per machine, "
            f"stop it first (python -m hack.devcluster down --name {owner.name})"
        )
    MACHINE_LOCK.write_text(f"{cluster_directory}\n")


def machine_owner() -> Path | None:
    """The cluster directory that runs (or last ran) the machine's real node, None when none is recorded."""
    try:
        return Path(MACHINE_LOCK.read_text().strip())
    except OSError:
        return None


def release_machine(cluster_directory: Path) -> None:
    with contextlib.suppress(OSError):
        if Path(MACHINE_LOCK.read_text().strip()) == cluster_directory:
            MACHINE_LOCK.unlink()
