"""A retraining Job's validation stage: the validator's checks of the new export against the target (issue 36, item 3).

`specdec-train validate` runs what `specdec validate` runs in a speculative pod's init container (the operator's
validator: metadata only, config.json, tokenizer files, safetensors headers, training_provenance.json) with the
flags the operator renders there (target, quantization, algorithm, context length, engine), on the export the Job
just wrote. Unlike the init container it does not fail on an incompatible drafter: it records the verdict in
`validation.json` (passed, the error codes, every finding's code and severity) and exits 0, so that the Job publishes
the revision with its verdict and the operator, not a retried pod, decides (a revision that failed validation is
never raced). Input the validator cannot read at all is recorded the same way, as its ValidatorInputError finding.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from specdec_operator.errors import InputError

INPUT_ERROR_CODE = "ValidatorInputError"  # the validator's own code for unusable input (validator/report.unusable_message)


def validate_export(validator_argv: list[str]) -> dict[str, Any]:
    """The validator's verdict on `specdec validate VALIDATOR_ARGV` as validation.json records it."""
    from specdec_operator.validator import ERROR, build_parser, run

    args = build_parser().parse_args(validator_argv)  # a bad flag is InputError: the Job's command line is wrong
    try:
        report, _ = run(args)
    except InputError as exc:
        line = " ".join(str(exc).split())
        return {"passed": False, "codes": [INPUT_ERROR_CODE], "findings": [{"severity": ERROR, "code": INPUT_ERROR_CODE, "message": line}]}
    return {
        "passed": report.compatible,
        "codes": report.codes(ERROR),
        "engine": report.engine,
        "findings": [{"severity": f.severity, "code": f.code, "message": f.message} for f in report.findings],
    }


def write_json(path: str | Path, doc: dict[str, Any]) -> None:
    """Whole or absent: a temporary file renamed over `path` (the next stage reads it)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, path)
