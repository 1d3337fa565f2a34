"""Every name the docs give is one the code has (issue 33, item 3).

The documents are README.md, docs/*.md and charts/*/README.md. Read from them and checked against the checkout:

- repo paths (`tests/cluster/test_chart_cluster.py`, `reconcile/stuck.py`, `docs/benchmarks/...`): each exists, from
  the repo root, the package (`operator/specdec_operator/`) or the document's folder, unless it is one of the
  upstream files the docs cite (UPSTREAM: SGLang's, vLLM's, ... sources) or an example path (EXAMPLES);
- make targets (`make test-unit`, `make tools LWS=1`): each is a target of the Makefile, each variable one it reads;
- CLI flags: those of a `specdec SUB`, `specdec-train STAGE` or `kubectl specdec VERB` command line are flags of
  that command's own argparse parser (captured from its `main`, not copied; a subcommand, stage or `kubectl specdec`
  verb is one the parser has), the flag table of docs/operator.md is exactly `specdec run`'s flags, and any other
  flag written alone (`--probe-timeout`) is one of ours or named in OTHER_FLAGS with the tool it belongs to;
- metrics: each `specdec_*` name is one the operator exports (controller/metrics.py, read from its registry), the
  alerts and the dashboard query only exported metrics, every exported metric is in docs/operator.md's metrics
  table with its labels, and every alert of the chart's PrometheusRule is named in docs/install.md's and the chart
  README's list of alerts, and no other alert is named anywhere;
- fields: each `spec.x.y` / `status.x.y` path is one the CRD's schema has (generated from api.py);
- docs/architecture.md names every module of the package's layers and every step of the reconcile pipeline (the
  functions reconcile/__init__.py's step calls).

Event reasons the docs name are tests/unit/test_docs_drift.py's (its reader of the source lives there).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from tests.support.markdown import section, table

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "operator" / "specdec_operator"
CHART = ROOT / "charts" / "specdec-operator"
OPERATOR_DOC = ROOT / "docs" / "operator.md"
ARCHITECTURE_DOC = ROOT / "docs" / "architecture.md"


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted(ROOT.glob("charts/*/README.md"))]


def _where(path: Path, text: str, offset: int) -> str:
    return f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name}:{text.count(chr(10), 0, offset) + 1}"


def code_spans(text: str) -> Iterator[tuple[int, str]]:
    """(offset, code) of every fenced block (its `\\`-continued lines joined) and every inline code span."""
    fenced = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
    for block in fenced.finditer(text):
        yield block.start(1), re.sub(r"\\\n\s*", " ", block.group(1))
    rest = fenced.sub(lambda b: re.sub(r"[^\n]", " ", b.group(0)), text)  # the same offsets, no fenced code
    for span in re.finditer(r"`([^`\n]+)`", rest):
        yield span.start(1), span.group(1)


# ---------------------------------------------------------------------------------------------------------
# Repo paths

# Files of other projects that the docs cite by their path in that project's tree. Not checked here: they are
# pinned by the release each doc names (hack/versions.env, docs/engines.md, docs/sglang-args.md).
UPSTREAM = {
    # vLLM 0.32
    "vllm/config/speculative.py": "vLLM",
    "vllm/distributed/device_communicators/shm_broadcast.py": "vLLM",
    "vllm/config/vllm.py": "vLLM",
    "vllm/model_executor/models/llama.py": "vLLM",
    "vllm/model_executor/models/llama_eagle3.py": "vLLM",
    "vllm/v1/spec_decode/dynamic/utils.py": "vLLM",
    "vllm/v1/spec_decode/metrics.py": "vLLM",
    "vllm/v1/worker/gpu_model_runner.py": "vLLM",
    "qwen3_dflash.py": "vLLM",  # docs/candidates.md: the DFlash draft class
    # SGLang (python/sglang/...)
    "sglang/benchmark/serving.py": "SGLang",
    "sglang/srt/models/llama.py": "SGLang",
    "srt/models/kimi_k25_eagle3.py": "SGLang",
    "srt/models/llama_eagle3.py": "SGLang",
    "srt/speculative/adaptive_spec_params.py": "SGLang",
    "speculative/eagle_worker_v2.py": "SGLang",
    "scheduler_components/batch_result_processor.py": "SGLang",
    "arg_groups/speculative_hook.py": "SGLang",
    "sglang/srt/speculative/spec_info.py": "SGLang",  # docs/candidates.md: SpeculativeAlgorithm per release
    "models/dflash.py": "SGLang",
    "utils/hf_transformers/common.py": "SGLang",
    "deepseek_v2.py": "SGLang",
    "gemma3_causal.py": "SGLang",
    "gemma4_causal.py": "SGLang",
    "glm4_moe_lite.py": "SGLang",
    "gpt_oss.py": "SGLang",
    "llama.py": "SGLang",
    "mindspore.py": "SGLang",
    "minimax_m3.py": "SGLang",
    "minimax_m3_vl.py": "SGLang",
    "model_config.py": "SGLang",
    # LeaderWorkerSet v0.9.0
    "config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml": "LeaderWorkerSet",
    "config/webhook/manifests.yaml": "LeaderWorkerSet",
    # EAGLE's repository (published drafter configs, tests/data/published_configs/SOURCES.json)
    "eagle/train/Mixtral_8x7B_config.json": "EAGLE",
    "eagle/traineagle3/config.json": "EAGLE",
    "traineagle3/config.json": "EAGLE",
}

# Paths that are not files of any tree: what a command writes (make manifests -> dist/), and a user's files on a
# volume in the docs' examples.
EXAMPLES = {
    "dist/install.yaml",
    "dist/crds.yaml",
    "dist/release/release.txt",  # make release
    "dist/release/krew/specdec.yaml",
    "datasets/absent.jsonl",
    "datasets/bad.jsonl",
    "datasets/chat.jsonl",
    "chat/good.jsonl",
}

_EXT = r"(?:py|md|yaml|yml|json|jsonl|txt|sh|lua|toml|env|go|mod|sum|tpl|lock|cfg|ini)"
# A path: no scheme, host or variable before it ($TMP/..., https://host/..., ~/.cache/... are not repo paths).
_PATH = re.compile(r"(?<![\w./:@$~\\-])((?:\.\.?/)?[\w.-]+(?:/[\w.-]+)*\." + _EXT + r")(?![\w/-])")
_TOP = ("operator", "tests", "benchmarks", "hack", "charts", "crds", "docs", "examples", "images", "drafter_training")
# A folder of the repo (a glob or a placeholder after it, docs/*.md or tests/unit/test_<x>.py, is no path).
_DIR = re.compile(r"(?<![\w./:@$~\\-])((?:" + "|".join(_TOP) + r")/[\w./-]*+)(?![*{<])")
_SKIP_DIRS = {".git", ".venv", "node_modules", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache", "dist", "build"}


def repo_basenames() -> set[str]:
    names: set[str] = set()
    for _dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS and not d.endswith(".egg-info")]
        names.update(filenames)
    return names


def _resolves(token: str, doc: Path, attribute: bool = False) -> bool:
    """``token`` names a file or folder; ``attribute``: or a module's attribute (tests/support/tiny_models.make_model)."""
    token = token.rstrip("./")
    folder, _, last = token.rpartition("/")
    module = f"{folder}/{last.split('.')[0]}.py" if attribute and "." in last else None
    return any(
        (base / token).exists() or (module is not None and (base / module).is_file()) for base in (ROOT, doc.parent, PACKAGE, ROOT / "operator")
    )


def missing_paths(docs: list[Path]) -> list[str]:
    names = repo_basenames()
    missing = []
    for doc in docs:
        text = doc.read_text()
        for match in _PATH.finditer(text):
            token = match.group(1)
            if token in UPSTREAM or token in EXAMPLES or token.split("/")[0].isupper():
                continue  # the last: a placeholder folder, e.g. TMP/cases/...
            if "/" in token:
                ok = _resolves(token, doc)
            else:  # a file named alone: the docs' own pages and modules; a model's config.json is not ours
                ok = not token.endswith((".py", ".md")) or token in names or (doc.parent / token).exists()
            if not ok:
                missing.append(f"{_where(doc, text, match.start())}: {token}")
        for match in _DIR.finditer(text):
            token = match.group(1)
            if not _PATH.fullmatch(token) and not _resolves(token, doc, attribute=True):
                missing.append(f"{_where(doc, text, match.start())}: {token}")
    return missing


def test_every_repo_path_the_docs_name_exists() -> None:
    missing = missing_paths(documents())
    assert not missing, "paths the docs name that do not exist (a file of another project goes into UPSTREAM):\n" + "\n".join(missing)


def test_the_path_reader_finds_what_it_must(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(
        "see tests/cluster/test_chart.py and `reconcile/stuck.py`, [x](nothing.md), hack/nowhere/, vllm/config/speculative.py,\n"
        "$TMP/cases/a/config.json, https://example.com/a/b.py, ~/.cache/x/y.py, config.json, dist/install.yaml, docs/*.md,\n"
        "tests/unit/test_docs_drift*.py, tests/support/tiny_models.make_model, tests/support/nothing.make_model\n"
    )
    assert [m.split(": ", 1)[1] for m in missing_paths([doc])] == [
        "tests/cluster/test_chart.py",
        "nothing.md",
        "hack/nowhere/",
        "tests/support/nothing.make_model",
    ]


# ---------------------------------------------------------------------------------------------------------
# Make targets


def make_targets() -> tuple[set[str], str]:
    text = (ROOT / "Makefile").read_text()
    targets = {t for line in re.findall(r"^([A-Za-z0-9_. -]+?)\s*:(?!=)", text, re.MULTILINE) for t in line.split()}
    return targets, text


def test_every_make_target_the_docs_name_exists() -> None:
    targets, makefile = make_targets()
    wrong = []
    for doc in documents():
        text = doc.read_text()
        for offset, code in code_spans(text):
            code = re.sub(r"(?:^|\s)#.*$", "", code, flags=re.MULTILINE)  # a shell comment is prose
            for call in re.finditer(r"(?:^|[\s;&(|])make((?:[ \t]+[^\s;&|#)`]+)+)", code, re.MULTILINE):
                for word in call.group(1).split():
                    if word.startswith("-"):
                        continue
                    if "=" in word:
                        variable = word.split("=")[0]
                        if not re.search(rf"\b{re.escape(variable)}\b", makefile):
                            wrong.append(f"{_where(doc, text, offset)}: make variable {variable} (not in the Makefile)")
                    elif word not in targets:
                        wrong.append(f"{_where(doc, text, offset)}: make {word}")
    assert not wrong, "make targets the docs name that the Makefile does not have:\n" + "\n".join(wrong)


# ---------------------------------------------------------------------------------------------------------
# CLI flags


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


def captured_parser(main: Callable[..., Any], argv: list[str]) -> argparse.ArgumentParser:
    """The parser a command's `main` builds: its first parse is stopped and the parser kept (nothing runs)."""

    def stop(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        raise _Captured(self)

    with mock.patch.object(argparse.ArgumentParser, "parse_known_args", stop):
        try:
            main(argv)
        except _Captured as captured:
            return captured.parser
    raise AssertionError(f"{main.__module__}.main parsed no arguments")


def _flags(parser: argparse.ArgumentParser) -> tuple[set[str], dict[str, argparse.ArgumentParser]]:
    flags: set[str] = set()
    subparsers: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        flags.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            subparsers.update(action.choices)
    return flags, subparsers


def cli_flags() -> dict[str, set[str]]:
    """`specdec SUB`, `specdec-train STAGE`, `kubectl specdec` -> the flags its parser accepts."""
    from drafter_training import cli as train_cli
    from specdec_operator.cli import COMMANDS, kubectl_specdec

    commands = {}
    for name, (module, _help) in COMMANDS.items():
        commands[f"specdec {name}"] = _flags(captured_parser(importlib.import_module(module).main, ["--help"]))[0]
    common, stages = _flags(captured_parser(train_cli.main, ["--help"]))
    for stage, parser in stages.items():
        commands[f"specdec-train {stage}"] = common | _flags(parser)[0]
    commands["kubectl specdec"] = _flags(captured_parser(kubectl_specdec.main, ["--help"]))[0]
    return commands


# Flags the docs write alone that belong to other programs (SGLang's and vLLM's servers, Kubernetes and its tools,
# pip, pytest) or to a benchmark script of this repo (run as `.venv/bin/python benchmarks/NAME.py --flag`).
OTHER_FLAGS = {
    "--runs": "benchmarks/probe_settle.py",
    "--audit": "benchmarks/scale.py",
    "--baseline": "benchmarks/scale.py",
    "--memory-report": "benchmarks/scale.py",
    "--tuned-control-plane": "benchmarks/scale.py",
    "--backend": "benchmarks/probe_calibration.py",
    "--case": "benchmarks/probe_calibration.py",
    "--part": "benchmarks/probe_calibration.py",
    "--quick": "benchmarks/probe_calibration.py",
    "--repeats": "benchmarks/probe_calibration.py",
    "--name": "python -m hack.devcluster",
    "--set": "helm",  # docs/install.md, mirroring a release
    "--plain-http": "helm",
    "--tls-verify": "buildah",
    "--print-dir": "python -m hack.devcluster",
    "--dataset-name": "SGLang's bench_serving",
    "--disable-ignore-eos": "SGLang's bench_serving",
    "--cuda-graph-max-bs": "SGLang",
    "--speculative-ngram-branch-length": "SGLang 0.5.9",  # docs/candidates.md
    "--cuda-graph-max-bs-decode": "SGLang",
    "--cuda-graph-max-bs-prefill": "SGLang",
    "--disable-radix-cache": "SGLang",
    "--dist-init-addr": "SGLang",
    "--enable-metrics": "SGLang",
    "--max-running": "SGLang (a prefix of --max-running-requests)",
    "--max-running-requests": "SGLang",
    "--mem-fraction-static": "SGLang",
    "--model-path": "SGLang",
    "--model-type": "SGLang",
    "--nccl-init-addr": "SGLang",
    "--nnodes": "SGLang",
    "--node-rank": "SGLang",
    "--speculative-algorithm": "SGLang",
    "--speculative-draft-model-path": "SGLang",
    "--speculative-eagle-topk": "SGLang",
    "--speculative-num-draft-tokens": "SGLang",
    "--speculative-num-steps": "SGLang",
    "--tp": "SGLang (a prefix of --tp-size)",
    "--tp-size": "SGLang",
    "--data-parallel-size": "vLLM",
    "--dtype": "vLLM",
    "--json-flag": "vLLM (its --json-flag.key form)",
    "--kv-cache-memory-bytes": "vLLM",
    "--max-model-len": "vLLM",
    "--max-num-seq": "vLLM (a prefix of --max-num-seqs)",
    "--speculative-config": "vLLM",
    "--authorization-mode": "kube-apiserver",
    "--service-cluster-ip-range": "kube-apiserver",
    "--use-service-account-credentials": "kube-controller-manager",
    "--unsafe-no-fsync": "etcd",
    "--force-conflicts": "kubectl",
    "--no-cache-dir": "pip",
    "--no-deps": "pip",
    "--dist": "pytest-xdist",
    "--durations": "pytest",
}

_COMMAND = re.compile(r"(?:^|(?<=[\s`($\"'/]))(kubectl specdec|specdec-train|specdec)(?=\s)([^\n|;&#)]*)", re.MULTILINE)


def kubectl_verbs() -> set[str]:
    """The verbs `kubectl specdec` accepts (its parser's first positional argument)."""
    from specdec_operator.cli import kubectl_specdec

    parser = captured_parser(kubectl_specdec.main, ["--help"])
    return {str(c) for action in parser._actions if action.dest == "verb" for c in action.choices or ()}


def wrong_flags(docs: list[Path], commands: dict[str, set[str]], verbs: set[str]) -> list[str]:
    ours = set().union(*commands.values())
    subcommands = {name.split()[-1] for name in commands if name.startswith("specdec ")}
    stages = {name.split()[-1] for name in commands if name.startswith("specdec-train ")}
    wrong = []
    for doc in docs:
        text = doc.read_text()
        for offset, code in code_spans(text):
            for call in _COMMAND.finditer(code):
                program, words = call.group(1), call.group(2).split()
                if program == "kubectl specdec":
                    command = program
                    if words and re.fullmatch(r"[a-z]+", words[0]) and words[0] not in verbs:
                        wrong.append(f"{_where(doc, text, offset)}: kubectl specdec {words[0]} (no such verb)")
                elif not words or not re.fullmatch(r"[a-z][a-z-]*", words[0]):
                    continue  # `specdec COMMAND --help`, `specdec --version`
                elif words[0] not in (subcommands if program == "specdec" else stages):
                    wrong.append(f"{_where(doc, text, offset)}: {program} {words[0]} (no such command)")
                    continue
                else:
                    command = f"{program} {words[0]}"
                for word in words:
                    flag = word.split("=")[0].strip("`\"'")
                    if re.fullmatch(r"--?[A-Za-z][\w-]*", flag) and flag not in commands[command]:
                        wrong.append(f"{_where(doc, text, offset)}: {command} {flag}")
            for alone in re.finditer(r"^(--[a-z0-9][a-z0-9-]*)(?:[ =].*)?$", code):
                flag = alone.group(1)
                if flag not in ours and flag not in OTHER_FLAGS:
                    wrong.append(f"{_where(doc, text, offset)}: {flag} (no command of ours has it)")
    return wrong


def test_every_flag_the_docs_give_a_command_is_that_commands() -> None:
    wrong = wrong_flags(documents(), cli_flags(), kubectl_verbs())
    assert not wrong, "flags the docs give that the command does not have (another program's flag goes into OTHER_FLAGS):\n" + "\n".join(wrong)


def test_the_operator_flag_table_is_specdec_runs() -> None:
    documented = {flag for row in table(OPERATOR_DOC, "Flag | Default") for flag in re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", row[0])}
    actual = cli_flags()["specdec run"] - {"-h", "--help"}
    assert documented == actual, (
        f"docs/operator.md's flag table only: {sorted(documented - actual)}; `specdec run` only: {sorted(actual - documented)}"
    )


def test_the_flag_reader_finds_what_it_must(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(
        "```console\nspecdec run --namespace demo --no-such-flag \\\n  --standalone\nspecdec-train export --run r --nope x\n```\n"
        "`kubectl specdec abort x --reason y --force`, `specdec validte --target t`, `--probe-timeout`, `--nonsense`,\n"
        "`specdec COMMAND --help`, `--tp`, `kubectl specdec status x`, `kubectl specdec unpause x`\n"
    )
    commands = cli_flags()
    assert [w.split(": ", 1)[1] for w in wrong_flags([doc], commands, kubectl_verbs())] == [
        "specdec run --no-such-flag",
        "specdec-train export --nope",
        "kubectl specdec --force",
        "specdec validte (no such command)",
        "--nonsense (no command of ours has it)",
        "kubectl specdec unpause (no such verb)",
    ]


# ---------------------------------------------------------------------------------------------------------
# Metrics and alerts


def exported_metrics() -> dict[str, set[str]]:
    """The metrics the operator exports (as scraped: a counter with `_total`) -> their label names, read from a
    real OperatorMetrics registry after every series has a value."""
    from specdec_operator.controller.metrics import OperatorMetrics

    metrics = OperatorMetrics()
    status = {"phase": "Promoted", "activeVariant": "speculative", "speedup": 1.5, "acceptLength": 2.5, "reason": "SpeedupConfirmed"}
    race = {"race": {"revision": "r", "state": "Decided"}, "candidates": [{"name": "eagle3", "state": "Serving"}]}
    metrics.observe_status("ns", "name", {**status, "gpus": {"base": 8, "speculative": 8, "idle": 8}, **race})
    collector: Any
    for collector in list(metrics.registry._collector_to_names):
        labelnames = getattr(collector, "_labelnames", None)
        if labelnames is None:
            continue
        child = collector.labels(*["x"] * len(labelnames)) if labelnames else collector
        (child.inc if hasattr(child, "inc") else child.observe)(1)
    exported: dict[str, set[str]] = {}
    for family in metrics.registry.collect():
        name = f"{family.name}_total" if family.type == "counter" else family.name
        exported[name] = {label for sample in family.samples for label in sample.labels} - {"le"}
    return exported


def _series_names(exported: dict[str, set[str]]) -> set[str]:
    """Every name a scrape can show: histograms' _bucket, _sum and _count too."""
    return set(exported) | {f"{name}{suffix}" for name in exported for suffix in ("_bucket", "_sum", "_count", "_created")}


_METRIC = re.compile(r"\bspecdec_[a-z0-9_]+\b")


def test_every_metric_the_docs_name_is_exported() -> None:
    names = _series_names(exported_metrics())
    wrong = [
        f"{_where(doc, text, m.start())}: {m.group(0)}"
        for doc in documents()
        for text in [doc.read_text()]
        for m in _METRIC.finditer(text)
        if m.group(0) != "specdec_operator" and m.group(0) not in names
    ]
    assert not wrong, "metrics the docs name that the operator does not export:\n" + "\n".join(wrong)


def test_the_alerts_and_the_dashboard_query_exported_metrics() -> None:
    names = _series_names(exported_metrics())
    for path in [CHART / "templates" / "prometheusrule.yaml", *sorted((CHART / "dashboards").glob("*.json"))]:
        used = set(_METRIC.findall(path.read_text())) - {"specdec_operator"}
        assert used and used <= names, f"{path.relative_to(ROOT)} queries {sorted(used - names)}, which the operator does not export"


def test_the_metrics_table_is_what_the_operator_exports() -> None:
    documented = {
        row[0].strip("`"): {label.strip() for label in row[1].split(",") if label.strip()} for row in table(OPERATOR_DOC, "Metric | Labels")
    }
    exported = exported_metrics()
    assert set(documented) == set(exported), (
        f"docs/operator.md's metrics table only: {sorted(set(documented) - set(exported))}; exported only: {sorted(set(exported) - set(documented))}"
    )
    for name, labels in exported.items():
        assert documented[name] == labels, f"{name}: docs/operator.md says labels {sorted(documented[name])}, the operator exports {sorted(labels)}"


def chart_alerts() -> list[str]:
    return re.findall(r"^\s*- alert: (\w+)", (CHART / "templates" / "prometheusrule.yaml").read_text(), re.MULTILINE)


def test_every_alert_the_docs_name_is_the_charts() -> None:
    alerts = set(chart_alerts())
    assert len(alerts) >= 6
    wrong = [
        f"{_where(doc, text, m.start())}: {m.group(0)}"
        for doc in documents()
        for text in [doc.read_text()]
        for m in re.finditer(r"\bSpecdec[A-Z]\w+", text)
        if m.group(0) not in alerts
    ]
    assert not wrong, "alerts the docs name that the chart's PrometheusRule does not have:\n" + "\n".join(wrong)


@pytest.mark.parametrize("doc", [ROOT / "docs" / "install.md", CHART / "README.md"], ids=["install.md", "chart-README"])
def test_the_alert_lists_name_every_alert_of_the_chart(doc: Path) -> None:
    """The list of alerts (the paragraph or table row that names the first one) names them all."""
    alerts = chart_alerts()
    blocks = [b for b in re.split(r"\n\s*\n|\n(?=\|)", doc.read_text()) if alerts[0] in b]
    assert blocks, f"{doc.relative_to(ROOT)} does not list the chart's alerts"
    missing = [alert for alert in alerts if alert not in blocks[0]]
    assert not missing, f"{doc.relative_to(ROOT)}'s list of alerts does not name {missing}"


# ---------------------------------------------------------------------------------------------------------
# Fields of the resource

# `spec.`/`status.` paths in the docs that are not the SpeculativeServer's: another resource's field.
OTHER_FIELDS = {"spec.healthCheckExprs": "Flux's Kustomization (docs/install.md)"}

_FIELD = re.compile(r"(?<![\w./-])((?:spec|status)(?:\.[A-Za-z_]\w*(?:\[\d*\])?)+)(?![\w(\[])")


def _schema_has(node: dict[str, Any], parts: list[str]) -> bool:
    for part in parts:
        if node.get("x-kubernetes-preserve-unknown-fields"):
            return True
        if node.get("type") == "array":
            node = node.get("items") or {}
        properties = node.get("properties")
        if properties is None:
            additional = node.get("additionalProperties")
            if not additional:
                return False
            node = additional if isinstance(additional, dict) else {}
            continue
        if part not in properties:
            return False
        node = properties[part]
    return True


def wrong_fields(docs: list[Path]) -> list[str]:
    from specdec_operator import crd

    schema = crd.custom_resource_definition()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    # reconcile/status.py's functions (status.build_status) and modules (status.py) are not fields.
    status_module = {n.name for n in ast.parse((PACKAGE / "reconcile" / "status.py").read_text()).body if isinstance(n, ast.FunctionDef)}
    wrong = []
    for doc in docs:
        text = doc.read_text()
        for match in _FIELD.finditer(text):
            token = match.group(1)
            parts = [re.sub(r"\[\d*\]$", "", part) for part in token.split(".")]
            if token in OTHER_FIELDS or parts[1] in ("py", "md") or (parts[0] == "status" and parts[1] in status_module):
                continue
            if not _schema_has(schema, parts):
                wrong.append(f"{_where(doc, text, match.start())}: {token}")
    return wrong


def test_every_spec_and_status_field_the_docs_name_is_the_crds() -> None:
    wrong = wrong_fields(documents())
    assert not wrong, "fields the docs name that the CRD does not have (another resource's goes into OTHER_FIELDS):\n" + "\n".join(wrong)


def test_the_field_reader_finds_what_it_must(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(
        "`spec.rollout.keepBaseWarm`, spec.rollout.keepBaseWarmer, status.gpus.idle, status.gpus.unused, status.py,\n"
        "status.build_status, has(status.conditions) && status.conditions.exists(c, ...), spec.sglang.env[0].name,\n"
        "spec.rollout.workloads[].prompts.configMap, spec.podTemplate.metadata.labels.team, facts.spec.engine\n"
    )
    assert [w.split(": ", 1)[1] for w in wrong_fields([doc])] == ["spec.rollout.keepBaseWarmer", "status.gpus.unused"]


# ---------------------------------------------------------------------------------------------------------
# docs/architecture.md: the modules and the pipeline


def test_the_architecture_names_every_module_of_the_layers() -> None:
    """Each module of the package's top level, controller/, reconcile/ and cli/ by its file name, each other
    package (engines/, probe/, ...) by its folder, in the layer diagram."""
    diagram = re.search(r"```\n(.*?)```", ARCHITECTURE_DOC.read_text(), re.DOTALL)
    assert diagram
    text = diagram.group(1)
    missing = []
    for path in sorted(PACKAGE.iterdir()):
        if path.is_dir() and (path / "__init__.py").exists() and path.name not in ("controller", "reconcile", "cli"):
            if f"{path.name}/" not in text:
                missing.append(f"{path.name}/")
    for folder in (PACKAGE, PACKAGE / "controller", PACKAGE / "reconcile", PACKAGE / "cli"):
        for path in sorted(folder.glob("*.py")):
            if path.name in ("__main__.py",) or (path.name == "__init__.py" and folder == PACKAGE):
                continue
            if not re.search(rf"(?<![\w/]){re.escape(path.name)}", text):
                missing.append(str(path.relative_to(PACKAGE)))
    assert not missing, f"docs/architecture.md's layer diagram does not name {missing}"


def pipeline_steps() -> list[str]:
    """The functions of reconcile's own modules (and steering.py) that one step calls, in reconcile/__init__.py's
    `_serve` and `_within_deadline` (predicates `is_*` and classes aside)."""
    source = ast.parse((PACKAGE / "reconcile" / "__init__.py").read_text())
    local: set[str] = {"steering"}
    for node in source.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            local.update(alias.asname or alias.name for alias in node.names)
    steps = []
    for function in source.body:
        if isinstance(function, ast.FunctionDef) and function.name in ("_serve", "_within_deadline"):
            for call in ast.walk(function):
                if not isinstance(call, ast.Call):
                    continue
                func = call.func
                if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in local:
                    name = f"{func.value.id}.{func.attr}"
                elif isinstance(func, ast.Name) and func.id in local:
                    name = func.id
                else:
                    continue
                last = name.split(".")[-1]
                if not last.startswith("is_") and not last[:1].isupper() and name not in steps:
                    steps.append(name)
    return steps


def test_the_architecture_pipeline_names_every_step() -> None:
    decide = section(ARCHITECTURE_DOC, "## From a Kopf event")
    steps = pipeline_steps()
    assert {"gather_facts", "steering.read", "deadline.waiting_for"} <= set(steps)
    missing = [step for step in steps if not re.search(rf"\b{re.escape(step)}\b", decide)]
    assert not missing, f"docs/architecture.md's step description does not name {missing}"
