"""spec.retraining and status.retraining: retraining drafters on the traffic the server really sees (issue 36).

``capture``, the opt-in sampling of what users send into a claim in the resource's namespace (docs/capture.md);
``training``, the training Jobs' settings (api_retraining_job.py); ``revision``, the user's pin of the served drafter
(a trained revision or spec.drafter). status.retraining: the capture, the training Jobs, the revision serving and the
revisions' rows (docs/retraining.md).

The models follow api.py's conventions (camelCase on the wire, unknown fields refused, no coercion, null is
unset) through a base of their own: api.py imports this module, so this module cannot import api.py's bases.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import ConfigDict, Field, field_validator

from .api_retraining_job import MAX_REVISION_ROWS, RetrainingTraining, RevisionStatus, TrainingStatus
from .apimodel import StrictModel

# The header a client sends to keep one request out of the capture (docs/capture.md); its values that mean "off".
OPT_OUT_HEADER = "X-Specdec-Capture"
OPT_OUT_VALUES = frozenset({"off", "no", "false", "0"})
DEFAULT_SAMPLE_SHARE = 0.01
DEFAULT_MAX_BYTES = 1 << 30
DEFAULT_RETENTION_HOURS = 168
MAX_PATTERNS = 32

CaptureState = Literal["Off", "Starting", "On", "Bypassed"]


class Redaction(StrictModel):
    patterns: list[str] = Field(
        default_factory=list,
        description="Python regular expressions replaced by `replacement` in every captured text (messages' contents, the prompt, "
        "the answer) before a record is written.",
        max_length=MAX_PATTERNS,
        json_schema_extra={"items": {"type": "string", "maxLength": 512}},
    )
    replacement: str = Field("[REDACTED]", description="What each match of a pattern is replaced with.", max_length=64)
    url: str | None = Field(
        None,
        description="Your redaction service (http or https): each record, as JSON, is POSTed to it after the patterns and its JSON "
        "answer is written instead. A failure or a 5 s timeout drops the record: nothing unredacted is written.",
        pattern=r"^https?://[^\s]+$",
        max_length=512,
    )

    @field_validator("patterns")
    @classmethod
    def _patterns_compile(cls, value: list[str]) -> list[str]:
        for i, pattern in enumerate(value):
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"[{i}] {pattern!r} is not a Python regular expression ({exc}); fix or remove it") from None
        return value


class CaptureSettings(StrictModel):
    enabled: bool = Field(
        True, description="Capture while true. false (or removing the section) deletes the capture proxy, its claim and the captured data."
    )
    sample_share: float = Field(
        DEFAULT_SAMPLE_SHARE,
        alias="sampleShare",
        description="The share of chat/completions requests captured, each request drawn independently.",
        gt=0,
        le=1,
    )
    include_responses: bool = Field(
        False, alias="includeResponses", description="Also keep the answer's text (a streamed answer is assembled from its chunks)."
    )
    max_bytes: int = Field(
        DEFAULT_MAX_BYTES,
        alias="maxBytes",
        description="Size cap of the stored records in bytes: the oldest files are deleted first. The claim is sized from it.",
        ge=1 << 20,
        le=1 << 40,
    )
    retention_hours: int = Field(
        DEFAULT_RETENTION_HOURS,
        alias="retentionHours",
        description="A file of records older than this is deleted.",
        ge=1,
        le=24 * 366,
    )
    storage_class_name: str | None = Field(
        None,
        alias="storageClassName",
        description="The claim's storage class (encryption at rest is the class's). Unset: the cluster's default class.",
        max_length=253,
    )
    access_mode: Literal["ReadWriteOnce", "ReadWriteMany"] = Field(
        "ReadWriteOnce",
        alias="accessMode",
        description="The claim's access mode. ReadWriteOnce keeps every capture pod on one node; ReadWriteMany lets them spread.",
    )
    replicas: int = Field(1, description="Capture proxy pods in front of the servers.", ge=1, le=16)
    redaction: Redaction | None = Field(None, description="Redaction applied to every record before it is written.")


class Retraining(StrictModel):
    capture: CaptureSettings | None = Field(
        None,
        description="Opt-in capture of a sampled share of the requests the stable Service receives, into a claim in this namespace "
        "(docs/capture.md). Unset: nothing is captured.",
    )
    training: RetrainingTraining | None = Field(
        None,
        description="Training Jobs that retrain the drafter on the captured traffic: their budget, triggers and limits "
        "(docs/retraining.md): the operator starts one on a trigger, within the limits. Unset: no retraining.",
    )
    revision: str | None = Field(
        None,
        description="Pins the drafter that serves: a trained revision's name (<name>-train-<n>, see status.retraining.revisions) or "
        "'drafter' for spec.drafter itself. Unset: the operator chooses (the newest promoted revision, else spec.drafter). The "
        "operator never changes this field: a pin is your decision, kept in Git.",
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        max_length=63,
    )


def capture_on(retraining: Retraining | None) -> CaptureSettings | None:
    """The capture settings when capture is on, else None."""
    capture = retraining.capture if retraining is not None else None
    return capture if capture is not None and capture.enabled else None


class CaptureStatus(StrictModel):
    model_config = ConfigDict(strict=False)
    state: CaptureState = Field(
        description="Off; Starting (the capture proxy is not Ready yet: the servers serve directly); On (the stable Service's traffic "
        "passes the capture proxy); Bypassed (no capture pod is Ready: the servers serve directly)."
    )
    claim_name: str | None = Field(None, alias="claimName", description="The PersistentVolumeClaim holding the captured records.")
    claim_size: str | None = Field(
        None, alias="claimSize", description="The claim's storage request as created (a later maxBytes does not resize it)."
    )
    claim_storage_class_name: str | None = Field(
        None, alias="claimStorageClassName", description="The claim's storage class as created (unset: the cluster's default)."
    )
    claim_access_mode: str | None = Field(None, alias="claimAccessMode", description="The claim's access mode as created.")
    conversations: int | None = Field(
        None,
        ge=0,
        description="Chat requests stored on the claim that a training Job can use (repeats included), as the capture proxies count "
        "them (read at most once a minute); unset: not known now (no capture proxy Ready or reachable).",
    )
    message: str | None = Field(None, description="For humans: what is captured and where, or why capture is bypassed.", max_length=1024)


class RetrainingStatus(StrictModel):
    model_config = ConfigDict(strict=False)
    capture: CaptureStatus | None = Field(None, description="The capture of the stable Service's traffic (spec.retraining.capture).")
    training: TrainingStatus | None = Field(None, description="The training Jobs of spec.retraining.training (docs/retraining.md).")
    serving: str | None = Field(
        None, description="The trained revision that serves now (its drafter /revisions/<name> on the claim <name>-revisions); unset: spec.drafter."
    )
    revisions: list[RevisionStatus] = Field(
        default_factory=list,
        description="The trained revisions, newest last, with their offline and live figures and outcome (docs/retraining.md).",
        max_length=MAX_REVISION_ROWS,
    )
    pin_refused: str | None = Field(
        None,
        alias="pinRefused",
        description="Why spec.retraining.revision is not served (a revision this resource does not have, or one pruned), and the fix.",
        max_length=1024,
    )
