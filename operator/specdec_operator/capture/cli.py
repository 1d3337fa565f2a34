"""`specdec capture`: the capture proxy as a process (the capture Deployment's command; docs/capture.md)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import signal
import socket
from pathlib import Path

from aiohttp import web

from ..cliparse import ArgumentParser
from ..errors import InputError
from .proxy import CaptureConfig, CaptureProxy
from .store import CaptureStore

DEFAULT_PORT = 30000
DEFAULT_ADMIN_PORT = 9091
# In-flight requests get this long to finish when the pod is asked to stop (its grace period is longer).
SHUTDOWN_TIMEOUT_S = 25.0


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="specdec capture",
        description="Forward every request to --upstream unchanged and write a sampled share of the OpenAI chat/completions "
        "requests to --dir as JSON lines, within a size cap and a retention period (docs/capture.md).",
    )
    parser.add_argument("--upstream", required=True, help="the servers' address, e.g. http://NAME-serving.NAMESPACE.svc:30000")
    parser.add_argument("--dir", required=True, type=Path, help="where the JSON lines go (the claim's mount)")
    parser.add_argument("--sample-share", type=float, required=True, help="share of chat/completions requests captured (0 < share <= 1)")
    parser.add_argument("--include-responses", action="store_true", help="also keep the answer's text")
    parser.add_argument("--max-bytes", type=int, required=True, help="size cap of the stored records: the oldest files are deleted first")
    parser.add_argument("--retention-hours", type=float, required=True, help="files older than this are deleted")
    parser.add_argument(
        "--redact", action="append", default=[], metavar="REGEX", help="a Python regular expression replaced in every text (repeatable)"
    )
    parser.add_argument("--redact-replacement", default="[REDACTED]", help="what a match is replaced with")
    parser.add_argument("--redaction-url", default=None, help="a redaction service: each record is POSTed to it, its JSON answer written instead")
    parser.add_argument("--host", default="0.0.0.0", help="address to bind (default 0.0.0.0)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"the traffic port (default {DEFAULT_PORT}, the servers')")
    parser.add_argument("--admin-port", type=int, default=DEFAULT_ADMIN_PORT, help=f"/metrics and /healthz (default {DEFAULT_ADMIN_PORT})")
    parser.add_argument("--writer", default=None, help="this writer's name in file names (default $POD_NAME, else the host name)")
    parser.add_argument("--seed", type=int, default=None, help="seed of the sampling draws (tests)")
    return parser


def parse(argv: list[str]) -> tuple[CaptureConfig, CaptureStore, argparse.Namespace]:
    args = build_parser().parse_args(argv)
    if not 0 < args.sample_share <= 1:
        raise InputError(f"--sample-share {args.sample_share}: must be above 0 and at most 1")
    if args.max_bytes < 1 or args.retention_hours <= 0:
        raise InputError("--max-bytes and --retention-hours must be positive")
    for pattern in args.redact:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise InputError(f"--redact {pattern!r}: not a Python regular expression ({exc})") from None
    writer = re.sub(r"[^A-Za-z0-9.-]", "-", args.writer or os.environ.get("POD_NAME") or socket.gethostname())
    config = CaptureConfig(
        upstream=args.upstream,
        sample_share=args.sample_share,
        include_responses=args.include_responses,
        redaction_patterns=tuple(args.redact),
        redaction_replacement=args.redact_replacement,
        redaction_url=args.redaction_url,
        seed=args.seed,
    )
    try:
        store = CaptureStore(args.dir, writer, args.max_bytes, args.retention_hours * 3600)
    except OSError as exc:
        raise InputError(f"--dir {args.dir}: cannot be written ({exc.strerror})") from None
    return config, store, args


async def serve(proxy: CaptureProxy, host: str, port: int, admin_port: int) -> None:
    traffic = web.AppRunner(proxy.traffic_app(), access_log=None, handle_signals=False, shutdown_timeout=SHUTDOWN_TIMEOUT_S)
    admin = web.AppRunner(proxy.admin_app(), access_log=None, handle_signals=False)
    await traffic.setup()
    await admin.setup()
    await web.TCPSite(traffic, host, port).start()
    await web.TCPSite(admin, host, admin_port).start()
    # One line once serving (the port chosen for --port 0 included): the benchmark and tests read it.
    print(f"specdec capture serving at http://{host}:{traffic.addresses[0][1]} (admin port {admin.addresses[0][1]})", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await traffic.cleanup()  # stops accepting, lets in-flight requests finish, writes the queued records
    await admin.cleanup()


def main(argv: list[str]) -> int:
    config, store, args = parse(argv)
    # No access log: a request line may carry a prompt in its query string.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(serve(CaptureProxy(config, store), args.host, args.port, args.admin_port))
    return 0
