"""A race of speculative candidates on vLLM's CPU build (issue 35, item 5 "On the real engine").

The copy-trained tiny target (tests/support/copy_models.py) is the base; its candidates (tests/support/race_candidates.py,
each --speculative-config rendered by the operator: parse_spec, api.spec_for_candidate, the vLLM engine's render_argv)
are its EAGLE-3 drafter (``eagle3``), n-gram prompt lookup (``ngram``) and a smaller draft model of its tokenizer
(``draft-model``, vLLM's draft_model). The workloads (tests/support/copy_workloads.py):

- ``copy``: "Repeat this text: <passage of 50-56 coined words>": the answer quotes the prompt;
- ``free``: the probe's shipped prompt set (free-text questions): nothing in the answer is in the prompt.

The base starts once (core 0) and stays warm; the candidates run one after another beside it (core 1: one
speculative server at a time), each probed by `specdec probe --engine vllm --base BASE --speculative CAND --json` on
both workloads, at confidence 1 - 0.002/3 each (the race's error budget split over three candidates). Before the
probes the base's greedy answers to each workload's first 8 prompts give the workload's ``copy_share`` (answer words
inside a 4-word run that occurs in the prompt; every coined word is one token) and ``context_share`` (or earlier in
the answer: what n-gram lookup can find).

Usage (about 20-30 minutes on a loaded 2-core machine; the models build once first, ~15-25 minutes):

    .venv/bin/python benchmarks/vllm_race.py --out docs/benchmarks/vllm-race-copy.json [--candidates eagle3,ngram,draft-model]
    .venv/bin/python benchmarks/vllm_race.py --check-only draft-model   # serve one candidate a minute, print its command
    .venv/bin/python benchmarks/vllm_race.py --summarize FILE            # the markdown tables of a written JSON

`--summarize` also reads the target-a runs of 31f45a8's script (vllm-race.json, -loaded, -separate-first).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "operator")]

from tests.support.copy_models import CopyModels, copy_models
from tests.support.copy_workloads import WORKLOADS, context_share, copy_share, write_jsonl
from tests.support.race_candidates import CANDIDATES, base_server, candidate_server
from tests.support.vllm_servers import start_servers

OUTPUT_TOKENS = 48
REQUESTS = 8
FAMILY_CONFIDENCE = 0.998


def greedy_chat(url: str, messages: list[dict[str, Any]]) -> str:
    body = {"model": "default", "messages": messages, "max_tokens": OUTPUT_TOKENS, "temperature": 0, "ignore_eos": True}
    req = urllib.request.Request(f"{url}/v1/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return str(json.loads(r.read())["choices"][0]["message"]["content"])


def measure_repetition(url: str, prompts: list[dict[str, Any]]) -> dict[str, Any]:
    """The base's greedy answers to `prompts`: their mean copy_share and context_share on words, and 3 examples."""
    rows = []
    for p in prompts:
        prompt, output = p["messages"][-1]["content"], greedy_chat(url, p["messages"])
        shares = {"copy_share": copy_share(prompt.split(), output.split()), "context_share": context_share(prompt.split(), output.split())}
        rows.append({"prompt": prompt, "output": output, **shares})
    mean = {k: round(sum(r[k] for r in rows) / len(rows), 3) for k in ("copy_share", "context_share")}
    return {**mean, "prompts": len(rows), "examples": rows[:3]}


def probe(base: str, candidate: str, dataset: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One `specdec probe --engine vllm --json` of `candidate` against `base` on `dataset`."""
    cmd = [sys.executable, "-m", "specdec_operator.cli", "probe", "--engine", "vllm", "--base", base, "--speculative", candidate]
    cmd += ["--workload", f"single-stream:1:64:{OUTPUT_TOKENS}:{REQUESTS}", "--max-rounds", str(args.max_rounds)]
    cmd += ["--base-gpus", "0", "--speculative-gpus", "0", "--base-cores", "1", "--speculative-cores", "1"]
    cmd += ["--confidence", str(round(1 - (1 - FAMILY_CONFIDENCE) / len(args.candidates), 6)), "--dataset", str(dataset)]
    cmd += ["--output-check-prompts", "4", "--timeout", str(args.probe_timeout), "--json", "--quiet"]
    env = {**os.environ, "PYTHONPATH": f"{args.operator_src}:{REPO}"}
    load_before = os.getloadavg()
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    record: dict[str, Any] = {
        "command": " ".join(["specdec", *cmd[3:]]),
        "rc": proc.returncode,
        "wall_seconds": round(time.monotonic() - started, 1),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
    }
    try:
        record["result"] = json.loads(proc.stdout)
    except json.JSONDecodeError:
        record["stdout_tail"], record["stderr_tail"] = proc.stdout[-2000:], proc.stderr[-2000:]
    return record


def check(models: CopyModels, work: Path, names: list[str]) -> dict[str, Any]:
    """Serve each candidate alone (core 1) until ready, send one greedy copy request, keep its command or error."""
    out = {}
    for name in names:
        server = candidate_server(models, name, work / f"check-{name}.log")
        entry: dict[str, Any] = {"speculative_config": server.speculative}
        try:
            start_servers([server])
            entry.update(command=server.cmd, served=True, ready_seconds=round(server.ready_s or 0, 1))
            entry["greedy"] = greedy_chat(server.url, WORKLOADS["copy"]()[0]["messages"])
        except (RuntimeError, TimeoutError) as err:
            entry.update(served=False, error_tail=str(err)[-1500:])
        finally:
            server.stop()
        out[name] = entry
        print(json.dumps({name: entry}, indent=1), flush=True)
    return out


def race(models: CopyModels, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The warm base, then each candidate beside it in turn, probed on every workload; the JSON written as it goes."""
    datasets = {w: write_jsonl(work / f"{w}.jsonl", make()) for w, make in WORKLOADS.items()}
    base = base_server(models, work / "base.log")
    report: dict[str, Any] = {"workloads": {}, "candidates": {}}
    started = time.monotonic()
    start_servers([base])
    try:
        report["base"] = {"command": base.cmd, "core": base.core, "ready_seconds": round(base.ready_s or 0, 1)}
        for workload, make in WORKLOADS.items():
            report["workloads"][workload] = {"repetition": measure_repetition(base.url, make()[:8])}
            shares = report["workloads"][workload]["repetition"]
            print(f"{workload}: copy {shares['copy_share']} context {shares['context_share']}", file=sys.stderr, flush=True)
        for name in args.candidates:
            server = candidate_server(models, name, work / f"{name}.log")
            held = time.monotonic()
            start_servers([server])
            try:
                entry: dict[str, Any] = {"speculative_config": server.speculative, "command": server.cmd, "core": server.core}
                entry["ready_seconds"] = round(server.ready_s or 0, 1)
                report["candidates"][name] = entry
                for workload, dataset in datasets.items():
                    entry.setdefault("probes", {})[workload] = record = probe(base.url, server.url, dataset, args)
                    print(f"{name} {workload}: rc {record['rc']} in {record['wall_seconds']} s", file=sys.stderr, flush=True)
                    write(args.out, report)
                entry["rss_mib"] = round(server.rss_mib())
            finally:
                server.stop()
            entry["held_seconds"] = round(time.monotonic() - held, 1)
        report["base"]["rss_mib"] = round(base.rss_mib())
    finally:
        base.stop()
    report["base"]["held_seconds"] = round(time.monotonic() - started, 1)
    report["winners"] = winners(report)
    report["core_seconds"] = race_cost(report)
    return report


def winners(report: dict[str, Any]) -> dict[str, Any]:
    """Per workload: the promoted candidate of the highest speedup estimate (what the race serves), and whether its
    interval clears every other candidate's estimate."""
    out: dict[str, Any] = {}
    for workload in report["workloads"]:
        results = {n: c["probes"][workload].get("result") for n, c in report["candidates"].items() if workload in c.get("probes", {})}
        promoted = {n: r for n, r in results.items() if r and r["decision"] == "promote"}
        best = max(promoted, key=lambda n: promoted[n]["speedup"]) if promoted else None
        others = [r["speedup"] for n, r in results.items() if r and n != best]
        clear = bool(best) and all(promoted[best]["speedup_low"] > s for s in others)
        out[workload] = {"winner": best, "promoted": sorted(promoted), "winner_low_above_every_other_estimate": clear}
    return out


def race_cost(report: dict[str, Any]) -> dict[str, float]:
    """Core-seconds: the probes' own (declared cores x wall) and what the servers were held for, start-ups included."""
    probes = [p["result"]["core_seconds"] for c in report["candidates"].values() for p in c.get("probes", {}).values() if p.get("result")]
    held = report["base"]["held_seconds"] + sum(c.get("held_seconds", 0.0) for c in report["candidates"].values())
    return {"probes": round(sum(probes), 1), "servers_held": round(held, 1)}


def legacy_rows(report: dict[str, Any]) -> list[str]:
    """31f45a8's target-a runs (one --arm race and each arm alone per workload): per arm its speedup and outcome."""
    rows = ["| workload | probe | arm | speedup [interval] | rounds | server accept length | outcome | decision (winner) | wall s | core-s |"]
    rows.append("|---|---|---|---|---|---|---|---|---|---|")
    for workload, entry in report.get("workloads", {}).items():
        probes = [("race", entry["race"])] * ("race" in entry) + [(f"{n} alone", p) for n, p in entry.get("separate", {}).items()]
        for label, record in probes:
            result = record.get("result")
            if result is None:
                rows.append(f"| {workload} | {label} | - | rc {record['rc']}, no JSON | | | | | {record['wall_seconds']} | |")
                continue
            arms = result.get("arms") or {label.removesuffix(" alone"): result}
            decided = f"{result['decision']} {result['reason']} ({result.get('winner')})"
            for arm, a in arms.items():
                interval = f"{a['speedup']} [{a['speedup_low']}, {a['speedup_high']}]"
                cells = [workload, label, arm, interval, a["rounds"], a["server_accept_length"], a.get("outcome", "-"), decided]
                cells += [result["wall_seconds"], result["core_seconds"]]
                rows.append("| " + " | ".join(str(c) for c in cells) + " |")
    return rows


def summary_rows(report: dict[str, Any]) -> list[str]:
    """Markdown tables of a race: the workloads' copy shares, every candidate's probe per workload, the winners, the cost."""
    if "candidates" not in report:
        return legacy_rows(report)
    rows = ["| workload | copy_share | context_share |", "|---|---|---|"]
    rows += [f"| {w} | {e['repetition']['copy_share']} | {e['repetition']['context_share']} |" for w, e in report["workloads"].items()]
    rows += ["", "| workload | candidate | speedup [interval] | rounds | server accept length | output match | decision | wall s | core-s | load |"]
    rows.append("|---|---|---|---|---|---|---|---|---|---|")
    for workload in report["workloads"]:
        for name, entry in report["candidates"].items():
            record = entry.get("probes", {}).get(workload)
            r = (record or {}).get("result")
            if r is None:
                rows.append(f"| {workload} | {name} | no result (rc {(record or {}).get('rc')}) | | | | | | | |")
                continue
            load = f"{record['load_average_before'][0]}-{record['load_average_after'][0]}"
            cells = [workload, name, f"{r['speedup']} [{r['speedup_low']}, {r['speedup_high']}]", r["rounds"], r["server_accept_length"]]
            cells += [r.get("output_match_rate"), f"{r['decision']} {r['reason']}", r["wall_seconds"], r["core_seconds"], load]
            rows.append("| " + " | ".join(str(c) for c in cells) + " |")
    rows += ["", "| workload | winner | promoted | winner's low end above every other estimate |", "|---|---|---|---|"]
    rows += [
        f"| {w} | {v['winner']} | {', '.join(v['promoted']) or '-'} | {v['winner_low_above_every_other_estimate']} |"
        for w, v in report.get("winners", {}).items()
    ]
    cost = report.get("core_seconds", {})
    rows += [
        "",
        f"core-seconds: probes {cost.get('probes')}, servers held {cost.get('servers_held')} (wall {report.get('base', {}).get('held_seconds')} s)",
    ]
    return rows


def write(path: Path | None, report: dict[str, Any]) -> None:
    if path is not None:
        path.write_text(json.dumps(report, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write the JSON here")
    parser.add_argument("--candidates", default=",".join(CANDIDATES), help=f"comma-separated, in race order (default {','.join(CANDIDATES)})")
    parser.add_argument("--check-only", metavar="NAMES", help="only serve these candidates (comma-separated) once each")
    parser.add_argument("--max-rounds", type=int, default=6)
    parser.add_argument(
        "--operator-src",
        type=Path,
        default=REPO / "operator",
        help="the directory holding specdec_operator that the probes run (a `git archive HEAD operator` snapshot keeps a "
        "shared tree's half-done edits out of a long race; default: this checkout's)",
    )
    parser.add_argument("--probe-timeout", type=float, default=1200)
    parser.add_argument("--summarize", type=Path, metavar="JSON", help="print the markdown tables of a written JSON and exit")
    args = parser.parse_args()
    # A SIGTERM (timeout, kill) unwinds like Ctrl-C, so the servers' finally blocks stop their process groups.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.summarize:
        print("\n".join(summary_rows(json.loads(args.summarize.read_text()))))
        return
    args.candidates = args.candidates.split(",")
    unknown = sorted(set(args.candidates + (args.check_only or "").split(",")) - set(CANDIDATES) - {""})
    if unknown:
        parser.error(f"--candidates/--check-only: unknown {', '.join(unknown)}; the candidates are {', '.join(CANDIDATES)}")
    models = copy_models()
    with tempfile.TemporaryDirectory(prefix="vllm-race-") as tmp:
        work = Path(tmp)
        meta = {
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip(),
            "models_root": str(models.root),
            "models_build": models.build_report,
            "eagle3_build": json.loads((models.eagle3.parent / "build.json").read_text()),
            "cpus": os.cpu_count(),
            "load_average_start": [round(x, 2) for x in os.getloadavg()],
            "command": " ".join(["benchmarks/vllm_race.py", *sys.argv[1:]]),
            "operator_src": str(args.operator_src),
        }
        if args.check_only:
            report = {**meta, "check": check(models, work, args.check_only.split(","))}
        else:
            report = {**meta, **race(models, work, args)}
        report["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
        write(args.out, report)
        if args.out is None:
            print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
