"""What is on the capture claim now: records, and conversations a training Job can use, over every writer's files.

Each proxy counts the whole claim, not only its own files. The replicas share the claim; a replaced pod's files stay
there under a name no live pod has (a Deployment's new pod has a new name); any replica deletes any file (the cap,
the retention); turning capture off deletes the claim. A sum of per-writer counts would lose a replaced pod's files
or count a file twice; a count of the directory is right from whichever replica reads it. So every proxy's figure is
the claim's, and the operator reads it from any Ready proxy (reconcile/capture.py).

Counted incrementally: a file's complete lines are read once, from where the previous count stopped (files are only
appended to); a file gone (deleted by any replica) leaves the count; a file shorter than what was read, or another
file under the same name, is read again from its start. A proxy that starts reads every file once: the records
written before it started, by any pod, count.
"""

from __future__ import annotations

import bisect
import json
import math
from array import array
from dataclasses import dataclass, field
from pathlib import Path

from drafter_training.regenerate import normalize_conversation

from ..errors import InputError
from ..textutil import parse_time
from .store import PREFIX, SUFFIX

READ_CHUNK = 1 << 20


@dataclass(frozen=True)
class ClaimCount:
    """The claim's files now: complete records, the chat conversations among them that a training Job can use
    (repeats included: its gather stage keeps each conversation once), and their files and bytes."""

    records: int = 0
    conversations: int = 0
    files: int = 0
    bytes: int = 0


@dataclass
class _FileCount:
    inode: int
    offset: int = 0  # bytes counted: up to the end of the last complete line
    records: int = 0
    conversations: int = 0
    # When each usable conversation was captured (epoch seconds, the record's "time"; -inf without one), in file order:
    # a writer appends in time order, so the list is sorted and "how many since T" is one bisection.
    # (8 bytes each in an array: a 1 GiB claim of ~500,000 conversations holds ~4 MB of them.)
    times: array[float] = field(default_factory=lambda: array("d"))


def conversation_time(line: bytes) -> float | None:
    """None when one record is not a chat conversation a training Job trains on (the rule of its gather stage,
    drafter_training/gather.py: ``messages`` that normalize as a conversation); else when it was captured (epoch
    seconds from the record's "time", -inf when it has none)."""
    try:
        record = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(record, dict) or "messages" not in record:
        return None
    try:
        normalize_conversation({"messages": record["messages"]}, "record")
    except InputError:
        return None
    stamp = parse_time(record["time"]) if isinstance(record.get("time"), str) else None
    return stamp.timestamp() if stamp is not None else -math.inf


def usable_conversation(line: bytes) -> bool:
    """Whether one record is a chat conversation a training Job trains on (``conversation_time``)."""
    return conversation_time(line) is not None


class RecordCounter:
    """The count of ``directory``'s capture files, kept between calls (call ``count`` from one thread at a time)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._files: dict[str, _FileCount] = {}

    def conversations_since(self, since: float) -> int:
        """The usable conversations captured at or after ``since`` (epoch seconds) among the files the last ``count``
        read: the training rule's "new since the last Job started", which retention deleting old files cannot
        lower as it lowers the claim's whole count."""
        return sum(len(f.times) - bisect.bisect_left(f.times, since) for f in self._files.values())

    def count(self) -> ClaimCount:
        """Read what was appended since the last call; forget the files that are gone."""
        kept: dict[str, _FileCount] = {}
        total_bytes = 0
        for path in sorted(self.directory.glob(f"{PREFIX}*{SUFFIX}")):
            try:
                info = path.stat()
                known = self._files.get(path.name)
                if known is None or known.inode != info.st_ino or info.st_size < known.offset:
                    known = _FileCount(info.st_ino)
                if info.st_size > known.offset:
                    _read_new_lines(path, known)
            except FileNotFoundError:  # deleted by another replica meanwhile: not on the claim any more
                continue
            kept[path.name] = known
            total_bytes += info.st_size
        self._files = kept
        return ClaimCount(
            records=sum(f.records for f in kept.values()),
            conversations=sum(f.conversations for f in kept.values()),
            files=len(kept),
            bytes=total_bytes,
        )


def _read_new_lines(path: Path, counted: _FileCount) -> None:
    """Count the complete lines after ``counted.offset``; a line still being written waits for the next call."""
    with open(path, "rb") as file:
        file.seek(counted.offset)
        partial = b""
        while chunk := file.read(READ_CHUNK):
            lines = (partial + chunk).split(b"\n")
            partial = lines.pop()  # after the last newline: incomplete (or empty)
            for line in lines:
                counted.offset += len(line) + 1
                if line.strip():
                    counted.records += 1
                    captured = conversation_time(line)
                    if captured is not None:
                        counted.conversations += 1
                        counted.times.append(captured)
