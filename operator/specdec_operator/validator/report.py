"""What the validator says: findings and the report, as text, as JSON (`--json`), and as the compact
termination message the operator reads into status.validation."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .. import SGLANG_VERSION
from ..enginefacts import facts_for
from ..textutil import clip

ERROR, WARNING, INFO = "error", "warning", "info"
SEVERITY_ORDER = {ERROR: 0, WARNING: 1, INFO: 2}
TERMINATION_MESSAGE_LIMIT = 4096  # bytes Kubernetes keeps of /dev/termination-log


@dataclass(frozen=True)
class Finding:
    """One result of a check. `field` says where the fact came from, e.g. 'drafter.config.hidden_size'."""

    severity: str
    code: str
    message: str
    field: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"severity": self.severity, "code": self.code, "message": self.message, "field": self.field}


@dataclass
class ValidationReport:
    """Findings plus the facts they were derived from."""

    algorithm: str
    serving_quantization: str | None
    checkpoint_quantization: str | None
    engine: str  # the serving engine the pair was checked for (sglang | vllm)
    findings: list[Finding] = field(default_factory=list)
    target: dict[str, Any] = field(default_factory=dict)
    drafter: dict[str, Any] = field(default_factory=dict)

    @property
    def compatible(self) -> bool:
        return not any(f.severity == ERROR for f in self.findings)

    def codes(self, severity: str | None = None) -> list[str]:
        return [f.code for f in self.findings if severity is None or f.severity == severity]

    def to_dict(self) -> dict[str, Any]:
        return {
            "compatible": self.compatible,
            "algorithm": self.algorithm,
            "engine": self.engine,
            "engine_version": facts_for(self.engine).version,
            "sglang_version": SGLANG_VERSION,  # the SGLang release the validator's tables mirror, whatever the engine
            "serving_quantization": self.serving_quantization,
            "checkpoint_quantization": self.checkpoint_quantization,
            "findings": [f.as_dict() for f in self.findings],
            "target": self.target,
            "drafter": self.drafter,
        }

    def termination_message(self, limit: int = TERMINATION_MESSAGE_LIMIT) -> str:
        """Compact JSON that always fits Kubernetes' termination-message limit (ASCII, so chars == bytes)."""
        base: dict[str, Any] = {
            "compatible": self.compatible,
            "serving_quantization": self.serving_quantization,
            "findings": [],
        }
        items = [{"severity": f.severity, "code": f.code, "message": clip(f.message, 400)} for f in self.findings]
        return _fit_json(base, "findings", items, limit)


def _fit_json(base: dict[str, Any], key: str, items: list[Any], limit: int) -> str:
    """Put as many of `items` under `key` as fit in `limit` bytes, with "truncated": n for the rest."""

    def dump(doc: dict[str, Any]) -> str:
        return json.dumps(doc, ensure_ascii=True, separators=(",", ":"))

    kept = list(items)
    while True:
        doc = dict(base, **{key: kept})
        if len(kept) < len(items):
            doc["truncated"] = len(items) - len(kept)
        text = dump(doc)
        if len(text) <= limit or not kept:
            return text[:limit]
        kept.pop()  # findings are sorted errors first, so infos and warnings go first


def unusable_message(line: str, limit: int = TERMINATION_MESSAGE_LIMIT) -> str:
    """The termination message for unusable input: the one line, also as an error finding so that a
    reader of `findings` (the operator's status.validation) shows it."""
    clipped = clip(line, 1800)
    while True:  # non-ASCII text grows sixfold as \uXXXX escapes
        doc = {"compatible": False, "unusable": clipped, "findings": [{"severity": ERROR, "code": "ValidatorInputError", "message": clipped}]}
        text = json.dumps(doc, ensure_ascii=True, separators=(",", ":"))
        if len(text) <= limit:
            return text
        clipped = clip(clipped, len(clipped) * 3 // 4)


def format_text(report: ValidationReport) -> str:
    """The human-readable report."""
    n_err, n_warn = len(report.codes(ERROR)), len(report.codes(WARNING))
    verdict = "compatible" if report.compatible else "INCOMPATIBLE"
    engine = facts_for(report.engine)
    lines = [
        f"{verdict}: {n_err} error(s), {n_warn} warning(s) ({report.algorithm}, serving "
        f"{report.serving_quantization or 'unknown'} on {engine.name} {engine.version})"
    ]
    for f in report.findings:
        lines.append(f"  {f.severity:<7} {f.code}: {f.message}")
    t, d = report.target, report.drafter
    arch = lambda facts: (facts.get("architectures") or ["?"])[0]  # noqa: E731
    lines.append(
        f"target:  {arch(t)} hidden {t.get('hidden_size')}, vocab {t.get('vocab_size')}, "
        f"{t.get('num_hidden_layers')} layers, {t.get('quantization') or 'unknown'} ({t.get('path')})"
    )
    lines.append(
        f"drafter: {arch(d)} hidden {d.get('hidden_size')}, vocab {d.get('vocab_size')}, draft vocab "
        f"{d.get('draft_vocab_size', '-')}, {d.get('tensors', '?')} tensors ({d.get('path')})"
    )
    return "\n".join(lines)
