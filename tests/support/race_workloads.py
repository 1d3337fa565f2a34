"""A race of three Llama-3.1-8B candidates on two kinds of traffic, for the demo and cluster tests (issue 35, item 4).

The candidates: spec.drafter's EAGLE-3 drafter (``eagle3``), n-gram speculation (``ngram``, no drafter) and a
Llama-3.2-1B-like draft model (``standalone``), each served by the simulator profile of its method
(simulator/profiles/llama31-8b-*.json). What each is worth depends on the traffic (docs/candidates.md):

- ``repetitive``: chat prompts whose context comes back in the answer (a file under edit quoted in full, a retrieved
  document the question quotes, an agent's transcript with repeated tool output): promptkind.repetition_share ~0.8-0.95.
  The n-gram profile drafts on that share of its steps: ~3.1x at one stream, ahead of EAGLE-3's ~2.2x.
- ``chat``: the probe's shipped prompt set (free-text questions, repetition share ~0): n-gram drafts almost nothing
  (~0.9x, slower than the base), EAGLE-3 ~2.2x.

The draft model (~1.6x on both) is slower than the best candidate on both, so the race eliminates it (CannotWin) once
its interval's high end falls below the best low end measured before it. ``EXPECTED_WINNER`` is what the profiles say
must win each; the demo's closing check and a cluster test compare status.race.winner with it.

``probe_script`` writes the profiles' own truth as a probe script (probe/scripted.py, an ``arms`` entry per candidate:
``profile_truth``'s analytic speedup and acceptance at the traffic's mean repetition share), for a race whose decisions
must not depend on how busy the host is.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
KINDS = ("repetitive", "chat")
CANDIDATE_PROFILES = {"eagle3": "llama31-8b-eagle3", "ngram": "llama31-8b-ngram", "standalone": "llama31-8b-standalone"}
EXPECTED_WINNER = {"repetitive": "ngram", "chat": "eagle3"}
BASE_PROFILE = "llama31-8b-base"
PROMPTS_KEY = "repetitive.jsonl"

_CODE = [
    """def merge_intervals(intervals):
    intervals = sorted(intervals, key=lambda item: item[0])
    merged = []
    for start, end in intervals:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged""",
    """class RateLimiter:
    def __init__(self, capacity, refill_per_second):
        self.capacity = capacity
        self.tokens = capacity
        self.refill_per_second = refill_per_second
        self.updated = time.monotonic()

    def allow(self):
        now = time.monotonic()
        self.tokens = min(self.capacity, self.tokens + (now - self.updated) * self.refill_per_second)
        self.updated = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False""",
    """func parseConfig(path string) (*Config, error) {
    data, err := os.ReadFile(path)
    if err != nil {
        return nil, fmt.Errorf("read %s: %w", path, err)
    }
    var cfg Config
    if err := yaml.Unmarshal(data, &cfg); err != nil {
        return nil, fmt.Errorf("parse %s: %w", path, err)
    }
    return &cfg, nil
}""",
]
_DOCUMENTS = [
    """The maintenance window for the storage cluster starts every Sunday at 02:00 UTC and lasts two hours. During the
window, writes to the primary volume are paused, reads are served from the replica, and snapshots older than
thirty days are deleted. Teams that need writes during the window must request an exception from the storage
on-call engineer at least two days in advance. Exceptions are granted for one window only.""",
    """Refunds are issued to the original payment method within five business days of the return being received at
the warehouse. Items returned after thirty days are refunded as store credit. Items marked final sale cannot be
returned. Shipping costs are refunded only when the item arrived damaged or was not the item ordered.""",
]
_TOOL_OUTPUT = """$ kubectl get pods -n payments
NAME                          READY   STATUS             RESTARTS   AGE
payments-api-7d9f8c6b5-2xkqz  1/1     Running            0          3d
payments-api-7d9f8c6b5-9wplm  0/1     CrashLoopBackOff   14         3d
payments-worker-5c8d7f9-hh2j  1/1     Running            2          3d"""


def repetitive_prompts() -> list[dict[str, Any]]:
    """Chat requests whose context repeats itself (JSONL lines of the probe's Chat format)."""
    prompts = []
    for code in _CODE:
        prompts.append(
            f"Add type hints to this code and return all of it.\n\n```\n{code}\n```\n\nThe code again, as in the repository now:\n\n```\n{code}\n```"
        )
        prompts.append(f"Here is the code under review:\n\n{code}\n\nRename nothing. Return the code with one comment per block:\n\n{code}")
    for doc in _DOCUMENTS:
        prompts.append(f"Document:\n{doc}\n\nQuote the passage that answers the customer, then answer. The passage as retrieved:\n{doc}")
    for step in (1, 2):
        prompts.append(
            f"Step {step} of the incident. Tool output:\n{_TOOL_OUTPUT}\n\nThe same tool output one minute later:\n{_TOOL_OUTPUT}\n\nWhat changed?"
        )
    return [{"messages": [{"role": "user", "content": text}], "max_tokens": 256} for text in prompts]


def mean_repetition_share(kind: str) -> float:
    """The mean promptkind.repetition_share of a kind's prompts (chat: the probe's shipped set)."""
    from specdec_operator.probe.datasets import parse_dataset
    from specdec_operator.simulator.promptkind import text_repetition_share

    if kind == "repetitive":
        prompts = parse_dataset("\n".join(json.dumps(p) for p in repetitive_prompts()), source="repetitive_prompts", fmt="Chat")
    else:
        shipped = REPO / "operator" / "specdec_operator" / "probe" / "data" / "default-prompts.jsonl"
        prompts = parse_dataset(shipped.read_text(), source=str(shipped), fmt="Auto")
    return sum(text_repetition_share(p.text) for p in prompts) / len(prompts)


def profile_truth(kind: str, concurrency: int = 1, input_tokens: int = 128, output_tokens: int = 64) -> dict[str, tuple[float, float]]:
    """Each candidate's (speedup over the base, acceptance length per verify) on ``kind`` traffic, from its profile's
    analytic_throughput and tokens_per_step at the kind's mean repetition share: what its simulator runs at on a quiet
    host."""
    from specdec_operator.simulator.model import load_profile

    share = mean_repetition_share(kind)
    base = load_profile(BASE_PROFILE).analytic_throughput(concurrency, input_tokens, output_tokens)
    out = {}
    for cand, name in CANDIDATE_PROFILES.items():
        profile = load_profile(name)
        speedup = profile.analytic_throughput(concurrency, input_tokens, output_tokens, share) / base
        out[cand] = (round(speedup, 3), round(profile.tokens_per_step(share), 3))
    return out


def probe_script(races: dict[str, str], noise: float = 0.05, seconds_per_round: float = 1.0) -> dict[str, Any]:
    """A --probe-script (probe/scripted.py) for races ``{"<namespace>/<name>": kind}``: each candidate's rounds at its
    profile_truth with ``noise`` (a race's candidate takes its entry under ``arms``)."""
    doc: dict[str, Any] = {}
    for key, kind in races.items():
        arms = {
            cand: {"speedup": speedup, "acceptLength": accept, "noise": noise, "secondsPerRound": seconds_per_round}
            for cand, (speedup, accept) in profile_truth(kind).items()
        }
        doc[key] = {"arms": arms}
    return doc


def prompts_config_map(name: str, namespace: str) -> dict[str, Any]:
    """The ConfigMap holding repetitive_prompts() under PROMPTS_KEY."""
    body = "\n".join(json.dumps(p) for p in repetitive_prompts()) + "\n"
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace}, "data": {PROMPTS_KEY: body}}


def workload(kind: str, prompts_config_map_name: str, requests: int = 4) -> dict[str, Any]:
    """The race's one workload: one stream, 64 tokens out; the repetitive prompts from the ConfigMap, or the shipped set."""
    prompts: dict[str, Any] = {"source": "Default"}
    if kind == "repetitive":
        prompts = {"source": "ConfigMap", "configMap": {"name": prompts_config_map_name, "key": PROMPTS_KEY}, "format": "Chat"}
    elif kind != "chat":
        raise ValueError(f"workload kind {kind!r}: one of {', '.join(KINDS)}")
    return {"name": kind, "concurrency": 1, "inputTokens": 128, "outputTokens": 64, "requests": requests, "prompts": prompts}


def race_resource(name: str, namespace: str, kind: str, prompts_config_map_name: str, annotations: dict[str, str]) -> dict[str, Any]:
    """examples/llama31-8b-eagle3.yaml with the ngram and standalone candidates and the race's workload of ``kind``.

    A hostPath volume (the local control plane has no storage provisioner); rollout.keepBaseWarm as shipped; the pods'
    outcomes scripted by ``annotations`` (specdec.test/*: kwok runs nothing)."""
    cr = yaml.safe_load((REPO / "examples" / "llama31-8b-eagle3.yaml").read_text())
    cr["metadata"] = {"name": name, "namespace": namespace}
    spec = cr["spec"]
    spec["model"]["volume"] = {"hostPath": {"path": "/data/models", "type": "Directory"}}
    spec["candidates"] = [
        {"name": "ngram", "algorithm": "NGRAM", "numDraftTokens": 8},
        {"name": "standalone", "algorithm": "STANDALONE", "path": "meta-llama/Llama-3.2-1B-Instruct", "numSteps": 3},
    ]
    spec["rollout"] = {"policy": "AllWorkloads", "workloads": [workload(kind, prompts_config_map_name)]}
    spec["podMetadata"] = {"annotations": dict(annotations)}
    return cr
