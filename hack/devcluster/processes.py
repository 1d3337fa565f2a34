"""The components as processes: spawned in their own process group (optionally tied to the caller's life), told
apart from reused pids by their cluster directory on the command line, stopped with SIGTERM then SIGKILL; and the
ports they listen on, a block per cluster outside Linux's ephemeral range."""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from .state import PORT_BLOCK, PORT_NAMES, PORT_RANGE, ClusterError


def _proc_cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _is_ours(pid: int, directory: Path) -> bool:
    """True when ``pid`` is a live component of the cluster in ``directory`` (guards against reused pids)."""
    if pid <= 0:
        return False
    cmdline = _proc_cmdline(pid)
    if not cmdline:
        return False
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
        if status.rsplit(")", 1)[1].split()[0] == "Z":  # a zombie is gone for our purposes
            return False
    except (OSError, IndexError):
        return False
    # Every component gets a path inside its cluster directory on its command line; the trailing slash keeps
    # cluster "a" from claiming the processes of cluster "a2".
    marker = f"{directory}/"
    return any(marker in arg for arg in cmdline[1:])


def _stop_pid(pid: int, directory: Path, grace: float = 10.0) -> None:
    """SIGTERM the component's process group, wait, then SIGKILL what is left of it."""
    if not _is_ours(pid, directory):
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not _is_ours(pid, directory):
            break
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    # Reap it when it is our child (pytest session that started the cluster).
    child = _CHILDREN.pop(pid, None)
    if child is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=5)
    else:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def _die_with_parent() -> None:
    """preexec_fn: ask Linux to SIGTERM the child when the process that started it dies."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signal.SIGTERM)


# Components started by this process, by pid: their exit status is known exactly (no /proc guessing while a
# component starts), and keeping the Popen objects avoids "subprocess still running" warnings.
_CHILDREN: dict[int, subprocess.Popen] = {}


def _alive(pid: int, directory: Path) -> bool:
    child = _CHILDREN.get(pid)
    if child is not None:
        return child.poll() is None
    return _is_ours(pid, directory)


def _exit_reason(pid: int) -> str:
    child = _CHILDREN.get(pid)
    if child is None or child.returncode is None:
        return "exited"
    if child.returncode < 0:
        return f"was killed by signal {signal.Signals(-child.returncode).name}"
    return f"exited with code {child.returncode}"


def _spawn(cmd: Sequence[str], log: Path, cwd: Path, tie_to_parent: bool) -> int:
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            list(cmd),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            start_new_session=True,  # own process group: `down` kills the whole group
            preexec_fn=_die_with_parent if tie_to_parent else None,
        )
    _CHILDREN[proc.pid] = proc
    return proc.pid


def _port_free(port: int) -> bool:
    """True when nothing listens on 127.0.0.1:port (connections lingering in TIME_WAIT do not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Like the Go servers that will bind it: only an active listener makes the port unusable.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _choose_ports(name: str, previous: dict[str, int] | None) -> dict[str, int]:
    """Ports for every component: the previous ones when still free, else a free block derived from the name."""
    if previous and set(previous) == set(PORT_NAMES) and all(_port_free(p) for p in previous.values()):
        return dict(previous)
    blocks = (PORT_RANGE[1] - PORT_RANGE[0]) // PORT_BLOCK
    start = int(hashlib.sha256(name.encode()).hexdigest(), 16) % blocks
    for step in range(blocks):
        base = PORT_RANGE[0] + ((start + step) % blocks) * PORT_BLOCK
        ports = {port_name: base + offset for offset, port_name in enumerate(PORT_NAMES)}
        if all(_port_free(p) for p in ports.values()):
            return ports
    raise ClusterError(f"no free block of {len(PORT_NAMES)} ports in {PORT_RANGE[0]}-{PORT_RANGE[1]}")


def _free_ports(count: int, avoid: set[int]) -> list[int]:
    ports: list[int] = []
    for port in range(PORT_RANGE[1] - 1, PORT_RANGE[0], -1):  # from the top of the range, away from the blocks
        if port not in avoid and _port_free(port):
            ports.append(port)
            if len(ports) == count:
                return ports
    raise ClusterError(f"no {count} free ports in {PORT_RANGE[0]}-{PORT_RANGE[1]} for the LeaderWorkerSet controller")
