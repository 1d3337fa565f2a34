"""The SpeculativeServer API (specdec.io/v1alpha1): types only, the single source of truth.

These pydantic models define field names, types, defaults, bounds, enums and the cross-field rules, and the
vocabulary (phases, variants, condition types, reasons, decisions) everything else uses. Like a kubebuilder
project's types.go this module imports nothing of the operator: `crd.py` turns the models into the
CustomResourceDefinition (the API server enforces it), and `resource.py` parses custom resources with them for
the CLI and the operator (so defaults are identical on both sides, and the CLI checks what admission checks).

Cross-field rules are written once, in CEL, in `x-kubernetes-validations` (see `_cel`): the API server
evaluates them, and the tests evaluate the same strings with cel-python.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, Literal, cast, get_args

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationInfo, field_validator, model_validator

from . import SGLANG_VERSION
from .api_retraining import Retraining, RetrainingStatus
from .apimodel import unset_nulls
from .choices import DRAFT_MODEL_ALGORITHMS, DRAFTER_FREE_ALGORITHMS, SGLANG_VERSIONS, TREE_ALGORITHMS, Algorithm, Quantization, SGLangVersion
from .enginefacts import DEFAULT, VLLM, EngineName, facts_for

# --------------------------------------------------------------------------------------------------
# Shared vocabulary: phases, variants, condition types and reasons are constants, never ad-hoc strings.


class Phase(StrEnum):
    PENDING = "Pending"
    VALIDATING = "Validating"
    DEPLOYING = "Deploying"
    PROBING = "Probing"
    PROMOTED = "Promoted"
    ROLLED_BACK = "RolledBack"
    INVALID = "Invalid"
    FAILED = "Failed"


class Variant(StrEnum):
    BASE = "base"
    SPECULATIVE = "speculative"


class ConditionType(StrEnum):
    DRAFTER_COMPATIBLE = "DrafterCompatible"
    BASE_READY = "BaseReady"
    SPECULATIVE_READY = "SpeculativeReady"
    SPEEDUP_VERIFIED = "SpeedupVerified"
    READY = "Ready"
    ROLLED_OUT = "RolledOut"  # fleets (spec.replicas >= 2) only: the walk to the decided variant has arrived


# What a probe (or the drift monitor) decided for a speculative revision. (A comment, not a docstring: pydantic
# would put a docstring into the CRD as the field's description.)
class Decision(StrEnum):
    PROMOTE = "promote"
    ROLLBACK = "rollback"


# rollout.loadAware. Auto: when plain speculation wins at low load and loses at high, try SGLang's adaptive
# speculation with a table derived from the measured curve (docs/operator.md); Off: the plain decision only.
class LoadAware(StrEnum):
    AUTO = "Auto"
    OFF = "Off"


class Reason(StrEnum):
    """Every reason the operator writes: status.reason, condition reasons, status.probe.reason, Event reasons.

    One set, like a kubebuilder project's reason constants, so a reason is never an ad-hoc string. Validator
    finding codes (HiddenSizeMismatch, ...) are the validator's own vocabulary and are used as reasons as they are.
    """

    # Decisions (status.probe.reason, SpeedupVerified, phase Promoted/RolledBack)
    LOAD_AWARE_SPEEDUP = "LoadAwareSpeedup"  # the adaptive server is never slower than the base and faster somewhere
    SPEEDUP_CONFIRMED = "SpeedupConfirmed"
    SPEEDUP_BELOW_THRESHOLD = "SpeedupBelowThreshold"
    DRAFTER_NOT_ACCEPTING = "DrafterNotAccepting"
    INCONCLUSIVE = "Inconclusive"
    PROBE_FAILED = "ProbeFailed"
    ACCEPTANCE_DRIFT = "AcceptanceDrift"
    SPECULATIVE_POD_SICK = "SpeculativePodSick"  # an Event: one speculative pod accepts far less than its peers
    NO_LOAD_WITH_SPEEDUP = "NoLoadWithSpeedup"
    # Load-aware speculation (status.probe.loadAware.reason; LoadAwareTrial is also the Event of its start)
    LOAD_AWARE_TRIAL = "LoadAwareTrial"
    LOAD_AWARE_UNSUPPORTED = "LoadAwareUnsupported"
    OUTPUT_MISMATCH = "OutputMismatch"
    DATASET_INVALID = "DatasetInvalid"
    # A race of candidates (reconcile/candidate_race.py): a candidate that cannot beat the best one so far, one the GPU
    # budget left unmeasured, a race waiting for a race slot; the Events of a candidate's result and of the winner
    CANNOT_WIN = "CannotWin"
    GPU_BUDGET_SPENT = "GpuBudgetSpent"
    RACE_QUEUED = "RaceQueued"
    CANDIDATE_MEASURED = "CandidateMeasured"
    RACE_WON = "RaceWon"
    # spec.retraining.capture's Events (reconcile/capture.py; status.retraining.capture.state says the same)
    CAPTURE_STARTING = "CaptureStarting"
    CAPTURE_STARTED = "CaptureStarted"
    CAPTURE_BYPASSED = "CaptureBypassed"
    CAPTURE_STOPPED = "CaptureStopped"
    # spec.retraining.training's Events (reconcile/training.py; status.retraining.training says the same)
    RETRAIN_STARTED = "RetrainStarted"
    RETRAIN_SUCCEEDED = "RetrainSucceeded"
    RETRAIN_FAILED = "RetrainFailed"
    # Trained revisions (reconcile/revision.py; status.retraining.revisions says the same)
    REVISION_PROMOTED = "RevisionPromoted"
    REVISION_LOST = "RevisionLost"
    REVISION_PIN_REFUSED = "RevisionPinRefused"
    # A warning on a decision: the probe measured random token ids, not the traffic users send
    SYNTHETIC_TRAFFIC = "SyntheticTraffic"
    # Phases before a decision, and failures
    CREATING = "Creating"
    VALIDATING = "Validating"
    LOADING = "Loading"
    PROBING = "Probing"
    NAME_CONFLICT = "NameConflict"
    INVALID_SPEC = "InvalidSpec"
    LEADER_WORKER_SET_MISSING = "LeaderWorkerSetMissing"  # resources.nodes > 1 in a cluster without the LeaderWorkerSet CRD
    FORBIDDEN = "Forbidden"
    APPLY_REJECTED = "ApplyRejected"
    # DrafterCompatible (validator findings' own codes aside)
    COMPATIBLE = "Compatible"
    DRAFTER_COMPATIBLE = "DrafterCompatible"
    DRAFTER_INCOMPATIBLE = "DrafterIncompatible"
    VALIDATOR_INPUT_ERROR = "ValidatorInputError"
    VALIDATOR_FAILED = "ValidatorFailed"
    VALIDATOR_OOM_KILLED = "ValidatorOOMKilled"
    NO_SEPARATE_DRAFTER = "NoSeparateDrafter"
    # BaseReady / SpeculativeReady: how a server is doing, read from its pods
    READY = "Ready"
    UNSCHEDULABLE = "Unschedulable"
    CRASH_LOOP = "CrashLoop"
    STARTING = "Starting"
    NO_POD = "NoPod"
    REPLACING = "Replacing"
    # Why a wait has no end, read from the pods and their Events (reconcile/stuck.py), and the deadline that ends it
    VOLUME_NOT_MOUNTED = "VolumeNotMounted"
    IMAGE_NOT_PULLED = "ImageNotPulled"
    CONTAINER_CONFIG_ERROR = "ContainerConfigError"
    PROGRESS_DEADLINE_EXCEEDED = "ProgressDeadlineExceeded"
    # By hand (specdec.io/* annotations, `kubectl specdec`): decisions made by a person, and their Events
    ABORTED = "Aborted"
    PROMOTED_BY_HAND = "PromotedByHand"
    RETRY_REQUESTED = "RetryRequested"
    WALK_PAUSED = "WalkPaused"
    WALK_RESUMED = "WalkResumed"
    SCALED_DOWN = "ScaledDown"
    # SpeedupVerified before a decision
    NOT_PROBED = "NotProbed"
    WAITING_FOR_SERVERS = "WaitingForServers"
    # Ready
    SERVICE_PENDING = "ServicePending"
    SERVING = "Serving"
    NO_READY_SERVER = "NoReadyServer"
    # RolledOut (fleets): walking toward a variant, or arrived; WalkStarted/WalkFinished are its Events
    WALKING_TO_SPECULATIVE = "WalkingToSpeculative"
    WALKING_TO_BASE = "WalkingToBase"
    ROLLED_OUT = "RolledOut"
    WALK_STARTED = "WalkStarted"
    WALK_FINISHED = "WalkFinished"
    # A one-server resource's new pod template cannot start: its new base is unschedulable while the old
    # speculative server holds the GPUs (rollout.updateStrategy RollingUpdate; Recreate frees them first)
    UPDATE_BLOCKED = "UpdateBlocked"
    # Events of transitions that have no reason of their own
    PROBE_STARTED = "ProbeStarted"
    TRAFFIC_SWITCHED = "TrafficSwitched"


GpuFamily = Literal["blackwell", "hopper", "any"]
RolloutPolicy = Literal["AllWorkloads", "WeightedMix"]

# Flags the operator owns on the SGLang command line. `sglang.extraArgs` may not set them: a user's
# --max-running-requests or --speculative-* in extraArgs would silently undo what the spec says.
MANAGED_SGLANG_FLAGS = (
    "model-path",
    "model",
    "host",
    "port",
    "tp",
    "tp-size",
    "tensor-parallel-size",
    "max-running-requests",
    "enable-metrics",
    "context-length",
    "mem-fraction-static",
    "quantization",
    # Multi-node servers (resources.nodes): rendered per rank of the LeaderWorkerSet group.
    "nnodes",
    "node-rank",
    "dist-init-addr",
    "nccl-init-addr",
)


def _prefixes(word: str) -> str:
    """Regex matching every non-empty prefix of word: argparse (and so SGLang) accepts unambiguous
    abbreviations, so `--max-running 48` sets --max-running-requests and must be refused as well."""
    pattern = ""
    for ch in reversed(word[1:]):
        pattern = f"({'[-_]' if ch == '-' else ch}{pattern})?"
    return word[0] + pattern


_MANAGED_FLAG_RE = (
    "^--("
    # Every --speculative-* flag, and every abbreviation of a managed flag (including "--spec").
    + "|".join(["speculative[-_][a-z0-9_-]*", _prefixes("speculative")] + [_prefixes(f) for f in MANAGED_SGLANG_FLAGS])
    + ")(=.*)?$"
)

# Flags the operator owns on the vLLM command line (engines/vllm.py renders them). vLLM's parser also accepts
# abbreviations, underscores for dashes, and a dotted key into a JSON flag (`--speculative-config.method eagle`
# sets a key of --speculative-config), so each is refused with all three; -tp and -sc are the short forms.
MANAGED_VLLM_FLAGS = (
    "model",
    "served-model-name",
    "host",
    "port",
    "tensor-parallel-size",
    "max-num-seqs",
    "max-model-len",
    "gpu-memory-utilization",
    "speculative-config",
    "disable-log-stats",
)

_MANAGED_VLLM_FLAG_RE = (
    "^(-tp|-sc|--(" + "|".join(["speculative[-_][a-z0-9_.-]*"] + [_prefixes(f) for f in MANAGED_VLLM_FLAGS]) + "))([.][^=]*)?(=.*)?$"
)

QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|K|M|G|T|P)?$"
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# A model load of the largest targets takes 5-10 minutes (seed: Kimi-K2.5, 547 GB), a probe up to its rounds: an
# hour without progress is a wait without an end, not a slow load.
DEFAULT_PROGRESS_DEADLINE_S = 3600
VERSION_PATTERN = r"^[0-9]+\.[0-9]+\.[0-9]+(\.post[0-9]+)?$"
# Kubernetes label syntax: key = [prefix/]name (name at most 63 of [A-Za-z0-9_.-], alphanumeric at both ends;
# prefix a DNS subdomain), value empty or like a name. The API server checks it only on the children, so a spec
# with a bad key was admitted and then every Deployment apply failed (found by the reliability fuzz).
_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
LABEL_KEY_PATTERN = rf"^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?{_LABEL_NAME}$"
LABEL_VALUE_PATTERN = rf"^({_LABEL_NAME})?$"

# The SGLang release an image tag names: an image of a repository called sglang (lmsysorg/sglang, a mirror's
# .../sglang) tagged v0.5.23, 0.5.23, v0.5.23-cu129, v0.5.9_b200 (after the version, '-' or '_' starts the build's
# own suffix: CUDA, platform), with or without a registry port or a digest. latest, dev, nightly-... or v0.5.23rc1
# name no release, nor does the version tag of another repository (my-team/inference:1.4.2 is that image's own
# version, not SGLang's). '[.]' rather than '\\.' (see _NO_DOTDOT below).
_RELEASE = "[0-9]+[.][0-9]+[.][0-9]+([.]post[0-9]+)?"


def _image_tag_pattern(release: str) -> str:
    """Regex matching an image of a repository called sglang whose tag names `release` (a regex)."""
    return f"^([^@]*/)?sglang:v?({release})([-_][A-Za-z0-9_.-]*)?(@.*)?$"


IMAGE_NAMES_A_RELEASE = _image_tag_pattern(_RELEASE)
_IMAGE_RELEASE = {v: _image_tag_pattern(v.replace(".", "[.]")) for v in SGLANG_VERSIONS}
IMAGE_NAMES_A_SUPPORTED_RELEASE = _image_tag_pattern("|".join(v.replace(".", "[.]") for v in SGLANG_VERSIONS))


def image_release(image: str) -> str | None:
    """The SGLang release image's tag names (lmsysorg/sglang:v0.5.23-cu129 -> 0.5.23), or None when it names none."""
    found = re.match(IMAGE_NAMES_A_RELEASE, image)
    return found.group(2) if found else None


def _supported_list() -> str:
    return ", ".join(SGLANG_VERSIONS[:-1]) + " or " + SGLANG_VERSIONS[-1]


def _tag_release_expression() -> str:
    """CEL: the supported release self.image's tag names (only evaluated when it names one)."""
    expr = f"'{SGLANG_VERSIONS[-1]}'"
    for version in reversed(SGLANG_VERSIONS[:-1]):
        expr = f"(self.image.matches('{_IMAGE_RELEASE[version]}') ? '{version}' : {expr})"
    return expr


UNNAMED_RELEASE_MESSAGE = (
    "{image} names no SGLang release (its repository is not called sglang, or its tag is latest, a digest or a name of "
    "your own), so the command line cannot be rendered for the release inside it: set spec.sglangVersion to that release "
    f"({_supported_list()}), or use an image tagged with it (lmsysorg/sglang:v{SGLANG_VERSIONS[-1]})"
)


def _release_rules() -> list[tuple[str, str, str | None, str]]:
    """CEL rules tying spec.image's tag to spec.sglangVersion: one truth about the release (docs/sglang-args.md)."""
    agreement = " || ".join(f"(self.sglangVersion == '{v}' && self.image.matches('{p}'))" for v, p in _IMAGE_RELEASE.items())
    return [
        (
            f"!self.image.matches('{IMAGE_NAMES_A_RELEASE}') || self.image.matches('{IMAGE_NAMES_A_SUPPORTED_RELEASE}')",
            f"image: its tag names an SGLang release the operator cannot render a command line for; use an image of SGLang {_supported_list()}",
            ".image",
            f"'image ' + self.image + ': its tag names an SGLang release the operator cannot render a command line for; "
            f"use an image of SGLang {_supported_list()}'",
        ),
        (
            f"!has(self.sglangVersion) || !self.image.matches('{IMAGE_NAMES_A_SUPPORTED_RELEASE}') || {agreement}",
            "sglangVersion disagrees with the release the image's tag names: leave sglangVersion out (the release comes from the tag) or use an image of that release",
            ".sglangVersion",
            "'sglangVersion ' + self.sglangVersion + ' disagrees with image ' + self.image + ' (SGLang ' + "
            + _tag_release_expression()
            + " + '): leave sglangVersion out (the release comes from the tag) or use an image of SGLang ' + self.sglangVersion",
        ),
        (
            # An image whose name says no release (a mirror that renames the repository, a digest, latest) would be
            # rendered for the operator's own release without a word: the spec must say which release is inside.
            f"(has(self.engine) && self.engine != '{DEFAULT.name}') || has(self.sglangVersion) || self.image.matches('{IMAGE_NAMES_A_RELEASE}')",
            UNNAMED_RELEASE_MESSAGE.format(image="image"),
            ".image",
            "'image ' + self.image + '" + UNNAMED_RELEASE_MESSAGE.format(image="") + "'",
        ),
    ]


def unnamed_release(spec: Mapping[str, Any]) -> str | None:
    """What the rule on an image that names no SGLang release refuses, in the same words, for a spec as written (the
    parsed spec has sglangVersion filled in): None for another engine, a set sglangVersion or an image naming a release."""
    image = spec.get("image")
    if (spec.get("engine") or DEFAULT.name) != DEFAULT.name or spec.get("sglangVersion") is not None or not isinstance(image, str):
        return None
    return None if image_release(image) is not None else f"image {image}" + UNNAMED_RELEASE_MESSAGE.format(image="")


_VLLM = f"has(self.engine) && self.engine == '{VLLM.name}'"
_SGLANG_DEFAULTS = (
    "(!has(self.sglang.maxRunningRequests) || self.sglang.maxRunningRequests == 128) && !has(self.sglang.memFractionStatic) "
    "&& (!has(self.sglang.extraArgs) || size(self.sglang.extraArgs) == 0) && (!has(self.sglang.env) || size(self.sglang.env) == 0)"
)


def _engine_rules() -> list[tuple[str, str, str | None]]:
    """CEL rules tying the settings to spec.engine: one engine's settings are refused with the other (engines/)."""
    return [
        (
            f"!({_VLLM}) || !self.image.matches('{IMAGE_NAMES_A_RELEASE}')",
            "image: its tag names an SGLang release, and engine vLLM needs a vLLM image (e.g. vllm/vllm-openai:v0.32.0)",
            ".image",
        ),
        (
            f"!({_VLLM}) || !has(self.sglangVersion)",
            "sglangVersion is an SGLang setting: with engine vLLM remove it (the command line is rendered for vLLM 0.32)",
            ".sglangVersion",
        ),
        (
            f"!({_VLLM}) || !has(self.sglang) || ({_SGLANG_DEFAULTS})",
            "sglang settings apply to engine SGLang only: with engine vLLM remove spec.sglang and use spec.vllm "
            "(maxNumSeqs, gpuMemoryUtilization, extraArgs, env)",
            ".sglang",
        ),
        (
            f"!has(self.vllm) || ({_VLLM})",
            "vllm settings apply to engine vLLM only: set engine: vLLM, or remove spec.vllm and use spec.sglang",
            ".vllm",
        ),
        (
            f"!({_VLLM}) || !has(self.resources) || !has(self.resources.nodes) || self.resources.nodes == 1",
            "resources.nodes above 1 needs engine SGLang: the operator renders vLLM servers of one node only",
            ".resources.nodes",
        ),
    ]


def _release_expression() -> str:
    """CEL: the SGLang release the command line is rendered for (spec.sglangVersion, else the one the image's tag names)."""
    return f"(has(self.sglangVersion) ? self.sglangVersion : {_tag_release_expression()})"


def _method_rules() -> list[tuple[str, str, str | None]]:
    """CEL rules refusing a method, or a method's setting, that the engine or the SGLang release does not serve: each
    (when, rule over one method's settings ``m``, message starting with the field) holds for spec.drafter and for every
    entry of spec.candidates."""
    sglang, release = f"!({_VLLM})", _release_expression()
    checks = [
        (
            sglang,
            "m.algorithm != 'SUFFIX'",
            "algorithm SUFFIX (suffix decoding) needs engine vLLM: SGLang has no suffix method; choose NGRAM for speculation "
            "without a drafter on SGLang, or set engine: vLLM",
            ".algorithm",
        ),
        (
            sglang,
            "!has(m.ngram) || (!has(m.ngram.minMatch) && !has(m.ngram.maxMatch))",
            "ngram.minMatch and ngram.maxMatch are vLLM's prompt_lookup_min/max: with engine SGLang remove them and use "
            "ngram.maxTrieDepth (and ngram.minBfsBreadth/maxBfsBreadth)",
            ".ngram",
        ),
        (
            f"({_VLLM})",
            "!has(m.ngram) || (!has(m.ngram.maxTrieDepth) && !has(m.ngram.minBfsBreadth) && !has(m.ngram.maxBfsBreadth))",
            "ngram.maxTrieDepth, minBfsBreadth and maxBfsBreadth are SGLang's: with engine vLLM remove them and use ngram.minMatch "
            "and ngram.maxMatch (prompt_lookup_min/max)",
            ".ngram",
        ),
        (
            f"({_VLLM})",
            "!has(m.eagleTopk) || m.eagleTopk == 1",
            "eagleTopk above 1 needs engine SGLang: the operator renders vLLM's speculation as a chain (eagleTopk 1)",
            ".eagleTopk",
        ),
        (
            f"({_VLLM})",
            "!has(m.numDraftTokens) || m.numDraftTokens == m.numSteps + 1",
            "numDraftTokens: vLLM verifies a chain of numSteps draft tokens; leave numDraftTokens out or set it to numSteps + 1",
            ".numDraftTokens",
        ),
    ]
    for version, methods in SGLANG_METHODS.items():
        lacking = tuple(a for a in DRAFT_MODEL_ALGORITHMS + TREE_ALGORITHMS + ("NGRAM",) if a not in methods)
        if lacking:
            later = next(v for v in SGLANG_VERSIONS if all(a in SGLANG_METHODS[v] for a in lacking))
            checks.append(
                (
                    f"{sglang} && {release} == '{version}'",
                    f"!({_in('m.algorithm', lacking)})",
                    f"algorithm {' and '.join(lacking)} needs SGLang {later} or later (SGLang {version} lacks it): use an image of "
                    f"a later release (lmsysorg/sglang:v{SGLANG_VERSIONS[-1]}) or another algorithm",
                    ".algorithm",
                )
            )
    checks.append(
        (
            f"{sglang} && {release} == '0.5.9'",
            "!has(m.ngram) || !has(m.ngram.maxTrieDepth)",
            "ngram.maxTrieDepth needs SGLang 0.5.22 or later (0.5.9 has no --speculative-ngram-max-trie-depth): remove it or use an "
            "image of a later release",
            ".ngram",
        )
    )
    rules: list[tuple[str, str, str | None]] = []
    for when, rule, message, field in checks:
        on_drafter = re.sub(r"\bm[.]", "self.drafter.", rule)
        rules.append((f"!({when}) || ({on_drafter})", f"drafter.{message}", f".drafter{field}"))
        rules.append((f"!({when}) || !has(self.candidates) || self.candidates.all(m, {rule})", f"candidates[].{message}", ".candidates"))
    return rules


def _candidate_rules() -> list[tuple[str, str, str | None]]:
    """CEL rules of spec.candidates against the rest of the spec."""
    names = "{" + ", ".join(f"'{a}': '{a.lower()}'" for a in get_args(Algorithm)) + "}"
    return [
        (
            "!has(self.candidates) || self.candidates.all(c, !has(c.path) || !c.path.startsWith('/') || c.path.startsWith(self.model.mountPath + '/'))",
            "candidates[].path must be relative to model.mountPath or an absolute path under it",
            ".candidates",
        ),
        (
            f"!has(self.candidates) || self.candidates.all(c, c.name != {names}[self.drafter.algorithm])",
            "candidates[].name must not be the name of spec.drafter's candidate (its algorithm in lower case, e.g. eagle3): rename the candidate",
            ".candidates",
        ),
    ]


def release_disagreement(image: str, sglang_version: str | None) -> str | None:
    """What _release_rules refuses, in the same words (the CLI and the operator parse specs with pydantic)."""
    tagged = image_release(image)
    if tagged is None:
        return None
    if tagged not in SGLANG_VERSIONS:
        return f"image {image}: its tag names an SGLang release the operator cannot render a command line for; use an image of SGLang {_supported_list()}"
    if sglang_version is not None and sglang_version != tagged:
        return (
            f"sglangVersion {sglang_version} disagrees with image {image} (SGLang {tagged}): leave sglangVersion out "
            f"(the release comes from the tag) or use an image of SGLang {sglang_version}"
        )
    return None


# metadata.name names the Services <name>, <name>-base and <name>-spec, which must be DNS-1035 labels (at most 63):
# a dotted or longer name is a valid resource name the API server would refuse Services for, one step at a time.
SERVICE_NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
MAX_NAME_LENGTH = 63 - len("-spec")
NAME_RULE_MESSAGE = (
    f"metadata.name names this server's Services (<name>, <name>-base, <name>-spec): at most {MAX_NAME_LENGTH} lowercase "
    "letters, digits and '-', starting with a letter, no dots"
)


def _cel(*rules: tuple[str, str, str | None] | tuple[str, str, str | None, str]) -> dict[str, Any]:
    """json_schema_extra carrying CEL rules: (rule, message, fieldPath or None[, messageExpression]).

    A messageExpression (a CEL expression giving the message) lets the refusal name the values it refuses; the
    static message stays for clients and documents that show rules without evaluating them."""
    out = []
    for rule, message, field_path, *message_expression in rules:
        item = {"rule": rule, "message": message}
        if field_path:
            item["fieldPath"] = field_path
        if message_expression:
            item["messageExpression"] = message_expression[0]
        out.append(item)
    return {"x-kubernetes-validations": out}


# The root's rule (CEL at the root may read metadata.name): kubectl apply refuses such a name at once; the operator
# says the same (InvalidSpec) for one admitted under an older CRD.
NAME_RULES = _cel(
    (
        f"self.metadata.name.matches('{SERVICE_NAME_PATTERN}') && size(self.metadata.name) <= {MAX_NAME_LENGTH}",
        NAME_RULE_MESSAGE,
        None,
        f'"metadata.name " + self.metadata.name + " cannot name this server\'s Services (" + self.metadata.name + "-spec and others): '
        f"use at most {MAX_NAME_LENGTH} lowercase letters, digits and '-', starting with a letter, no dots\"",
    )
)


def _label_keys(field: str) -> dict[str, Any]:
    """CEL rule on a string map: every key is a Kubernetes label (or annotation) key."""
    return _cel(
        (
            f"self.all(k, size(k) <= 317 && k.matches('{LABEL_KEY_PATTERN}'))",
            f"{field} keys must be Kubernetes label keys: [prefix/]name, the name at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit",
            None,
        )
    )


def _check_label_keys(value: dict[str, Any]) -> dict[str, Any]:
    for key in value:
        if len(key) > 317 or not re.match(LABEL_KEY_PATTERN, key):
            raise ValueError(f"{key!r} is not a Kubernetes label key ([prefix/]name, the name at most 63 letters, digits, '-', '_' or '.')")
    return value


LabelValue = Annotated[str, StringConstraints(pattern=LABEL_VALUE_PATTERN, max_length=63)]


def _free_object() -> dict[str, Any]:
    """Schema marker for an embedded Kubernetes object we pass through unchanged (volume source, affinity)."""
    return {"x-kubernetes-preserve-unknown-fields": True}


class _Model(BaseModel):
    # Unknown fields are errors (`specdec sglang-args -f` on a typo must fail, as the API server's strict
    # field validation does); camelCase on the wire, snake_case in Python.
    model_config = ConfigDict(extra="forbid", populate_by_name=True, use_enum_values=True)


class _SpecModel(_Model):
    """Spec sections: typed exactly as the API server types them, so the CLI and the cluster agree.

    strict: no coercion ("3" is not an integer, "true" not a boolean, 3.0 not an integer: the API server
    refuses the first two, and a CEL rule reading an integer field that holds 3.0 fails on the server).
    null is "unset": the API server drops null from typed fields before defaulting, so we drop it too.
    """

    model_config = ConfigDict(strict=True)

    @model_validator(mode="before")
    @classmethod
    def _null_is_unset(cls, data: Any) -> Any:
        return unset_nulls(cls, data)


def _drop_null_values(value: Any) -> Any:
    """A string map with null values: the API server prunes those entries."""
    return {k: v for k, v in value.items() if v is not None} if isinstance(value, dict) else value


# --------------------------------------------------------------------------------------------------
# Spec


class ModelStorage(_SpecModel):
    volume: dict[str, Any] = Field(
        description=(
            "Where the weights live: one core/v1 volume source, exactly as in a Pod's volumes[] entry without "
            "its name (persistentVolumeClaim, hostPath, nfs, csi, ...). Mounted read-only into both servers."
        ),
        json_schema_extra={**_free_object(), "minProperties": 1, "maxProperties": 1},
    )
    mount_path: str = Field(
        "/models",
        alias="mountPath",
        description="Where the volume is mounted in the server containers; target.path and drafter.path are relative to it.",
        pattern=r"^(/[^/\x00]+)+$",  # absolute, no trailing slash: the path rules below join with "/"
        max_length=1024,
    )

    @field_validator("volume")
    @classmethod
    def _one_volume_source(cls, value: dict[str, Any]) -> dict[str, Any]:
        # minProperties/maxProperties are schema keywords pydantic does not enforce on a free-form dict.
        if len(value) != 1:
            raise ValueError(f"must name exactly one volume source (e.g. persistentVolumeClaim), got {len(value)}")
        return value


# '[.]' rather than '\\.': a backslash escape inside a CEL string literal must itself be escaped, and the API
# server refuses the CRD otherwise (cel-python is more lenient).
_NO_DOTDOT = r"(^|/)[.][.](/|$)"


class Target(_SpecModel):
    model_config = ConfigDict(
        json_schema_extra=_cel(
            (f"!self.path.matches('{_NO_DOTDOT}')", "target.path must not contain '..' segments", ".path"),
        )
    )
    path: str = Field(
        description="Directory of the target model, relative to model.mountPath (or absolute under it).",
        min_length=1,
        max_length=1024,
    )
    quantization: Quantization = Field(
        "auto",
        description=(
            "Quantization the target is SERVED with. auto reads it from the target's config.json "
            "quantization_config (compressed-tensors/awq/gptq 4-bit -> int4, fp8, modelopt NVFP4 -> fp4, none -> bf16). "
            "The drafter must have been trained on hidden states of this same quantization."
        ),
    )
    context_length: int | None = Field(
        None,
        alias="contextLength",
        description="Maximum context length served (--context-length). Unset: the model's own.",
        ge=1,
        le=10_485_760,
    )


# What each engine serves of the methods (choices.Algorithm), as the operator renders them. SGLang: per release, read
# from SpeculativeAlgorithm in each release's sglang/srt/speculative/spec_info.py (0.5.9 has no DFLASH; no release has
# suffix decoding). vLLM 0.32: SpeculativeMethod in vllm/config/speculative.py, under its own names.
SGLANG_METHODS: dict[str, tuple[Algorithm, ...]] = {
    "0.5.9": ("EAGLE3", "EAGLE", "NEXTN", "STANDALONE", "NGRAM"),
    "0.5.22": ("EAGLE3", "EAGLE", "NEXTN", "STANDALONE", "DFLASH", "NGRAM"),
    "0.5.23": ("EAGLE3", "EAGLE", "NEXTN", "STANDALONE", "DFLASH", "NGRAM"),
}
VLLM_METHODS: dict[str, str] = {
    "EAGLE3": "eagle3",
    "EAGLE": "eagle",
    "NEXTN": "mtp",  # the target's own MTP layers, vLLM's generic mtp
    "STANDALONE": "draft_model",
    "DFLASH": "dflash",
    "NGRAM": "ngram",
    "SUFFIX": "suffix",  # needs the arctic-inference package in the image
}
# What spec.includeDrafterFree adds: n-gram speculation, which both engines serve (every SGLang release above, vLLM's
# ngram). vLLM's suffix decoding is left to be named (candidates[].algorithm SUFFIX): it needs the arctic-inference
# package, which an image may lack, and vLLM refuses to start without it.
DRAFTER_FREE_DEFAULTS: tuple[Algorithm, ...] = ("NGRAM",)

# The admission rule's words, also said by reconcile (refused.py) of a resource admitted under an older CRD.
NEXTN_PATH_MESSAGE = (
    "drafter.path must not be set with algorithm NEXTN, which drafts with the target's own multi-token-prediction "
    "layers: remove drafter.path, or choose EAGLE3 or EAGLE for a separate draft model"
)
_LIST = "', '".join  # a CEL list literal's items


def _in(expr: str, methods: tuple[str, ...]) -> str:
    return f"{expr} in ['{_LIST(methods)}']"


class NgramSettings(_SpecModel):
    """N-gram speculation's parameters (algorithm NGRAM): the drafts are spans of the prompt and the output so far."""

    model_config = ConfigDict(
        json_schema_extra=_cel(
            (
                "!has(self.minMatch) || !has(self.maxMatch) || self.minMatch <= self.maxMatch",
                "ngram.minMatch must be at most ngram.maxMatch",
                ".minMatch",
            ),
            (
                "!has(self.minBfsBreadth) || !has(self.maxBfsBreadth) || self.minBfsBreadth <= self.maxBfsBreadth",
                "ngram.minBfsBreadth must be at most ngram.maxBfsBreadth",
                ".minBfsBreadth",
            ),
        )
    )
    min_match: int | None = Field(
        None,
        alias="minMatch",
        description="engine vLLM: the shortest n-gram matched against the context (prompt_lookup_min; unset: vLLM's 5).",
        ge=1,
        le=64,
    )
    max_match: int | None = Field(
        None,
        alias="maxMatch",
        description="engine vLLM: the longest n-gram matched against the context (prompt_lookup_max; unset: vLLM's 5).",
        ge=1,
        le=64,
    )
    max_trie_depth: int | None = Field(
        None,
        alias="maxTrieDepth",
        description="engine SGLang 0.5.22 and later: how many recent tokens the n-gram trie matches and stores (--speculative-ngram-max-trie-depth; unset: 18).",
        ge=1,
        le=1024,
    )
    min_bfs_breadth: int | None = Field(
        None,
        alias="minBfsBreadth",
        description="engine SGLang: the draft tree's smallest breadth (--speculative-ngram-min-bfs-breadth; unset: 1).",
        ge=1,
        le=64,
    )
    max_bfs_breadth: int | None = Field(
        None,
        alias="maxBfsBreadth",
        description="engine SGLang: the draft tree's largest breadth (--speculative-ngram-max-bfs-breadth; unset: 10).",
        ge=1,
        le=64,
    )


class SuffixSettings(_SpecModel):
    """Suffix decoding's parameters (algorithm SUFFIX, engine vLLM: its suffix_decoding_* keys)."""

    max_tree_depth: int | None = Field(
        None,
        alias="maxTreeDepth",
        description="The suffix tree's depth: the longest draft (suffix_decoding_max_tree_depth; unset: 24).",
        ge=1,
        le=1024,
    )
    max_spec_factor: float | None = Field(
        None,
        alias="maxSpecFactor",
        description="Drafts at most this times the matched prefix's length (suffix_decoding_max_spec_factor; unset: 1.0).",
        ge=0,
        le=100,
    )
    min_token_prob: float | None = Field(
        None,
        alias="minTokenProb",
        description="Drafts only tokens at least this frequent after the match (suffix_decoding_min_token_prob; unset: 0.1).",
        ge=0,
        le=1,
    )


def _drafter_rules(shown: str) -> list[tuple[str, str, str | None]]:
    """The CEL rules of one speculative method's settings (spec.drafter, or each of spec.candidates)."""
    chain_free = "self.algorithm == 'NGRAM'"  # SGLang's n-gram tree: numDraftTokens is its size, not numSteps + 1
    return [
        (
            f"{chain_free} || !has(self.numDraftTokens) || self.eagleTopk != 1 || self.numDraftTokens == self.numSteps + 1",
            f"{shown}.numDraftTokens must equal {shown}.numSteps + 1 when {shown}.eagleTopk is 1 "
            "(a chain of numSteps drafts plus the bonus token; SGLang would silently change it)",
            ".numDraftTokens",
        ),
        (
            "self.eagleTopk == 1 || has(self.numDraftTokens)",
            f"{shown}.numDraftTokens is required when {shown}.eagleTopk is above 1 (the tree size cannot be derived)",
            ".numDraftTokens",
        ),
        (
            f"{chain_free} || !has(self.numDraftTokens) || self.eagleTopk == 1 || self.numDraftTokens <= self.numSteps * self.eagleTopk + 1",
            f"{shown}.numDraftTokens must be at most numSteps * eagleTopk + 1 (the size of the draft tree)",
            ".numDraftTokens",
        ),
        (
            f"self.eagleTopk == 1 || {_in('self.algorithm', TREE_ALGORITHMS)}",
            f"{shown}.eagleTopk above 1 (a draft tree) needs algorithm EAGLE3, EAGLE, NEXTN or STANDALONE: DFLASH and SUFFIX draft "
            "a chain, NGRAM's tree breadth is ngram.maxBfsBreadth; remove eagleTopk",
            ".eagleTopk",
        ),
        (
            f"has(self.path) || !({_in('self.algorithm', DRAFT_MODEL_ALGORITHMS)})",
            f"{shown}.path is required for EAGLE3, EAGLE, STANDALONE and DFLASH (the draft model's directory; NEXTN uses the "
            "target's own layers, NGRAM and SUFFIX need no drafter)",
            ".path",
        ),
        (
            # A NEXTN server drafts with the target's own layers: a path would be ignored by the command line,
            # and the operator would wait for a validator verdict no init container ever gives.
            "self.algorithm != 'NEXTN' || !has(self.path)",
            NEXTN_PATH_MESSAGE.replace("drafter.path", f"{shown}.path"),
            ".path",
        ),
        (
            f"!({_in('self.algorithm', DRAFTER_FREE_ALGORITHMS)}) || !has(self.path)",
            f"{shown}.path must not be set with algorithm NGRAM or SUFFIX, which draft from the prompt and the output so far: "
            "remove it, or choose STANDALONE for a small draft model",
            ".path",
        ),
        (
            f"!has(self.path) || !self.path.matches('{_NO_DOTDOT}')",
            f"{shown}.path must not contain '..' segments",
            ".path",
        ),
        ("!has(self.ngram) || self.algorithm == 'NGRAM'", f"{shown}.ngram applies to algorithm NGRAM only: remove it", ".ngram"),
        ("!has(self.suffix) || self.algorithm == 'SUFFIX'", f"{shown}.suffix applies to algorithm SUFFIX only: remove it", ".suffix"),
    ]


class Drafter(_SpecModel):
    model_config = ConfigDict(json_schema_extra=_cel(*_drafter_rules("drafter")))
    algorithm: Algorithm = Field(
        "EAGLE3",
        description=(
            "Speculative method: EAGLE3 (a draft fed by three target layers), EAGLE, NEXTN (the target's own "
            "multi-token-prediction layers, DeepSeek-V3/Kimi style; vLLM's mtp), STANDALONE (a small model of the target's "
            "family and tokenizer; vLLM's draft_model), DFLASH (a block-diffusion drafter; SGLang 0.5.22 and later, vLLM), "
            "NGRAM (no drafter: drafts from the prompt and the output so far) or SUFFIX (vLLM's suffix decoding, no drafter; "
            "the image needs the arctic-inference package)."
        ),
    )
    path: str | None = Field(
        None,
        description="Directory of the draft model, relative to model.mountPath (or absolute under it): EAGLE3, EAGLE, STANDALONE and DFLASH only.",
        min_length=1,
        max_length=1024,
    )
    num_steps: int = Field(
        3,
        alias="numSteps",
        description="Draft tokens per verify step of a chain: SGLang's --speculative-num-steps (DFLASH: its block is numSteps + 1 "
        "tokens, --speculative-num-draft-tokens; NGRAM: the tree holds numSteps + 1 tokens unless numDraftTokens says), vLLM's "
        "num_speculative_tokens.",
        ge=1,
        le=16,
    )
    eagle_topk: int = Field(
        1,
        alias="eagleTopk",
        description="Branching factor per draft step (--speculative-eagle-topk); 1 is a chain. EAGLE3, EAGLE, NEXTN and STANDALONE "
        "with engine SGLang only.",
        ge=1,
        le=16,
    )
    num_draft_tokens: int | None = Field(
        None,
        alias="numDraftTokens",
        description="Tokens verified per step (--speculative-num-draft-tokens). Unset: numSteps + 1 (a chain); required when "
        "eagleTopk > 1; with NGRAM on SGLang the size of its draft tree (any value up to 64).",
        ge=2,
        le=64,
    )
    ngram: NgramSettings | None = Field(None, description="algorithm NGRAM: the n-gram sizes (vLLM) or the trie and tree (SGLang).")
    suffix: SuffixSettings | None = Field(None, description="algorithm SUFFIX (engine vLLM): the suffix tree's limits.")

    @property
    def draft_tokens(self) -> int:
        """The effective --speculative-num-draft-tokens."""
        return self.num_draft_tokens if self.num_draft_tokens is not None else self.num_steps + 1


# metadata.name of a candidate's speculative server will carry its name (the race, issue 35): short, a DNS label.
CANDIDATE_NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
MAX_CANDIDATE_NAME_LENGTH = 20
MAX_CANDIDATES = 8


class Candidate(Drafter):
    """One speculative configuration to measure against the base: a method and its settings, as spec.drafter has them."""

    model_config = ConfigDict(json_schema_extra=_cel(*_drafter_rules("candidates[]")))
    name: str = Field(
        description="The candidate's name, unique among the candidates and not the name of spec.drafter's candidate (its "
        "algorithm in lower case, e.g. eagle3).",
        pattern=CANDIDATE_NAME_PATTERN,
        max_length=MAX_CANDIDATE_NAME_LENGTH,
    )


def drafter_candidate_name(drafter: Drafter) -> str:
    """The name spec.drafter has among the candidates: its algorithm in lower case (eagle3, ngram)."""
    return drafter.algorithm.lower()


class Resources(_SpecModel):
    model_config = ConfigDict(
        json_schema_extra=_cel(
            (
                # has(): the API server also checks the rule on the object's default ({}), before its fields default.
                "!has(self.nodes) || self.nodes == 1 || !has(self.gpus) || self.gpus <= 8",
                "resources.gpus is per node when resources.nodes is above 1: at most 8 (a node's GPUs)",
                ".gpus",
            ),
        )
    )
    gpus: Literal[1, 2, 4, 8, 16] = Field(
        8,
        description=(
            "GPUs per pod. With resources.nodes 1 each server is one pod and this is its tensor-parallel size "
            "(--tp); with more nodes the tensor-parallel size is gpus * nodes."
        ),
    )
    gpu_family: GpuFamily = Field(
        "blackwell",
        alias="gpuFamily",
        description="GPU generation the servers must run on, rendered as node affinity on the nvidia.com/gpu.family label of GPU feature discovery; any adds no affinity.",
    )
    shm_size: str = Field(
        "32Gi",
        alias="shmSize",
        description="Size of the memory-backed /dev/shm emptyDir (NCCL and SGLang's shared-memory transport need far more than the 64Mi default).",
        pattern=QUANTITY_PATTERN,
        max_length=32,
    )
    cpu: str | None = Field(
        None,
        description="CPU request and limit of each server container (unset: none).",
        pattern=QUANTITY_PATTERN.replace("(Ki", "(m|Ki"),
        max_length=32,
    )
    memory: str | None = Field(
        None, description="Memory request and limit of each server container (unset: none).", pattern=QUANTITY_PATTERN, max_length=32
    )
    nodes: int = Field(
        1,
        description=(
            "Nodes per server. 1: each server is one pod (a Deployment replica). Above 1: each server is one "
            "LeaderWorkerSet group of this many pods on distinct nodes of resources.gpuFamily, each pod with "
            "resources.gpus GPUs, SGLang's tensor parallelism spanning them all (--tp gpus*nodes, --nnodes, "
            "--node-rank); needs the LeaderWorkerSet controller (sigs.k8s.io/lws) in the cluster."
        ),
        ge=1,
        le=64,
    )


def _check_env_names(value: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # The items' schema (required name, 1-256 characters) lives in json_schema_extra: enforce it here too.
    for i, var in enumerate(value):
        name = var.get("name")
        if not isinstance(name, str) or not 1 <= len(name) <= 256:
            raise ValueError(f"env[{i}].name must be a string of 1 to 256 characters")
    return value


def _extra_args_field(description: str, managed_flag_re: str, refusal: str) -> Any:
    """spec.<engine>.extraArgs: free flags for both servers, with a CEL rule refusing those the operator manages."""
    return Field(
        default_factory=list,
        alias="extraArgs",
        description=description,
        max_length=64,
        json_schema_extra={"items": {"type": "string", "maxLength": 1024}, **_cel((f"self.all(a, !a.matches('{managed_flag_re}'))", refusal, None))},
    )


def _server_env_field() -> Any:
    """spec.<engine>.env: core/v1 EnvVar objects for both server containers (a name is required; the rest passes through)."""
    return Field(
        default_factory=list,
        description="Environment variables of both server containers (core/v1 EnvVar objects: name with value or valueFrom).",
        max_length=128,
        json_schema_extra={
            "items": {
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": True,
                "required": ["name"],
                "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 256, "description": "Variable name."}},
            }
        },
    )


class SGLangSettings(_SpecModel):
    max_running_requests: int = Field(
        128,
        alias="maxRunningRequests",
        description=(
            "Always passed as --max-running-requests. Without it SGLang silently caps speculative servers at 48 "
            "running requests, which made a 128-stream workload run at 0.36x."
        ),
        ge=1,
        le=16384,
    )
    mem_fraction_static: float | None = Field(
        None,
        alias="memFractionStatic",
        description="--mem-fraction-static: fraction of GPU memory for weights and KV cache (unset: SGLang's own choice).",
        gt=0,
        lt=1,
    )
    extra_args: list[str] = _extra_args_field(
        "Additional SGLang flags appended to both servers. Flags the operator manages (--speculative-*, --tp, --host, --port, --model-path, --max-running-requests, ...) are refused.",
        _MANAGED_FLAG_RE,
        "sglang.extraArgs must not set flags the operator manages (--speculative-*, --tp, --host, --port, "
        "--model-path, --max-running-requests, --enable-metrics, --context-length, --mem-fraction-static, "
        "--quantization, --nnodes, --node-rank, --dist-init-addr): use the matching spec field",
    )
    env: list[dict[str, Any]] = _server_env_field()

    _env_names = field_validator("env")(_check_env_names)


class VLLMSettings(_SpecModel):
    max_num_seqs: int = Field(
        128,
        alias="maxNumSeqs",
        description="Always passed as --max-num-seqs: the most requests a vLLM server runs at once (a batch).",
        ge=1,
        le=16384,
    )
    gpu_memory_utilization: float | None = Field(
        None,
        alias="gpuMemoryUtilization",
        description="--gpu-memory-utilization: fraction of GPU memory for weights, activations and KV cache (unset: vLLM's own, 0.9).",
        gt=0,
        le=1,
    )
    served_model_name: str | None = Field(
        None,
        alias="servedModelName",
        description="--served-model-name: the model name clients send (unset: the name of target.path's directory).",
        pattern=r"^[A-Za-z0-9][-A-Za-z0-9_.:/]*$",
        max_length=256,
    )
    extra_args: list[str] = _extra_args_field(
        "Additional vLLM flags appended to both servers. Flags the operator manages (--speculative-config and its keys, "
        "--model, --served-model-name, --host, --port, --tensor-parallel-size, --max-num-seqs, --max-model-len, "
        "--gpu-memory-utilization, --disable-log-stats) are refused.",
        _MANAGED_VLLM_FLAG_RE,
        "vllm.extraArgs must not set flags the operator manages (--speculative-config and its keys, --model, "
        "--served-model-name, --host, --port, --tensor-parallel-size, --max-num-seqs, --max-model-len, "
        "--gpu-memory-utilization, --disable-log-stats): use the matching spec field",
    )
    env: list[dict[str, Any]] = _server_env_field()

    _env_names = field_validator("env")(_check_env_names)


# spec.engine: the server both variants run. Settings of one engine (spec.sglang, spec.sglangVersion; spec.vllm) are
# refused with the other, and so is what only SGLang serves (multi-node servers, EAGLE trees). Its names are
# enginefacts.EngineName ("SGLang" | "vLLM"), its default enginefacts.DEFAULT.

# Where a workload's prompts come from. Default: the project's own prompt set shipped with the operator (code,
# chat, math, summarisation, several languages). Random: random token ids of exactly inputTokens (synthetic
# traffic: the decision says so). ConfigMap: a dataset in a ConfigMap key of the resource's namespace. File: a
# dataset file on the model volume or on another PVC, read by a small reader pod the operator starts (docs/probe.md).
PromptSourceKind = Literal["Default", "Random", "ConfigMap", "File"]


# A dataset's format: Chat (JSONL of OpenAI chat requests, {"messages": [...]}, optional max_tokens), ShareGPT
# ({"conversations": [{"from", "value"}]}, JSONL or one JSON array), Prompt (JSONL of {"prompt": "..."}); Auto
# tells them apart by their keys, line by line.
DatasetFormat = Literal["Auto", "Chat", "ShareGPT", "Prompt"]


# How text prompts are sent: Chat is /v1/chat/completions, streaming, the server applying its chat template;
# Generate is SGLang's native /generate with `text` (the contents as they are, no template). Random ids always go
# through /generate as input_ids.
PromptEndpoint = Literal["Chat", "Generate"]


# Fixed: every request generates exactly outputTokens (ignore_eos), so rounds compare like for like. Dataset: the
# prompt's own max_tokens (maxOutputTokens where it has none, and never more), stopping at EOS like real traffic.
OutputLength = Literal["Fixed", "Dataset"]


class ConfigMapKey(_SpecModel):
    name: str = Field(description="ConfigMap name, in the SpeculativeServer's namespace.", pattern=DNS_SUBDOMAIN_PATTERN, max_length=253)
    key: str = Field(description="Key holding the dataset (e.g. prompts.jsonl).", pattern=r"^[-._a-zA-Z0-9]+$", max_length=253)


class DatasetFile(_SpecModel):
    model_config = ConfigDict(
        json_schema_extra=_cel(
            (f"!self.path.matches('{_NO_DOTDOT}')", "prompts.file.path must not contain '..' segments", ".path"),
        )
    )
    path: str = Field(
        description="The dataset file, relative to the volume's root (the model volume: relative to model.mountPath).",
        pattern=r"^[^/\x00-\x1f][^\x00-\x1f]*$",  # relative; no control characters (errors name it on one line)
        min_length=1,
        max_length=1024,
    )
    claim_name: str | None = Field(
        None,
        alias="claimName",
        description="A PersistentVolumeClaim in the SpeculativeServer's namespace holding the file; absent: the model volume.",
        pattern=DNS_SUBDOMAIN_PATTERN,
        max_length=253,
    )


class Prompts(_SpecModel):
    model_config = ConfigDict(
        json_schema_extra=_cel(
            (
                # has(): the API server also checks the rules on the default ({}), before its fields default.
                "(has(self.source) && self.source == 'ConfigMap') == has(self.configMap)",
                "prompts.configMap is required with source ConfigMap, and only allowed with it",
                ".configMap",
            ),
            (
                "(has(self.source) && self.source == 'File') == has(self.file)",
                "prompts.file is required with source File, and only allowed with it",
                ".file",
            ),
            (
                "!has(self.source) || self.source != 'Random' || !has(self.endpoint) || self.endpoint == 'Generate'",
                "prompts.endpoint: random token ids are sent to /generate; endpoint Chat needs text prompts (source Default, ConfigMap or File)",
                ".endpoint",
            ),
            (
                "!has(self.source) || self.source != 'Random' || !has(self.outputLength) || self.outputLength == 'Fixed'",
                "prompts.outputLength: random token ids have no length of their own; use Fixed (outputTokens)",
                ".outputLength",
            ),
            (
                "!has(self.source) || self.source != 'Random' || !has(self.format)",
                "prompts.format applies to datasets (source Default, ConfigMap or File), not to random token ids",
                ".format",
            ),
        )
    )
    source: PromptSourceKind = Field(
        "Default", description="Default (the operator's own prompt set), Random (random token ids of inputTokens), ConfigMap or File."
    )
    config_map: ConfigMapKey | None = Field(None, alias="configMap", description="The ConfigMap key holding the dataset (source ConfigMap).")
    file: DatasetFile | None = Field(
        None, description="The dataset file on the model volume or on a PersistentVolumeClaim (source File; read by a reader pod)."
    )
    format: DatasetFormat | None = Field(None, description="Dataset format: Auto (the default), Chat, ShareGPT or Prompt.")
    endpoint: PromptEndpoint | None = Field(
        None, description="Chat (/v1/chat/completions, the server's chat template; the default for text) or Generate (/generate with text)."
    )
    output_length: OutputLength = Field(
        "Fixed",
        alias="outputLength",
        description="Fixed: exactly outputTokens per request (ignore_eos). Dataset: the prompt's own max_tokens, capped by maxOutputTokens, stopping at EOS.",
    )
    max_output_tokens: int = Field(
        1024,
        alias="maxOutputTokens",
        description="With outputLength Dataset: the cap on a request's output, and its length when the prompt gives none.",
        ge=1,
        le=65_536,
    )


class Workload(_SpecModel):
    model_config = ConfigDict(
        json_schema_extra=_cel(
            (
                "self.requests >= self.concurrency",
                "rollout.workloads[].requests must be at least its concurrency, or the concurrency is never reached",
                ".requests",
            ),
        )
    )
    name: str = Field(description="Workload name, unique within rollout.workloads.", pattern=DNS_LABEL_PATTERN, max_length=63)
    concurrency: int = Field(description="Concurrent streams (closed-loop clients).", ge=1, le=4096)
    input_tokens: int = Field(
        1024,
        alias="inputTokens",
        description="Prompt length in tokens (prompts.source Random only: a dataset's prompts have their own).",
        ge=1,
        le=1_048_576,
    )
    output_tokens: int = Field(
        256, alias="outputTokens", description="Generated tokens per request (fixed, ignore_eos) with prompts.outputLength Fixed.", ge=1, le=65_536
    )
    requests: int = Field(description="Requests per round and server.", ge=1, le=100_000)
    weight: float = Field(1.0, description="Share of this workload in the WeightedMix policy.", gt=0, le=1000)
    prompts: Prompts = Field(
        default_factory=Prompts,
        description="Where the prompts come from and how they are sent (default: the operator's own prompt set, chat endpoint).",
    )


_DEFAULT_PROMPTS: dict[str, Any] = {"source": "Default", "outputLength": "Fixed", "maxOutputTokens": 1024}
DEFAULT_WORKLOADS: list[dict[str, Any]] = [
    {"name": "single-stream", "concurrency": 1, "inputTokens": 1024, "outputTokens": 256, "requests": 4, "weight": 1.0, "prompts": _DEFAULT_PROMPTS},
    {
        "name": "concurrent-64",
        "concurrency": 64,
        "inputTokens": 1024,
        "outputTokens": 256,
        "requests": 128,
        "weight": 1.0,
        "prompts": _DEFAULT_PROMPTS,
    },
]


class OutputCheck(_SpecModel):
    enabled: bool = Field(True, description="Compare the greedy completions of both servers before deciding; a mismatch rolls back (OutputMismatch).")
    prompts: int = Field(8, description="Prompts compared, taken in turn from the workloads' prompts.", ge=1, le=256)
    max_tokens: int = Field(64, alias="maxTokens", description="Tokens generated per compared prompt (temperature 0, ignore_eos).", ge=1, le=4096)
    min_match_rate: float = Field(
        0.9,
        alias="minMatchRate",
        description="Roll back when the mean share of each completion's tokens before its first difference from the base is below this (docs/probe.md).",
        ge=0,
        le=1,
    )


class Rollout(_SpecModel):
    model_config = ConfigDict(
        json_schema_extra=_cel(
            (
                # has(): the API server also checks the rule on the object's default ({}), before its fields default.
                "!has(self.maxSurge) || !has(self.maxUnavailable) || self.maxSurge > 0 || self.maxUnavailable > 0",
                "rollout.maxSurge and rollout.maxUnavailable must not both be 0: the walk from one variant to the "
                "other could never replace a replica (as in a Deployment)",
                ".maxUnavailable",
            ),
        )
    )
    min_speedup: float = Field(
        1.0,
        alias="minSpeedup",
        description="Promote only when the lower end of the speedup's confidence interval is at least this (speculative tok/s over base tok/s).",
        gt=0,
        le=100,
    )
    policy: RolloutPolicy = Field(
        "AllWorkloads",
        description="AllWorkloads: every workload must pass. WeightedMix: the weight-averaged speedup must pass.",
    )
    workloads: list[Workload] = Field(
        default_factory=lambda: [Workload.model_validate(w) for w in DEFAULT_WORKLOADS],
        description="Traffic shapes to measure, each run against both servers in alternating paired rounds.",
        min_length=1,
        max_length=16,
        json_schema_extra={
            "default": cast(Any, DEFAULT_WORKLOADS),
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"],
        },
    )

    @field_validator("workloads")
    @classmethod
    def _unique_names(cls, value: list[Workload]) -> list[Workload]:
        # A list-type map: the API server refuses a repeated key.
        seen: set[str] = set()
        for i, workload in enumerate(value):
            if workload.name in seen:
                raise ValueError(f"workloads[{i}].name {workload.name!r} is repeated: names must be unique")
            seen.add(workload.name)
        return value

    max_rounds: int = Field(
        6, alias="maxRounds", description="Paired rounds before an undecided probe ends Inconclusive (which never promotes).", ge=1, le=50
    )
    accept_length_floor: float = Field(
        1.1,
        alias="acceptLengthFloor",
        description="A speculative server whose acceptance length is at or below this after the first round is rejected at once (DrafterNotAccepting).",
        ge=1.0,
        le=64,
    )
    max_surge: int = Field(
        0,
        alias="maxSurge",
        description=(
            "Servers above spec.replicas that the fleet may request while it walks from one variant to the other "
            "(the canary included). 0: no spare GPUs are needed (a base replica becomes the probe's comparison and "
            "the canary replaces another). A GPU server rarely has room to surge on a full node."
        ),
        ge=0,
        le=1000,
    )
    max_unavailable: int = Field(
        1,
        alias="maxUnavailable",
        description="Servers below spec.replicas that may be not Ready while the fleet walks from one variant to the other.",
        ge=0,
        le=1000,
    )
    keep_base_warm: bool = Field(
        True,
        alias="keepBaseWarm",
        description="After a promotion, keep the base server running (its GPUs serve no traffic) for an instant rollback, instead of "
        "scaling it to 0. One server only: a fleet walks every server to the winner.",
    )
    keep_speculative_warm: bool = Field(
        False,
        alias="keepSpeculativeWarm",
        description="After a rollback, keep the speculative server that lost running (its GPUs serve no traffic), e.g. to debug its "
        "acceptance. Off by default: a speculative server that lost holds no GPUs. One server only.",
    )
    update_strategy: Literal["RollingUpdate", "Recreate"] = Field(
        "RollingUpdate",
        alias="updateStrategy",
        description="How a one-server resource (replicas 1) replaces a promoted speculative server whose pod template changes (a new "
        "image, drafter or argument). RollingUpdate: the new base starts beside the old speculative server, which serves until "
        "the base does; it needs the GPUs of one more server, and where none are free the resource fails fast (reason "
        "UpdateBlocked) and the old server keeps serving. Recreate: the old speculative server is scaled to 0 first, then the "
        "new base and then the new speculative server start: no extra GPUs, but nothing serves until the new base is Ready "
        "(downtime). Fleets (replicas 2 and more) walk within maxSurge/maxUnavailable and ignore it.",
    )
    load_aware: Literal["Auto", "Off"] = Field(
        LoadAware.AUTO.value,
        alias="loadAware",
        description="Auto: when the speculative server wins at low concurrency and loses at high, restart it with SGLang's adaptive "
        "speculation (no drafting from the measured break-even batch size up; EAGLE/EAGLE3 with eagleTopk 1 only) and promote it if it is "
        "never slower than the base. Off: promote or roll back on the plain probe only.",
    )
    output_check: OutputCheck = Field(
        default_factory=OutputCheck,
        alias="outputCheck",
        description="Same answers: the speculative server's greedy completions must equal the base's.",
    )


class Monitor(_SpecModel):
    enabled: bool = Field(True, description="Scrape the promoted speculative server and roll back on acceptance drift.")
    interval: int = Field(30, description="Seconds between scrapes of the speculative pods' /metrics.", ge=5, le=3600)
    accept_length_floor: float = Field(
        1.1,
        alias="acceptLengthFloor",
        description="Roll back (AcceptanceDrift) when the acceptance length (SGLang's sglang:spec_accept_length; vLLM's 1 + accepted "
        "over drafts between two scrapes) stays below this for monitor.window consecutive scrapes.",
        ge=1.0,
        le=64,
    )
    window: int = Field(5, description="Consecutive scrapes below the floor that trigger a rollback.", ge=1, le=1000)


class PodMetadata(_SpecModel):
    labels: dict[str, LabelValue] = Field(
        default_factory=dict,
        description="Extra labels on the server pods (the operator's own labels win).",
        max_length=64,
        json_schema_extra=_label_keys("podMetadata.labels"),
    )
    annotations: dict[str, str] = Field(
        default_factory=dict,
        description="Extra annotations on the server pods.",
        max_length=64,
        json_schema_extra=_label_keys("podMetadata.annotations"),
    )

    _maps_drop_null = field_validator("labels", "annotations", mode="before")(_drop_null_values)
    _keys = field_validator("labels", "annotations")(_check_label_keys)


# What the operator puts into every server pod itself, and what a podTemplate may therefore not take: the volumes'
# names and the directories they are mounted at (manifests.py renders them; tests/unit/test_podtemplate.py keeps the
# two equal). The model volume is mounted at model.mountPath.
OPERATOR_VOLUME_NAMES = ("model", "dshm", "tmp", "cache", "adaptive-config")
OPERATOR_MOUNT_PATHS = ("/dev/shm", "/tmp", "/cache", "/etc/specdec/adaptive")
_ABSOLUTE_PATH = r"^(/[^/\x00]+)+$"  # absolute, no trailing slash, not "/": the rules compare prefixes joined with "/"


def _free_list(max_items: int, item_extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Schema of a list of embedded Kubernetes objects passed through unchanged (tolerations, volumes, ...)."""
    return {"items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True, **(item_extra or {})}, "maxItems": max_items}


class LocalObjectReference(_SpecModel):
    name: str = Field(description="Name of an object in the SpeculativeServer's namespace.", pattern=DNS_SUBDOMAIN_PATTERN, max_length=253)


class PodTemplate(_SpecModel):
    """What a platform team sets on its pods, taken by every server pod the operator creates (both variants'
    Deployments, or the leader and worker templates of LeaderWorkerSets).

    The operator owns the rest: the containers' image, command, GPU limits, probes and ports, the model volume and
    its mount, /dev/shm, /tmp and /cache. A field that would change those is refused at admission.
    """

    model_config = ConfigDict(
        json_schema_extra=_cel(
            (
                "!has(self.volumes) || self.volumes.all(v, !(v.name in " + repr(list(OPERATOR_VOLUME_NAMES)) + "))",
                "podTemplate.volumes[].name must not be "
                + ", ".join(OPERATOR_VOLUME_NAMES)
                + ": the operator's own volumes have those names; give the volume another name",
                ".volumes",
            ),
            (
                "!has(self.volumeMounts) || self.volumeMounts.all(m, has(self.volumes) && self.volumes.exists(v, v.name == m.name))",
                "podTemplate.volumeMounts[].name must name a volume of podTemplate.volumes",
                ".volumeMounts",
            ),
            (
                "!has(self.volumeMounts) || self.volumeMounts.all(m, "
                + repr(list(OPERATOR_MOUNT_PATHS))
                + ".all(p, m.mountPath != p && !p.startsWith(m.mountPath + '/')))",
                "podTemplate.volumeMounts[].mountPath must not be "
                + ", ".join(OPERATOR_MOUNT_PATHS)
                + " or a directory above one of them (the operator mounts its own volumes there); a directory below "
                "/tmp or /cache is fine",
                ".volumeMounts",
            ),
            (
                "!has(self.volumeMounts) || self.volumeMounts.all(m, !m.mountPath.matches('" + r"(^|/)[.][.](/|$)" + "'))",
                "podTemplate.volumeMounts[].mountPath must not contain '..' segments",
                ".volumeMounts",
            ),
            (
                # The validator init container runs as UID 65532 with runAsNonRoot unless told otherwise: root
                # without runAsNonRoot false would never start (the kubelet refuses the container).
                "!has(self.containerSecurityContext) || !has(self.containerSecurityContext.runAsUser) "
                "|| self.containerSecurityContext.runAsUser != 0 "
                "|| (has(self.containerSecurityContext.runAsNonRoot) && self.containerSecurityContext.runAsNonRoot == false)",
                "podTemplate.containerSecurityContext: runAsUser 0 also needs runAsNonRoot: false (the validator init "
                "container runs as non-root unless told otherwise)",
                ".containerSecurityContext",
            ),
        )
    )

    metadata: PodMetadata | None = Field(None, description="Extra labels and annotations of the server pods (the operator's own labels win).")
    node_selector: dict[str, LabelValue] | None = Field(
        None,
        alias="nodeSelector",
        description="Extra node selector of the server pods.",
        max_length=64,
        json_schema_extra=_label_keys("podTemplate.nodeSelector"),
    )
    _node_selector_drop_null = field_validator("node_selector", mode="before")(_drop_null_values)

    @field_validator("node_selector")
    @classmethod
    def _node_selector_keys(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if value is None else _check_label_keys(value)

    affinity: dict[str, Any] | None = Field(
        None,
        description="core/v1 Affinity of the server pods (node affinity terms are ANDed with the one from resources.gpuFamily; "
        "multi-node servers add their own pod (anti-)affinity terms).",
        json_schema_extra=_free_object(),
    )
    tolerations: list[dict[str, Any]] | None = Field(
        None,
        description="core/v1 Tolerations of the server pods, in addition to the nvidia.com/gpu taint toleration the operator adds.",
        max_length=64,
        json_schema_extra=_free_list(64),
    )
    topology_spread_constraints: list[dict[str, Any]] | None = Field(
        None,
        alias="topologySpreadConstraints",
        description="core/v1 TopologySpreadConstraints of the server pods (e.g. spread a fleet's servers over zones).",
        max_length=16,
        json_schema_extra=_free_list(16),
    )
    priority_class_name: str | None = Field(
        None, alias="priorityClassName", description="PriorityClass of the server pods.", pattern=DNS_SUBDOMAIN_PATTERN, max_length=253
    )
    runtime_class_name: str | None = Field(
        None,
        alias="runtimeClassName",
        description="RuntimeClass of the server pods (e.g. nvidia, where the NVIDIA container runtime is not the default).",
        pattern=DNS_SUBDOMAIN_PATTERN,
        max_length=253,
    )
    service_account_name: str | None = Field(
        None,
        alias="serviceAccountName",
        description="ServiceAccount of the server pods (unset: the namespace's default).",
        pattern=DNS_SUBDOMAIN_PATTERN,
        max_length=253,
    )
    automount_service_account_token: bool | None = Field(
        None,
        alias="automountServiceAccountToken",
        description="Mount the ServiceAccount's API token into the server pods (unset: false; SGLang never calls the Kubernetes API).",
    )
    image_pull_secrets: list[LocalObjectReference] | None = Field(
        None,
        alias="imagePullSecrets",
        description="Secrets for pulling the SGLang image and the validator image (a private mirror).",
        max_length=16,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    security_context: dict[str, Any] | None = Field(
        None,
        alias="securityContext",
        description="core/v1 PodSecurityContext of the server pods (runAsUser, fsGroup, supplementalGroups, seLinuxOptions, ...), "
        "its fields over the operator's (seccompProfile RuntimeDefault).",
        json_schema_extra=_free_object(),
    )
    container_security_context: dict[str, Any] | None = Field(
        None,
        alias="containerSecurityContext",
        description="core/v1 SecurityContext of the server container and the validator init container, its fields over the "
        "operator's (no privilege escalation, read-only root filesystem, every capability dropped; the validator also "
        "runAsNonRoot as UID/GID 65532).",
        json_schema_extra={
            **_free_object(),
            "properties": {
                "runAsUser": {"type": "integer", "minimum": 0, "maximum": 2147483647, "description": "UID of the containers."},
                "runAsNonRoot": {"type": "boolean", "description": "Refuse to start as UID 0."},
            },
        },
    )
    volumes: list[dict[str, Any]] | None = Field(
        None,
        description="Extra core/v1 Volumes of the server pods (certificates, a persistent compile cache, ...); names must not be "
        "the operator's own (" + ", ".join(OPERATOR_VOLUME_NAMES) + ").",
        max_length=32,
        json_schema_extra={
            **_free_list(
                32,
                {
                    "required": ["name"],
                    "properties": {"name": {"type": "string", "pattern": DNS_LABEL_PATTERN, "maxLength": 63, "description": "Volume name."}},
                },
            ),
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"],
        },
    )
    volume_mounts: list[dict[str, Any]] | None = Field(
        None,
        alias="volumeMounts",
        description="Extra core/v1 VolumeMounts of the server container, of podTemplate.volumes; not at or under model.mountPath, "
        "nor at or above " + ", ".join(OPERATOR_MOUNT_PATHS) + ".",
        max_length=32,
        json_schema_extra={
            **_free_list(
                32,
                {
                    "required": ["name", "mountPath"],
                    "properties": {
                        "name": {"type": "string", "pattern": DNS_LABEL_PATTERN, "maxLength": 63, "description": "The volume's name."},
                        "mountPath": {"type": "string", "pattern": _ABSOLUTE_PATH, "maxLength": 1024, "description": "Where it is mounted."},
                    },
                },
            ),
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["mountPath"],
        },
    )

    @field_validator("volumes", "volume_mounts")
    @classmethod
    def _named_items(cls, value: list[dict[str, Any]] | None, info: ValidationInfo) -> list[dict[str, Any]] | None:
        # The items' schema lives in json_schema_extra (the objects pass through): enforce it here too.
        keys = ("name",) if info.field_name == "volumes" else ("name", "mountPath")
        patterns = {"name": DNS_LABEL_PATTERN, "mountPath": _ABSOLUTE_PATH}
        seen: set[str] = set()
        for i, item in enumerate(value or []):
            for key in keys:
                if not isinstance(item.get(key), str) or not re.match(patterns[key], item[key]):
                    raise ValueError(f"[{i}].{key} must be {'a DNS label' if key == 'name' else 'an absolute path without a trailing slash'}")
            unique = item[keys[-1]]
            if unique in seen:
                raise ValueError(f"[{i}].{keys[-1]} {unique!r} is repeated: it must be unique")
            seen.add(unique)
        return value


# The pod fields a spec had before podTemplate gathered them (spec.X -> spec.podTemplate.Y). Still accepted: they are
# validated where they are (errors name them there, as the API server's do), then moved into podTemplate, and a spec
# that sets both places is refused.
LEGACY_POD_FIELDS = {"nodeSelector": "nodeSelector", "affinity": "affinity", "tolerations": "tolerations", "podMetadata": "metadata"}
_LEGACY_ATTRIBUTES = {"node_selector": "node_selector", "affinity": "affinity", "tolerations": "tolerations", "pod_metadata": "metadata"}


def _legacy_set(attribute: str, value: Any) -> bool:
    """Whether an older pod field says anything, as _legacy_rules decides it (the API server defaults podMetadata to {})."""
    if attribute == "pod_metadata":
        return any(getattr(value, k) for k in ("labels", "annotations"))
    if attribute == "affinity":
        return value is not None
    return bool(value)


def _legacy_rules() -> list[tuple[str, str, str | None]]:
    rules: list[tuple[str, str, str | None]] = []
    for old, new in LEGACY_POD_FIELDS.items():
        # Whether the old field says anything: the API server defaults podMetadata to {}.
        if old == "podMetadata":
            unsaid = "(!has(self.podMetadata.labels) || size(self.podMetadata.labels) == 0) && (!has(self.podMetadata.annotations) || size(self.podMetadata.annotations) == 0)"
        elif old == "affinity":
            unsaid = "false"
        else:
            unsaid = f"size(self.{old}) == 0"
        rules.append(
            (
                f"!has(self.{old}) || ({unsaid}) || !has(self.podTemplate) || !has(self.podTemplate.{new})",
                f"{old} and podTemplate.{new} are both set: {old} is the older place for it; move it into podTemplate.{new}",
                f".{old}",
            )
        )
    return rules


class Race(_SpecModel):
    gpu_seconds_budget: float | None = Field(
        None,
        alias="gpuSecondsBudget",
        description="The most GPU-seconds the race's probes may spend (status.race.gpuSeconds; each probe's as "
        "status.probe.gpuSeconds counts it). A candidate whose turn comes after the budget is spent is not measured "
        "(state Skipped, reason GpuBudgetSpent); the race is decided on those measured. Unset: no budget.",
        gt=0,
    )


class SpeculativeServerSpec(_SpecModel):
    model_config = ConfigDict(
        json_schema_extra=_cel(
            (
                "!self.target.path.startsWith('/') || self.target.path.startsWith(self.model.mountPath + '/')",
                "target.path must be relative to model.mountPath or an absolute path under it",
                ".target.path",
            ),
            (
                "!has(self.drafter.path) || !self.drafter.path.startsWith('/') || self.drafter.path.startsWith(self.model.mountPath + '/')",
                "drafter.path must be relative to model.mountPath or an absolute path under it",
                ".drafter.path",
            ),
            (
                "!has(self.target.contextLength) || self.rollout.workloads.all(w, w.inputTokens + w.outputTokens <= self.target.contextLength)",
                "rollout.workloads[].inputTokens + outputTokens must fit in target.contextLength",
                ".rollout.workloads",
            ),
            (
                "self.rollout.acceptLengthFloor < double(has(self.drafter.numDraftTokens) ? self.drafter.numDraftTokens : self.drafter.numSteps + 1)",
                "rollout.acceptLengthFloor must be below the draft tokens per verify (drafter.numDraftTokens, or numSteps + 1): no verify step accepts more",
                ".rollout.acceptLengthFloor",
            ),
            (
                "self.monitor.acceptLengthFloor < double(has(self.drafter.numDraftTokens) ? self.drafter.numDraftTokens : self.drafter.numSteps + 1)",
                "monitor.acceptLengthFloor must be below the draft tokens per verify (drafter.numDraftTokens, or numSteps + 1): no verify step accepts more",
                ".monitor.acceptLengthFloor",
            ),
            (
                "!has(self.podTemplate) || !has(self.podTemplate.volumeMounts) || self.podTemplate.volumeMounts.all(m, "
                "m.mountPath != self.model.mountPath && !m.mountPath.startsWith(self.model.mountPath + '/') "
                "&& !self.model.mountPath.startsWith(m.mountPath + '/'))",
                "podTemplate.volumeMounts[].mountPath must not be model.mountPath, a directory under it or one above it "
                "(the model volume is mounted there, read-only): mount the volume elsewhere",
                ".podTemplate.volumeMounts",
            ),
            *_legacy_rules(),
            *_release_rules(),
            *_engine_rules(),
            *_method_rules(),
            *_candidate_rules(),
        )
    )

    @model_validator(mode="after")
    def _legacy_pod_fields(self) -> SpeculativeServerSpec:
        """Move nodeSelector/affinity/tolerations/podMetadata into podTemplate: the rest of the code reads only it."""
        moved: dict[str, Any] = {}
        for (old, new), alias in zip(_LEGACY_ATTRIBUTES.items(), LEGACY_POD_FIELDS, strict=True):
            value = getattr(self, old)
            if not _legacy_set(old, value):
                continue
            if getattr(self.pod_template, new) is not None:
                raise ValueError(
                    f"{alias} and podTemplate.{LEGACY_POD_FIELDS[alias]} are both set: {alias} is the older place for it; "
                    f"move it into podTemplate.{LEGACY_POD_FIELDS[alias]}"
                )
            moved[new] = value
        if moved:
            self.pod_template = self.pod_template.model_copy(update=moved)
            self.node_selector, self.affinity, self.tolerations, self.pod_metadata = {}, None, [], PodMetadata()
        return self

    replicas: int = Field(
        1,
        description=(
            "Servers in the fleet behind the stable Service (the scale subresource: kubectl scale, HPA and KEDA "
            "set it). Each server is a pod, or a LeaderWorkerSet group when resources.nodes is above 1."
        ),
        ge=0,
        le=1000,
    )
    progress_deadline_seconds: int = Field(
        DEFAULT_PROGRESS_DEADLINE_S,
        alias="progressDeadlineSeconds",
        description="How long a waiting state (Pending, Validating, Deploying, Probing, a walk step) may go without progress before the "
        "resource ends in phase Failed, reason ProgressDeadlineExceeded, with the cause read from the pods (as a Deployment's "
        "progressDeadlineSeconds). The default allows a large model's load; the base keeps serving where it serves.",
        ge=60,
        le=7 * 24 * 3600,
    )
    engine: EngineName = Field(
        DEFAULT.name,
        description="The engine both servers run: SGLang (spec.sglang, spec.sglangVersion) or vLLM (spec.vllm; one node per server, "
        "EAGLE as a chain). Settings of the other engine are refused.",
    )
    image: str = Field(
        description="The engine's container image, e.g. lmsysorg/sglang:v0.5.23-cu130 or vllm/vllm-openai:v0.32.0.", min_length=1, max_length=512
    )
    # After parsing, the release the command line is rendered for: the one the image's tag names, else the one
    # given (required at admission then: unnamed_release), else the operator's own (SGLANG_VERSION, for a resource
    # admitted under an older CRD). Unset on the wire unless the user sets it.
    sglang_version: SGLangVersion | None = Field(
        None,
        alias="sglangVersion",
        description=(
            "The SGLang release inside image (flags differ between releases; the command line is rendered for this one). "
            "Unset: the release the tag of an image of a repository called sglang names (lmsysorg/sglang:v0.5.23-cu129 is 0.5.23), or "
            "required when the image names none (latest, a digest, a mirror that renames the repository, an image of your own): such a "
            f"spec is refused at admission without it (one admitted under an older CRD is rendered for {SGLANG_VERSION}). Set, it must "
            "agree with the tag."
        ),
        validate_default=True,
    )

    @field_validator("image")
    @classmethod
    def _image_of_a_supported_release(cls, image: str) -> str:
        problem = release_disagreement(image, None)
        if problem:
            raise ValueError(problem)
        return image

    @field_validator("sglang_version")
    @classmethod
    def _release_of_the_image(cls, value: str | None, info: ValidationInfo) -> str | None:
        image = info.data.get("image")
        if not isinstance(image, str):  # image itself is invalid: its own error is reported
            return value or SGLANG_VERSION
        # An SGLang setting: with an engine rendered for one release it is refused when set (_engine_rules), never filled in.
        if not facts_for(info.data.get("engine") or DEFAULT.name).release_per_spec:
            return value
        problem = release_disagreement(image, value)
        if problem:
            raise ValueError(problem)
        return image_release(image) or value or SGLANG_VERSION

    model: ModelStorage = Field(description="Where the target and drafter weights are.")
    target: Target = Field(description="The model being served.")
    # Required: Drafter()'s defaults (EAGLE3 without a path) are not a valid drafter, and an object default
    # that breaks its own CEL rules makes the API server refuse the whole CRD.
    drafter: Drafter = Field(
        description="The draft model and the speculation shape: the first candidate of a race, and the only one without "
        "spec.candidates (named after its algorithm in lower case among spec.candidates)."
    )
    candidates: list[Candidate] | None = Field(
        None,
        description="More speculative configurations for the same target (a method, its drafter where it has one, its steps, "
        "tree or n-gram sizes), raced with spec.drafter against the base: each in turn in the speculative server's slot, "
        "measured against the same warm base, and the fastest confirmed one served (status.candidates, status.race). "
        "Each is admitted, rendered and validated as spec.drafter would be.",
        max_length=MAX_CANDIDATES,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    include_drafter_free: bool | None = Field(
        None,
        alias="includeDrafterFree",
        description="true: add the engine's methods that need no trained drafter (NGRAM, on SGLang and vLLM) to the candidates, "
        "unless a candidate already uses them. vLLM's SUFFIX is added only when named (it needs the arctic-inference package "
        "in the image). Unset: false.",
    )
    race: Race | None = Field(None, description="Limits of the race of the candidates (when the spec names more than spec.drafter).")

    @field_validator("candidates")
    @classmethod
    def _unique_candidate_names(cls, value: list[Candidate] | None, info: ValidationInfo) -> list[Candidate] | None:
        # A list-type map (the API server refuses a repeated name), and none may take spec.drafter's name.
        drafter = info.data.get("drafter")
        seen = {drafter_candidate_name(drafter)} if isinstance(drafter, Drafter) else set()
        for i, candidate in enumerate(value or []):
            if candidate.name in seen:
                raise ValueError(
                    f"[{i}].name {candidate.name!r} is repeated or is spec.drafter's (its algorithm in lower case): names must be unique"
                )
            seen.add(candidate.name)
        return value

    resources: Resources = Field(default_factory=Resources, description="GPUs and memory of each server.")
    pod_template: PodTemplate = Field(
        default_factory=PodTemplate,
        alias="podTemplate",
        description="What the server pods take from you: metadata, scheduling (nodeSelector, affinity, tolerations, topology spread, "
        "priority class, runtime class), identity (ServiceAccount, image pull secrets), security contexts and extra volumes. "
        "The operator owns the containers' image, command, GPU limits, probes and the model mount.",
    )
    node_selector: dict[str, LabelValue] = Field(
        default_factory=dict,
        alias="nodeSelector",
        description="Deprecated: podTemplate.nodeSelector (moved there when parsed; setting both is refused).",
        max_length=64,
        json_schema_extra=_label_keys("nodeSelector"),
    )
    _node_selector_drop_null = field_validator("node_selector", mode="before")(_drop_null_values)
    _node_selector_keys = field_validator("node_selector")(_check_label_keys)
    affinity: dict[str, Any] | None = Field(
        None,
        description="Deprecated: podTemplate.affinity (moved there when parsed; setting both is refused).",
        json_schema_extra=_free_object(),
    )
    tolerations: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Deprecated: podTemplate.tolerations (moved there when parsed; setting both is refused).",
        max_length=64,
        json_schema_extra={"items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
    )
    pod_metadata: PodMetadata = Field(
        default_factory=PodMetadata,
        alias="podMetadata",
        description="Deprecated: podTemplate.metadata (moved there when parsed; setting both is refused).",
    )
    sglang: SGLangSettings = Field(default_factory=SGLangSettings, description="SGLang server settings shared by both servers (engine SGLang only).")
    vllm: VLLMSettings | None = Field(None, description="vLLM server settings shared by both servers (engine vLLM only; unset: the defaults).")
    rollout: Rollout = Field(default_factory=Rollout, description="How the speculative server is measured against the base before it serves.")
    monitor: Monitor = Field(default_factory=Monitor, description="How a promoted speculative server is watched after promotion.")
    retraining: Retraining | None = Field(
        None,
        description="Retraining the drafter on the traffic the server really sees (docs/capture.md). Unset: off; nothing is captured.",
    )


# --------------------------------------------------------------------------------------------------
# Status


class Condition(_Model):
    type: str = Field(description="Condition type: DrafterCompatible, BaseReady, SpeculativeReady, SpeedupVerified or Ready.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(description="CamelCase reason code.", max_length=1024)
    message: str = Field("", description="Human-readable explanation.", max_length=32768)
    observed_generation: int | None = Field(None, alias="observedGeneration", description="metadata.generation this condition was computed for.")
    last_transition_time: str | None = Field(None, alias="lastTransitionTime", description="When status last changed (RFC 3339).")


class Finding(_Model):
    severity: Literal["error", "warning", "info"] = Field(description="error blocks the speculative server; warning and info do not.")
    code: str = Field(description="Finding code, e.g. HiddenSizeMismatch or HiddenStateSourceMismatch.")
    message: str = Field("", description="What is wrong and how to fix it.")
    field: str | None = Field(None, description="The config field or file the finding is about.")


class ValidationStatus(_Model):
    compatible: bool | None = Field(None, description="Whether the drafter can serve with the target (no error findings).")
    findings: list[Finding] = Field(default_factory=list, description="What the validator found.")
    revision: str | None = Field(None, description="Speculative revision (hash of the spec fields that matter) this result is for.")


class WorkloadResult(_Model):
    name: str = Field(description="Workload name.")
    concurrency: int = Field(description="Concurrent streams.")
    base_tokens_per_second: float | None = Field(None, alias="baseTokensPerSecond", description="Base server output tokens per second.")
    speculative_tokens_per_second: float | None = Field(
        None, alias="speculativeTokensPerSecond", description="Speculative server output tokens per second."
    )
    speedup: float | None = Field(None, description="Speculative over base throughput (point estimate from paired rounds).")
    speedup_low: float | None = Field(None, alias="speedupLow", description="Lower end of the speedup's confidence interval.")
    speedup_high: float | None = Field(None, alias="speedupHigh", description="Upper end of the speedup's confidence interval.")


class BreakEvenStatus(_Model):
    concurrency: float | None = Field(
        None,
        description="Concurrency where the speedup curve crosses 1.0 (interpolated between measured workloads); unset when it does not cross in the measured range.",
    )
    low: float | None = Field(None, description="Lower end of its interval; unset when open (below the smallest measured concurrency).")
    high: float | None = Field(None, description="Upper end of its interval; unset when open (above the largest measured concurrency).")
    summary: str = Field("", description="For humans: '24 [16, 40]' or 'none in 1-128 (faster at every measured concurrency)'.")


# One probe's measurements and decision (status.probe, and the plain probe of a load-aware trial).
class ProbeMeasurement(_Model):
    decision: Decision | None = Field(None, description="promote or rollback.")
    reason: str | None = Field(
        None, description="SpeedupConfirmed, SpeedupBelowThreshold, DrafterNotAccepting, OutputMismatch, DatasetInvalid, Inconclusive or ProbeFailed."
    )
    message: str | None = Field(None, description="Human-readable summary of the decision.")
    rounds: int | None = Field(None, description="Paired rounds run.")
    started_at: str | None = Field(None, alias="startedAt", description="When the probe started (RFC 3339).")
    finished_at: str | None = Field(None, alias="finishedAt", description="When the probe finished (RFC 3339).")
    gpu_seconds: float | None = Field(
        None,
        alias="gpuSeconds",
        description="What the decision cost: the GPUs of the two servers the probe measured (one base and one speculative "
        "server, each resources.gpus x resources.nodes, as their pods request nvidia.com/gpu) times the probe's time, every "
        "attempt's included (its output check too). A load-aware decision adds its plain probe's (loadAware.plainProbe.gpuSeconds). "
        "Unset when no probe ran or a part's cost is unknown.",
        ge=0,
    )
    accept_length: float | None = Field(None, alias="acceptLength", description="Mean acceptance length of the speculative server during the probe.")
    accept_rate_by_position: list[float] | None = Field(
        None,
        alias="acceptRateByPosition",
        description="engine vLLM: accepted tokens per draft at each draft position during the probe (its counters since the probe began).",
        max_length=64,
    )
    speedup: float | None = Field(
        None, description="Overall speedup: the smallest workload speedup (AllWorkloads) or the weighted one (WeightedMix)."
    )
    revision: str | None = Field(None, description="Speculative revision this decision is for; a decided revision is never probed again.")
    output_match_rate: float | None = Field(
        None,
        alias="outputMatchRate",
        description="Mean share of each compared greedy completion's tokens before its first difference from the base's (1.0: identical).",
    )
    outputs_compared: int | None = Field(None, alias="outputsCompared", description="Prompts whose greedy completions were compared.")
    traffic: str | None = Field(None, description="What the probe sent: the prompt source of each workload.")
    synthetic_traffic: bool | None = Field(
        None,
        alias="syntheticTraffic",
        description="True when a workload sent random token ids instead of prompts (reason SyntheticTraffic in the Events).",
    )
    workloads: list[WorkloadResult] | None = Field(None, description="Per-workload results.")
    break_even: BreakEvenStatus | None = Field(
        None,
        alias="breakEven",
        description="Where speculation stops paying: the concurrency at which the speedup curve over the workloads crosses 1.0 "
        "(for a load-aware decision, the plain probe's curve, which the adaptive table comes from).",
    )


class LoadAwareStatus(_Model):
    summary: str = Field("", description="For humans: 'drafts below batch 16' or 'unsupported: speculative_eagle_topk=4 ...'.")
    reason: str | None = Field(
        None,
        description="LoadAwareTrial (the adaptive server is measured), LoadAwareSpeedup, NoLoadWithSpeedup or LoadAwareUnsupported; "
        "or the adaptive probe's own reason when it ended for another cause than speed (ProbeFailed, OutputMismatch, DatasetInvalid).",
    )
    message: str | None = Field(None, description="Human-readable explanation.")
    no_draft_from: int | None = Field(
        None, alias="noDraftFrom", description="Smallest batch size the adaptive server serves without drafting (steps 0 from there up)."
    )
    config: str | None = Field(None, description="The --speculative-adaptive-config document (JSON) the speculative server runs with.")
    plain_probe: ProbeMeasurement | None = Field(
        None, alias="plainProbe", description="The first probe, of the plain speculative server, whose curve the adaptive table comes from."
    )


# status.probe: the decision in force for the revision; with load-aware speculation, that of the second probe.
class ProbeStatus(ProbeMeasurement):
    load_aware: LoadAwareStatus | None = Field(
        None, alias="loadAware", description="Load-aware speculation: the adaptive table, the first (plain) probe, or why it was not tried."
    )


class SickPod(_Model):
    name: str = Field(description="The speculative pod.")
    accept_length: float = Field(alias="acceptLength", description="Its acceptance length when it was last judged.")
    peers_accept_length: float = Field(
        alias="peersAcceptLength", description="The weighted median acceptance length of its peers then (verify calls as weights)."
    )
    since: str | None = Field(None, description="When it was first judged sick (RFC 3339).")


class MonitorStatus(_Model):
    last_scrape_time: str | None = Field(None, alias="lastScrapeTime", description="When the speculative pods were last scraped (RFC 3339).")
    accept_length: float | None = Field(
        None,
        alias="acceptLength",
        description="The fleet's acceptance length at the last scrape with evidence: the pods' values weighted by their verify calls.",
    )
    below_floor_count: int = Field(0, alias="belowFloorCount", description="Consecutive scrapes below monitor.acceptLengthFloor.")
    pods: int | None = Field(None, description="Ready speculative pods scraped at the last scrape.")
    verify_calls: int | None = Field(None, alias="verifyCalls", description="Verify calls behind the last scrape's acceptance length (all pods).")
    accept_rate_by_position: list[float] | None = Field(
        None,
        alias="acceptRateByPosition",
        description="engine vLLM: accepted tokens per draft at each draft position (the first draft token first) between the last two "
        "scrapes, the pods weighted by their drafts.",
        max_length=64,
    )
    sick_pods: list[SickPod] = Field(
        default_factory=list,
        alias="sickPods",
        description="Speculative pods whose accepted draft tokens per verify step are below half their peers' (reported, not rolled back).",
        max_length=1000,
    )


class GpuStatus(_Model):
    base: int = Field(0, description="GPUs requested by the base server's pods that exist (terminating ones included).")
    speculative: int = Field(0, description="GPUs requested by the speculative server's pods that exist.")
    idle: int = Field(
        0,
        description="Of those, GPUs of servers that serve no traffic and are not being probed (a warm base after a promotion, "
        "keepSpeculativeWarm, pods still going away).",
    )


class SteeringStatus(_Model):
    retried: str | None = Field(None, description="The specdec.io/retry token last acted on (a retry happens once per new token).")
    override: str | None = Field(
        None, description="promote or abort while a specdec.io/promote or specdec.io/abort annotation holds the resource there."
    )
    reason: str | None = Field(None, description="The reason given with the override.")
    paused: bool | None = Field(None, description="True while specdec.io/paused holds a fleet's walk.")


CandidateState = Literal["Waiting", "Measuring", "Passed", "Serving", "Lost", "Eliminated", "Skipped", "Invalid", "Drifted"]


class CandidateStatus(_Model):
    """One row of the race's table (status.candidates): a candidate and what its probe found."""

    name: str = Field(description="The candidate's name (spec.drafter's: its algorithm in lower case).")
    algorithm: str = Field(description="Its speculative method (EAGLE3, NGRAM, ...).")
    state: CandidateState = Field(
        description="Waiting: not measured yet. Measuring: in the speculative server's slot now. Passed: confirmed faster, "
        "not (or not yet) the winner. Serving: the winner, served. Lost: slower than rollout.minSpeedup, not accepting, "
        "inconclusive or failed. Eliminated: it could no longer beat the best candidate (CannotWin). Skipped: the race's "
        "GPU budget was spent before its turn. Invalid: its drafter was refused by the validator. Drifted: it won, then "
        "its acceptance drifted below the monitor's floor."
    )
    revision: str | None = Field(None, description="Its speculative revision (the server it runs as, when in the slot).")
    reason: str | None = Field(None, description="Why it ended where it is: its probe's reason (SpeedupConfirmed, CannotWin, ...).")
    message: str | None = Field(None, description="Its probe's summary, shortened.")
    rounds: int | None = Field(None, description="Paired rounds its probe ran.")
    accept_length: float | None = Field(None, alias="acceptLength", description="Its acceptance length during its probe.")
    speedup: float | None = Field(None, description="Its overall speedup (the policy's: the smallest workload's, or the weighted one).")
    workloads: list[WorkloadResult] | None = Field(None, description="Its speedup per workload, with the interval.")
    break_even: BreakEvenStatus | None = Field(
        None,
        alias="breakEven",
        description="Where its speculation stops paying (as status.probe.breakEven): a served candidate's load-aware table starts there.",
    )
    gpu_seconds: float | None = Field(None, alias="gpuSeconds", description="What its probe cost (as status.probe.gpuSeconds).", ge=0)
    finished_at: str | None = Field(None, alias="finishedAt", description="When its probe ended (RFC 3339).")


class RaceStatus(_Model):
    """Where the race of the candidates stands (status.race); the table is status.candidates."""

    revision: str = Field(description="The race's revision: a hash of every candidate's revision, in order. A new one is a new race.")
    state: Literal["Queued", "Running", "Decided"] = Field(
        description="Queued: waiting for a race slot (the operator's --max-concurrent-races), the base serves. Running: "
        "candidates are measured one after another in the speculative server's slot. Decided: a winner serves, or none "
        "was faster and the base serves."
    )
    current: str | None = Field(None, description="The candidate in the speculative server's slot.")
    winner: str | None = Field(None, description="The candidate that won (the fastest confirmed under rollout.policy), if any.")
    gpu_seconds: float | None = Field(None, alias="gpuSeconds", description="GPU-seconds the race's probes spent so far.", ge=0)
    confidence: float | None = Field(
        None,
        description="The confidence each candidate's probe decides at: 1 - (1 - 0.998) / candidates (0.998 is a probe's "
        "confidence), so that picking the best of them promotes a candidate slower than rollout.minSpeedup no more often "
        "than a single probe promotes one (0.2 %).",
    )


class SpeculativeServerStatus(_Model):
    phase: Phase | None = Field(None, description="Pending, Validating, Deploying, Probing, Promoted, RolledBack, Invalid or Failed.")
    active_variant: Variant | None = Field(None, alias="activeVariant", description="Which server the stable Service selects: base or speculative.")
    reason: str | None = Field(None, description="Reason code of the current phase (e.g. the rollback reason).")
    message: str | None = Field(None, description="What is happening now, for humans (e.g. 'base: loading weights since 2026-12-02T10:00:00Z').")
    speedup: float | None = Field(None, description="Measured speedup of the speculative server (from the last probe).")
    accept_length: float | None = Field(None, alias="acceptLength", description="Latest acceptance length (probe, then monitor).")
    observed_generation: int | None = Field(None, alias="observedGeneration", description="metadata.generation the status reflects.")
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Standard Kubernetes conditions.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    replicas: int | None = Field(None, description="Servers that exist (base and speculative together): the scale subresource's status.")
    ready_replicas: int | None = Field(None, alias="readyReplicas", description="Servers that are Ready (base and speculative together).")
    speculative_replicas: int | None = Field(
        None, alias="speculativeReplicas", description="Speculative servers that are Ready: the walk's progress toward the drafter."
    )
    rollout_progress: str | None = Field(
        None, alias="rolloutProgress", description="The walk's progress for humans and kubectl get, e.g. '3/8 speculative'."
    )
    selector: str | None = Field(
        None, description="Label selector of the fleet's server pods, as a string (the scale subresource's labelSelectorPath, for HPA)."
    )
    service_address: str | None = Field(
        None,
        alias="serviceAddress",
        description="Where clients reach the servers: the stable Service's in-cluster address, <name>.<namespace>.svc:<port> "
        "(set once the Service exists).",
    )
    validation: ValidationStatus | None = Field(None, description="Result of the drafter/target validator.")
    probe: ProbeStatus | None = Field(None, description="Result of the speedup probe.")
    monitor: MonitorStatus | None = Field(None, description="Drift monitor state after promotion.")
    gpus: GpuStatus | None = Field(None, description="The GPUs each variant's pods hold, and how many of them serve no traffic.")
    steering: SteeringStatus | None = Field(None, description="What was asked by hand (the specdec.io/* annotations) and acted on.")
    retraining: RetrainingStatus | None = Field(
        None, description="spec.retraining's state: the capture of the stable Service's traffic and the training Jobs."
    )
    candidates: list[CandidateStatus] | None = Field(
        None,
        description="The race's table: the resolved candidates (spec.drafter, spec.candidates, the drafter-free methods "
        "spec.includeDrafterFree adds), when the spec names more than spec.drafter, each with its state and its probe's "
        "figures.",
        max_length=MAX_CANDIDATES + 4,
    )
    race: RaceStatus | None = Field(None, description="The race of the candidates, when the spec names more than spec.drafter.")
    waiting_for: str | None = Field(
        None,
        alias="waitingFor",
        description="What the resource waits for now, e.g. 'the speculative server (VolumeNotMounted)'; unset when nothing is awaited.",
    )
    waiting_since: str | None = Field(
        None,
        alias="waitingSince",
        description="Since when it waits for that (RFC 3339): spec.progressDeadlineSeconds counts from here, and a change of waitingFor is progress (not from one cause of no progress to another for the same server, e.g. Unschedulable to ImageNotPulled).",
    )


# --------------------------------------------------------------------------------------------------
# Candidates: spec.drafter first, then spec.candidates, then the drafter-free methods spec.includeDrafterFree adds.
# The race (reconcile/candidate_race.py) puts each in turn in spec.drafter's place (spec_for_candidate): what renders,
# validates and probes it is the one-drafter lifecycle every other part of the operator reads.


@dataclass(frozen=True)
class ResolvedCandidate:
    name: str
    drafter: Drafter  # the method and its settings, as spec.drafter holds them
    source: str  # where it comes from: spec.drafter, spec.candidates[i] or spec.includeDrafterFree


def _settings(drafter: Drafter) -> Drafter:
    """A candidate's method and settings as a Drafter (without its name)."""
    return Drafter.model_validate(drafter.model_dump(by_alias=True, exclude_none=True, exclude={"name"}))


def resolve_candidates(spec: SpeculativeServerSpec) -> list[ResolvedCandidate]:
    """The candidates in order: spec.drafter, spec.candidates, then each drafter-free method of the engine that no
    candidate uses yet (with includeDrafterFree), named after the method (or method-auto when that name is taken)."""
    out = [ResolvedCandidate(drafter_candidate_name(spec.drafter), spec.drafter, "spec.drafter")]
    for i, candidate in enumerate(spec.candidates or []):
        out.append(ResolvedCandidate(candidate.name, _settings(candidate), f"spec.candidates[{i}]"))
    if spec.include_drafter_free:
        used = {c.drafter.algorithm for c in out}
        names = {c.name for c in out}
        for algorithm in DRAFTER_FREE_DEFAULTS:
            if algorithm in used:
                continue
            name = algorithm.lower() if algorithm.lower() not in names else f"{algorithm.lower()}-auto"
            out.append(ResolvedCandidate(name, Drafter(algorithm=algorithm), "spec.includeDrafterFree"))
    return out


def names_more_than_the_drafter(spec: SpeculativeServerSpec) -> bool:
    """Whether the spec asks for candidates beyond spec.drafter (status.candidates is written only then, so the status
    of a single-drafter spec stays as it was)."""
    return bool(spec.candidates) or bool(spec.include_drafter_free)


def spec_for_candidate(spec: SpeculativeServerSpec, name: str) -> SpeculativeServerSpec:
    """The spec with candidate ``name`` in spec.drafter's place (and no other candidates): what renders and validates it."""
    for candidate in resolve_candidates(spec):
        if candidate.name == name:
            return spec.model_copy(update={"drafter": candidate.drafter, "candidates": None, "include_drafter_free": None})
    raise ValueError(f"spec.candidates: no candidate named {name!r}; the candidates are {', '.join(c.name for c in resolve_candidates(spec))}")
