"""`specdec simulate`: run an SGLang-compatible simulator as a process."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

from .. import SGLANG_VERSION
from ..cliparse import ArgumentParser
from ..errors import InputError
from .model import load_profile, shipped_profiles
from .server import SimulatorServer, exit_process_on_death


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="specdec simulate",
        description=f"Serve SGLang {SGLANG_VERSION}'s HTTP API (/generate, /v1/*, /metrics, /server_info, /health) over a "
        "continuous-batching performance model. Not a GPU server: a simulator for tests and demos.",
    )
    parser.add_argument("--profile", required=True, help=f"profile JSON file, or a shipped profile name: {', '.join(shipped_profiles())}")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; 0.0.0.0 in a pod)")
    parser.add_argument("--port", type=int, default=30000, help="port to bind (default 30000, as SGLang; 0 = any)")
    parser.add_argument("--time-scale", type=float, default=1.0, help="run the simulated clock S times faster than wall time (tok/s scale by S)")
    parser.add_argument(
        "--load-seconds", type=float, default=None, help="override the profile's load_seconds (simulated; health is 503 while loading)"
    )
    parser.add_argument("--seed", type=int, default=None, help="seed for jitter, acceptance draws and faults")
    return parser


async def _serve(args: argparse.Namespace) -> None:
    profile = load_profile(args.profile)
    server = SimulatorServer(
        profile,
        host=args.host,
        port=args.port,
        time_scale=args.time_scale,
        seed=args.seed,
        load_seconds=args.load_seconds,
        on_death=exit_process_on_death,
    )
    try:
        url = await server.start()
    except OSError as exc:
        raise InputError(f"--host/--port: cannot bind {args.host}:{args.port} ({exc.strerror or exc})") from None
    # process.SimulatorProcess reads the URL from this line.
    print(f"specdec simulate: profile {profile.name} serving SGLang API at {url} (time scale {args.time_scale:g})", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop()


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.time_scale <= 0:
        raise InputError("--time-scale must be > 0")
    if args.load_seconds is not None and args.load_seconds < 0:
        raise InputError("--load-seconds must be >= 0")
    if not 0 <= args.port <= 65535:
        raise InputError("--port must be within 0..65535")
    asyncio.run(_serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
