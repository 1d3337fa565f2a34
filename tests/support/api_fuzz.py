"""Hypothesis-generated SpeculativeServers for the API fuzz (tests/cluster/test_reliability_api_fuzz.py): plausible
specs and their mutations, our verdict on each (the oracle), and what the API server answers."""

from __future__ import annotations

import json
import re
import unicodedata
from typing import Any, NamedTuple

from hypothesis import strategies as st
from pydantic import ValidationError

from specdec_operator import API_GROUP, API_VERSION, PLURAL, api, resource
from specdec_operator.celrules import violations
from specdec_operator.crd import structural_schema
from specdec_operator.errors import InputError

BATCH = 25  # objects per hypothesis example, sent concurrently
EXAMPLES = 42  # hypothesis examples: BATCH * EXAMPLES objects in all (1,050)
WORKERS = 8

# --------------------------------------------------------------------------------------------------
# Generators. Sizes of big values are drawn as numbers (not as long choice sequences) so a batch stays
# within hypothesis' data budget.

# Surrogates cannot travel in UTF-8 JSON; everything else in Unicode may, NUL and newlines included.
UNICODE = st.characters(exclude_categories=("Cs",))
TEXT = st.text(UNICODE, min_size=0, max_size=12)
PATH_PIECES = ["a", "m", "llama", "..", ".", "/", "\n", "é", "模型", " ", "\x00", "-", "..\n", "/models/", "☃"]
PATHS = st.lists(st.sampled_from(PATH_PIECES), min_size=0, max_size=6).map("".join)
# Integers around every bound in the API (0/1/2, 16/17, 64/65, 4096, 16384, 100000, contextLength, int64).
EDGE_INTS = st.sampled_from(
    [
        -(2**63),
        -1,
        0,
        1,
        2,
        3,
        4,
        5,
        8,
        15,
        16,
        17,
        50,
        51,
        63,
        64,
        65,
        128,
        1000,
        1001,
        3600,
        3601,
        4096,
        4097,
        16384,
        16385,
        65536,
        65537,
        100000,
        100001,
        1048576,
        1048577,
        10485760,
        10485761,
        2**31,
        2**53 + 1,
        2**63 - 1,
        2**63,
        2**64 + 7,
    ]
)
EDGE_FLOATS = st.sampled_from([-1.0, -0.0, 0.0, 1e-300, 0.5, 0.999999, 1.0, 1.1, 2.5, 3.0, 63.9, 64.0, 64.5, 100.0, 100.0001, 1000.0, 1000.5, 1e308])
INTS = st.one_of(EDGE_INTS, st.integers(-5, 70))
NUMBERS = st.one_of(INTS, EDGE_FLOATS, st.floats(-10, 200, allow_nan=False, allow_infinity=False))
QUANTITIES = st.one_of(
    st.sampled_from(["32Gi", "1", "0.5", "64Mi", "1.5Ti", "16", "100m", "1e3", "-1Gi", "Gi", "32Gi\n", "32 Gi", "３２Gi"]),
    st.from_regex(api.QUANTITY_PATTERN, fullmatch=True).filter(lambda s: len(s) <= 40),
)
SCALARS = st.one_of(st.none(), st.booleans(), INTS, EDGE_FLOATS, TEXT)
ANY_JSON = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(TEXT, inner, max_size=3)), max_leaves=6)


def _maybe(draw, strategy, p_absent: float = 0.5):
    # Absent at the high end of the range: hypothesis favours the simplest choice (index 0) now and then, and that
    # should be a present field, as in `mostly`, or a required field goes missing in far more objects than p_absent.
    return None if draw(st.sampled_from(range(100))) >= (1 - p_absent) * 100 else draw(strategy)


def mostly(good: st.SearchStrategy, bad: st.SearchStrategy, p_bad: float = 0.04) -> st.SearchStrategy:
    """`good` most of the time, `bad` with probability p_bad: keeps a fair share of whole specs valid."""
    return st.sampled_from(range(1000)).flatmap(lambda u: bad if u >= (1 - p_bad) * 1000 else good)


@st.composite
def volumes(draw):
    return draw(
        st.sampled_from(
            [
                {"persistentVolumeClaim": {"claimName": "weights", "readOnly": True}},
                {"hostPath": {"path": "/mnt/models", "type": "Directory"}},
                {"nfs": {"server": "10.0.0.2", "path": "/export"}},
                {"csi": {"driver": "x.csi.io", "volumeAttributes": {"k": "v"}}},
            ]
        )
    )


@st.composite
def workloads(draw):
    out = []
    for i in range(draw(st.integers(1, 3))):
        concurrency = draw(mostly(st.integers(1, 64), INTS, 0.1))
        w: dict[str, Any] = {
            # Distinct names mostly; a repeated name (the list is a map keyed by name) or a non-DNS one now and then.
            "name": draw(
                mostly(
                    st.just(["chat", "single-stream", "concurrent-64"][i]), st.sampled_from(["chat", "Bad_Name", "x" * 63, "y" * 64, "-a", "ü"]), 0.1
                )
            ),
            "concurrency": concurrency,
            "requests": draw(mostly(st.integers(low := min(max(1, concurrency), 4096), max(low, 512)), INTS, 0.1)),
        }
        for key, strat in (
            # Mostly within the smallest plausible context (1024): a workload too long for target.contextLength
            # is refused by a CEL rule, and that should not drown the other verdicts.
            ("inputTokens", mostly(st.integers(1, 768), st.one_of(st.integers(1, 8192), INTS), 0.15)),
            ("outputTokens", mostly(st.integers(1, 256), st.one_of(st.integers(1, 1024), INTS), 0.15)),
            ("weight", mostly(st.floats(0.01, 10), NUMBERS, 0.1)),
        ):
            value = _maybe(draw, strat, 0.6)
            if value is not None:
                w[key] = value
        out.append(w)
    return out


@st.composite
def plausible_specs(draw) -> dict[str, Any]:
    """A spec that is often valid: every field present about half the time, values near their bounds."""
    spec: dict[str, Any] = {
        "image": draw(mostly(st.one_of(st.just("lmsysorg/sglang:v0.5.23-cu130"), st.text(UNICODE, min_size=1, max_size=20)), st.just(""))),
        "model": {"volume": draw(volumes())},
        "target": {"path": draw(mostly(st.sampled_from(["llama", "meta/Llama-3.1-8B", "/models/llama", "模型/x y"]), PATHS, 0.15))},
    }
    if draw(st.booleans()):
        spec["model"]["mountPath"] = draw(
            mostly(st.sampled_from(["/models", "/models", "/mnt/ü"]), st.one_of(st.sampled_from(["/", "/models/", "models"]), PATHS), 0.15)
        )
    if draw(st.booleans()):
        spec["sglangVersion"] = draw(
            mostly(
                # The release of the usual image's tag; else one that disagrees with it (0.5.9), any version-shaped
                # string (an unsupported release) or a malformed one.
                st.just("0.5.23"),
                st.one_of(
                    st.just("0.5.9"),
                    st.from_regex(api.VERSION_PATTERN, fullmatch=True).filter(lambda v: len(v) <= 32),
                    st.sampled_from(["0.5", "v0.5.23", "0.5.23\n", "１.2.3", "0.5.23.post"]),
                ),
                0.3,
            )
        )
    for key, strat in (
        ("quantization", mostly(st.sampled_from(["auto", "none", "bf16", "fp8", "int8", "int4", "fp4"]), st.sampled_from(["FP8", "int3", ""]))),
        # Mostly room for the default workloads (1024 + 256 tokens); a shorter context refuses them (a CEL rule).
        ("contextLength", mostly(st.integers(2048, 65536), st.one_of(st.integers(1, 2048), INTS), 0.1)),
    ):
        value = _maybe(draw, strat)
        if value is not None:
            spec["target"][key] = value
    drafter: dict[str, Any] = {}
    for key, strat in (
        ("algorithm", mostly(st.sampled_from(["EAGLE3", "EAGLE", "NEXTN"]), st.sampled_from(["eagle3", "MEDUSA"]))),
        ("path", mostly(st.sampled_from(["eagle3/llama", "/models/d", "d"]), PATHS, 0.2)),
        ("numSteps", mostly(st.integers(1, 16), INTS, 0.1)),
        ("eagleTopk", mostly(st.just(1), st.one_of(st.integers(1, 16), INTS), 0.3)),
    ):
        value = _maybe(draw, strat, 0.05 if key == "path" else 0.5)
        if value is not None:
            drafter[key] = value
    # numDraftTokens: absent, consistent with steps/topk, or anything (conflicting shapes).
    steps, topk = drafter.get("numSteps", 3), drafter.get("eagleTopk", 1)
    shape = draw(st.sampled_from(["absent", "absent", "consistent", "consistent", "any"]))
    if shape == "consistent" and isinstance(steps, int) and isinstance(topk, int) and steps >= 1 and topk >= 1:
        drafter["numDraftTokens"] = steps + 1 if topk == 1 else draw(st.integers(min(steps + 1, 64), max(2, min(steps * topk + 1, 64))))
    elif shape == "any":
        drafter["numDraftTokens"] = draw(st.one_of(st.integers(2, 64), INTS))
    spec["drafter"] = drafter
    if draw(st.booleans()):
        spec["resources"] = {
            k: v
            for k, v in {
                "gpus": _maybe(draw, mostly(st.sampled_from([1, 2, 4, 8, 16]), st.sampled_from([3, 32, 0]))),
                "gpuFamily": _maybe(draw, mostly(st.sampled_from(["blackwell", "hopper", "any"]), st.sampled_from(["ampere", "Hopper"]))),
                "shmSize": _maybe(draw, mostly(st.just("32Gi"), QUANTITIES, 0.3)),
                "cpu": _maybe(draw, mostly(st.sampled_from(["8", "500m"]), QUANTITIES, 0.2)),
                "memory": _maybe(draw, mostly(st.just("64Gi"), QUANTITIES, 0.2)),
            }.items()
            if v is not None
        }
    if draw(st.booleans()):
        spec["nodeSelector"] = draw(
            mostly(
                st.dictionaries(
                    st.sampled_from(["topology.kubernetes.io/zone", "team", "example.com/pool", "a_b.c-d"]),
                    st.sampled_from(["", "a", "us-east-1a", "x" * 63]),
                    max_size=3,
                ),
                st.dictionaries(st.text(UNICODE, min_size=1, max_size=8), st.text(UNICODE, max_size=8), min_size=1, max_size=3),
                0.1,
            )
        )
    if draw(st.booleans()):
        spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    if draw(st.booleans()):
        spec["affinity"] = {"podAntiAffinity": {}}
    if draw(st.booleans()):
        spec["podMetadata"] = {
            "labels": draw(
                st.dictionaries(
                    mostly(st.sampled_from(["team", "tier"]), st.sampled_from(["é", "-x", "a/b/c", "x" * 64]), 0.1),
                    mostly(st.sampled_from(["a", "b", ""]), st.sampled_from(["é", "x" * 64, "-a"]), 0.1),
                    max_size=2,
                )
            )
        }
    if draw(st.booleans()):
        sglang: dict[str, Any] = {}
        for key, strat in (
            ("maxRunningRequests", mostly(st.integers(1, 1024), INTS, 0.1)),
            ("memFractionStatic", mostly(st.floats(0.05, 0.95), NUMBERS, 0.1)),
            (
                "extraArgs",
                st.lists(
                    st.sampled_from(
                        [
                            "--log-level=debug",
                            "--trust-remote-code",
                            "--tp=4",
                            "--tp_size",
                            "--speculative-algorithm",
                            "--speculative-num-steps=2",
                            "--max-running-requests=8",
                            "--max_running_requests",
                            "--context-length",
                            "--quantization=fp8",
                            "--model",
                            "--modelx",
                            "--chunked-prefill-size",
                            "8192",
                            "--host=0.0.0.0",
                            "--tp\n",
                            "x\n--tp",
                            "--enable-metrics",
                            "--mem-fraction-static=0.8",
                        ]
                    ),
                    max_size=4,
                ),
            ),
            (
                "env",
                st.lists(
                    mostly(
                        st.sampled_from(
                            [
                                {"name": "NCCL_DEBUG", "value": "INFO"},
                                {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
                            ]
                        ),
                        st.sampled_from([{"name": "", "value": "x"}, {"value": "no-name"}, {"name": "X", "value": 3}]),
                        0.15,
                    ),
                    max_size=3,
                ),
            ),
        ):
            value = _maybe(draw, strat)
            if value is not None:
                sglang[key] = value
        spec["sglang"] = sglang
    if draw(st.booleans()):
        rollout: dict[str, Any] = {}
        for key, strat in (
            ("minSpeedup", mostly(st.floats(0.5, 3.0), NUMBERS, 0.1)),
            ("policy", mostly(st.sampled_from(["AllWorkloads", "WeightedMix"]), st.just("Majority"))),
            ("workloads", workloads()),
            ("maxRounds", mostly(st.integers(1, 50), INTS, 0.1)),
            ("acceptLengthFloor", mostly(st.floats(1.0, 1.9), st.one_of(st.floats(1.0, 20.0), EDGE_FLOATS), 0.15)),
            ("keepBaseWarm", st.booleans()),
        ):
            value = _maybe(draw, strat)
            if value is not None:
                rollout[key] = value
        spec["rollout"] = rollout
    if draw(st.booleans()):
        monitor: dict[str, Any] = {}
        for key, strat in (
            ("enabled", st.booleans()),
            ("interval", mostly(st.integers(5, 3600), INTS, 0.1)),
            ("acceptLengthFloor", mostly(st.floats(1.0, 1.9), st.one_of(st.floats(1.0, 20.0), EDGE_FLOATS), 0.15)),
            ("window", mostly(st.integers(1, 1000), INTS, 0.1)),
        ):
            value = _maybe(draw, strat)
            if value is not None:
                monitor[key] = value
        spec["monitor"] = monitor
    return spec


def _locations(node: Any, path: tuple = ()) -> list[tuple]:
    """Every path to a value inside a JSON document (dict keys and list indexes)."""
    out = [path]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _locations(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _locations(v, path + (i,))
    return out


def _wrong_type(value: Any) -> st.SearchStrategy:
    """A value of another JSON type than `value` (strings of digits and 'true' included: coercion is a bug)."""
    options = [st.none(), st.just({"a": 1}), st.just([1])]
    if not isinstance(value, str):
        options += [st.sampled_from(["3", "true", "1.5", "", "yes"])]
    if not isinstance(value, bool):
        options += [st.booleans()]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        options += [INTS, EDGE_FLOATS]
    if isinstance(value, int) and not isinstance(value, bool):
        options += [st.just(float(value) + 0.5), st.just(float(value))]
    return st.one_of(options)


@st.composite
def mutated_specs(draw) -> tuple[dict[str, Any], list[str]]:
    """A plausible spec with up to three mutations; returns (spec, descriptions of what was done)."""
    spec = draw(plausible_specs())
    done: list[str] = []
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 2, 3]))):
        where = draw(st.sampled_from(_locations(spec)))
        if not where:
            kind = draw(st.sampled_from(["unknown", "absurd-object"]))
        else:
            kind = draw(st.sampled_from(["wrong-type", "out-of-range", "delete", "unknown", "null", "absurd", "long-string", "unicode", "any-json"]))
        parent = spec
        for key in where[:-1]:
            parent = parent[key]
        node = parent[where[-1]] if where else spec
        label = "spec" + "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in where)
        if kind == "wrong-type":
            parent[where[-1]] = draw(_wrong_type(node))
        elif kind == "out-of-range":
            parent[where[-1]] = draw(st.one_of(EDGE_INTS, EDGE_FLOATS))
        elif kind == "delete":
            del parent[where[-1]]
        elif kind == "null":
            parent[where[-1]] = None
        elif kind == "unknown":
            target = node if isinstance(node, dict) else spec
            target[draw(st.sampled_from(["extra", "numsteps", "Image", "spec", "ünknown", "x" * 300]))] = draw(SCALARS)
        elif kind == "any-json":
            parent[where[-1]] = draw(ANY_JSON)
        elif kind == "long-string":
            n = draw(st.sampled_from([31, 32, 33, 63, 64, 256, 257, 511, 512, 513, 1023, 1024, 1025, 4096, 40000]))
            parent[where[-1]] = draw(st.sampled_from(["x", "é", "模", "😀"])) * n
        elif kind == "unicode":
            parent[where[-1]] = draw(st.text(UNICODE, min_size=1, max_size=10))
        elif kind in ("absurd", "absurd-object"):
            n = draw(st.sampled_from([17, 64, 65, 128, 129, 1000]))
            choice = draw(st.sampled_from(["list-of-strings", "list-of-objects", "map"]))
            value: Any = (
                ["--flag"] * n
                if choice == "list-of-strings"
                else [{"name": f"w{i}", "concurrency": 1, "requests": 1} for i in range(n)]
                if choice == "list-of-objects"
                else {f"k{i}": "v" for i in range(n)}
            )
            if where:
                parent[where[-1]] = value
            else:
                spec["rollout"] = (
                    {"workloads": value} if choice == "list-of-objects" else {"workloads": [{"name": "a", "concurrency": 1, "requests": 1}] * 2}
                )
        done.append(f"{kind}@{label}")
        if not isinstance(spec, dict):  # pragma: no cover - spec itself is never replaced (where is non-empty)
            break
    return spec, done


# --------------------------------------------------------------------------------------------------
# Our verdict and the API server's


SPEC_SCHEMA = structural_schema(api.SpeculativeServerSpec)


def _kube_path(loc: tuple) -> str:
    return "spec" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc)


class Verdict(NamedTuple):
    valid: bool
    fields: list[str]  # the field paths that are wrong, in the API server's notation
    message: str  # our one-line error
    # The one intended difference: an integral float (3.0) in an integer field. We refuse it; the API server
    # admits it unless a CEL rule reads the field, and then refuses it naming only `spec`.
    integral_floats_only: bool = False


def oracle(spec: dict[str, Any]) -> Verdict:
    """Our own verdict on a spec: what `specdec sglang-args -f` and the operator would say."""
    try:
        resource.parse_spec(spec, check_rules=True)
        return Verdict(True, [], "")
    except InputError as exc:
        message = str(exc)
    try:
        parsed = api.SpeculativeServerSpec.model_validate(spec)
    except ValidationError as exc:
        errors = exc.errors()
        floats = all(e["type"] == "int_type" and isinstance(e["input"], float) and e["input"].is_integer() for e in errors)
        return Verdict(False, [_kube_path(e["loc"]) for e in errors], message, floats)
    # A rule on the whole spec (a CEL rule with a fieldPath, or the release an image names) names its field in our message
    # ("spec: spec.image: ..."), as the API server names it in its refusal.
    named = re.findall(r"(spec(?:\.[A-Za-z][A-Za-z0-9]*)+):", message)
    return Verdict(False, [where for where, _ in violations(SPEC_SCHEMA, resource.dump(parsed), "spec")] or named or ["spec"], message)


def pruned(value: Any, schema: dict[str, Any]) -> Any:
    """What the API server keeps of `value` when unknown fields are not refused: it drops them."""
    if isinstance(value, dict) and schema.get("type") == "object":
        if schema.get("x-kubernetes-preserve-unknown-fields") and "properties" not in schema:
            return value
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        if props is not None:
            keep = schema.get("x-kubernetes-preserve-unknown-fields")
            return {k: pruned(v, props[k]) if k in props else v for k, v in value.items() if k in props or keep}
        if isinstance(extra, dict):
            return {k: pruned(v, extra) for k, v in value.items()}
        return value
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [pruned(v, schema["items"]) for v in value]
    return value


def _normalise(path: str) -> list[str]:
    """'spec.rollout.workloads[0].name' and 'spec.rollout.workloads.0.name' -> the same segments.

    Control characters are dropped: the API server leaves them out of the field names in its messages.
    """
    printable = "".join(ch for ch in path if unicodedata.category(ch) != "Cc")
    return [seg for seg in re.split(r"[.\[\]]", printable) if seg != ""]


def names_a_field(server_fields: list[str], server_message: str, ours: list[str]) -> bool:
    """Whether the API server's refusal names one of the fields our oracle flags (or a parent/child of it)."""
    printable = "".join(ch for ch in server_message if unicodedata.category(ch) != "Cc")
    candidates = list(server_fields) + re.findall(r'(spec(?:[.\[][^\s:"\],]*)+)', printable)
    for theirs in candidates:
        a = _normalise(theirs)
        for path in ours:
            b = _normalise(path)
            common = 0
            while common < min(len(a), len(b)) and a[common] == b[common]:
                common += 1
            if common >= 2 and common == min(len(a), len(b)):
                return True
    return False


def submit(custom: Any, namespace: str, name: str, spec: dict[str, Any], strict: bool) -> tuple[bool, int, str, list[str], dict | None]:
    """Server-side dry-run create: (admitted, HTTP status, message, field paths of the causes, stored object)."""
    from kubernetes.client.rest import ApiException

    body = {"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": "SpeculativeServer", "metadata": {"name": name}, "spec": spec}
    # Ignore, not the default Warn: both prune unknown fields, but Warn sends one Warning header per field and
    # an absurd object overflows http.client's limit of 100 response headers.
    kwargs: dict[str, Any] = {"dry_run": "All", "field_validation": "Strict" if strict else "Ignore"}
    try:
        stored = custom.create_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, body, **kwargs)
        return True, 201, "", [], stored
    except ApiException as exc:
        try:
            status = json.loads(exc.body)
        except (TypeError, ValueError):
            status = {"message": str(exc.body)}
        causes = (status.get("details") or {}).get("causes") or []
        return False, exc.status, status.get("message", ""), [c.get("field", "") for c in causes if c.get("field")], None
