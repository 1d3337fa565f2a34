"""Served EAGLE-3 acceptance on vLLM's CPU build against `specdec-train evaluate`'s offline prediction, for one drafter
exported with `--engine vllm` and with `--engine sglang` (issue 26; results in docs/vllm-cpu.md).

1. A tiny random Llama target (hidden 256, 4 layers, head size 64: vLLM's CPU attention takes head sizes 32, 64,
   80 ... 512 only), made with tests/support/tiny_models.py.
2. vLLM serves the target alone; `specdec-train regenerate` rewrites the training prompts through it.
3. `specdec-train capture` (transformers), `vocab`, `train`, `export --engine vllm` and `export --engine sglang`,
   `evaluate` (chain speculative decoding offline, 3 steps, greedy) on held-out prompts.
4. vLLM serves the target with each export as its EAGLE-3 drafter (3 speculative tokens); the held-out prompts are
   sent greedily through /v1/completions and vLLM's counters are read from /metrics before and after.

Every server listens on 127.0.0.1 only, is pinned to one core (VLLM_CPU_OMP_THREADS_BIND; the two EAGLE-3 servers to
different cores), runs under a deadline and is stopped (its process group killed) whatever happens. Work files live outside the checkout
(~/.cache/specdec-operator/vllm-acceptance); stages already done are reused (--fresh redoes them).

Needs hack/vllm-cpu.sh to have run. Usage:
  .venv/bin/python benchmarks/vllm_cpu_acceptance.py [--out docs/benchmarks/vllm-cpu-acceptance.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
PROMPTS = REPO / "operator" / "specdec_operator" / "probe" / "data" / "default-prompts.jsonl"
TRAIN = [sys.executable, "-m", "drafter_training.cli", "--quiet"]
METRIC = re.compile(r"^(vllm:spec_decode_[a-z_]+_total)(\{[^}]*\})? ([0-9.eE+-]+)$")


def vllm_env(threads_bind: str) -> dict[str, str]:
    out = subprocess.run([str(REPO / "hack" / "vllm-cpu.sh"), "env"], capture_output=True, text=True, check=True).stdout
    env = dict(os.environ)
    for line in out.splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        env[key] = value
    env.update(
        VLLM_CPU_OMP_THREADS_BIND=threads_bind,
        VLLM_CPU_KVCACHE_SPACE="1",  # GiB; the tiny target needs a few MiB
        HF_HUB_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
    )
    return env


class VllmServer:
    """One `python -m vllm.entrypoints.openai.api_server` on 127.0.0.1, stopped with its whole process group."""

    def __init__(self, target: Path, port: int, log: Path, *, drafter: Path | None = None, threads_bind: str = "0") -> None:
        self.port, self.log = port, log
        env = vllm_env(threads_bind)
        cmd = [
            f"{env['VLLM_VENV']}/bin/python",
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(target),
            "--served-model-name",
            "default",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--dtype",
            "float32",  # this machine's CPUs have no bf16 instructions (AVX2 only)
            "--max-model-len",
            "512",  # the target's max_position_embeddings
            "--max-num-seqs",
            "8",
            "--seed",
            "0",
        ]
        if drafter is not None:
            spec = {"method": "eagle3", "model": str(drafter), "num_speculative_tokens": 3}
            cmd += ["--speculative-config", json.dumps(spec)]
        self.cmd = cmd
        self.started = time.monotonic()
        self.fh = log.open("w")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.fh, stderr=subprocess.STDOUT, start_new_session=True)
        self.ready_s: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, deadline_s: float) -> float:
        while time.monotonic() - self.started < deadline_s:
            if self.proc.poll() is not None:
                tail = self.log.read_text()[-3000:]
                raise RuntimeError(f"vLLM exited with {self.proc.returncode} before it was ready; log tail:\n{tail}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if r.status == 200:
                        self.ready_s = time.monotonic() - self.started
                        return self.ready_s
            except OSError:
                pass
            time.sleep(1)
        raise TimeoutError(f"vLLM not ready after {deadline_s:.0f}s (log {self.log})")

    def rss_mib(self) -> float:
        """Resident memory of the server's process group (API server and engine core), from /proc."""
        total = 0
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                if os.getpgid(int(pid)) != self.proc.pid:
                    continue
                with open(f"/proc/{pid}/status") as f:
                    for line in f:
                        if line.startswith("VmRSS:"):
                            total += int(line.split()[1])
            except (OSError, ProcessLookupError):
                continue
        return total / 1024

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=30)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait()
        self.fh.close()


def metrics(url: str) -> dict[str, float]:
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


def complete(url: str, prompt_ids: list[int], max_tokens: int) -> int:
    """One greedy completion of a tokenized prompt; returns the number of tokens generated."""
    body = {"model": "default", "prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 0}
    req = urllib.request.Request(f"{url}/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return int(json.loads(r.read())["usage"]["completion_tokens"])


def served_acceptance(url: str, prompts: list[list[int]], max_tokens: int) -> dict[str, Any]:
    before = metrics(url)
    t0 = time.monotonic()
    generated = sum(complete(url, p, max_tokens) for p in prompts)
    elapsed = time.monotonic() - t0
    after = metrics(url)
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    drafts = delta.get("vllm:spec_decode_num_drafts_total", 0.0)
    accepted = delta.get("vllm:spec_decode_num_accepted_tokens_total", 0.0)
    per_pos = sorted((int(k.split("[")[1][:-1]), v) for k, v in delta.items() if k.startswith("vllm:spec_decode_num_accepted_tokens_per_pos_total["))
    return {
        "counters": delta,
        "drafts": drafts,
        "draft_tokens": delta.get("vllm:spec_decode_num_draft_tokens_total", 0.0),
        "accepted_tokens": accepted,
        "acceptance_length": 1 + accepted / drafts if drafts else None,
        "acceptance_rate_per_position": [v / drafts for _, v in per_pos] if drafts else [],
        "generated_tokens": generated,
        "seconds": round(elapsed, 2),
    }


def heldout_prompts(samples: Path, n: int) -> list[list[int]]:
    """Prompt spans (tokens before the first loss-masked token) of the held-out samples."""
    out = []
    for line in samples.read_text().splitlines()[:n]:
        rec = json.loads(line)
        mask = rec["loss_mask"]
        first = mask.index(1) if 1 in mask else len(mask)
        out.append(rec["input_ids"][:first])
    return out


def run(cmd: list[str], log: Path, timeout: float) -> dict[str, Any]:
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=timeout)
    log.write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[3:6])}... exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
    out = json.loads(proc.stdout) if proc.stdout.strip().startswith(("{", "[")) else {}
    return {"seconds": round(time.monotonic() - t0, 1), "result": out}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", default=str(Path.home() / ".cache" / "specdec-operator" / "vllm-acceptance"))
    ap.add_argument("--out", default=str(REPO / "docs" / "benchmarks" / "vllm-cpu-acceptance.json"))
    ap.add_argument("--train-prompts", type=int, default=200)
    ap.add_argument("--heldout", type=int, default=24)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--max-steps", type=int, default=60, help="train steps (about 5 s each on a loaded 2-core machine)")
    ap.add_argument("--port", type=int, default=18431)
    ap.add_argument("--start-deadline", type=float, default=900)
    ap.add_argument("--fresh", action="store_true")
    ap.add_argument("--skip-evaluate", action="store_true", help="no offline evaluate (it takes 15+ min on a loaded 2-core machine)")
    args = ap.parse_args()
    work = Path(args.work)
    if args.fresh and work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"stages": {}, "servers": {}}
    stages = report["stages"]

    target = work / "target"
    if not (target / "config.json").exists():
        import torch

        from tests.support.tiny_models import make_model

        torch.set_num_threads(1)
        make_model(target, "llama", layers=4, hidden=256)
    cfg = json.loads((target / "config.json").read_text())
    report["target"] = {k: cfg[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "vocab_size")}

    lines = PROMPTS.read_text().splitlines()
    (work / "train-prompts.jsonl").write_text("\n".join(lines[: args.train_prompts]) + "\n")
    (work / "heldout-prompts.jsonl").write_text("\n".join(lines[-args.heldout :]) + "\n")

    def launch(name: str, drafter: Path | None, port: int, core: str) -> VllmServer:
        server = VllmServer(target, port, work / f"server-{name}.log", drafter=drafter, threads_bind=core)
        report["servers"][name] = {"command": " ".join(server.cmd), "VLLM_CPU_OMP_THREADS_BIND": core}
        return server

    def ready(name: str, server: VllmServer) -> None:
        server.wait_ready(args.start_deadline)
        report["servers"][name].update(ready_seconds=round(server.ready_s or 0, 1), rss_mib=round(server.rss_mib()))

    def serve(name: str, drafter: Path | None) -> VllmServer:
        server = launch(name, drafter, args.port, "0")
        ready(name, server)
        return server

    # 2. Regenerate the training and held-out conversations through vLLM itself.
    if not (work / "heldout.jsonl").exists():
        server = serve("plain", None)
        try:
            for src, dst in (("train-prompts.jsonl", "samples.jsonl"), ("heldout-prompts.jsonl", "heldout.jsonl")):
                stages[f"regenerate {dst}"] = run(
                    TRAIN
                    + ["regenerate", "--prompts", str(work / src), "--out", str(work / dst), "--base-url", server.url, "--tokenizer", str(target)]
                    + ["--api", "chat", "--max-new-tokens", str(args.max_new_tokens), "--concurrency", "8", "--max-length", "512"],
                    work / f"regenerate-{dst}.log",
                    timeout=900,
                )
        finally:
            server.stop()

    # 3. Capture, vocab, train, export for both engines, evaluate offline.
    cap, run_dir = work / "cap", work / "run"
    if not (run_dir / "final" / "draft.safetensors").exists():
        stages["capture"] = run(
            TRAIN
            + [
                "capture",
                "--samples",
                str(work / "samples.jsonl"),
                "--target",
                str(target),
                "--out",
                str(cap),
                "--quantization",
                "none",
                "--capture-layers",
                "0,1,2",
            ],
            work / "capture.log",
            timeout=900,
        )
        stages["vocab"] = run(TRAIN + ["vocab", "--capture", str(cap), "--draft-vocab-size", str(cfg["vocab_size"])], work / "vocab.log", timeout=300)
        stages["train"] = run(
            TRAIN
            + [
                "train",
                "--capture",
                str(cap),
                "--target",
                str(target),
                "--out",
                str(run_dir),
                "--epochs",
                str(args.epochs),
                "--max-steps",
                str(args.max_steps),
            ]
            + ["--lr", "3e-3", "--batch-size", "4", "--ttt-steps", "3", "--max-length", "512", "--device", "cpu"],
            work / "train.log",
            timeout=1800,
        )
    for engine in ("vllm", "sglang"):
        stages[f"export --engine {engine}"] = run(
            TRAIN + ["export", "--run", str(run_dir), "--target", str(target), "--out", str(work / f"drafter-{engine}"), "--engine", engine],
            work / f"export-{engine}.log",
            timeout=300,
        )
    if not args.skip_evaluate:
        evaluate = run(
            TRAIN
            + ["evaluate", "--target", str(target), "--drafter", str(run_dir / "final"), "--prompts", str(work / "heldout.jsonl")]
            + [
                "--num-steps",
                "3",
                "--temperature",
                "0",
                "--max-new-tokens",
                str(args.max_new_tokens),
                "--limit",
                str(args.heldout),
                "--device",
                "cpu",
            ],
            work / "evaluate.log",
            timeout=900,
        )
        stages["evaluate"] = {"seconds": evaluate["seconds"]}
        offline = evaluate["result"]["runs"][0]
        # Per position, comparable with vLLM's per-position counters: the share of verify steps whose accepted
        # length (the bonus token included) reaches position i + 2.
        hist = {int(k): v for k, v in offline["accept_length_histogram"].items()}
        offline["acceptance_rate_per_position"] = [sum(v for k, v in hist.items() if k >= i + 2) / offline["verifies"] for i in range(3)]
        report["offline"] = offline

    # 4. Served acceptance for each export: both servers start side by side, each pinned to its own core, and are
    # measured one after the other.
    prompts = heldout_prompts(work / "heldout.jsonl", args.heldout)
    report["served"] = {}
    servers: dict[str, VllmServer] = {}
    try:
        for i, engine in enumerate(("vllm", "sglang")):
            servers[engine] = launch(f"eagle3-exported-for-{engine}", work / f"drafter-{engine}", args.port + 1 + i, str(i % 2))
        for engine, server in servers.items():
            ready(f"eagle3-exported-for-{engine}", server)
        for engine, server in servers.items():
            report["served"][f"exported for {engine}"] = served_acceptance(server.url, prompts, args.max_new_tokens)
    finally:
        for server in servers.values():
            server.stop()
    report["client_max_rss_mib"] = round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    summary = {k: v["acceptance_length"] for k, v in report["served"].items()}
    print(json.dumps({"offline": report.get("offline", {}).get("acceptance_length"), "served_acceptance_length": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
