"""Images on the real node: `ctr` against its containerd, archives imported, and the archives `make images-local` wrote."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path

from . import realnode
from .state import REPO_DIR, Cluster, ClusterError, cache_dir


def node_ctr(cluster: Cluster, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run `ctr` against the real node's containerd, in the CRI's namespace (k8s.io)."""
    sock = realnode.node_dir(cluster.directory) / "containerd" / "containerd.sock"
    return subprocess.run(["ctr", "--address", str(sock), "--namespace", "k8s.io", *args], capture_output=True, text=True, timeout=timeout)


def load_images(cluster: Cluster, archives: Sequence[Path | str]) -> list[str]:
    """Import OCI/Docker image archives into the real node's containerd; returns the image names imported."""
    if not (realnode.node_dir(cluster.directory) / "containerd" / "containerd.sock").exists():
        raise ClusterError(f"cluster {cluster.name!r} has no real node: `up --real-node` first")
    names = []
    for archive in archives:
        if not Path(archive).is_file():
            raise ClusterError(f"image archive {archive} not found: build it first (make images-local)")
        proc = node_ctr(cluster, "images", "import", str(archive))
        if proc.returncode != 0:
            raise ClusterError(f"ctr images import {archive} failed: {(proc.stderr or proc.stdout).strip()[-300:]}")
        names += re.findall(r"^unpacking (\S+)", proc.stdout, flags=re.M)
    return names


def trust_registry(cluster: Cluster, host: str) -> Path:
    """Let the real node's containerd pull from the plain-HTTP registry at ``host`` (HOST:PORT, e.g. the release
    test's on 127.0.0.1): a hosts.toml in its registry config_path, read at each pull (no restart)."""
    if not re.fullmatch(r"[A-Za-z0-9.-]+:[0-9]+", host):
        raise ClusterError(f"registry host {host!r}: give HOST:PORT")
    directory = realnode.node_dir(cluster.directory) / "containerd" / "certs.d" / host
    directory.mkdir(parents=True, exist_ok=True)
    hosts = directory / "hosts.toml"
    hosts.write_text(f'server = "http://{host}"\n\n[host."http://{host}"]\n  capabilities = ["pull", "resolve"]\n')
    return hosts


def _built_image_archives() -> list[Path]:
    """The operator and simulator archives that hack/build-image.sh (buildah) wrote, those that exist."""
    env = {}
    for line in (REPO_DIR / "images" / "images.env").read_text().splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            key, value = line.strip().split("=", 1)
            env[key] = value
    images_dir = Path(os.environ.get("SPECDEC_IMAGES_DIR") or cache_dir() / "images")
    found = []
    for image, tag in (("OPERATOR_IMAGE", "OPERATOR_TAG"), ("SIMULATOR_IMAGE", "SIMULATOR_TAG")):
        ref = f"{env[image]}:{env[tag]}".replace("/", "_").replace(":", "_")
        if (images_dir / f"{ref}.oci.tar").is_file():
            found.append(images_dir / f"{ref}.oci.tar")
    return found
