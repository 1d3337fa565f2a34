"""`specdec-train`: the drafter-training command line (stages filled in by drafter_training modules)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    print("specdec-train: no stages yet", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
