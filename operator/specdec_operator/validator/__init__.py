"""`specdec validate`: can SGLang serve this drafter with this target, and will it accept anything?

- modelmeta.py: bounded reads of a model directory's metadata (config.json, tokenizer files, safetensors
  headers, training_provenance.json), never tensor data.
- tables.py: what the SGLang release supports, read from its source.
- quantization.py: the precision a checkpoint is stored in; the words provenance uses for it.
- checks.py: validate(target, drafter, ...) -> ValidationReport, a pure function of the two ModelMetas.
- report.py: findings and the report, as text and as JSON.
- cli.py: the command line; `specdec validate` runs as the speculative pod's init container.

Standard library only, so that the init container starts in milliseconds.
"""

from .. import SGLANG_VERSION
from .checks import derived_context_length, validate
from .cli import build_parser, main, run
from .quantization import checkpoint_quantization, normalize_quantization
from .report import ERROR, INFO, SEVERITY_ORDER, WARNING, Finding, ValidationReport, format_text, unusable_message

__all__ = [
    "ERROR",
    "INFO",
    "SEVERITY_ORDER",
    "SGLANG_VERSION",
    "WARNING",
    "Finding",
    "ValidationReport",
    "build_parser",
    "checkpoint_quantization",
    "derived_context_length",
    "format_text",
    "main",
    "normalize_quantization",
    "run",
    "unusable_message",
    "validate",
]
