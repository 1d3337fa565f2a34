"""Text helpers shared across the package: bounded status texts and the time format Kubernetes writes."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any


def clip(text: Any, limit: int) -> str:
    """`text` as a string of at most `limit` characters, ending in "..." where it was cut; None is ""."""
    text = str(text or "")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def rfc3339(t: datetime) -> str:
    """`t` in UTC to the second, as Kubernetes writes times: 2026-01-02T03:04:05Z."""
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str | None) -> datetime | None:
    """A time as Kubernetes writes it (RFC 3339, Z or an offset); None when absent or unreadable."""
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
