"""Small text helpers shared by the operator, the probe and the CLI: bounded text and RFC 3339 times."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

# Messages read back from pods or written into a status are bounded: a status is not a log.
MAX_TEXT = 1024


def clip(text: Any, limit: int = MAX_TEXT) -> str:
    """``text`` as a string of at most ``limit`` characters (an ellipsis marks a cut)."""
    text = str(text or "")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def rfc3339(t: datetime) -> str:
    """A time as Kubernetes writes it: UTC, seconds, a Z."""
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str | None) -> datetime | None:
    """An RFC 3339 time from the API server, or None when absent or unreadable."""
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
