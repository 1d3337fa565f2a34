"""Reading the docs' Markdown: tables and sections (tests that keep the docs and the code in step)."""

from __future__ import annotations

import re
from pathlib import Path


def table(path: Path, header: str) -> list[list[str]]:
    """The rows of the Markdown table whose header row starts with `header` (cells stripped, without the header)."""
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        if line.startswith("|") and line.strip("| ").startswith(header):
            rows = []
            for row in lines[i + 2 :]:
                if not row.startswith("|"):
                    break
                rows.append([cell.strip() for cell in row.strip().strip("|").split("|")])
            return rows
    raise AssertionError(f"{path.name}: no table with header {header!r}")


def section(path: Path, heading: str) -> str:
    text = path.read_text()
    start = text.index(heading)
    following = re.search(r"^#{1,3} ", text[start + len(heading) :], re.MULTILINE)
    return text[start : start + len(heading) + following.start()] if following else text[start:]
