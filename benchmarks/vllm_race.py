"""A race of speculative candidates on vLLM's CPU build (issue 35, item 5 "On the real engine").

The real-engine tier's target `a` as the base, and as arms its EAGLE-3 drafter (drafter-a-vllm) and n-gram (prompt
lookup) speculation, raced by `specdec probe --speculative URL --arm NAME=URL` on two workloads:

- ``repeat``: prompts that quote a span of words three times (a document quoted in a prompt), the kind of
  traffic n-gram speculation is for;
- ``free``: the probe's shipped prompt set (free-text chat questions).

Each candidate's --speculative-config is the one the operator renders: a spec with that drafter goes through
resource.parse_spec (admission's rules) and the vLLM engine's render_argv; only the draft model's path is moved from
the container's /models mount to the local build. The servers are tests/support/vllm_servers.py's (float32, one core
each, no compilation): the base on core 0, every arm on core 1. The probe measures one server at a time (each arm
with a base measurement of its own, docs/probe.md "Several arms, measured"), so the two arms share core 1 without
running at once.

Before the probes, every workload's prompts get the base's greedy completions, and the script reports how much of
them repeats the prompt (``copy_share``: the share of output words inside a 4-word span that occurs in the prompt)
and the context n-gram lookup sees (``context_share``: a span that occurs in the prompt or earlier in the output).

Usage (about 10-30 minutes on a loaded 2-core machine):

    .venv/bin/python benchmarks/vllm_race.py --out docs/benchmarks/vllm-race.json [--models-root DIR] [--separate]
    .venv/bin/python benchmarks/vllm_race.py --check-only      # start each candidate's server once, print the commands

``--separate`` also probes each arm alone against the same base, for the cost of a race against separate probes.
"""

from __future__ import annotations

import argparse
import json
import os
import posixpath
import random
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "operator")]

from specdec_operator.engines import engine_for
from specdec_operator.resource import parse_spec
from tests.support.real_engine import WORDS, RealEngineModels, real_engine_models
from tests.support.vllm_servers import VllmServer, start_servers

MOUNT = "/models"
SPEC = {
    "engine": "vLLM",
    "image": "vllm/vllm-openai:v0.32.0",
    "model": {"mountPath": MOUNT, "volume": {"persistentVolumeClaim": {"claimName": "weights"}}},
    "target": {"path": "target-a"},
}
# The candidates as spec.drafter (docs/candidates.md); 3 draft tokens each, like the tier's EAGLE-3 server.
CANDIDATES: dict[str, dict[str, Any]] = {
    "eagle3": {"path": "drafter-a-vllm", "numSteps": 3},
    "ngram": {"algorithm": "NGRAM", "numSteps": 3, "ngram": {"minMatch": 2, "maxMatch": 4}},
    "suffix": {"algorithm": "SUFFIX", "numSteps": 3},
}
OUTPUT_TOKENS = 48
REQUESTS = 8
SPAN = 4


def rendered_config(drafter: dict[str, Any], root: Path) -> dict[str, Any]:
    """The --speculative-config the operator renders for `drafter`, its draft model moved from /models to `root`."""
    spec = parse_spec({**SPEC, "drafter": drafter}, check_rules=True)
    argv = engine_for(spec).render_argv(spec, "speculative")
    config: dict[str, Any] = json.loads(argv[argv.index("--speculative-config") + 1])
    if "model" in config:
        config["model"] = str(root / posixpath.relpath(config["model"], MOUNT))
    return config


@dataclass
class CandidateServer(VllmServer):
    """A tier server whose --speculative-config is given whole (VllmServer's own speaks EAGLE-3 only)."""

    speculative: dict[str, Any] | None = None

    def command(self, python: str) -> list[str]:
        cmd = super().command(python)
        if self.speculative is not None:
            cmd += ["--speculative-config", json.dumps(self.speculative)]
        return cmd


def repeat_prompts(n: int, seed: int) -> list[dict[str, Any]]:
    """Chat prompts quoting a span of 12 words three times."""
    rnd = random.Random(seed)
    out = []
    for _ in range(n):
        span = " ".join(rnd.choice(WORDS) for _ in range(12))
        out.append({"messages": [{"role": "user", "content": f"Repeat this text: {span} {span} {span}"}]})
    return out


def shipped_prompts() -> list[dict[str, Any]]:
    path = REPO / "operator" / "specdec_operator" / "probe" / "data" / "default-prompts.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def covered_share(output: list[str], seen_in: Any) -> float:
    """The share of `output` words inside a SPAN-word span for which seen_in(start) is true."""
    covered = [False] * len(output)
    for i in range(len(output) - SPAN + 1):
        if seen_in(i):
            covered[i : i + SPAN] = [True] * SPAN
    return sum(covered) / len(output) if output else 0.0


def repetition(prompt: str, output: str) -> dict[str, float]:
    p, o = prompt.split(), output.split()
    in_prompt = {tuple(p[i : i + SPAN]) for i in range(len(p) - SPAN + 1)}

    def in_context(i: int) -> bool:
        span = tuple(o[i : i + SPAN])
        earlier = o[: i + SPAN - 1]
        return span in in_prompt or any(tuple(earlier[j : j + SPAN]) == span for j in range(len(earlier) - SPAN + 1))

    return {
        "copy_share": covered_share(o, lambda i: tuple(o[i : i + SPAN]) in in_prompt),
        "context_share": covered_share(o, in_context),
    }


def greedy_chat(url: str, messages: list[dict[str, Any]]) -> str:
    body = {"model": "default", "messages": messages, "max_tokens": OUTPUT_TOKENS, "temperature": 0, "ignore_eos": True}
    req = urllib.request.Request(f"{url}/v1/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return str(json.loads(r.read())["choices"][0]["message"]["content"])


def measure_repetition(url: str, prompts: list[dict[str, Any]]) -> dict[str, Any]:
    rows = []
    for p in prompts:
        output = greedy_chat(url, p["messages"])
        rows.append({"prompt": p["messages"][-1]["content"], "output": output, **repetition(p["messages"][-1]["content"], output)})
    mean = {k: round(sum(r[k] for r in rows) / len(rows), 3) for k in ("copy_share", "context_share")}
    return {**mean, "examples": rows[:3]}


def probe(base: str, arms: dict[str, str], dataset: Path | None, args: argparse.Namespace) -> dict[str, Any]:
    """One `specdec probe --engine vllm --json` of `arms` (the first as --speculative, the rest as --arm)."""
    names = list(arms)
    cmd = [sys.executable, "-m", "specdec_operator.cli", "probe", "--engine", "vllm", "--base", base, "--speculative", arms[names[0]]]
    for name in names[1:]:
        cmd += ["--arm", f"{name}={arms[name]}"]
    cmd += ["--workload", f"single-stream:1:64:{OUTPUT_TOKENS}:{REQUESTS}", "--max-rounds", str(args.max_rounds)]
    cmd += ["--base-gpus", "0", "--speculative-gpus", "0", "--base-cores", "1", "--speculative-cores", "1"]
    cmd += ["--output-check-prompts", "4", "--timeout", str(args.probe_timeout), "--json", "--quiet"]
    if dataset is not None:
        cmd += ["--dataset", str(dataset)]
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'operator'}:{REPO}"}
    load_before = os.getloadavg()
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    wall = time.monotonic() - started
    record: dict[str, Any] = {
        "command": " ".join(["specdec", *cmd[3:]]),
        "urls": arms,
        "rc": proc.returncode,
        "wall_seconds": round(wall, 1),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
    }
    try:
        record["result"] = json.loads(proc.stdout)
    except json.JSONDecodeError:
        record["stdout_tail"], record["stderr_tail"] = proc.stdout[-2000:], proc.stderr[-2000:]
    return record


def check(models: RealEngineModels, work: Path) -> dict[str, Any]:
    """Start the drafter-free candidates' servers alone (one at a time, core 1), send one greedy request, keep the log's tail."""
    out = {}
    for name in ("ngram", "suffix"):  # EAGLE-3 is the tier's own server (tests/realengine)
        drafter = CANDIDATES[name]
        config = rendered_config(drafter, models.root)
        server = CandidateServer(name, models.target("a"), work / f"check-{name}.log", core="1", speculative=config)
        entry: dict[str, Any] = {"speculative_config": config}
        try:
            start_servers([server])
            entry["command"] = server.cmd
            entry["served"] = True
            entry["ready_seconds"] = round(server.ready_s or 0, 1)
            entry["greedy"] = greedy_chat(server.url, repeat_prompts(1, 5)[0]["messages"])
        except (RuntimeError, TimeoutError) as err:
            entry["served"] = False
            entry["error_tail"] = str(err)[-1500:]
        finally:
            server.stop()
        out[name] = entry
        print(json.dumps({name: entry}, indent=1), flush=True)
    return out


def race(models: RealEngineModels, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    arm_names = ["eagle3", "ngram"]
    configs = {name: rendered_config(CANDIDATES[name], models.root) for name in arm_names}
    servers = [CandidateServer("base", models.target("a"), work / "base.log", core="0")]
    servers += [CandidateServer(n, models.target("a"), work / f"{n}.log", core="1", speculative=configs[n]) for n in arm_names]
    datasets = {"repeat": work / "repeat.jsonl", "free": None}
    (work / "repeat.jsonl").write_text("".join(json.dumps(p) + "\n" for p in repeat_prompts(16, args.seed)))
    report: dict[str, Any] = {"speculative_configs": configs, "servers": {}, "workloads": {}, "separate_first": args.separate_first}
    started = time.monotonic()
    start_servers(servers)
    try:
        by_name = {s.name: s for s in servers}
        report["servers"] = {s.name: {"core": s.core, "command": s.cmd, "ready_seconds": round(s.ready_s or 0, 1)} for s in servers}
        base = by_name["base"].url
        for workload, dataset in datasets.items():
            prompts = repeat_prompts(16, args.seed) if dataset else shipped_prompts()
            report["workloads"][workload] = {"repetition": measure_repetition(base, prompts[:8])}
            shares = report["workloads"][workload]["repetition"]
            print(f"{workload}: repetition {shares['copy_share']} / {shares['context_share']}", file=sys.stderr, flush=True)
        # Each workload's race, then (--separate) each arm alone; --separate-first swaps the two, for the machine's drift.
        runs = [(w, "race", arm_names) for w in datasets] + [(w, n, [n]) for w in datasets for n in arm_names if args.separate]
        if args.separate_first:
            runs = [r for r in runs if r[1] != "race"] + [r for r in runs if r[1] == "race"]
        for workload, label, names in runs:
            record = probe(base, {n: by_name[n].url for n in names}, datasets[workload], args)
            entry = report["workloads"][workload]
            if label == "race":
                entry["race"] = record
            else:
                entry.setdefault("separate", {})[label] = record
            print(f"{workload}: {label} rc {record['rc']} in {record['wall_seconds']} s", file=sys.stderr, flush=True)
            write(args.out, report)
        for s in servers:
            report["servers"][s.name]["rss_mib"] = round(s.rss_mib())
    finally:
        for s in servers:
            s.stop()
    report["wall_seconds"] = round(time.monotonic() - started, 1)
    return report


def summary_rows(report: dict[str, Any]) -> list[str]:
    """A markdown table of every probe in `report`: per arm its speedup, interval, rounds, acceptance and outcome."""
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
                outcome = a.get("outcome", "-")
                cells = [workload, label, arm, interval, a["rounds"], a["server_accept_length"], outcome, decided]
                cells += [result["wall_seconds"], result["core_seconds"]]
                rows.append("| " + " | ".join(str(c) for c in cells) + " |")
    return rows


def write(path: Path | None, report: dict[str, Any]) -> None:
    if path is not None:
        path.write_text(json.dumps(report, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models-root", type=Path, help="a built real-engine directory (default: this checkout's build)")
    parser.add_argument("--out", type=Path, help="write the JSON here")
    parser.add_argument("--check-only", action="store_true", help="only start each candidate's server once")
    parser.add_argument("--separate", action="store_true", help="also probe each arm alone")
    parser.add_argument("--separate-first", action="store_true", help="with --separate: the arms alone before the races")
    parser.add_argument("--max-rounds", type=int, default=6)
    parser.add_argument("--probe-timeout", type=float, default=1200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--summarize", type=Path, metavar="JSON", help="print the markdown table of a written JSON and exit")
    args = parser.parse_args()
    if args.summarize:
        print("\n".join(summary_rows(json.loads(args.summarize.read_text()))))
        return
    models = RealEngineModels(args.models_root) if args.models_root else real_engine_models()
    with tempfile.TemporaryDirectory(prefix="vllm-race-") as tmp:
        work = Path(tmp)
        meta = {
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip(),
            "models_root": str(models.root),
            "cpus": os.cpu_count(),
            "load_average_start": [round(x, 2) for x in os.getloadavg()],
            "command": " ".join(["benchmarks/vllm_race.py", *sys.argv[1:]]),
        }
        report = {**meta, "check": check(models, work)} if args.check_only else {**meta, **race(models, work, args)}
        report["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
        write(args.out, report)
        if args.out is None:
            print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
