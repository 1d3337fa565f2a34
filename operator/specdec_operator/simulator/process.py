"""``specdec simulate`` as a child process, for a client that must not share the simulator's core."""

from __future__ import annotations

import subprocess
import sys
from typing import Any


class SimulatorProcess:
    """``with SimulatorProcess("llama31-8b-base", "--seed", "1") as url: ...`` runs ``specdec simulate --port 0``.

    ``args`` are further ``specdec simulate`` flags, ``popen`` further subprocess.Popen arguments. The URL is read
    from the line cli.py prints once the simulator serves; leaving the block terminates the process (:attr:`proc`).
    """

    def __init__(self, profile: str, *args: str, **popen: Any) -> None:
        self.argv = [sys.executable, "-m", "specdec_operator.cli", "simulate", "--profile", profile, "--port", "0", *args]
        self.popen = popen
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""

    def __enter__(self) -> str:
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, text=True, **self.popen)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if " at " not in line:
            self.proc.kill()
            raise RuntimeError(f"specdec simulate exited ({self.proc.wait()}) before serving: {line!r}")
        self.url = line.split(" at ")[1].split()[0]
        return self.url

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
