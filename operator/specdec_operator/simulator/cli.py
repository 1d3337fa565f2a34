"""`specdec simulate`: run an SGLang-compatible simulator as a process."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

from .. import SGLANG_VERSION
from ..cliparse import ArgumentParser
from ..errors import InputError
from .adaptive import AdaptiveConfig, adaptive_unsupported_reason, default_adaptive_config, disabled_warning, load_adaptive_config
from .model import Profile, load_profile, shipped_profiles
from .revisions import parse_kinds, trained_on
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
    parser.add_argument(
        "--trained-on",
        metavar="KIND[,KIND]",
        default=None,
        help="serve the profile's drafter as trained on these prompt kinds only (revisions.py): their acceptance the "
        "profile's, every other kind's 1.2 (kinds: random, multilingual, code, math, summary, chat)",
    )
    parser.add_argument(
        "--speculative-adaptive",
        action="store_true",
        help="SGLang's adaptive speculation: num_steps per batch-size bucket, from the config below, else the "
        "profile's 'adaptive', else SGLang's default config (EAGLE/EAGLE3 with topk 1 only, as SGLang)",
    )
    parser.add_argument(
        "--speculative-adaptive-config",
        default=None,
        metavar="PATH",
        help="JSON config for --speculative-adaptive in SGLang's format (integer-string batch-size keys with candidate_steps)",
    )
    return parser


def resolve_profile(args: argparse.Namespace) -> Profile:
    """The profile with the adaptive flags applied as SGLang applies them; warns when SGLang would switch it off."""
    profile = load_profile(args.profile)
    if args.trained_on is not None:
        profile = trained_on(profile, parse_kinds(args.trained_on))
    if args.speculative_adaptive:
        path = args.speculative_adaptive_config
        spec = profile.speculative
        unsupported = adaptive_unsupported_reason(spec.algorithm if spec else None, spec.eagle_topk if spec else None)
        if path is None:
            config = profile.adaptive or default_adaptive_config()
        elif unsupported is not None:
            # SGLang checks support first and reads the file only when the mode stays on (speculative_hook.py).
            config = AdaptiveConfig(buckets=(), source=path, path=path)
        else:
            config = load_adaptive_config(path)
        profile = profile.with_adaptive(config)
    reason = profile.adaptive_unsupported_reason
    if reason is not None:
        print(f"specdec simulate: warning: {disabled_warning(reason)}", file=sys.stderr, flush=True)
    return profile


async def _serve(args: argparse.Namespace) -> None:
    profile = resolve_profile(args)
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
