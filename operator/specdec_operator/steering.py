"""What people asked the operator to do by hand: retry, abort, promote, pause and resume, read from annotations.

Annotations on the SpeculativeServer itself, so that the same request comes from `kubectl specdec` (which patches
them) and from Git (a manifest that carries them; Argo CD and Flux apply metadata.annotations like any field):

    specdec.io/retry: <token>     probe the current revision again, once per new token, without restarting the base
    specdec.io/abort: <reason>    back to the base now, and stay there while the annotation is present
    specdec.io/promote: <reason>  promote the speculative server without (or against) the probe's verdict
    specdec.io/paused: "true"     a fleet's walk takes no further step while present

Abort wins over promote when both are set (the safe side). A retry is one-shot: the token that was acted on is
recorded in status.steering.retried, so the same annotation left in Git does not probe forever.

Pure: a dict of annotations and the stored steering status in, a Steering out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .textutil import clip

RETRY = "specdec.io/retry"
ABORT = "specdec.io/abort"
PROMOTE = "specdec.io/promote"
PAUSED = "specdec.io/paused"
ANNOTATIONS = (RETRY, ABORT, PROMOTE, PAUSED)

# Values of specdec.io/paused that mean "not paused" (an annotation left as "false" must not pause a fleet).
_FALSE = {"", "false", "no", "0", "off"}
# A reason is written into status and an Event: bounded, one line.
MAX_REASON = 256


@dataclass(frozen=True)
class Steering:
    """The hand-made requests on one object."""

    retry: str | None = None  # a retry token not yet acted on
    abort: str | None = None  # the reason given, when abort is requested
    promote: str | None = None  # the reason given, when promote is requested (and abort is not)
    paused: bool = False

    @property
    def any(self) -> bool:
        return bool(self.retry or self.abort or self.promote or self.paused)


def _reason(value: str | None, default: str) -> str:
    text = " ".join((value or "").split())
    return clip(text or default, MAX_REASON)


def read(annotations: Mapping[str, str] | None, retried: str | None = None) -> Steering:
    """The requests in ``annotations``; ``retried`` is the retry token already acted on (status.steering.retried)."""
    annotations = annotations or {}
    retry = annotations.get(RETRY)
    abort = _reason(annotations[ABORT], "aborted by hand") if ABORT in annotations else None
    promote = _reason(annotations[PROMOTE], "promoted by hand") if PROMOTE in annotations and abort is None else None
    paused = str(annotations.get(PAUSED, "")).strip().lower() not in _FALSE
    return Steering(retry=retry if retry and retry != retried else None, abort=abort, promote=promote, paused=paused)
