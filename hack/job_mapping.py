"""A training pod's paths and addresses moved onto this machine: what hack/job_runner.py and
tests/unit/test_trainjob_stages.py need to run a rendered training Job's containers as local processes.

A container's command names its pod's mounts (`/models/...`, `/capture`, `/revisions/...`, `/dev/termination-log`)
and in-cluster Services (`http://<name>-base.<ns>.svc:30000`). `PodPaths` rewrites each argument (and each
environment value) whose path starts with a mount onto the local directory standing in for that mount's volume, and
each URL that starts with a mapped address onto a local server. Nothing else of the command changes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TERMINATION_LOG = "/dev/termination-log"  # the kubelet's default terminationMessagePath


@dataclass(frozen=True)
class PodPaths:
    """Mount paths (longest first) onto local directories, and URL prefixes onto local addresses."""

    mounts: tuple[tuple[str, Path], ...]
    urls: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, mounts: Mapping[str, Path], urls: Mapping[str, str] | None = None) -> PodPaths:
        ordered = sorted(((m.rstrip("/") or "/", Path(p)) for m, p in mounts.items()), key=lambda kv: -len(kv[0]))
        return cls(tuple(ordered), tuple(sorted((urls or {}).items(), key=lambda kv: -len(kv[0]))))

    def local(self, arg: str) -> str:
        """`arg` with a mount prefix or a URL prefix replaced; anything else unchanged."""
        for prefix, local in self.urls:
            if arg.startswith(prefix):
                return local + arg[len(prefix) :]
        for mount, directory in self.mounts:
            if arg == mount or arg.startswith(mount + "/"):
                return str(directory) + arg[len(mount) :]
        return arg

    def argv(self, command: Iterable[str]) -> list[str]:
        return [self.local(a) for a in command]


@dataclass
class VolumeDirs:
    """Where each volume of a pod lives here: a claim's directory is shared by every pod that mounts the claim (as a
    volume is), an emptyDir is the pod's own, a hostPath is its path. `claims` and `named` override by claim name and
    by volume name (e.g. the model volume onto the cached tiny models)."""

    root: Path
    claims: dict[str, Path] = field(default_factory=dict)
    named: dict[str, Path] = field(default_factory=dict)

    def volume(self, namespace: str, pod: str, volume: dict[str, Any]) -> Path:
        name = volume["name"]
        if name in self.named:
            return self.named[name]
        claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
        if claim:
            return self.claims.get(claim, self.root / "claims" / namespace / claim)
        if volume.get("hostPath"):
            return Path(volume["hostPath"]["path"])
        return self.root / "pods" / namespace / pod / "volumes" / name


def container_paths(
    pod: dict[str, Any], container: dict[str, Any], dirs: VolumeDirs | Callable[[str, str, dict[str, Any]], Path], termination_log: Path
) -> PodPaths:
    """The container's mounts (subPath honoured) and its terminationMessagePath onto local paths, creating the
    directories as a kubelet creates a volume's."""
    meta, spec = pod["metadata"], pod["spec"]
    resolve = dirs.volume if isinstance(dirs, VolumeDirs) else dirs
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    mounts: dict[str, Path] = {}
    for mount in container.get("volumeMounts") or []:
        base = resolve(meta["namespace"], meta["name"], volumes[mount["name"]])
        local = base / mount["subPath"] if mount.get("subPath") else base
        local.mkdir(parents=True, exist_ok=True)
        mounts[mount["mountPath"]] = local
    mounts[container.get("terminationMessagePath") or TERMINATION_LOG] = termination_log
    return PodPaths.of(mounts)


def with_urls(paths: PodPaths, urls: Mapping[str, str]) -> PodPaths:
    return PodPaths(paths.mounts, tuple(sorted(urls.items(), key=lambda kv: -len(kv[0]))))
