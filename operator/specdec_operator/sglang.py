"""SGLang command lines of the base and the speculative server (`specdec sglang-args` prints them: cli/sglang_args.py).

`render_argv(spec, variant)` is a pure function: the full container command of one server, for the SGLang
release of the spec (the one its image tag names, else `sglangVersion`). The two variants are identical except for the speculative flags, so
the probe compares the draft model and nothing else.

Every supported release is listed in `RELEASES` with what was verified against its published wheel (see
docs/sglang-args.md for how). Flags differ between releases (`--cuda-graph-max-bs` exists in 0.5.9 and is
rejected by 0.5.23's parser), so an unknown release is refused rather than guessed.

This module never imports SGLang: the operator renders command lines for images it does not contain.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .api import MANAGED_SGLANG_FLAGS, SGLANG_METHODS, SpeculativeServerSpec, Variant
from .choices import TREE_ALGORITHMS
from .engines.paths import LISTEN_HOST as LISTEN_HOST  # where every engine's server listens (engines/paths.py)
from .engines.paths import SERVER_PORT as SERVER_PORT
from .engines.paths import draft_model_path as draft_model_path
from .engines.paths import server_port as server_port
from .engines.paths import target_model_path as target_model_path
from .errors import InputError

# Served on the main port when --enable-metrics is given (Prometheus text format).
METRICS_PATH = "/metrics"

# Multi-node servers (resources.nodes > 1) run as LeaderWorkerSet groups. The LeaderWorkerSet controller's pod
# webhook puts these variables into every container: the leader's stable DNS name and the pod's index in its group
# (0 for the leader). The kubelet expands $(VAR) in a container's command from the container's environment.
LEADER_ADDRESS_ENV = "LWS_LEADER_ADDRESS"
WORKER_INDEX_ENV = "LWS_WORKER_INDEX"
# The port rank 0 opens for the torch.distributed rendezvous of the group (SGLang's --dist-init-addr host:port).
DIST_INIT_PORT = 5000


@dataclass(frozen=True)
class Release:
    """What one SGLang release accepts, as far as the rendered command line is concerned."""

    version: str
    # The program and arguments before the server flags.
    entrypoint: tuple[str, ...]
    # Flags a user may carry over from another release that this release's parser rejects, with the
    # replacement to suggest. Refused in sglang.extraArgs so the pod does not crash-loop on argparse.
    rejected_flags: Mapping[str, str] = field(default_factory=dict)


# `sglang serve` (the recommended entrypoint from 0.5.15 on; `python -m sglang.launch_server` warns there)
# first decides between its LLM and diffusion backends by inspecting the model directory. `--model-type llm`
# skips that detection (no diffusers import, no hub lookup) and is stripped before the server flags are parsed.
_SERVE_LLM = ("sglang", "serve", "--model-type", "llm")
# 0.5.9 has `sglang serve` but without --model-type; `python -m sglang.launch_server` is its plain, silent path.
_LAUNCH_SERVER = ("python3", "-m", "sglang.launch_server")

RELEASES: dict[str, Release] = {
    release.version: release
    for release in (
        Release(
            "0.5.9",
            _LAUNCH_SERVER,
            rejected_flags={
                "--cuda-graph-max-bs-decode": "--cuda-graph-max-bs (the decode/prefill split came after 0.5.9)",
                "--cuda-graph-max-bs-prefill": "--cuda-graph-max-bs (the decode/prefill split came after 0.5.9)",
            },
        ),
        Release(
            "0.5.22",
            _SERVE_LLM,
            rejected_flags={"--cuda-graph-max-bs": "--cuda-graph-max-bs-decode (and --cuda-graph-max-bs-prefill)"},
        ),
        Release(
            "0.5.23",
            _SERVE_LLM,
            rejected_flags={"--cuda-graph-max-bs": "--cuda-graph-max-bs-decode (and --cuda-graph-max-bs-prefill)"},
        ),
    )
}

# The speculative flags, in the order they are rendered. The base server gets none of them.
SPECULATIVE_FLAGS = (
    "--speculative-algorithm",
    "--speculative-draft-model-path",
    "--speculative-num-steps",
    "--speculative-eagle-topk",
    "--speculative-num-draft-tokens",
    "--speculative-ngram-max-trie-depth",
    "--speculative-ngram-min-bfs-breadth",
    "--speculative-ngram-max-bfs-breadth",
    "--speculative-adaptive",
    "--speculative-adaptive-config",
)
# drafter.ngram's SGLang settings and their flags (0.5.9 has no --speculative-ngram-max-trie-depth: admission refuses
# maxTrieDepth there).
NGRAM_FLAGS = (
    ("max_trie_depth", "--speculative-ngram-max-trie-depth"),
    ("min_bfs_breadth", "--speculative-ngram-min-bfs-breadth"),
    ("max_bfs_breadth", "--speculative-ngram-max-bfs-breadth"),
)


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part.replace("post", "")) for part in version.split("."))


def supported_versions() -> list[str]:
    """The SGLang releases `render_argv` can render for, oldest first."""
    return sorted(RELEASES, key=_version_key)


def release_of(spec: SpeculativeServerSpec) -> Release:
    """The release table entry of spec.sglangVersion (parsing sets it: the image tag's release, the one given, or the
    operator's own); InputError (phase Failed) for an unknown release, which admission refuses already."""
    release = RELEASES.get(spec.sglang_version) if spec.sglang_version else None
    if release is None:
        raise InputError(
            f"spec.sglangVersion: SGLang {spec.sglang_version} is not supported (command-line flags differ between "
            f"releases); use one of {', '.join(supported_versions())} and an image that contains it"
        )
    return release


# Flags the operator sets (the API refuses them in extraArgs by name; see _check_extra_args for prefixes).
_MANAGED_FLAGS = tuple(f"--{name}" for name in MANAGED_SGLANG_FLAGS) + SPECULATIVE_FLAGS


def _check_extra_args(spec: SpeculativeServerSpec, release: Release) -> None:
    for arg in spec.sglang.extra_args:
        flag = arg.split("=", 1)[0]
        # SGLang's parser accepts any unambiguous prefix of a flag, and extraArgs come last, so `--max-running 48`
        # would silently bring back the 48-request cap that --max-running-requests is there to prevent.
        overridden = next((m for m in _MANAGED_FLAGS if flag.startswith("--") and len(flag) > 2 and m.startswith(flag)), None)
        if overridden is not None:
            raise InputError(
                f"spec.sglang.extraArgs: {flag} would set {overridden}, which the operator manages (SGLang accepts "
                f"abbreviated flags); remove it and use the matching spec field"
            )
        if flag in release.rejected_flags:
            raise InputError(
                f"spec.sglang.extraArgs: {flag} is not accepted by SGLang {release.version} (the server would exit "
                f"at start-up); use {release.rejected_flags[flag]}"
            )


def speculative_args(spec: SpeculativeServerSpec, adaptive_config_path: str | None = None) -> list[str]:
    """The speculative flags, all explicit.

    SGLang asserts at start-up when --speculative-eagle-topk or --speculative-num-draft-tokens is given without
    --speculative-num-steps, and picks its own shape (5/4/8 for Llama) when none is given: passing all three
    makes the served shape the one in the spec. ``adaptive_config_path``: serve load-aware, drafting per batch
    size as that file says (loadaware.py renders it).
    """
    drafter = spec.drafter
    _check_method(spec)
    args = ["--speculative-algorithm", drafter.algorithm]
    draft_path = draft_model_path(spec)
    if draft_path is not None:
        args += ["--speculative-draft-model-path", draft_path]
    if drafter.algorithm in TREE_ALGORITHMS:
        args += [
            "--speculative-num-steps", str(drafter.num_steps),
            "--speculative-eagle-topk", str(drafter.eagle_topk),
            "--speculative-num-draft-tokens", str(drafter.draft_tokens),
        ]  # fmt: skip
    else:
        # DFLASH: the block (numSteps + 1), SGLang sets its steps and topk to 1 itself (speculative_hook.py _handle_dflash,
        # with a warning for any other value). NGRAM: the draft tree's size; SGLang sets topk to ngram.maxBfsBreadth and
        # derives the steps (_handle_ngram), so neither is passed.
        args += ["--speculative-num-draft-tokens", str(drafter.draft_tokens)]
    if drafter.algorithm == "NGRAM" and drafter.ngram is not None:
        for key, flag in NGRAM_FLAGS:
            value = getattr(drafter.ngram, key)
            if value is not None:
                args += [flag, str(value)]
    if adaptive_config_path is not None:
        args += ["--speculative-adaptive", "--speculative-adaptive-config", adaptive_config_path]
    return args


def _check_method(spec: SpeculativeServerSpec) -> None:
    """InputError (InvalidSpec) for a method this release does not serve: admission refuses it already (api._method_rules);
    this says the same of a spec that reached the renderer another way (the CLI without the rules, an older CRD)."""
    algorithm, version = spec.drafter.algorithm, spec.sglang_version or ""
    if algorithm not in SGLANG_METHODS.get(version, ()):
        served = ", ".join(SGLANG_METHODS.get(version, ()))
        raise InputError(
            f"spec.drafter.algorithm: SGLang {version} has no {algorithm} speculation (it serves {served}); choose one of those, "
            "or an engine or release that has it"
        )
    ngram = spec.drafter.ngram
    if ngram is not None and (ngram.min_match is not None or ngram.max_match is not None):
        raise InputError("spec.drafter.ngram: minMatch and maxMatch are vLLM's; with engine SGLang use ngram.maxTrieDepth")


def tensor_parallel_size(spec: SpeculativeServerSpec) -> int:
    """--tp-size: every GPU of the server, over all of its nodes."""
    return spec.resources.gpus * spec.resources.nodes


def multi_node_args(spec: SpeculativeServerSpec, *, worker: bool) -> list[str]:
    """SGLang's multi-node flags of one rank of a LeaderWorkerSet group (none for a one-node server).

    The leader is rank 0; a worker's rank is its index in the group, LWS_WORKER_INDEX (1 to nodes - 1). Every rank
    meets at the leader's address, LWS_LEADER_ADDRESS, on DIST_INIT_PORT. Both are $(VAR) references that the
    kubelet expands from the variables the LeaderWorkerSet webhook injects.
    """
    if spec.resources.nodes == 1:
        return []
    return [
        "--nnodes", str(spec.resources.nodes),
        "--node-rank", f"$({WORKER_INDEX_ENV})" if worker else "0",
        "--dist-init-addr", f"$({LEADER_ADDRESS_ENV}):{DIST_INIT_PORT}",
    ]  # fmt: skip


def render_argv(spec: SpeculativeServerSpec, variant: Variant | str, *, adaptive_config_path: str | None = None, worker: bool = False) -> list[str]:
    """The full container command of the base or the speculative server (of its leader, or with worker=True of
    the other ranks of a multi-node server: the same command but for --node-rank).

    Always explicit: --host 0.0.0.0 (SGLang binds 127.0.0.1 by default), --port, --tp-size (= resources.gpus
    times resources.nodes), with more than one node --nnodes/--node-rank/--dist-init-addr (multi_node_args),
    --max-running-requests (SGLang otherwise caps speculative servers at 48 without saying so) and
    --enable-metrics (the monitor reads sglang:spec_accept_length). --quantization is never passed: SGLang
    reads the method from the checkpoint's quantization_config, and an explicit one would also be inherited by
    the draft model. sglang.extraArgs come last.
    """
    try:
        variant = Variant(variant)
    except ValueError:
        raise InputError(f"variant: {variant!r} is not one of base, speculative") from None
    release = release_of(spec)
    _check_extra_args(spec, release)

    argv = list(release.entrypoint)
    argv += [
        "--model-path", target_model_path(spec),
        "--host", LISTEN_HOST,
        "--port", str(server_port(spec)),
        "--tp-size", str(tensor_parallel_size(spec)),
        "--max-running-requests", str(spec.sglang.max_running_requests),
        "--enable-metrics",
    ]  # fmt: skip
    argv += multi_node_args(spec, worker=worker)
    if spec.target.context_length is not None:
        argv += ["--context-length", str(spec.target.context_length)]
    if spec.sglang.mem_fraction_static is not None:
        argv += ["--mem-fraction-static", repr(spec.sglang.mem_fraction_static)]
    if variant is Variant.SPECULATIVE:
        argv += speculative_args(spec, adaptive_config_path)
    argv += list(spec.sglang.extra_args)
    return argv
