"""The captured records on disk: JSON lines in files of bounded size, the size cap and the retention period.

Each proxy pod writes only its own files, ``capture-<UTC start>-<writer>.jsonl`` (several pods may share a
ReadWriteMany claim: no two writers append to one file). A file is closed at ``segment_bytes`` or after
``segment_seconds``; then, and at every ``enforce`` call, the whole directory is held to ``max_bytes`` by deleting
the oldest files first (by the start time in their names, any writer's), and a file whose last write is older than
the retention period is deleted. A file another pod deletes at the same moment is simply gone.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

PREFIX = "capture-"
SUFFIX = ".jsonl"
MIN_SEGMENT_BYTES = 64 * 1024
SEGMENT_SECONDS = 3600.0


def segment_bytes_for(max_bytes: int) -> int:
    """Files are closed at 1/16 of the cap (at least 64 KiB), so dropping the oldest keeps most of it."""
    return max(MIN_SEGMENT_BYTES, max_bytes // 16)


@dataclass
class Deleted:
    """What one enforcement deleted (bytes by cause)."""

    cap_bytes: int = 0
    retention_bytes: int = 0


@dataclass
class CaptureStore:
    directory: Path
    writer: str  # this pod's name (file names carry it)
    max_bytes: int
    retention_seconds: float
    segment_bytes: int = 0  # 0: segment_bytes_for(max_bytes)
    segment_seconds: float = SEGMENT_SECONDS
    clock: Callable[[], float] = time.time
    # Bytes free on the volume (a claim smaller than max_bytes, or shared): below min_free, the oldest files go too.
    disk_free: Callable[[Path], int] = field(default=lambda path: shutil.disk_usage(path).free)
    min_free: int = 0  # 0: two files' worth
    _file: IO[bytes] | None = field(default=None, init=False, repr=False)
    _path: Path | None = field(default=None, init=False, repr=False)
    _opened_at: float = field(default=0.0, init=False, repr=False)
    _sequence: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        if not self.segment_bytes:
            self.segment_bytes = segment_bytes_for(self.max_bytes)
        if not self.min_free:
            self.min_free = 2 * self.segment_bytes

    def write(self, record: dict[str, Any]) -> tuple[int, Deleted]:
        """Append one record; the bytes written and what closing a full file made the cap delete."""
        line = (json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")
        deleted = Deleted()
        if self._file is not None and (self._file.tell() + len(line) > self.segment_bytes or self.clock() - self._opened_at >= self.segment_seconds):
            self._close()
            deleted = self.enforce()
        if self._file is None:
            self._open()
        assert self._file is not None
        self._file.write(line)
        self._file.flush()
        return len(line), deleted

    def _open(self) -> None:
        self._opened_at = self.clock()
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(self._opened_at))
        self._sequence += 1
        # The sequence keeps two files opened in one second apart; the names still sort by start time.
        self._path = self.directory / f"{PREFIX}{stamp}-{self._sequence:06d}-{self.writer}{SUFFIX}"
        self._file = open(self._path, "ab")

    def _close(self) -> None:
        if self._file is not None:
            self._file.close()
        self._file, self._path = None, None

    def close(self) -> None:
        self._close()

    def files(self) -> list[tuple[Path, int, float]]:
        """Every writer's files, oldest first: (path, size, last modified)."""
        out = []
        for path in sorted(self.directory.glob(f"{PREFIX}*{SUFFIX}"), key=lambda p: p.name):
            try:
                info = path.stat()
            except FileNotFoundError:
                continue
            out.append((path, info.st_size, info.st_mtime))
        return out

    def stored_bytes(self) -> int:
        return sum(size for _, size, _ in self.files())

    def enforce(self) -> Deleted:
        """Delete files past the retention period, then the oldest files until the total is within max_bytes and
        the volume has min_free bytes free.

        The file being written is deleted last of all (then it is closed)."""
        deleted = Deleted()
        now = self.clock()
        kept = []
        for path, size, modified in self.files():
            if now - modified > self.retention_seconds:
                if path == self._path:
                    self._close()
                if _unlink(path):
                    deleted.retention_bytes += size
            else:
                kept.append((path, size))
        total = sum(size for _, size in kept)
        # Within the cap, and leaving min_free on the volume: a claim smaller than the cap (kept as it was created
        # while maxBytes grew) fills before the cap would be reached.
        short = max(0, self.min_free - self.disk_free(self.directory))
        for path, size in sorted(kept, key=lambda item: item[0] == self._path):  # the open file last
            if total <= self.max_bytes and short <= 0:
                break
            short -= size
            if path == self._path:
                self._close()
            if _unlink(path):
                deleted.cap_bytes += size
            total -= size
        return deleted


def _unlink(path: Path) -> bool:
    try:
        os.unlink(path)
    except FileNotFoundError:  # another pod deleted it first
        return False
    return True
