"""Fidelity of the probe and the simulator, measured (results in docs/probe.md).

1. The probe's base tok/s against a simulator agrees with the profile's analytic throughput (within 3%) at
   concurrency 1 and 128.
2. SGLang's own benchmark client, ``python -m sglang.benchmark.serving --backend sglang --dataset-name
   random-ids``, and the probe agree on output tok/s against the same simulator (within 3%).
3. The same on text prompts (``--part dataset``): prompts of the shipped default set, exported as a ShareGPT
   file, sent by the probe (the file read as ``specdec probe --dataset FILE`` reads it) and by SGLang's client
   (``--dataset-name sharegpt --dataset-path FILE --sharegpt-output-len N``), both to ``/generate`` with
   ``text`` (``--backend sglang``; the probe's endpoint Generate) and both to ``/v1/chat/completions``
   (``--backend sglang-oai-chat``; the probe's endpoint Chat), a fixed output length with ``ignore_eos`` on
   both sides.
4. How many rounds and how much time each decision on the seed's profiles takes.

The simulator runs as a separate process (``specdec simulate``) so it does not share the client's core.
SGLang's benchmark needs a tokenizer: a small word-level one is built locally (no network; HF_HUB_OFFLINE=1).

Usage: .venv/bin/python benchmarks/probe_fidelity.py [--quick] [--part fidelity|dataset|decisions|all]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time

import aiohttp

from specdec_operator.api import Prompts, Workload
from specdec_operator.cli.probe import run_probe
from specdec_operator.probe.client import measure
from specdec_operator.probe.datasets import Prompt, default_prompts, load_dataset_file
from specdec_operator.probe.traffic import build_traffic
from specdec_operator.simulator import SimulatorProcess, load_profile

HERE = os.path.abspath(__file__)


# --- SGLang's benchmark, unmodified, in a child process ------------------------------------------------


def sglang_bench_child(argv: list[str]) -> None:
    """Run ``sglang.benchmark.serving`` as ``python -m`` would.

    One import is stood in for: ``sglang/benchmark/serving.py`` imports the string constant
    ``FAKE_BOOTSTRAP_HOST = "2.2.2.2"`` from ``sglang.srt.disaggregation.utils`` (used only for
    prefill/decode disaggregation), and that module imports SGLang's GPU runtime (model configs, quantization
    kernels: torchvision, compressed-tensors, apache-tvm-ffi, sentencepiece, ...) that cannot be installed
    next to this project's torch. The constant is provided with its real value; everything else is SGLang's
    own code.
    """
    import runpy
    import types

    stub = types.ModuleType("sglang.srt.disaggregation.utils")
    stub.FAKE_BOOTSTRAP_HOST = "2.2.2.2"
    sys.modules["sglang.srt.disaggregation.utils"] = stub
    sys.argv = ["sglang.benchmark.serving", *argv]
    runpy.run_module("sglang.benchmark.serving", run_name="__main__", alter_sys=True)


def build_tokenizer(folder: str) -> str:
    """A word-level tokenizer of 32,000 entries saved as a transformers tokenizer (no download)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for i in range(3, 32000):
        vocab[f"w{i}"] = i
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    path = os.path.join(folder, "tokenizer")
    fast.save_pretrained(path)
    return path


def run_sglang_bench(url: str, tokenizer: str, concurrency: int, input_len: int, output_len: int, prompts: int, out_file: str) -> dict:
    """SGLang's client on random ids of exactly ``input_len`` (``--dataset-name random-ids``)."""
    dataset = ["--dataset-name", "random-ids", "--random-input-len", str(input_len), "--random-output-len", str(output_len)]
    dataset += ["--random-range-ratio", "1.0", "--tokenize-prompt"]
    return _sglang_bench(url, tokenizer, "sglang", dataset, concurrency, prompts, out_file)


def run_sglang_bench_sharegpt(
    url: str, tokenizer: str, backend: str, path: str, concurrency: int, output_len: int, prompts: int, out_file: str
) -> dict:
    """SGLang's client on a ShareGPT file: each conversation's first turn as the prompt, ``output_len`` tokens."""
    dataset = ["--dataset-name", "sharegpt", "--dataset-path", path, "--sharegpt-output-len", str(output_len)]
    return _sglang_bench(url, tokenizer, backend, dataset, concurrency, prompts, out_file)


def _sglang_bench(url: str, tokenizer: str, backend: str, dataset: list[str], concurrency: int, prompts: int, out_file: str) -> dict:
    argv = ["--backend", backend, "--base-url", url, *dataset, "--tokenizer", tokenizer, "--model", "simulated"]
    argv += ["--num-prompts", str(prompts), "--max-concurrency", str(concurrency), "--seed", "1", "--disable-tqdm", "--output-file", out_file]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, HERE, "--sglang-bench-child", *argv], capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"sglang.benchmark.serving failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    with open(out_file) as f:
        return json.loads(f.read().strip().splitlines()[-1])


# --- simulator process ---------------------------------------------------------------------------------


def simulator_process(profile: str, scale: float, seed: int = 1) -> SimulatorProcess:
    return SimulatorProcess(profile, "--time-scale", str(scale), "--load-seconds", "0", "--seed", str(seed))


async def probe_tok_s(url: str, workload: Workload, dataset: list[Prompt] | None = None) -> tuple[float, int]:
    """The probe's output tok/s and requests of one measurement: random ids, or ``dataset`` as the probe sends a
    ``--dataset`` (build_traffic: the same request plans a probe round makes)."""
    traffic = None if dataset is None else build_traffic([workload], {workload.name: dataset}, seed=1)[workload.name]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=workload.concurrency + 8)) as s:
        await measure(s, url, Workload(name="warm", concurrency=1, input_tokens=8, output_tokens=8, requests=1), rng=random.Random(0))
        m = await measure(s, url, workload, rng=random.Random(1), traffic=traffic)
    return m.tokens_per_second, m.requests


# --- the three parts -------------------------------------------------------------------------------------


def fidelity(quick: bool) -> list[dict]:
    rows = []
    profile_name = "sglang-base-kimi-k25"
    profile = load_profile(profile_name)
    # (concurrency, prompts, time scale): scales keep the simulator's event rate (one SSE event per token at
    # SGLang's default stream_interval) well within what a shared 2-core host serves on time.
    cases = [(1, 4 if quick else 8, 5.0), (128, 128 if quick else 256, 1.0)]
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = build_tokenizer(tmp)
        for concurrency, prompts, scale in cases:
            input_len, output_len = 128, 256
            analytic = profile.analytic_throughput(concurrency, input_len, output_len) * scale
            with simulator_process(profile_name, scale) as url:
                probe, _ = asyncio.run(
                    probe_tok_s(
                        url, Workload(name="fid", concurrency=concurrency, input_tokens=input_len, output_tokens=output_len, requests=prompts)
                    )
                )
            with simulator_process(profile_name, scale) as url:
                bench = run_sglang_bench(url, tokenizer, concurrency, input_len, output_len, prompts, os.path.join(tmp, f"bench-{concurrency}.jsonl"))
            rows.append(
                {
                    "profile": profile_name,
                    "concurrency": concurrency,
                    "input_tokens": input_len,
                    "output_tokens": output_len,
                    "requests": prompts,
                    "time_scale": scale,
                    "analytic_tok_s": round(analytic, 1),
                    "probe_tok_s": round(probe, 1),
                    "sglang_bench_output_throughput": round(bench["output_throughput"], 1),
                    "sglang_bench_completed": bench["completed"],
                    "probe_vs_analytic": round(probe / analytic - 1, 4),
                    "probe_vs_sglang_bench": round(probe / bench["output_throughput"] - 1, 4),
                    "sglang_bench_vs_analytic": round(bench["output_throughput"] / analytic - 1, 4),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    return rows


def server_counts(url: str) -> dict[str, int]:
    """The simulator's own counters (its /metrics, as SGLang exports them): what it was sent, whichever client."""
    import urllib.request

    wanted = {"sglang:prompt_tokens_total": "prompt_tokens", "sglang:num_requests_total": "requests"}
    out = {}
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        for line in resp.read().decode().splitlines():
            name = line.split("{")[0]
            if name in wanted:
                out[wanted[name]] = int(float(line.rsplit(" ", 1)[1]))
    return out


def write_sharegpt(prompts: list[Prompt], path: str) -> None:
    """A ShareGPT JSON array, one human turn and a gpt reference per conversation (what SGLang's ``sharegpt``
    dataset reads: it takes the first two turns). The human turn is the prompt's text: what the probe sends as
    /generate's ``text`` and, as the one user message, to the chat endpoint."""
    rows = [{"conversations": [{"from": "human", "value": p.text}, {"from": "gpt", "value": "reference answer"}]} for p in prompts]
    with open(path, "w") as f:
        json.dump(rows, f, ensure_ascii=False)


def dataset_fidelity(quick: bool) -> list[dict]:
    rows = []
    profile_name = "sglang-base-kimi-k25"
    # Every prompt of the file is sent once by each client (requests = prompts in the file), so both send the
    # same set; each shuffles its order with its own seed.
    cases = [(1, 4 if quick else 8, 5.0), (128, 128 if quick else 256, 1.0)]
    output_len = 256
    shipped = [p for p in default_prompts() if len(p.text.split()) >= 2]  # SGLang's client drops prompts under 2 tokens
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = build_tokenizer(tmp)
        for concurrency, prompts, scale in cases:
            chosen = random.Random(concurrency).sample(shipped, prompts)
            path = os.path.join(tmp, f"sharegpt-{concurrency}.json")
            write_sharegpt(chosen, path)
            dataset = load_dataset_file(path, "ShareGPT")
            for endpoint, backend in (("Generate", "sglang"), ("Chat", "sglang-oai-chat")):
                workload = Workload(
                    name="fid",
                    concurrency=concurrency,
                    input_tokens=128,
                    output_tokens=output_len,
                    requests=prompts,
                    prompts=Prompts(endpoint=endpoint, output_length="Fixed"),
                )
                # The server's counts include each client's one warmup request: the probe's 8 random ids,
                # SGLang's first prompt of its order.
                with simulator_process(profile_name, scale) as url:
                    probe, probe_requests = asyncio.run(probe_tok_s(url, workload, dataset))
                    probe_server = server_counts(url)
                with simulator_process(profile_name, scale) as url:
                    out_file = os.path.join(tmp, f"bench-{concurrency}-{backend}.jsonl")
                    bench = run_sglang_bench_sharegpt(url, tokenizer, backend, path, concurrency, output_len, prompts, out_file)
                    bench_server = server_counts(url)
                rows.append(
                    {
                        "profile": profile_name,
                        "dataset": f"{prompts} prompts of the default set as ShareGPT",
                        "endpoint": "/generate (text)" if endpoint == "Generate" else "/v1/chat/completions",
                        "sglang_backend": backend,
                        "concurrency": concurrency,
                        "output_tokens": output_len,
                        "requests": prompts,
                        "time_scale": scale,
                        "probe_requests": probe_requests,
                        "probe_tok_s": round(probe, 1),
                        "sglang_bench_output_throughput": round(bench["output_throughput"], 1),
                        "sglang_bench_completed": bench["completed"],
                        "sglang_bench_total_output_tokens": bench.get("total_output_tokens"),
                        "probe_vs_sglang_bench": round(probe / bench["output_throughput"] - 1, 4),
                        "server_saw_probe": probe_server,
                        "server_saw_sglang_bench": bench_server,
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
    return rows


async def _decision(base: str, cand: str, workloads: list[Workload], scale: float) -> dict:
    with simulator_process(base, scale, 1) as base_url, simulator_process(cand, scale, 2) as cand_url:
        t = time.perf_counter()
        result = await run_probe(base_url, cand_url, workloads, seed=1)
        wall = time.perf_counter() - t
    return {
        "candidate": cand,
        "decision": result.decision,
        "reason": result.reason,
        "rounds": result.rounds,
        "accept_length": result.to_dict()["accept_length"],
        "speedups": {w.name: [w.to_dict()["speedup"], w.to_dict()["speedup_low"], w.to_dict()["speedup_high"]] for w in result.workloads},
        "warnings": len(result.warnings),
        "wall_s": round(wall, 2),
        "time_scale": scale,
        "simulated_gpu_s": round(wall * scale, 1),
    }


def decisions(quick: bool) -> list[dict]:
    rows = []
    workloads = [
        Workload(name="single-stream", concurrency=1, input_tokens=512, output_tokens=256, requests=2),
        Workload(name="concurrent-128", concurrency=128, input_tokens=512, output_tokens=256, requests=128),
    ]
    for cand, scale in (("kimi-k25-custom-eagle3", 10.0), ("kimi-k2-public-eagle3", 1.0), ("sglang-base-kimi-k25", 1.0)):
        if quick and cand == "sglang-base-kimi-k25":
            continue
        rows.append(asyncio.run(_decision("sglang-base-kimi-k25", cand, workloads, scale)))
        print(json.dumps(rows[-1]), flush=True)
    wl = [
        Workload(name="single-stream", concurrency=1, input_tokens=512, output_tokens=256, requests=2),
        Workload(name="concurrent-64", concurrency=64, input_tokens=512, output_tokens=256, requests=128),
    ]
    rows.append(asyncio.run(_decision("llama31-8b-base", "llama31-8b-eagle3", wl, 1.0)))
    print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--sglang-bench-child":
        sglang_bench_child(sys.argv[2:])
        return 0
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer requests")
    parser.add_argument("--part", choices=["fidelity", "dataset", "decisions", "all"], default="all")
    args = parser.parse_args()
    if args.part in ("fidelity", "all"):
        fidelity(args.quick)
    if args.part in ("dataset", "all"):
        dataset_fidelity(args.quick)
    if args.part in ("decisions", "all"):
        decisions(args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
