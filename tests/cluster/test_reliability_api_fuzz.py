"""Bad input: hypothesis-generated SpeculativeServers sent to the real kube-apiserver.

Every object goes through the real admission path (structural schema, pruning, defaulting, CEL rules) as a
server-side dry run, twice: with fieldValidation=Strict (unknown fields are refused) and with the server's
default (unknown fields are pruned). The verdict is compared with our own: `resource.parse_spec(spec,
check_rules=True)`, which is what `specdec sglang-args -f` and the operator run. The two must agree object by
object: a spec the CLI accepts is one the cluster admits, and the reverse. Refusals must name a field.

The generator starts from specs that look plausible (every optional field present half of the time, numbers
drawn around their bounds, drafter shapes that may or may not be consistent) and applies up to three
mutations: a wrong JSON type, an out-of-range number, a deleted field, an unknown field, null, an absurdly
large list or map, a very long or unicode string, paths with '..' and newlines. The oracle, not the
generator, says whether an object is valid; the test checks that both kinds occur in large numbers.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import json
import threading
import time
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from specdec_operator import API_GROUP, API_VERSION, resource
from tests.support.api_fuzz import (
    BATCH,
    EXAMPLES,
    SPEC_SCHEMA,
    WORKERS,
    Verdict,
    mutated_specs,
    names_a_field,
    oracle,
    pruned,
    submit,
)

# --------------------------------------------------------------------------------------------------
# The real API server


@pytest.mark.cluster
@pytest.mark.slow
def test_api_server_and_our_validation_agree_on_1050_generated_objects(kube_api_client, namespace):
    from kubernetes import client

    custom = client.CustomObjectsApi(kube_api_client)
    stats: Counter = Counter()
    disagreements: list[str] = []
    counter = itertools.count()  # object names (dry runs store nothing, names only need to be valid)
    lock = threading.Lock()

    def count(*keys: str) -> None:
        with lock:
            stats.update(keys)

    def compare(mode: str, index: int, spec: dict[str, Any], done: list[str], ours: Verdict, strict: bool) -> dict | None:
        admitted, code, message, fields, stored = submit(custom, namespace, f"fuzz-{index}", spec, strict=strict)
        verdict = "admitted" if admitted else f"refused {code}: {message[:400]}"
        if ours.integral_floats_only:
            count(f"{mode}: integral float, ours refused, server {'admitted' if admitted else 'refused'}")
            return None
        if admitted != ours.valid:
            disagreements.append(
                f"{mode}: ours={'valid' if ours.valid else ours.message!r} server={verdict} mutations={done} spec={json.dumps(spec)[:800]}"
            )
        # The field must be one we flag, or one the generator broke: the server stops at the first stage that
        # fails (decoding with unknown fields, then the schema, then CEL), so it may name another broken field.
        elif not admitted and not names_a_field(fields, message, ours.fields + [d.split("@", 1)[1] for d in done]):
            disagreements.append(f"{mode}: refusal does not name {ours.fields}: {verdict} mutations={done}")
        else:
            count(f"{mode}: {'admitted' if admitted else 'refused, naming the field'}")
        return stored

    def check(job: tuple[int, dict[str, Any], list[str], Verdict, Verdict]) -> dict | None:
        index, spec, done, ours, ours_pruned = job
        count("objects", "valid" if ours.valid else "invalid", *(f"mutation: {d.split('@')[0]}" for d in done))
        compare("strict", index, spec, done, ours, strict=True)
        # With Ignore the server drops unknown fields instead of refusing them; we must agree on the rest.
        return compare("ignore", index, spec, done, ours_pruned, strict=False)

    # No shrinking: every example is BATCH round trips, and a disagreement is reported with its whole spec.
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        print_blob=False,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
    )
    @given(st.lists(mutated_specs(), min_size=BATCH, max_size=BATCH))
    def batch(cases):
        disagreements.clear()
        # Our verdicts are computed here, in one thread: cel-python compiles rules through CPython's ast
        # module, which is not safe to drive from several threads at once. Only the HTTP calls run in the pool.
        jobs = [(next(counter), spec, done, oracle(spec), oracle(pruned(spec, SPEC_SCHEMA))) for spec, done in cases]
        with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
            stored_specs = list(pool.map(check, jobs))
        for (_, spec, _, _, _), stored in zip(jobs, stored_specs):
            if stored is not None:
                # What the server stores (pruned, defaulted) parses, and defaults to exactly what we default to.
                if resource.dump(resource.parse_spec(stored["spec"], check_rules=True)) != resource.dump(
                    resource.parse_spec(pruned(spec, SPEC_SCHEMA))
                ):
                    disagreements.append(f"defaults differ: server stored {json.dumps(stored['spec'])[:400]}")
        assert not disagreements, f"{len(disagreements)} of {len(cases)} disagree; first:\n" + "\n".join(disagreements[:5])

    batch()
    print("\napi fuzz:\n" + "\n".join(f"  {k}: {v}" for k, v in sorted(stats.items())))
    assert stats["objects"] >= 1000
    assert stats["valid"] >= 150 and stats["invalid"] >= 150, stats


# --------------------------------------------------------------------------------------------------
# The operator on admitted generated objects


@pytest.mark.cluster
@pytest.mark.slow
def test_the_operator_explains_every_admitted_generated_object_and_stays_cool(cluster, namespace):
    """30 generated objects the API server admits (odd Unicode paths, extreme sizes, every shape of drafter) are
    created for real: each gets a status with a phase and an explanation, the operator never exits, and once they
    are all explained it does not spin (CPU over 10 s)."""
    import psutil

    from tests.support.operator_process import status, step_after_now

    specs: list[dict[str, Any]] = []

    @settings(
        max_examples=400,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
    )
    @given(mutated_specs())
    def collect(case):
        spec, _ = case
        if len(specs) < 30 and oracle(spec).valid and len(json.dumps(spec)) < 200_000:
            specs.append(spec)

    collect()
    assert len(specs) == 30
    op = cluster.replica()
    op.start()
    for i, spec in enumerate(specs):
        cluster.create(
            {"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": "SpeculativeServer", "metadata": {"name": f"generated-{i}"}, "spec": spec}
        )
    deadline = time.monotonic() + 120
    unexplained = [f"generated-{i}" for i in range(len(specs))]
    while unexplained:
        assert op.proc.poll() is None, f"the operator exited:\n{op.logs()[-3000:]}"
        assert time.monotonic() < deadline, f"no explaining status after 120 s: {unexplained[:5]}"
        unexplained = [
            n for n in unexplained if not ((st := status(cluster.custom, namespace, n)).get("phase") and (st.get("message") or st.get("reason")))
        ]
        time.sleep(1)
    phases = Counter(
        f"{(st := status(cluster.custom, namespace, f'generated-{i}'))['phase']} {st.get('reason', '')}".strip() for i in range(len(specs))
    )
    print(f"\n30 generated resources: {dict(phases)}")
    for i in range(len(specs)):
        if (st := status(cluster.custom, namespace, f"generated-{i}"))["phase"] == "Failed":
            print(f"  generated-{i}: {st['reason']}: {st.get('message', '')[:300]}")
    process = psutil.Process(op.proc.pid)
    before = sum(process.cpu_times()[:2])
    time.sleep(10)
    cores = (sum(process.cpu_times()[:2]) - before) / 10
    assert cores < 0.5, f"the operator uses {cores:.2f} cores with 30 resources explained"
    assert op.proc.poll() is None
    # Quiet, not stalled: it still steps a resource that is edited. (One whose status follows its generation: a
    # refusal of the API server's, ApplyRejected, leaves observedGeneration as it was.)
    quiet = next(f"generated-{i}" for i in range(len(specs)) if status(cluster.custom, namespace, f"generated-{i}").get("observedGeneration") == 1)
    step_after_now(cluster.custom, namespace, quiet)
