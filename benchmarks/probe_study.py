"""The probe's decision rule, old and new, over recorded per-round evidence (issue 32 item 3).

Two parts:

* ``record``: real measurements with the probe's own client (probe/client.py ``measure``) and the probe's own reduction of
  each measurement (run.py ``_log_rate``: own time blocks and their robust variance; ``_pooled_profile``: the coarse
  block profile for the pooled variance; tok/s), in rounds whose server order alternates as run.py's does (speculative
  first in odd rounds), for ``--rounds`` rounds without ever stopping. Pairs: two equal simulator servers
  (llama31-8b-base against itself) and a pair with a known speedup (llama31-8b-base against llama31-8b-eagle3), each
  with stream_interval 8 at time scale 5 (benchmarks/probe_decisions.py ``heldout``: the demo's workloads, as the
  cluster tests run them), on the demo workloads chat (c=1) and batch-32. The simulators are in-process
  ``SimulatorServer``s (real HTTP on localhost, the client on the same event loop). What the machine was doing is
  recorded with the trace (``uptime``, ``vmstat``, the processes' names, the 1-minute load at every round). Traces
  go to docs/benchmarks/probe-study-traces-<label>.json. ``--vllm``: vLLM's CPU tier instead (the real-engine tier's
  target a served twice and with its matched drafter, tests/support/vllm_servers.py; the operator test's workload).
* ``study``: an offline Monte Carlo over the traces. Each simulated probe draws its rounds from a trace (whole rounds
  with replacement, each round's pair of measurements kept together; look k draws from the trace's rounds of the same
  server order as run.py's round k), shifts every speculative log rate by ``log(truth) - mean log ratio of the trace``
  (so the truth is imposed and the noise is the trace's own), and runs the decision rule look by look as run.py does
  for one workload under policy ``all``: the pooled variance over the rounds drawn so far
  (``stats.with_pooled_variance``), ``paired_round``, the interval, ``judge_paired`` (promotion from round 2, the
  MAX_WIDTH bound), futility, the width bound on a stop, the last round Inconclusive. Methods:

  - ``old`` (the rule before 4e29854): ``paired_interval(rounds, per_look_level(confidence, max_rounds))``,
    ``futile(iv, min_speedup, max_rounds)``;
  - ``new`` (4e29854): ``sequential_interval(rounds, look_levels(confidence, look))``,
    ``futile(iv, min_speedup, futility_horizon(max_rounds), look_levels(confidence, horizon).low_level)``;
  - ``current``: the same calls with this checkout's functions, under another name so that a study of today's
    interval (a840076: the between-round floor; df88494: the first look, futility past round 6, the between-round df)
    sits beside the 4e29854 results; futility's horizon is ``futility_horizon(max_rounds, rounds)`` as race.py's;
  - ``priorK`` (issue 32 item 2): ``current`` with a prior on the between-round variance (``stats.RoundPrior``, what
    ``RaceRules.round_priors`` carries): for every simulated probe a previous probe of K rounds is drawn from the same
    trace, and its ``round_variance`` with K - 1 df is the prior; ``priorK@label``: the previous probe drawn from the
    trace of the same pair and workload recorded under ``label`` (a prior from a quieter or busier time).

  The operator's own functions are imported and called; only ``t_quantile`` (a bisection of ~0.8 ms) is replaced by
  an interpolation between its exact values on a fine grid (``fast_t_quantile``: relative error below 1e-5). ``verify`` runs the old method once from the old checkout (``--old-operator
  /tmp/old/operator``, a subprocess) and once from this one, on the same draws, and compares every probe's outcome.

GPU-seconds per decision = rounds x the trace's mean round duration (wall) x time scale (simulated seconds) x GPUs
(``--gpus``, default 16: two servers of 8 GPUs, as the seed's Kimi-K2.5 servers; the Llama profiles are 1 GPU each).

Usage (docs/benchmarks/probe-study.md has the commands that made the committed results):
  .venv/bin/python benchmarks/probe_study.py record --label loaded --rounds 60 [--pairs equal,eagle3] [--workloads chat,batch-32]
  .venv/bin/python benchmarks/probe_study.py record --vllm --label vllm --rounds 24 [--models-root DIR]
  .venv/bin/python benchmarks/probe_study.py study --traces docs/benchmarks/probe-study-traces-*.json --json OUT.json [--md OUT.md]
  .venv/bin/python benchmarks/probe_study.py verify --traces FILE --old-operator /tmp/old/operator
  .venv/bin/python benchmarks/probe_study.py render STUDY.json... [--traces TRACES.json...] [--md OUT.md] [--summary-json OUT.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import math
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRUTHS = (0.36, 0.64, 0.9, 0.99, 1.0, 1.05, 1.2, 1.5, 2.0, 3.0)
NULL_HEAVY = (0.9, 0.99, 1.0)  # truths at which false promotions are counted with the most probes
CONFIDENCE = 0.998
MIN_SPEEDUP = 1.0
MAX_ROUNDS = (6, 24)
TIME_SCALE = 5.0
PAIRS = {"equal": ("llama31-8b-base", "llama31-8b-base"), "eagle3": ("llama31-8b-base", "llama31-8b-eagle3")}
# The demo's workloads (hack/demo.py, benchmarks/probe_decisions.py DEMO_WORKLOADS), random token ids.
WORKLOADS: dict[str, dict[str, Any]] = {
    "chat": dict(name="chat", concurrency=1, input_tokens=128, output_tokens=64, requests=4),
    "batch-32": dict(name="batch-32", concurrency=32, input_tokens=128, output_tokens=64, requests=64),
}


# --- record ---------------------------------------------------------------------------------------------------------


def _sh(cmd: str) -> str:
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception as exc:  # the load record is informative only
        return f"({type(exc).__name__}: {exc})"


def machine_load() -> dict[str, Any]:
    """What the machine is doing: uptime, vmstat over 3 s, the busiest processes, the pytest and Go compiler counts."""
    return {
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "uptime": _sh("uptime"),
        "nproc": os.cpu_count(),
        "vmstat": _sh("vmstat 1 3 | tail -2"),
        "pytest_processes": int(_sh("pgrep -c -f 'pytest' || true") or 0),
        "go_compile_processes": int(_sh("pgrep -c -x compile || true") or 0) + int(_sh("pgrep -c -x go || true") or 0),
        "top": _sh("ps -eo pcpu,comm --sort=-pcpu | head -8").splitlines(),
    }


def _profile(name: str) -> dict[str, Any]:
    data = json.loads((resources.files("specdec_operator.simulator") / "profiles" / f"{name}.json").read_text())
    data["stream_interval"] = 8  # as benchmarks/probe_decisions.py heldout
    data["load_seconds"] = 0
    return data


def _g(x: float) -> float:
    return float(f"{x:.5g}") if math.isfinite(x) else x


def _measurement_row(m: Any, w: Any, earlier: list[list[float]]) -> tuple[dict[str, Any], list[float]]:
    from specdec_operator.probe.run import _log_rate, _pooled_profile

    lr = _log_rate(m, w)
    prof = _pooled_profile(m, w, earlier)
    row = {
        "tok_s": _g(m.tokens_per_second),
        "log_rate": round(lr.log_rate, 6),
        "var": _g(lr.var) if math.isfinite(lr.var) else None,
        "df": round(lr.df, 3),
        "events": len(m.arrivals),
        "duration_s": round(m.duration_s, 4),
        "profile": [_g(x) for x in prof],
    }
    return row, prof


async def record_rounds(
    session: Any, urls: dict[str, str], w: Any, rounds: int, rng: random.Random, traffic: Any, title: str
) -> list[dict[str, Any]]:
    """``rounds`` rounds of one workload on both servers, the order alternating as run.py's (speculative first in odd
    rounds), never stopping; each measurement reduced as run.py reduces it."""
    from specdec_operator.probe.client import measure

    rows: list[dict[str, Any]] = []
    profiles: dict[str, list[list[float]]] = {"base": [], "speculative": []}
    for rnd in range(1, rounds + 1):
        order = ["speculative", "base"] if rnd % 2 == 1 else ["base", "speculative"]
        t0 = time.perf_counter()
        row: dict[str, Any] = {"round": rnd, "order": order[0][0] + order[1][0], "load1": round(os.getloadavg()[0], 2)}
        for variant in order:
            m = await measure(session, urls[variant], w, rng=rng, traffic=traffic)
            row[variant], prof = _measurement_row(m, w, profiles[variant])
            profiles[variant].append(prof)
        row["duration_s"] = round(time.perf_counter() - t0, 4)
        rows.append(row)
        ratio = row["speculative"]["tok_s"] / row["base"]["tok_s"]
        print(f"{title} round {rnd}: ratio {ratio:.3f} ({row['duration_s']:.2f}s, load {row['load1']})", file=sys.stderr, flush=True)
    return rows


async def record_trace(pair: str, workload: str, rounds: int, time_scale: float, seed: int, label: str) -> dict[str, Any]:
    """A simulator pair (in-process SimulatorServers, real HTTP on localhost) on one of the demo's workloads."""
    import aiohttp

    from specdec_operator.api import Prompts, Workload
    from specdec_operator.simulator import SimulatorServer, profile_from_dict

    base_name, spec_name = PAIRS[pair]
    base_p, spec_p = profile_from_dict(_profile(base_name)), profile_from_dict(_profile(spec_name))
    w = Workload(prompts=Prompts(source="Random"), **WORKLOADS[workload])
    shape = (w.concurrency, w.input_tokens, w.output_tokens)
    analytic = spec_p.analytic_throughput(*shape) / base_p.analytic_throughput(*shape)
    before = machine_load()
    async with (
        SimulatorServer(base_p, time_scale=time_scale, seed=seed, load_seconds=0) as base_url,
        SimulatorServer(spec_p, time_scale=time_scale, seed=seed + 1000, load_seconds=0) as spec_url,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=w.concurrency + 8)) as session,
    ):
        urls = {"base": base_url, "speculative": spec_url}
        rows = await record_rounds(session, urls, w, rounds, random.Random(seed), None, f"{label} {pair} {workload}")
    return {
        "name": f"{label}/{pair}/{workload}",
        "label": label,
        "pair": pair,
        "base_profile": base_name,
        "speculative_profile": spec_name,
        "analytic_speedup": round(analytic, 4),
        "workload": WORKLOADS[workload],
        "time_scale": time_scale,
        "seed": seed,
        "load_before": before,
        "load_after": machine_load(),
        "rounds": rows,
    }


def cmd_record(args: argparse.Namespace) -> None:
    out = args.out or os.path.join(REPO, "docs", "benchmarks", f"probe-study-traces-{args.label}.json")
    doc: dict[str, Any] = {"label": args.label, "note": args.note, "traces": []}
    if os.path.exists(out) and args.append:
        with open(out) as f:
            doc = json.load(f)

    def save(trace: dict[str, Any]) -> None:  # after every trace: a long recording keeps what it has
        doc["traces"] = [t for t in doc["traces"] if t["name"] != trace["name"]] + [trace]
        with open(out, "w") as f:
            json.dump(doc, f, separators=(",", ":"))
            f.write("\n")
        print(f"wrote {trace['name']} to {out}", file=sys.stderr)

    if args.vllm:
        for trace in record_vllm(args.rounds, args.seed, args.label, args.models_root, (args.pairs or ",".join(VLLM_PAIRS)).split(",")):
            save(trace)
        return
    for i, (pair, workload) in enumerate((p, wl) for p in (args.pairs or ",".join(PAIRS)).split(",") for wl in args.workloads.split(",")):
        save(asyncio.run(record_trace(pair, workload, args.rounds, args.time_scale, args.seed + 10 * i, args.label)))


# vLLM's CPU tier: the operator test's workload (tests/cluster/test_vllm_engine.py WORKLOADS: one stream, 16 requests of
# 48 tokens, the default prompt set through the chat endpoint).
VLLM_WORKLOAD: dict[str, Any] = dict(name="single-stream", concurrency=1, input_tokens=64, output_tokens=48, requests=16)


VLLM_PAIRS = {"equal": "base-2", "matched": "matched"}  # pair -> the server measured as the speculative one


def record_vllm(
    rounds: int, seed: int, label: str, models_root: str | None = None, pairs: Sequence[str] = tuple(VLLM_PAIRS)
) -> Iterator[dict[str, Any]]:
    """Two equal servers (target a, twice) and base against the matched drafter (target a + its drafter exported for
    vLLM), each server pinned to one core (tests/support/vllm_servers.py), the servers' own probe protocol (engine
    vllm). Equal pair first, then the speedup pair (``pairs``: which of them); the servers run together (two per
    core)."""
    import tempfile
    from pathlib import Path

    import aiohttp

    sys.path.insert(0, REPO)
    from specdec_operator.api import Workload
    from specdec_operator.engines import engine_named
    from specdec_operator.probe.traffic import build_traffic
    from tests.support.real_engine import RealEngineModels, real_engine_models
    from tests.support.vllm_servers import VllmServer, start_servers

    t0 = time.monotonic()
    # --models-root: a build already made (the pipeline's key changes with every edit of its sources, and a build takes
    # tens of minutes on a loaded machine).
    models = RealEngineModels(Path(models_root)) if models_root else real_engine_models()
    models_s = time.monotonic() - t0
    work = Path(tempfile.mkdtemp(prefix="probe-study-vllm-"))
    target = models.target("a")
    wanted = [
        VllmServer("base", target, work / "base.log", core="0"),
        VllmServer("base-2", target, work / "base-2.log", core="1"),
        VllmServer("matched", target, work / "matched.log", drafter=models.drafter("a", "vllm"), core="1"),
    ]
    engine = engine_named("vllm")
    try:
        servers = {s.name: s for s in start_servers(wanted)}
        ready = {n: round(s.ready_s or 0.0, 1) for n, s in servers.items()}
        for i, (pair, spec_name) in enumerate((p, VLLM_PAIRS[p]) for p in VLLM_PAIRS if p in pairs):
            w = Workload(**VLLM_WORKLOAD)
            traffic = build_traffic([w], None, seed + i, engine)[w.name]
            traffic.model = "default"  # --served-model-name default (tests/support/vllm_servers.py)

            async def go(w: Any = w, traffic: Any = traffic, spec_name: str = spec_name, pair: str = pair, i: int = i) -> list[dict[str, Any]]:
                async with aiohttp.ClientSession() as session:
                    urls = {"base": servers["base"].url, "speculative": servers[spec_name].url}
                    return await record_rounds(session, urls, w, rounds, random.Random(seed + i), traffic, f"{label} vllm {pair}")

            before = machine_load()
            rows = asyncio.run(go())
            yield {
                "name": f"{label}/{pair}/single-stream",
                "label": label,
                "pair": pair,
                "engine": "vllm",
                "base_server": "target a",
                "speculative_server": "target a" if pair == "equal" else "target a + its drafter (--engine vllm export)",
                "workload": VLLM_WORKLOAD,
                "time_scale": 1.0,
                "devices": 2,
                "device_unit": "CPU core",
                "models_ready_s": round(models_s, 1),
                "models": str(models.root),
                "servers_ready_s": ready,
                "seed": seed + i,
                "load_before": before,
                "load_after": machine_load(),
                "rounds": rows,
            }
    finally:
        for s in wanted:
            s.stop()


# --- study ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Trace:
    name: str
    # Per recorded round: (speculative LogRate, base LogRate, speculative profile, base profile), grouped by order.
    odd: tuple[tuple[Any, Any, tuple[float, ...], tuple[float, ...]], ...]  # speculative first (run.py's odd rounds)
    even: tuple[tuple[Any, Any, tuple[float, ...], tuple[float, ...]], ...]
    mean_log_ratio: float
    round_s: float  # mean wall seconds of a round (both measurements)
    time_scale: float
    devices: int | None = None  # what a second of the probe costs (vLLM CPU tier: 2 cores); None: --gpus
    device_unit: str = "GPU"


def load_traces(paths: Sequence[str], stats: Any) -> list[Trace]:
    traces = []
    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        for t in doc["traces"]:
            odd: list[tuple[Any, Any, tuple[float, ...], tuple[float, ...]]] = []
            even: list[tuple[Any, Any, tuple[float, ...], tuple[float, ...]]] = []
            ratios: list[float] = []
            for r in t["rounds"]:
                s, b = r["speculative"], r["base"]
                item = (
                    stats.LogRate(s["log_rate"], math.inf if s["var"] is None else s["var"], s["df"]),
                    stats.LogRate(b["log_rate"], math.inf if b["var"] is None else b["var"], b["df"]),
                    tuple(s["profile"]),
                    tuple(b["profile"]),
                )
                (odd if r["order"] == "sb" else even).append(item)
                ratios.append(s["log_rate"] - b["log_rate"])
            round_s = sum(r["duration_s"] for r in t["rounds"]) / len(t["rounds"])
            trace = Trace(
                t["name"], tuple(odd), tuple(even), sum(ratios) / len(ratios), round_s, t["time_scale"], t.get("devices"), t.get("device_unit", "GPU")
            )
            traces.append(trace)
    return traces


# t_quantile's bisection costs ~0.8 ms and Satterthwaite's df is continuous, so a cache on exact arguments rarely hits:
# the study interpolates log t linearly in log df between grid points T_GRID apart (each grid point exact, computed once),
# for 1 <= df <= T_MAX_DF; a relative error below 1e-5 of t (checked by tests/unit/test_probe_study.py), and `verify`
# checks the decisions against the exact function.
T_GRID = 0.002
T_MAX_DF = 5000.0


@contextlib.contextmanager
def fast_t_quantile(mods: dict[str, Any]) -> Iterator[None]:
    """While inside: t_quantile, where paired_interval and futile look it up, interpolated on a grid of exact values
    (above). Restored on exit."""
    stats, decide = mods["stats"], mods["decide"]
    exact = stats.t_quantile

    @functools.lru_cache(maxsize=1 << 20)
    def grid(p: float, i: int) -> float:
        return math.log(exact(p, math.exp(i * T_GRID)))

    @functools.lru_cache(maxsize=1 << 16)
    def far(p: float, df: float) -> float:
        return exact(p, df)

    def fast(p: float, df: float) -> float:
        if p <= 0.5 or not 1.0 <= df <= T_MAX_DF:
            return exact(p, df) if p <= 0.5 or df < 1.0 else far(p, float(f"{df:.4g}"))
        x = math.log(df) / T_GRID
        i = int(x)
        lo = grid(p, i)
        return math.exp(lo + (grid(p, i + 1) - lo) * (x - i))

    stats.t_quantile = decide.t_quantile = fast
    try:
        yield
    finally:
        stats.t_quantile = decide.t_quantile = exact


class Rule:
    """One method's interval and futility, from the modules given (this checkout's, or the old one's)."""

    def __init__(self, method: str, confidence: float, max_rounds: int, mods: dict[str, Any]) -> None:
        self.stats, self.decide = mods["stats"], mods["decide"]
        self.method, self.max_rounds = method, max_rounds
        # "priorK": today's method with a prior on the between-round variance (stats.RoundPrior) from a previous probe
        # of K rounds of the same trace (drawn for every probe: simulate), pooled with the probe's own spread.
        # "priorK@label": the previous probe ran on the trace of the same pair and workload recorded under ``label``
        # (a prior from a quieter or busier time than the probe's own: the noise moved between the two probes).
        # "...+tag" (e.g. "prior6+between"): the same method under another name, so that a study of a changed checkout
        # sits beside the committed rows of the method before the change.
        base = method.split("+")[0]
        self.prior_rounds = int(base[len("prior") :].split("@")[0]) if base.startswith("prior") else 0
        self.prior_label = base.split("@")[1] if "@" in base else None
        if base == "old":
            level = self.stats.per_look_level(confidence, max_rounds)
            self.interval: Callable[[Sequence[Any], int], Any] = lambda rounds, look: self.stats.paired_interval(rounds, level)
            self.futile: Callable[[Any], bool] = lambda iv: self.decide.futile(iv, MIN_SPEEDUP, max_rounds)
        else:
            seq = mods["sequential"]
            levels = [seq.look_levels(confidence, k) for k in range(1, max_rounds + 1)]
            self.interval = lambda rounds, look, prior=None: (
                self.stats.sequential_interval(rounds, levels[look - 1], prior) if prior else self.stats.sequential_interval(rounds, levels[look - 1])
            )
            self.futile = lambda iv: self._futile_new(iv, seq, confidence)

    def _futile_new(self, iv: Any, seq: Any, confidence: float) -> bool:
        """As reconcile/race.py: futility projects to decide.futility_horizon of the interval's rounds (round 6, or 3 rounds
        ahead after it, when decide.py has that second argument; before df88494 it had not and switched off after 6)."""
        try:
            horizon = self.decide.futility_horizon(self.max_rounds, iv.n)
        except TypeError:
            horizon = self.decide.futility_horizon(self.max_rounds)
        return bool(self.decide.futile(iv, MIN_SPEEDUP, horizon, seq.look_levels(confidence, horizon).low_level))


# Looks memoized by the rounds drawn so far, up to this many rounds (a trace of 30 rounds per order has 900 two-round
# prefixes, which 20,000 probes revisit ~20 times each; longer prefixes rarely repeat).
MEMO_ROUNDS = 3


def previous_probe(trace: Trace, rule: Rule, rng: random.Random) -> Any:
    """The prior a previous probe of ``rule.prior_rounds`` rounds of the same servers leaves (stats.RoundPrior: its
    between-round variance, with the servers' floor, and rounds - 1 df), its rounds drawn from ``trace`` as a probe's."""
    stats = rule.stats
    paired = []
    for k in range(1, rule.prior_rounds + 1):
        rows = trace.odd if k % 2 == 1 else trace.even
        s, b, _, _ = rows[rng.randrange(len(rows))]
        paired.append(stats.paired_round(s, b))
    return stats.RoundPrior(stats.round_variance(paired), float(rule.prior_rounds - 1))


def look(trace: Trace, shift: float, rule: Rule, drawn: Sequence[int], prior: Any = None) -> str | None:
    """The decision after the rounds ``drawn`` (indices into the trace's rounds of each look's order): "promote",
    "rollback", "inconclusive", or None (another round), as run.py decides after that round for one workload under
    policy all."""
    stats, decide = rule.stats, rule.decide
    rnd = len(drawn)
    spec, base, sprof, bprof = [], [], [], []
    for k, i in enumerate(drawn, start=1):
        s, b, sp, bp = (trace.odd if k % 2 == 1 else trace.even)[i]
        spec.append(stats.LogRate(s.log_rate + shift, s.var, s.df))
        base.append(b)
        sprof.append(sp)
        bprof.append(bp)
    rs = stats.with_pooled_variance(spec, sprof, "w/speculative")
    rb = stats.with_pooled_variance(base, bprof, "w/base")
    paired = [stats.paired_round(rs[i], rb[i]) for i in range(rnd)]
    iv = rule.interval(paired, rnd, prior) if prior is not None else rule.interval(paired, rnd)
    verdict = decide.judge_paired(iv, MIN_SPEEDUP)
    final = rnd == rule.max_rounds
    futility = verdict is decide.Verdict.UNDECIDED and not final and rule.futile(iv)
    if (verdict is not decide.Verdict.UNDECIDED or futility) and not final and decide.width(iv) > decide.MAX_WIDTH:
        verdict, futility = decide.Verdict.UNDECIDED, False  # run.py _stop_or_go_on: a wide interval is measured again
    if verdict is decide.Verdict.PASS:
        return "promote"
    if verdict is decide.Verdict.FAIL:
        return "rollback"
    if futility or final:
        return "inconclusive"
    return None


def simulate(trace: Trace, truth: float, rule: Rule, rng: random.Random, memo: dict[tuple[int, ...], str | None] | None = None) -> tuple[str, int]:
    """One probe over ``trace`` at ``truth``: ("promote" | "rollback" | "inconclusive", rounds). Round k is drawn from
    the trace's rounds of run.py's order for round k (speculative first when k is odd), with replacement. ``memo``:
    the looks of one (trace, truth, rule) already computed, by their drawn rounds."""
    shift = math.log(truth) - trace.mean_log_ratio
    source = trace
    if rule.prior_label:
        source = _worker_state["traces"][rule.prior_label + trace.name[trace.name.index("/") :]]
    prior = previous_probe(source, rule, rng) if rule.prior_rounds else None
    memo = memo if prior is None else None  # the looks depend on the prior too
    drawn: list[int] = []
    for rnd in range(1, rule.max_rounds + 1):
        drawn.append(rng.randrange(len(trace.odd if rnd % 2 == 1 else trace.even)))
        key = tuple(drawn)
        if memo is not None and key in memo:
            decision = memo[key]
        else:
            decision = look(trace, shift, rule, drawn, prior)
            if memo is not None and rnd <= MEMO_ROUNDS:
                memo[key] = decision
        if decision is not None:
            return decision, rnd
    raise AssertionError("unreachable: the last round always decides")


def _quantile(sorted_values: Sequence[int], q: float) -> float:
    """Nearest-rank quantile of sorted integers."""
    if not sorted_values:
        return math.nan
    return float(sorted_values[min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))])


def run_cell(trace: Trace, truth: float, rule: Rule, probes: int, seed: int, gpus: int) -> dict[str, Any]:
    """``probes`` simulated probes at ``truth``; their outcomes, rounds and cost (``gpus`` unless the trace says what
    its servers are: the vLLM CPU tier's cores)."""
    gpus = trace.devices or gpus
    rng = random.Random(seed)
    counts = {"promote": 0, "rollback": 0, "inconclusive": 0}
    rounds: list[int] = []
    by_rounds: dict[str, dict[int, int]] = {"promote": {}, "rollback": {}, "inconclusive": {}}
    memo: dict[tuple[int, ...], str | None] = {}
    for _ in range(probes):
        decision, n = simulate(trace, truth, rule, rng, memo)
        counts[decision] += 1
        rounds.append(n)
        by_rounds[decision][n] = by_rounds[decision].get(n, 0) + 1
    rounds.sort()
    mean_rounds = sum(rounds) / probes
    return {
        "trace": trace.name,
        "method": rule.method,
        "max_rounds": rule.max_rounds,
        "truth": truth,
        "probes": probes,
        "promote": counts["promote"],
        "rollback": counts["rollback"],
        "inconclusive": counts["inconclusive"],
        "false_promotion_rate": counts["promote"] / probes if truth <= MIN_SPEEDUP else None,
        "false_rollback_rate": counts["rollback"] / probes if truth >= 1.2 else None,
        "inconclusive_share": counts["inconclusive"] / probes,
        "rounds_median": _quantile(rounds, 0.5),
        "rounds_p90": _quantile(rounds, 0.9),
        "rounds_mean": round(mean_rounds, 3),
        "cost_unit": f"{trace.device_unit}-s ({gpus})",
        "gpu_s_mean": round(mean_rounds * trace.round_s * trace.time_scale * gpus, 1),
        "by_rounds": {k: dict(sorted(v.items())) for k, v in by_rounds.items()},  # decision -> {rounds: probes}
        "gpu_s_p90": round(_quantile(rounds, 0.9) * trace.round_s * trace.time_scale * gpus, 1),
    }


def load_modules(operator_path: str | None) -> dict[str, Any]:
    if operator_path:
        sys.path.insert(0, operator_path)
    import importlib

    mods = {name: importlib.import_module(f"specdec_operator.probe.{name}") for name in ("stats", "decide")}
    try:
        mods["sequential"] = importlib.import_module("specdec_operator.probe.sequential")
    except ImportError:  # the old checkout has no sequential.py: only the old method runs there
        pass
    return mods


def probes_for(truth: float, args: argparse.Namespace) -> int:
    return args.null_probes if truth in NULL_HEAVY else args.probes


def _cells(args: argparse.Namespace) -> list[tuple[str, int, float]]:
    truths = [float(x) for x in args.truths.split(",")] if args.truths else list(TRUTHS)
    return [(m, r, t) for m in args.methods.split(",") for r in args.max_rounds for t in truths]


def _work(job: tuple[str, str, int, float, int, int, dict[str, Any]]) -> dict[str, Any]:
    trace_name, method, max_rounds, truth, probes, seed, opts = job
    mods = _worker_state["mods"]
    trace = _worker_state["traces"][trace_name]
    rule = Rule(method, opts["confidence"], max_rounds, mods)
    return run_cell(trace, truth, rule, probes, seed, opts["gpus"])


_worker_state: dict[str, Any] = {}


def _init_worker(paths: list[str], operator_path: str | None, exact: bool) -> None:
    mods = load_modules(operator_path)
    if not exact:  # for the process's life (a study or a pool worker); tests use fast_t_quantile's restore
        _worker_state["fast_t"] = patch = fast_t_quantile(mods)  # kept: a collected generator would restore at once
        patch.__enter__()
    _worker_state["mods"] = mods
    _worker_state["traces"] = {t.name: t for t in load_traces(paths, mods["stats"])}


def cell_seed(trace: str, truth: float, max_rounds: int) -> int:
    # The same draws for both methods (common random numbers): their difference is the rule's, not the sample's.
    return int.from_bytes(f"{trace}|{truth}|{max_rounds}".encode(), "little") % (1 << 61)


def cmd_study(args: argparse.Namespace) -> dict[str, Any]:
    _init_worker(args.traces, args.operator_path, args.exact_t)
    traces = list(_worker_state["traces"].values())
    if args.only:
        traces = [t for t in traces if any(o in t.name for o in args.only.split(","))]
    opts = {"confidence": args.confidence, "gpus": args.gpus}
    jobs = [(t.name, m, r, truth, probes_for(truth, args), cell_seed(t.name, truth, r), opts) for t in traces for (m, r, truth) in _cells(args)]
    # Longest first (null-heavy, large budget) so the pool ends together.
    jobs.sort(key=lambda j: -(j[4] * (j[2] if j[3] in NULL_HEAVY else 2)))
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    saved = [started]

    def done(row: dict[str, Any]) -> None:
        rows.append(row)
        print(_progress(row, started), file=sys.stderr, flush=True)
        if args.json and time.perf_counter() - saved[0] > 30:  # a run cut short keeps the cells it finished
            _study_doc(args, traces, rows, started, partial=True)
            saved[0] = time.perf_counter()

    if args.workers > 1:
        import multiprocessing

        with multiprocessing.get_context("fork").Pool(args.workers, _init_worker, (args.traces, args.operator_path, args.exact_t)) as pool:
            for row in pool.imap_unordered(_work, jobs):
                done(row)
    else:
        for job in jobs:
            done(_work(job))
    return _study_doc(args, traces, rows, started, partial=False)


def _study_doc(args: argparse.Namespace, traces: Sequence[Trace], rows: list[dict[str, Any]], started: float, partial: bool) -> dict[str, Any]:
    """The study's JSON (written to --json, and the cells' table to --md); ``partial``: the cells finished so far."""
    rows = sorted(rows, key=lambda r: (r["trace"], r["max_rounds"], r["truth"], r["method"]))
    doc = {
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(["benchmarks/probe_study.py", *sys.argv[1:]]),
        "confidence": args.confidence,
        "min_speedup": MIN_SPEEDUP,
        "gpus": args.gpus,
        "exact_t_quantile": args.exact_t,
        "seconds": round(time.perf_counter() - started, 1),
        "traces": {
            t.name: {
                "mean_log_ratio": round(t.mean_log_ratio, 5),
                "round_s": round(t.round_s, 4),
                "time_scale": t.time_scale,
                "rounds_odd": len(t.odd),
                "rounds_even": len(t.even),
            }
            for t in traces
        },
        "rows": rows,
    }
    if partial:
        doc["partial"] = True
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
    if args.md:
        with open(args.md, "w") as f:
            f.write(markdown(doc))
    return doc


def _progress(row: dict[str, Any], started: float) -> str:
    return (
        f"[{time.perf_counter() - started:7.1f}s] {row['trace']} {row['method']} R{row['max_rounds']} x{row['truth']}: "
        f"promote {row['promote']} rollback {row['rollback']} inconclusive {row['inconclusive']} of {row['probes']}, "
        f"rounds p50 {row['rounds_median']:g} p90 {row['rounds_p90']:g}"
    )


def _pct(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{100 * x:.3f} %" if x < 0.01 else f"{100 * x:.1f} %"


def markdown(doc: dict[str, Any]) -> str:
    """One table per trace: rows truth x (old, new) x maxRounds."""
    out = [
        f"Generated {doc['generated_at']} by `{doc['command']}` ({doc['seconds']} s); confidence {doc['confidence']}, "
        f"min speedup {doc['min_speedup']}, GPU-seconds for {doc['gpus']} GPUs.\n"
    ]
    by_trace: dict[str, list[dict[str, Any]]] = {}
    for r in doc["rows"]:
        by_trace.setdefault(r["trace"], []).append(r)
    for name, rows in by_trace.items():
        t = doc["traces"][name]
        out.append(
            f"\n#### {name} (trace mean ratio {math.exp(t['mean_log_ratio']):.3f}x, round {t['round_s']:.2f} s wall x time scale {t['time_scale']:g})\n"
        )
        out.append(
            "| truth | maxRounds | method | probes | promote | rollback | inconclusive | false promotion | false rollback | rounds p50 / p90 | GPU-s mean |"
        )
        out.append("|---|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            out.append(
                f"| {r['truth']:g} | {r['max_rounds']} | {r['method']} | {r['probes']} | {r['promote']} | {r['rollback']} | {r['inconclusive']} "
                f"| {_pct(r['false_promotion_rate'])} | {_pct(r['false_rollback_rate'])} | {r['rounds_median']:g} / {r['rounds_p90']:g} | {r['gpu_s_mean']:g} |"
            )
    return "\n".join(out) + "\n"


# --- render: summary and goals (issue 32 item 3) ----------------------------------------------------------------

CLEAR = (0.36, 0.64, 1.5, 2.0, 3.0)  # a truth of 1.5x or more, or 0.7x or less: the goal's "clear" speedups and losses


def round_bound(trace: str) -> int:
    """The goal's rounds for a clear truth: 2 on quiet traces, 4 on loaded ones (every trace not labelled quiet)."""
    return 2 if trace.startswith("quiet/") else 4


def correct_within(row: dict[str, Any], bound: int) -> float:
    """The share of probes that reached the right decision (promote a win, roll back a loss) within ``bound`` rounds."""
    right = "promote" if row["truth"] > MIN_SPEEDUP else "rollback"
    return sum(c for n, c in row["by_rounds"][right].items() if int(n) <= bound) / row["probes"]


def wilson_high(k: int, n: int, z: float = 1.96) -> float:
    """Upper end of the 95 % Wilson interval of a binomial share."""
    p = k / n
    centre = p + z * z / (2 * n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (centre + half) / (1 + z * z / n)


def wilson_low(k: int, n: int, z: float = 1.96) -> float:
    p = k / n
    centre = p + z * z / (2 * n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (centre - half) / (1 + z * z / n)


def summarize(rows: list[dict[str, Any]], confidence: float) -> list[dict[str, Any]]:
    """Per (trace, maxRounds, method): the worst false-promotion rate at truths <= min speedup, the worst false rollback
    at truths >= 1.2, rounds at the clear truths, the goals."""
    alpha = 1.0 - confidence
    groups: dict[tuple[str, int, str], dict[float, dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["trace"], r["max_rounds"], r["method"]), {})[r["truth"]] = r
    out = []
    for (trace, max_rounds, method), cells in sorted(groups.items()):
        nulls = [c for t, c in cells.items() if t <= MIN_SPEEDUP]
        worst = max(nulls, key=lambda c: (c["false_promotion_rate"], c["truth"]))
        wins = [c for t, c in cells.items() if t >= 1.2]
        worst_fr = max(wins, key=lambda c: c["false_rollback_rate"]) if wins else None
        bound = round_bound(trace)
        clear = {t: cells[t] for t in CLEAR if t in cells}
        within = {t: correct_within(c, bound) for t, c in clear.items()}
        out.append(
            {
                "trace": trace,
                "max_rounds": max_rounds,
                "method": method,
                "false_promotion_worst": worst["false_promotion_rate"],
                "false_promotion_worst_truth": worst["truth"],
                "false_promotion_worst_count": f"{worst['promote']}/{worst['probes']}",
                "false_promotion_worst_wilson_low": wilson_low(worst["promote"], worst["probes"]),
                # The claim "at most 1 - confidence" holds as far as the probes show it when this is within the bound.
                "false_promotion_worst_wilson_high": wilson_high(worst["promote"], worst["probes"]),
                "false_promotion_wilson_high_within": all(wilson_high(c["promote"], c["probes"]) <= alpha for c in nulls),
                # Met when no truth at or below the threshold shows a rate above 1 - confidence beyond its sampling error.
                "goal_false_promotions": all(wilson_low(c["promote"], c["probes"]) <= alpha for c in nulls),
                "false_promotion_point_within": all(c["false_promotion_rate"] <= alpha for c in nulls),
                "false_rollback_worst": None if worst_fr is None else worst_fr["false_rollback_rate"],
                "false_rollback_worst_truth": None if worst_fr is None else worst_fr["truth"],
                "round_bound": bound,
                "correct_within_bound": {str(t): round(v, 4) for t, v in within.items()},
                # The quiet bound on every trace too: what a loaded trace says about the stricter goal.
                "correct_within_2": {str(t): round(correct_within(c, 2), 4) for t, c in clear.items()},
                "rounds_p50": {str(t): c["rounds_median"] for t, c in clear.items()},
                "rounds_p90": {str(t): c["rounds_p90"] for t, c in clear.items()},
                # Met when at every clear truth at least 90 % of probes decide right within the bound (p90 rounds <= bound).
                "goal_rounds_p90": all(v >= 0.9 for v in within.values()),
                "goal_rounds_median": all(v >= 0.5 for v in within.values()),
                "inconclusive": {str(t): round(c["inconclusive_share"], 4) for t, c in sorted(cells.items())},
                "gpu_s_mean": {str(t): c["gpu_s_mean"] for t, c in sorted(cells.items())},
                "cost_unit": next(iter(cells.values())).get("cost_unit", "GPU-s"),
            }
        )
    return out


def _yes(ok: bool) -> str:
    return "yes" if ok else "**no**"


def render(docs: list[dict[str, Any]]) -> str:
    """The summary tables (goals, rounds, errors, cost) and every cell, for docs/benchmarks/probe-study.md."""
    rows = [r for d in docs for r in d["rows"]]
    confidence = docs[0]["confidence"]
    summary = summarize(rows, confidence)
    out = ["### Goals\n"]
    out.append(
        "| trace | maxRounds | method | worst false promotion (truth; count; Wilson high) | goal 1: <= 1 - confidence | clear truths decided right within "
        "the bound (worst; bound) | goal 2 (90 % within) | median within | worst within 2 rounds |"
    )
    out.append("|---|---|---|---|---|---|---|---|---|")
    for s in summary:
        worst_t, worst_share = min(s["correct_within_bound"].items(), key=lambda kv: kv[1])
        fp = (
            f"{_pct(s['false_promotion_worst'])} (x{s['false_promotion_worst_truth']:g}; {s['false_promotion_worst_count']}; "
            f"Wilson 95 % high {_pct(s['false_promotion_worst_wilson_high'])})"
        )
        out.append(
            f"| {s['trace']} | {s['max_rounds']} | {s['method']} | {fp} | {_yes(s['goal_false_promotions'])} "
            f"| {100 * worst_share:.1f} % at x{float(worst_t):g}; {s['round_bound']} | {_yes(s['goal_rounds_p90'])} | {_yes(s['goal_rounds_median'])} "
            f"| {100 * min(s['correct_within_2'].values()):.1f} % at x{float(min(s['correct_within_2'], key=s['correct_within_2'].get)):g} |"
        )
    out.append("\n### Rounds to the end of a probe (median / p90) and Inconclusive share\n")
    truths = sorted({r["truth"] for r in rows})
    out.append("| trace | maxRounds | method | " + " | ".join(f"x{t:g}" for t in truths) + " |")
    out.append("|---|---|---|" + "---|" * len(truths))
    cells = {(r["trace"], r["max_rounds"], r["method"], r["truth"]): r for r in rows}
    for s in summary:
        parts = []
        for t in truths:
            c = cells.get((s["trace"], s["max_rounds"], s["method"], t))
            if c is None:
                parts.append("-")
                continue
            main = "P" if c["promote"] >= max(c["rollback"], c["inconclusive"]) else ("R" if c["rollback"] >= c["inconclusive"] else "I")
            parts.append(f"{c['rounds_median']:g}/{c['rounds_p90']:g} {main} I{100 * c['inconclusive_share']:.0f}%")
        out.append(f"| {s['trace']} | {s['max_rounds']} | {s['method']} | " + " | ".join(parts) + " |")
    out.append("\n### Cost per decision (mean over probes)\n")
    out.append("| trace | maxRounds | method | unit | " + " | ".join(f"x{t:g}" for t in truths) + " |")
    out.append("|---|---|---|---|" + "---|" * len(truths))
    for s in summary:
        vals = [f"{s['gpu_s_mean'].get(str(t), '-')}" for t in truths]
        out.append(f"| {s['trace']} | {s['max_rounds']} | {s['method']} | {s['cost_unit']} | " + " | ".join(vals) + " |")
    out.append("\n### Mean rounds, old against new\n")
    out.append(comparisons(rows))
    out.append("\n### Every cell\n")
    for d in docs:
        out.append(markdown(d))
    return "\n".join(out) + "\n"


def trace_table(paths: Sequence[str]) -> str:
    """What each recorded trace is: its servers, workload, rounds, ratio and noise, and the machine's load."""
    import statistics

    out = [
        "| trace | servers | workload | rounds | expected | measured mean ratio | sd of a round's log ratio | round (wall s) | "
        "load average (1 min) during the rounds | load record before |"
    ]
    out.append("|---|---|---|---|---|---|---|---|---|---|")
    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        for t in doc["traces"]:
            logs = [r["speculative"]["log_rate"] - r["base"]["log_rate"] for r in t["rounds"]]
            loads = [r["load1"] for r in t["rounds"]]
            w = t["workload"]
            servers = f"{t.get('base_profile', t.get('base_server'))} vs {t.get('speculative_profile', t.get('speculative_server'))}"
            if t.get("engine") == "vllm":
                servers = f"vLLM CPU: {servers}"
            else:
                servers = f"simulator x{t['time_scale']:g}: {servers}"
            expected = t.get("analytic_speedup", 1.0 if t["pair"] == "equal" else "-")
            before = t["load_before"]
            record = f"{before['uptime'].split('load average:')[-1].strip()}; {before['pytest_processes']} pytest, {before['go_compile_processes']} Go compile"
            out.append(
                f"| {t['name']} | {servers} | {w['name']} c={w['concurrency']} {w['input_tokens']}/{w['output_tokens']} x{w['requests']} "
                f"| {len(t['rounds'])} | {expected} | {math.exp(statistics.fmean(logs)):.3f} | {statistics.stdev(logs):.3f} "
                f"| {statistics.fmean(r['duration_s'] for r in t['rounds']):.2f} | {min(loads):g}-{max(loads):g} | {record} |"
            )
    return "\n".join(out) + "\n"


def comparisons(rows: list[dict[str, Any]]) -> str:
    """Old against new where the issue asks: is the new rule ever slower at maxRounds 6, and what does a budget of 24
    cost each (mean rounds; round-1 rollbacks; probes that ran all 24 rounds)."""
    cells = {(r["trace"], r["max_rounds"], r["method"], r["truth"]): r for r in rows}
    out = [
        "| trace | truth | old R6 | new R6 | new vs old, R6 | round-1 rollbacks old / new R6 | old R24 | new R24 | new R24 probes that ran 24 rounds |"
    ]
    out.append("|---|---|---|---|---|---|---|---|---|")
    for (trace, budget, method, truth), r in sorted(cells.items()):
        if budget != 6 or method != "new" or (trace, 6, "old", truth) not in cells:
            continue
        old6, old24, new24 = cells[trace, 6, "old", truth], cells.get((trace, 24, "old", truth)), cells.get((trace, 24, "new", truth))
        r1 = f"{old6['by_rounds']['rollback'].get('1', 0)} / {r['by_rounds']['rollback'].get('1', 0)}"
        ran = "-" if new24 is None else f"{sum(v.get('24', 0) for v in new24['by_rounds'].values())} of {new24['probes']}"
        out.append(
            f"| {trace} | {truth:g} | {old6['rounds_mean']:.2f} | {r['rounds_mean']:.2f} | {100 * (r['rounds_mean'] / old6['rounds_mean'] - 1):+.0f} % | {r1} "
            f"| {'-' if old24 is None else format(old24['rounds_mean'], '.2f')} | {'-' if new24 is None else format(new24['rounds_mean'], '.2f')} | {ran} |"
        )
    return "\n".join(out) + "\n"


def cmd_render(args: argparse.Namespace) -> None:
    docs = []
    for path in args.studies:
        with open(path) as f:
            docs.append(json.load(f))
    text = render(docs)
    if args.traces:
        text = "### Traces\n\n" + trace_table(args.traces) + "\n" + text
    if args.md:
        with open(args.md, "w") as f:
            f.write(text)
    else:
        print(text, end="")
    if args.summary_json:
        rows = [r for d in docs for r in d["rows"]]
        with open(args.summary_json, "w") as f:
            json.dump(summarize(rows, docs[0]["confidence"]), f, indent=1)
            f.write("\n")


# --- verify ---------------------------------------------------------------------------------------------------------


def cmd_outcomes(args: argparse.Namespace) -> None:
    """Every probe's (decision, rounds) of the old method on a few cells, as JSON on stdout (for verify)."""
    mods = load_modules(args.operator_path)
    patch = fast_t_quantile(mods) if not args.exact_t else contextlib.nullcontext()
    patch.__enter__()
    traces = load_traces(args.traces, mods["stats"])
    out = {}
    for t in traces:
        for max_rounds in args.max_rounds:
            rule = Rule(args.method, args.confidence, max_rounds, mods)
            for truth in (0.64, 1.0, 1.2, 2.0):
                rng = random.Random(cell_seed(t.name, truth, max_rounds))
                out[f"{t.name}|{max_rounds}|{truth}"] = [simulate(t, truth, rule, rng) for _ in range(args.probes)]
    json.dump(out, sys.stdout)


def cmd_verify(args: argparse.Namespace) -> None:
    """The old method run from the old checkout (exact t quantiles) and from this one, on the same draws: every outcome
    must agree; and the new method with the cached t quantile against the exact one."""
    common = [
        sys.executable,
        os.path.abspath(__file__),
        "outcomes",
        "--traces",
        *args.traces,
        "--probes",
        str(args.probes),
        "--max-rounds",
        *map(str, args.max_rounds),
    ]
    here = os.path.join(REPO, "operator")
    runs = {
        "old method, old checkout, exact t": ([*common, "--operator-path", args.old_operator, "--exact-t"], args.old_operator),
        "old method, this checkout, cached t": (common, here),
        "old method, this checkout, exact t": ([*common, "--exact-t"], here),
        "new method, this checkout, exact t": ([*common, "--method", "new", "--exact-t"], here),
        "new method, this checkout, cached t": ([*common, "--method", "new"], here),
    }
    got = {}
    for label, (cmd, path) in runs.items():
        proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=path), check=True)
        got[label] = json.loads(proc.stdout)
    for label, ref in (
        ("old method, old checkout, exact t", got["old method, old checkout, exact t"]),
        ("new method, this checkout, exact t", got["new method, this checkout, exact t"]),
    ):
        method = label.split(",")[0]
        for other, outcomes in got.items():
            if other == label or not other.startswith(method):
                continue
            probes = sum(len(v) for v in ref.values())
            diff = sum(1 for k in ref for a, b in zip(ref[k], outcomes[k]) if tuple(a) != tuple(b))
            print(f"{other}: {diff} of {probes} probes' (decision, rounds) differ from {label} ({len(ref)} cells)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("--label", required=True)
    rec.add_argument("--note", default="")
    rec.add_argument("--rounds", type=int, default=50)
    rec.add_argument("--pairs", help="comma-separated; default equal,eagle3 (simulators) or equal,matched (--vllm)")
    rec.add_argument("--workloads", default="chat,batch-32")
    rec.add_argument("--time-scale", type=float, default=TIME_SCALE)
    rec.add_argument("--seed", type=int, default=1)
    rec.add_argument("--out")
    rec.add_argument("--append", action="store_true", help="add to (replace by name in) an existing traces file")
    rec.add_argument("--vllm", action="store_true", help="vLLM's CPU tier (the real-engine models, make vllm-cpu) instead of simulators")
    rec.add_argument("--models-root", help="with --vllm: a real-engine build to use (~/.cache/specdec-operator/real-engine/<key>)")
    for name in ("study", "outcomes", "verify"):
        p = sub.add_parser(name)
        p.add_argument("--traces", nargs="+", required=True)
        p.add_argument("--confidence", type=float, default=CONFIDENCE)
        p.add_argument("--max-rounds", type=int, nargs="+", default=list(MAX_ROUNDS))
        p.add_argument("--operator-path", help="import specdec_operator from here (the old checkout's operator/)")
        p.add_argument("--exact-t", action="store_true", help="the exact t_quantile, no cache (slow)")
    st = sub.choices["study"]
    st.add_argument("--methods", default="old,new")
    st.add_argument("--truths", help=f"comma-separated; default {','.join(map(str, TRUTHS))}")
    st.add_argument("--probes", type=int, default=2000)
    st.add_argument("--null-probes", type=int, default=20000, help=f"probes at the truths {NULL_HEAVY}")
    st.add_argument("--gpus", type=int, default=16)
    st.add_argument("--workers", type=int, default=1)
    st.add_argument("--only", help="comma-separated substrings of trace names")
    st.add_argument("--json")
    st.add_argument("--md")
    sub.choices["outcomes"].add_argument("--probes", type=int, default=200)
    sub.choices["outcomes"].add_argument("--method", default="old")
    sub.choices["verify"].add_argument("--probes", type=int, default=200)
    sub.choices["verify"].add_argument("--old-operator", default="/tmp/old/operator")
    ren = sub.add_parser("render")
    ren.add_argument("studies", nargs="+", help="study JSON files")
    ren.add_argument("--md")
    ren.add_argument("--traces", nargs="*", help="trace files, for the table of what each trace is")
    ren.add_argument("--summary-json")
    args = parser.parse_args(argv)
    {"record": cmd_record, "study": cmd_study, "outcomes": cmd_outcomes, "verify": cmd_verify, "render": cmd_render}[args.cmd](args)


if __name__ == "__main__":
    main()
