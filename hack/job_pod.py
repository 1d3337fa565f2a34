"""A pod's containers run as local processes, in order, with its paths mapped (hack/job_mapping.py): the part of
hack/job_runner.py that needs no cluster, so a benchmark can run a rendered training Job's pod directly.

`run_containers(pod, ...)` runs the init containers then the containers, stopping at the first that fails, and returns
the record (each container's exit code, CPU-seconds and seconds; the last container's termination message), calling
`write_status` with the pod's status (hack/job_status.py) before and after each container when given.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from hack.job_mapping import PodPaths, VolumeDirs, container_paths, with_urls
from hack.job_status import Finished, now, pod_status, termination_message

PROGRAMS = {"specdec-train": [sys.executable, "-m", "drafter_training.cli"]}
HOST_IP = "127.0.0.1"


@dataclass
class ContainerRun:
    """One container to run: its command and environment already moved onto local paths."""

    namespace: str
    pod: str
    job: str
    name: str
    command: list[str]
    env: dict[str, str]
    termination_log: Path  # the local file standing in for the container's terminationMessagePath
    log: Path  # stdout and stderr
    workdir: Path
    # Called every second while it runs; True: the pod is gone or being deleted, stop the container.
    cancelled: Callable[[], bool] = lambda: False


@dataclass
class Ran:
    exit_code: int
    cpu_seconds: float = 0.0


class Execute(Protocol):
    def __call__(self, run: ContainerRun) -> Ran: ...


@dataclass
class LocalExecute:
    """Runs a container's command as a process in its own process group (killed with it when cancelled)."""

    programs: dict[str, list[str]] = field(default_factory=lambda: dict(PROGRAMS))
    nice: int = 0
    # Appended to a container's command by its name, e.g. {"regenerate": ["--max-new-tokens", "12"]} for tiny models.
    extra_args: dict[str, list[str]] = field(default_factory=dict)

    def __call__(self, run: ContainerRun) -> Ran:
        argv = [*self.programs.get(run.command[0], run.command[:1]), *run.command[1:], *self.extra_args.get(run.name, [])]
        env = {**os.environ, **run.env}
        nice = self.nice
        with run.log.open("w") as out:
            proc = subprocess.Popen(
                argv,
                env=env,
                cwd=run.workdir,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=(lambda: os.nice(nice)) if nice else None,
            )
            while True:
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    proc.returncode = os.waitstatus_to_exitcode(status)
                    return Ran(proc.returncode if proc.returncode >= 0 else 128 - proc.returncode, usage.ru_utime + usage.ru_stime)
                if run.cancelled():
                    os.killpg(proc.pid, signal.SIGKILL)
                time.sleep(0.5)


def container_run(pod: dict[str, Any], container: dict[str, Any], job: str, work: Path, dirs: VolumeDirs, urls: dict[str, str]) -> ContainerRun:
    """`container` of `pod` with its command and environment values moved onto local paths."""
    meta = pod["metadata"]
    termination_log = work / "termination" / container["name"]
    termination_log.parent.mkdir(parents=True, exist_ok=True)
    termination_log.unlink(missing_ok=True)
    paths: PodPaths = with_urls(container_paths(pod, container, dirs, termination_log), urls)
    env = {e["name"]: paths.local(e.get("value", "")) for e in container.get("env") or [] if "value" in e}
    return ContainerRun(
        namespace=meta["namespace"],
        pod=meta["name"],
        job=job,
        name=container["name"],
        command=paths.argv([*(container.get("command") or []), *(container.get("args") or [])]),
        env=env,
        termination_log=termination_log,
        log=work / f"{container['name']}.log",
        workdir=work,
    )


def run_containers(
    pod: dict[str, Any],
    work: Path,
    dirs: VolumeDirs,
    execute: Execute,
    urls: dict[str, str] | None = None,
    write_status: Callable[[dict[str, Any]], None] | None = None,
    gone: Callable[[], bool] = lambda: False,
) -> dict[str, Any]:
    """Run `pod`'s containers in order (init containers, then containers), stop at the first failure or when `gone`;
    the record: {job, pod, namespace, containers: [{name, exitCode, cpuSeconds, seconds}], outcome, cpuSeconds,
    seconds, terminationMessage (the last container's)}."""
    meta, spec = pod["metadata"], pod["spec"]
    labels = meta.get("labels") or {}
    job = labels.get("job-name") or labels.get("batch.kubernetes.io/job-name") or meta["name"]
    work.mkdir(parents=True, exist_ok=True)
    started, finished = now(), dict[str, Finished]()
    status = write_status or (lambda _: None)
    record: dict[str, Any] = {"namespace": meta.get("namespace"), "job": job, "pod": meta["name"], "containers": [], "startedAt": started}
    t0 = time.monotonic()
    status(pod_status(pod, finished, None, started, HOST_IP))
    for container in [*(spec.get("initContainers") or []), *spec["containers"]]:
        run = container_run(pod, container, job, work, dirs, urls or {})
        run.cancelled = gone
        since = now()
        status(pod_status(pod, finished, (container["name"], since), started, HOST_IP))
        c0 = time.monotonic()
        ran = execute(run)
        written = run.termination_log.read_text(errors="replace") if run.termination_log.is_file() else ""
        log = run.log.read_text(errors="replace")[-8192:] if run.log.is_file() else ""
        message = termination_message(written, log, ran.exit_code, container.get("terminationMessagePolicy"))
        finished[container["name"]] = Finished(ran.exit_code, message, since, now())
        seconds = round(time.monotonic() - c0, 1)
        record["containers"].append(
            {"name": container["name"], "exitCode": ran.exit_code, "cpuSeconds": round(ran.cpu_seconds, 2), "seconds": seconds}
        )
        if gone():
            record["outcome"] = "PodGone"
            break
        status(pod_status(pod, finished, None, started, HOST_IP))
        if ran.exit_code != 0:
            break
    last = spec["containers"][-1]["name"]
    record.setdefault("outcome", "Succeeded" if last in finished and all(f.exit_code == 0 for f in finished.values()) else "Failed")
    record["cpuSeconds"] = round(sum(c["cpuSeconds"] for c in record["containers"]), 2)
    record["seconds"] = round(time.monotonic() - t0, 1)
    record["terminationMessage"] = finished[last].message if last in finished else None
    return record
