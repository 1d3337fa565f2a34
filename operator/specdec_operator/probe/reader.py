"""`specdec dataset-serve`: the reader of a File prompt source (docs/probe.md, "Prompts").

The operator cannot mount a volume, so for a workload whose prompts are a file on the model volume or on another
PVC it starts a small pod running this command with the volume mounted read-only. The file is read and parsed
once, at start, with the same parser as every other source (``datasets.parse_dataset``), and the result is served
over HTTP until the operator has fetched it and deleted the pod:

- ``GET /dataset``: 200 with the normalised prompts as JSONL (``datasets.to_jsonl``), or 422 with the one-line
  error (naming ``--source``, the line and the fix) when the file is missing, unreadable or malformed;
- ``GET /health``: 200 once the file has been read (the pod's readiness probe), whatever its verdict.

The error is an answer, not an exit: the operator reads it like a dataset and puts it in the condition, and a
4 KiB termination message could not carry a dataset anyway.
"""

from __future__ import annotations

import argparse
import json
import sys

from aiohttp import web

from ..errors import InputError
from .datasets import FORMATS, load_dataset_file, to_jsonl

DEFAULT_PORT = 8090
DATASET_PATH = "/dataset"
HEALTH_PATH = "/health"
JSONL_TYPE = "application/x-ndjson"


def read(path: str, fmt: str, source: str) -> tuple[int, str]:
    """The answer to ``GET /dataset``: (200, the normalised JSONL) or (422, the one-line error)."""
    try:
        prompts = load_dataset_file(path, fmt, source=source)
    except InputError as exc:
        return 422, str(exc).replace("\n", " ")
    return 200, to_jsonl(prompts)


def make_app(status: int, body: str, *, prompts: int | None = None) -> web.Application:
    async def dataset(_request: web.Request) -> web.Response:
        if status == 200:
            return web.Response(status=200, text=body, content_type=JSONL_TYPE)
        return web.Response(status=status, text=body, content_type="text/plain")

    async def health(_request: web.Request) -> web.Response:
        return web.json_response({"read": True, "valid": status == 200, "prompts": prompts})

    app = web.Application()
    app.router.add_get(DATASET_PATH, dataset)
    app.router.add_get(HEALTH_PATH, health)
    return app


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="specdec dataset-serve", description="Read a prompt dataset file and serve it, normalised, over HTTP.")
    parser.add_argument("--file", required=True, help="the dataset file (JSONL, or one JSON array)")
    parser.add_argument("--format", default="Auto", choices=FORMATS, help="dataset format (default Auto)")
    parser.add_argument("--source", help="how errors name the file (default: 'dataset FILE'); the operator names the claim and path")
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port to listen on (default {DEFAULT_PORT})")
    args = parser.parse_args(argv)
    source = args.source or f"dataset {args.file}"
    status, body = read(args.file, args.format, source)
    prompts = body.count("\n") if status == 200 else None
    # One line on stdout for the pod's log: what was read, or why not.
    print(json.dumps({"source": source, "valid": status == 200, "prompts": prompts, "error": None if status == 200 else body}), flush=True)
    web.run_app(make_app(status, body, prompts=prompts), host=args.host, port=args.port, print=None, handle_signals=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
