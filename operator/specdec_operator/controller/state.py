"""What the controller remembers of one SpeculativeServer between steps (none of it is needed to resume)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from typing import Any

from ..api import SpeculativeServerSpec, SpeculativeServerStatus
from ..monitor import Sample

# How long a name found taken by a foreign object is remembered before it is looked up again.
FOREIGN_TTL_S = 30.0

Key = tuple[str, str]  # (namespace, name)
Logger = logging.Logger | logging.LoggerAdapter[Any]  # Kopf hands handlers either


@dataclasses.dataclass(frozen=True)
class Captured:
    """The captured conversations as last read from the capture proxies (controller/capturecount.py)."""

    next_read_at: float  # time.monotonic() when they are read again
    conversations: int | None  # None: not known
    note: str  # "counted", or why not known (logged when it changes)
    since: str | None = None  # the last training Job's start, when one started (status.retraining.training.startedAt)
    since_start: int | None = None  # the conversations captured at or after it (None: not known, or no Job yet)


@dataclasses.dataclass
class ResourceState:
    """What this process remembers of one SpeculativeServer between steps.

    None of it is needed to resume: a fresh process rebuilds everything from the cluster (status and children).
    """

    uid: str
    wake: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    # The status as last written (or read): what the next merge patch is computed against, and its typed form.
    written: dict[str, Any] | None = None
    status: SpeculativeServerStatus | None = None
    # The parsed spec and its rendered pod templates, for one generation (the spec changes only with it).
    generation: int | None = None
    spec: SpeculativeServerSpec | None = None
    rendered: dict[str, Any] = dataclasses.field(default_factory=dict)
    last_scrape: dict[str, Sample] | None = None  # the last drift scrape, by speculative pod
    monitor_due: bool = False
    foreign: dict[str, tuple[float, dict[str, Any]]] = dataclasses.field(default_factory=dict)  # child name -> (seen, object)
    creating: asyncio.Task[None] | None = None  # the stable Service's creation, beside the steps
    # The API server refused a child in a way retrying cannot fix (reconcile/refused.py) and no step has written
    # every child since: the next step writes its status only after its children are accepted.
    refused: bool = False
    last_step: float = -math.inf  # when the last step ended (time.monotonic): steps closer together are merged
    captured: Captured | None = None  # spec.retraining.capture's last count (capturecount.py); None while capture is off

    def forget_status(self) -> None:
        """Reread the status from the API server at the next step (after a failed step)."""
        self.written = self.status = None

    def foreign_objects(self) -> dict[str, dict[str, Any]]:
        now = time.monotonic()
        for child, (seen, _) in list(self.foreign.items()):
            if now - seen > FOREIGN_TTL_S:
                del self.foreign[child]
        return {child: obj for child, (_, obj) in self.foreign.items()}
