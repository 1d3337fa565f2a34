"""Drafter revisions that learned one kind of traffic, for `make demo`'s retraining loop (issue 36, item 5).

A drafter accepts what it was trained on: an EAGLE-3 head trained on chat predicts chat's next tokens and few of a
code answer's. The simulator models that with a profile's per-kind acceptance (``accept_length_by_kind``,
promptkind.py classifies each request): :func:`trained_on` turns a speculative profile into the drafter "trained" on
some kinds of traffic, accepting the profile's own mean acceptance length on them and ``UNTRAINED_ACCEPT_LENGTH``
on every other kind. `specdec simulate --trained-on KIND[,KIND]` serves such a drafter.

A simulated training Job (hack/demo_flywheel.py) learns the kinds of the conversations it was given
(:func:`learned_kinds`: the kinds that make up at least ``LEARNED_SHARE`` of them) and writes them in its revision
(``REVISION_FILE``); the demo serves the revision with that profile, and its offline and live figures come from
:func:`kind_figures` (the analytic throughput at the kind's acceptance), never from timing on a busy host.

The numbers are illustrative, not measured: a drafter on traffic it never saw still accepts a little (common
tokens, punctuation), hence 1.2 rather than 1.0; at 1.2 the verify step costs more than it gains (about 0.93x).
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

from ..errors import InputError
from .model import Profile, load_profile
from .promptkind import KINDS, classify

UNTRAINED_ACCEPT_LENGTH = 1.2
LEARNED_SHARE = 0.25  # a kind below this share of the training conversations is not learned
REVISION_FILE = "simulated-drafter.json"  # in a revision's directory: {"profile": ..., "trainedOn": [...]}


def parse_kinds(text: str, where: str = "--trained-on") -> tuple[str, ...]:
    """'chat,code' -> ('chat', 'code'); InputError naming ``where`` for an unknown or missing kind."""
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in kinds if k not in KINDS]
    if not kinds or unknown:
        raise InputError(f"{where}: {', '.join(unknown) or 'no kind'} given; kinds are {', '.join(KINDS)} (comma-separated)")
    return kinds


def trained_on(profile: Profile, kinds: Sequence[str], untrained: float = UNTRAINED_ACCEPT_LENGTH) -> Profile:
    """``profile``'s drafter as trained on ``kinds``: their acceptance the profile's mean, every other kind's
    ``untrained`` (never above the mean)."""
    spec = profile.speculative
    if spec is None or spec.drafts_from_context:
        raise InputError(f"--trained-on: profile {profile.name} has no trained drafter (a base server, or n-gram/suffix drafting)")
    other = min(untrained, spec.accept_length_mean)
    by_kind = tuple((kind, spec.accept_length_mean if kind in kinds else other) for kind in KINDS)
    name = f"{profile.name}@{'+'.join(kinds)}"
    return dataclasses.replace(profile, name=name, speculative=dataclasses.replace(spec, accept_length_by_kind=by_kind))


def kind_figures(
    profile: Profile, base: Profile, kind: str, concurrency: int = 1, input_tokens: int = 128, output_tokens: int = 64
) -> tuple[float, float]:
    """(speedup over ``base``, acceptance length) of ``profile`` on ``kind`` traffic, from the analytic throughput:
    what its simulator runs at on a quiet host."""
    spec = profile.speculative
    accept = spec.accept_length_for(kind) if spec is not None else 1.0
    at_kind = dataclasses.replace(profile, speculative=dataclasses.replace(spec, accept_length_mean=accept)) if spec is not None else profile
    speedup = at_kind.analytic_throughput(concurrency, input_tokens, output_tokens) / base.analytic_throughput(
        concurrency, input_tokens, output_tokens
    )
    return round(speedup, 3), round(accept, 3)


def learned_kinds(texts: Iterable[str]) -> tuple[str, ...]:
    """The kinds a drafter trained on ``texts`` learns: each kind with at least LEARNED_SHARE of them, most first."""
    counts = Counter(classify(t) for t in texts)
    total = sum(counts.values())
    return tuple(kind for kind, n in counts.most_common() if total and n / total >= LEARNED_SHARE)


def write_revision(directory: Path, profile: str, kinds: Sequence[str]) -> Path:
    """Record in a revision's directory what its simulated drafter learned."""
    path = Path(directory) / REVISION_FILE
    path.write_text(json.dumps({"profile": profile, "trainedOn": list(kinds)}) + "\n")
    return path


def read_revision(directory: Path) -> Profile:
    """The profile a revision's directory describes (its REVISION_FILE); InputError naming the file otherwise."""
    path = Path(directory) / REVISION_FILE
    try:
        doc = json.loads(path.read_text())
        return trained_on(load_profile(doc["profile"]), parse_kinds(",".join(doc["trainedOn"]), str(path)))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"{path}: not a simulated drafter revision ({exc}); hack/demo_flywheel.py writes it") from None
