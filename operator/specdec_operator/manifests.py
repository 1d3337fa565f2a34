"""The Kubernetes objects of one SpeculativeServer, as pure functions of its spec.

Five children, all named after the custom resource and owned by it (six during load-aware speculation):

* Deployments ``<name>-base`` and ``<name>-spec``: one SGLang pod each (the base server and the speculative
  server). The speculative pod runs ``specdec validate`` as an init container, so an incompatible drafter is
  caught in seconds, before a 10-minute model load and before the GPUs are spent.
* Services ``<name>-base`` and ``<name>-spec``: one per variant; the probe and the monitor talk to these.
* Service ``<name>``: the stable Service clients use. Its selector names the active variant; switching it is
  promotion and rollback (nothing restarts).
* ConfigMap ``<name>-adaptive`` (load-aware speculation only): SGLang's ``--speculative-adaptive-config``
  document, mounted into the speculative pod; its hash is a pod template annotation, so a new table restarts the
  speculative server (and only it).

Nothing here talks to the API server; ``reconcile`` decides replicas and the active variant and the handlers
apply what these functions return (server-side apply, so fields dropped from the spec are dropped from the
objects too).
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from . import API_GROUP, API_VERSION, KIND
from .api import PodMetadata, SpeculativeServerSpec, Variant, Workload
from .engines import engine_for, engine_named, engine_names
from .engines.sglang import ALLOW_LONGER_DRAFT_CONTEXT_ENV as ALLOW_LONGER_DRAFT_CONTEXT_ENV  # set by engines/sglang.py
from .probe import reader
from .probe.traffic import describe_source
from .sglang import SERVER_PORT, draft_model_path, target_model_path

# ---------------------------------------------------------------------------------------------------------
# Names and labels (design.md, "Names")

LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_VARIANT = "specdec.io/variant"
MANAGED_BY = "specdec-operator"
# The pods' app.kubernetes.io/name, for every engine: it is part of the Deployments' selectors, which the API server
# never lets change, so a resource moved from one engine to the other keeps its Deployments.
APP_NAME = "sglang"

# Pod template annotations the operator reads back from pods: which speculative revision a pod serves, and
# the hash of the template it was created from (a pod of an older template is not the server the spec asks for).
ANNOTATION_REVISION = "specdec.io/revision"
ANNOTATION_TEMPLATE_HASH = "specdec.io/template-hash"
ANNOTATION_ACTIVE_VARIANT = "specdec.io/active-variant"
ANNOTATION_ADAPTIVE_CONFIG = "specdec.io/adaptive-config-hash"

GPU_RESOURCE = "nvidia.com/gpu"
GPU_FAMILY_LABEL = "nvidia.com/gpu.family"

# The server container is named after its engine (Engine.container_name); SGLang's name was the only one before.
SERVER_CONTAINER = "sglang"
SERVER_CONTAINERS = frozenset(engine_named(n).container_name for n in engine_names())
VALIDATOR_CONTAINER = "validate-drafter"
TERMINATION_LOG = "/dev/termination-log"
PORT_NAME = "http"
DEFAULT_PORT = SERVER_PORT

MODEL_VOLUME = "model"
SHM_VOLUME = "dshm"
TMP_VOLUME = "tmp"
CACHE_VOLUME = "cache"
CACHE_DIR = "/cache"
ADAPTIVE_VOLUME = "adaptive-config"
# A trained revision (issue 36) is served from the claim <name>-revisions, mounted read-only at /revisions in the
# speculative pod only (its server and validator) when the drafter's path is there: the base's template never changes.
REVISIONS_VOLUME = "specdec-revisions"
REVISIONS_MOUNT = "/revisions"
ADAPTIVE_CONFIG_DIR = "/etc/specdec/adaptive"
ADAPTIVE_CONFIG_KEY = "config.json"
ADAPTIVE_CONFIG_PATH = f"{ADAPTIVE_CONFIG_DIR}/{ADAPTIVE_CONFIG_KEY}"

DEFAULT_VALIDATOR_IMAGE = "ghcr.io/specdec/specdec-operator:0.1.0"

# Probes: a 547 GB model takes 5-10 minutes to load. The startup probe gives the server 30 minutes before the
# kubelet may restart it; readiness then asks for a real one-token generation (/health_generate answers
# within 20 s when the server is healthy).
STARTUP_PERIOD_S = 10
STARTUP_ALLOWANCE_S = 30 * 60

SUFFIX = {Variant.BASE.value: "base", Variant.SPECULATIVE.value: "spec"}


def child_name(name: str, variant: str | None) -> str:
    """``<name>-base``, ``<name>-spec``, or the stable ``<name>`` when variant is None."""
    return name if variant is None else f"{name}-{SUFFIX[_v(variant)]}"


def service_address(name: str, namespace: str, settings: ManifestSettings) -> str:
    """status.serviceAddress: the stable Service's in-cluster address (the cluster domain left to the resolver)."""
    return f"{child_name(name, None)}.{namespace}.svc:{settings.port}"


def adaptive_config_map_name(name: str) -> str:
    return f"{name}-adaptive"


def adaptive_config_mounted(spec: SpeculativeServerSpec) -> bool:
    """Whether a load-aware server reads its table from the ConfigMap <name>-adaptive (SGLang) rather than from its
    command line (vLLM): only then is the ConfigMap made and mounted."""
    return engine_for(spec).adaptive_config_file


def _v(variant: str | Variant) -> str:
    return variant.value if isinstance(variant, Variant) else str(variant)


def instance_labels(name: str) -> dict[str, str]:
    """Labels every child of one SpeculativeServer carries."""
    return {LABEL_NAME: APP_NAME, LABEL_INSTANCE: name, LABEL_MANAGED_BY: MANAGED_BY}


def selector_labels(name: str, variant: str | Variant) -> dict[str, str]:
    """The selector of one variant's pods (Deployment selector, variant Service, stable Service)."""
    return {LABEL_NAME: APP_NAME, LABEL_INSTANCE: name, LABEL_VARIANT: _v(variant)}


def fleet_selector(name: str) -> str:
    """status.selector: every server pod of one SpeculativeServer, both variants (the scale subresource's
    labelSelectorPath, for HPA), as a label selector string."""
    labels = {LABEL_NAME: APP_NAME, LABEL_INSTANCE: name}
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


@dataclass(frozen=True)
class ManifestSettings:
    """Operator configuration that shapes the children (not part of any custom resource)."""

    validator_image: str = DEFAULT_VALIDATOR_IMAGE
    # Memory limit of the validator init container (a Kubernetes quantity); its request is the smaller of this and
    # 128Mi. Metadata-only checks of the largest checkpoints stay far below the default.
    validator_memory_limit: str = "512Mi"
    port: int = DEFAULT_PORT
    startup_allowance_s: int = STARTUP_ALLOWANCE_S


# ---------------------------------------------------------------------------------------------------------
# Pod template


def _gpu_affinity(spec: SpeculativeServerSpec) -> dict[str, Any] | None:
    """The user's affinity with the gpuFamily requirement ANDed into every node selector term."""
    affinity = copy.deepcopy(spec.pod_template.affinity) if spec.pod_template.affinity else {}
    if spec.resources.gpu_family == "any":
        return affinity or None
    requirement = {"key": GPU_FAMILY_LABEL, "operator": "In", "values": [spec.resources.gpu_family]}
    node_affinity = affinity.setdefault("nodeAffinity", {})
    required = node_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.get("nodeSelectorTerms") or [{}]
    # Terms are ORed by the scheduler, expressions within a term ANDed: the family must hold in each term.
    for term in terms:
        term.setdefault("matchExpressions", []).append(dict(requirement))
    required["nodeSelectorTerms"] = terms
    return affinity


def _container_security() -> dict[str, Any]:
    # SGLang writes only to /tmp, its caches and /dev/shm, which are emptyDirs below, so the image's root
    # filesystem can be read-only. Official SGLang images run as root, so runAsNonRoot is not forced on the
    # server; the validator (our own image) runs as an unprivileged user.
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
    }


def _over(operator: dict[str, Any], user: dict[str, Any] | None) -> dict[str, Any]:
    """A security context: the user's fields (podTemplate) over the operator's, field by field."""
    return {**operator, **copy.deepcopy(user)} if user else operator


def _validator_memory_request(limit: str) -> str:
    """128Mi, or the limit when that is smaller (a request above its limit is refused by the API server)."""
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "K": 10**3, "M": 10**6, "G": 10**9, "": 1}
    number = limit.rstrip("KMGi")
    unit = limit[len(number) :]
    try:
        limit_bytes = float(number) * units[unit]
    except (ValueError, KeyError):
        return "128Mi"
    return limit if limit_bytes < 128 * 2**20 else "128Mi"


def validator_container(spec: SpeculativeServerSpec, settings: ManifestSettings) -> dict[str, Any] | None:
    """The init container that checks the drafter against the target from metadata (None for NEXTN)."""
    drafter = draft_model_path(spec)
    if drafter is None:
        return None
    return {
        "name": VALIDATOR_CONTAINER,
        "image": settings.validator_image,
        "command": [
            "specdec",
            "validate",
            "--target",
            target_model_path(spec),
            "--drafter",
            drafter,
            "--quantization",
            spec.target.quantization,
            "--algorithm",
            spec.drafter.algorithm,
            *(["--context-length", str(spec.target.context_length)] if spec.target.context_length else []),
            # The engine reads the drafter's aux layer ids its own way (validator: DrafterExportedForOtherEngine).
            *engine_for(spec).validator_args,
            "--json",
            "--termination-log",
            TERMINATION_LOG,
        ],
        # The operator reads the verdict back from the pod's status (initContainerStatuses[].state.terminated.message).
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "File",
        "volumeMounts": [{"name": MODEL_VOLUME, "mountPath": spec.model.mount_path, "readOnly": True}],
        "resources": {
            "requests": {"cpu": "100m", "memory": _validator_memory_request(settings.validator_memory_limit)},
            "limits": {"cpu": "1", "memory": settings.validator_memory_limit},
        },
        "securityContext": _over(
            {**_container_security(), "runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532},
            spec.pod_template.container_security_context,
        ),
    }


def _server_resources(spec: SpeculativeServerSpec) -> dict[str, Any]:
    limits: dict[str, Any] = {GPU_RESOURCE: str(spec.resources.gpus)}
    if spec.resources.cpu:
        limits["cpu"] = spec.resources.cpu
    if spec.resources.memory:
        limits["memory"] = spec.resources.memory
    return {"requests": dict(limits), "limits": limits}


def server_container(
    spec: SpeculativeServerSpec, command: list[str], settings: ManifestSettings, variant: str | Variant = Variant.BASE
) -> dict[str, Any]:
    """The server container of one variant; ``command`` is the full command line from the engine's render_argv.

    The environment: the operator's cache locations, then the user's (which win), then the engine's own for the
    variant (engines/: SGLang's longer-draft-context switch) unless the user set that name."""
    engine = engine_for(spec)
    env = [
        # Every cache SGLang, Triton, FlashInfer, torch and Hugging Face write goes under the cache emptyDir.
        {"name": "HOME", "value": CACHE_DIR},
        {"name": "XDG_CACHE_HOME", "value": f"{CACHE_DIR}/.cache"},
        {"name": "TRITON_CACHE_DIR", "value": f"{CACHE_DIR}/triton"},
        {"name": "HF_HOME", "value": f"{CACHE_DIR}/huggingface"},
        {"name": "HF_HUB_OFFLINE", "value": "1"},
    ]
    user_env = [copy.deepcopy(e) for e in engine.user_env(spec)]
    user_names = {e.get("name") for e in user_env}
    env = [e for e in env if e["name"] not in user_names] + user_env
    env += [e for e in engine.container_env(spec, variant) if e["name"] not in user_names]
    failure_threshold = max(1, -(-settings.startup_allowance_s // STARTUP_PERIOD_S))
    return {
        "name": engine.container_name,
        "image": spec.image,
        "command": list(command),
        "ports": [{"name": PORT_NAME, "containerPort": settings.port, "protocol": "TCP"}],
        "env": env,
        "resources": _server_resources(spec),
        "volumeMounts": [
            {"name": MODEL_VOLUME, "mountPath": spec.model.mount_path, "readOnly": True},
            {"name": SHM_VOLUME, "mountPath": "/dev/shm"},
            {"name": TMP_VOLUME, "mountPath": "/tmp"},
            {"name": CACHE_VOLUME, "mountPath": CACHE_DIR},
            # After the operator's: a mount below /tmp or /cache lands inside their emptyDirs.
            *copy.deepcopy(spec.pod_template.volume_mounts or []),
        ],
        "startupProbe": {
            "httpGet": {"path": engine.health.startup, "port": PORT_NAME},
            "periodSeconds": STARTUP_PERIOD_S,
            "timeoutSeconds": 5,
            "failureThreshold": failure_threshold,
        },
        "readinessProbe": {
            "httpGet": {"path": engine.health.readiness, "port": PORT_NAME},
            "periodSeconds": 10,
            "timeoutSeconds": 25,
            "failureThreshold": 3,
        },
        "livenessProbe": {
            "httpGet": {"path": engine.health.liveness, "port": PORT_NAME},
            "periodSeconds": 30,
            "timeoutSeconds": 10,
            "failureThreshold": 5,
        },
        "securityContext": _over(_container_security(), spec.pod_template.container_security_context),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def pod_template(
    name: str,
    spec: SpeculativeServerSpec,
    variant: str | Variant,
    command: list[str],
    revision: str,
    settings: ManifestSettings,
    adaptive_config_hash: str | None = None,
) -> dict[str, Any]:
    """The pod template of one variant, annotated with its revision and its own hash.

    ``adaptive_config_hash``: the speculative server runs SGLang's adaptive speculation with the table of the
    ``<name>-adaptive`` ConfigMap (its command line says so; ``command`` names ADAPTIVE_CONFIG_PATH).
    """
    variant = _v(variant)
    user = spec.pod_template
    user_metadata = user.metadata or PodMetadata()
    labels = {**user_metadata.labels, **instance_labels(name), **selector_labels(name, variant)}
    annotations = dict(user_metadata.annotations)
    if variant == Variant.SPECULATIVE.value:
        # Only the speculative pod carries the revision (its validator verdict is read per revision): a drafter
        # change must not restart the base server, which keeps serving while the new drafter is validated.
        annotations[ANNOTATION_REVISION] = revision
    model_volume = {"name": MODEL_VOLUME, **copy.deepcopy(spec.model.volume)}
    pod_spec: dict[str, Any] = {
        "enableServiceLinks": False,
        "automountServiceAccountToken": bool(user.automount_service_account_token),
        "hostNetwork": False,
        "hostIPC": False,
        "hostPID": False,
        "securityContext": _over({"seccompProfile": {"type": "RuntimeDefault"}}, user.security_context),
        "terminationGracePeriodSeconds": 60,
        "tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}] + copy.deepcopy(user.tolerations or []),
        "volumes": [
            model_volume,
            {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": spec.resources.shm_size}},
            {"name": TMP_VOLUME, "emptyDir": {}},
            {"name": CACHE_VOLUME, "emptyDir": {}},
            *copy.deepcopy(user.volumes or []),
        ],
        "containers": [server_container(spec, command, settings, variant)],
    }
    # Only what the user set is rendered: a spec without these fields keeps its template hash (no restart on upgrade).
    for key, value in (
        ("serviceAccountName", user.service_account_name),
        ("imagePullSecrets", [{"name": ref.name} for ref in user.image_pull_secrets or []]),
        ("priorityClassName", user.priority_class_name),
        ("runtimeClassName", user.runtime_class_name),
        ("topologySpreadConstraints", copy.deepcopy(user.topology_spread_constraints or [])),
        ("nodeSelector", dict(user.node_selector or {})),
    ):
        if value:
            pod_spec[key] = value
    affinity = _gpu_affinity(spec)
    if affinity:
        pod_spec["affinity"] = affinity
    if variant == Variant.SPECULATIVE.value:
        init = validator_container(spec, settings)
        if init:
            pod_spec["initContainers"] = [init]
        if serves_a_revision(spec):
            _mount_revisions(pod_spec, name)
        if adaptive_config_hash is not None:
            annotations[ANNOTATION_ADAPTIVE_CONFIG] = adaptive_config_hash
        if adaptive_config_hash is not None and adaptive_config_mounted(spec):
            pod_spec["volumes"].append({"name": ADAPTIVE_VOLUME, "configMap": {"name": adaptive_config_map_name(name)}})
            pod_spec["containers"][0]["volumeMounts"].append({"name": ADAPTIVE_VOLUME, "mountPath": ADAPTIVE_CONFIG_DIR, "readOnly": True})
    template = {"metadata": {"labels": labels, "annotations": annotations}, "spec": pod_spec}
    template["metadata"]["annotations"][ANNOTATION_TEMPLATE_HASH] = template_hash(template)
    return template


def revisions_claim_name(name: str) -> str:
    """The claim the training Jobs publish revisions to (trainjob.py) and a speculative pod serves one from."""
    return f"{name}-revisions"


def serves_a_revision(spec: SpeculativeServerSpec) -> bool:
    """Whether the drafter is a trained revision on the revisions claim (/revisions/<job>)."""
    drafter = draft_model_path(spec)
    return drafter is not None and drafter.startswith(REVISIONS_MOUNT + "/")


def _mount_revisions(pod_spec: dict[str, Any], name: str) -> None:
    """The revisions claim, read-only at /revisions, in the speculative server and its validator."""
    claim = {"claimName": revisions_claim_name(name), "readOnly": True}
    pod_spec["volumes"].append({"name": REVISIONS_VOLUME, "persistentVolumeClaim": claim})
    mount = {"name": REVISIONS_VOLUME, "mountPath": REVISIONS_MOUNT, "readOnly": True}
    for container in [*pod_spec.get("initContainers", []), *pod_spec["containers"]]:
        container["volumeMounts"] = [*container.get("volumeMounts", []), dict(mount)]


def template_hash(template: dict[str, Any]) -> str:
    """Hash of a pod template without its own hash annotation (stable across dict ordering)."""
    metadata = dict(template.get("metadata") or {})
    metadata["annotations"] = {k: v for k, v in (metadata.get("annotations") or {}).items() if k != ANNOTATION_TEMPLATE_HASH}
    blob = json.dumps({**template, "metadata": metadata}, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------------------
# Objects


# The speculative server's groups are replaced one at a time with no surge: the operator walks the fleet back to the
# base before the speculative template changes (reconcile), so no speculative server serves alone while it changes.
_GROUP_AT_A_TIME = {"maxUnavailable": 1, "maxSurge": 0}


def base_rolling_update(spec: SpeculativeServerSpec) -> dict[str, int]:
    """How a base template change (a new image, new arguments) replaces the base servers: never all at once.

    A fleet walks within rollout.maxSurge/maxUnavailable (the API refuses both at 0), each new server Ready before
    the next old one goes when maxUnavailable is 0. A one-server resource surges: the new pod loads beside the old
    one, which keeps serving until the new one is Ready. Where the GPUs do not allow the surge, the new pod waits
    Unschedulable and the old one keeps serving (status says so; the progress deadline ends the wait).
    """
    if spec.replicas <= 1:
        return {"maxSurge": 1, "maxUnavailable": 0}
    return {"maxSurge": spec.rollout.max_surge, "maxUnavailable": spec.rollout.max_unavailable}


def deployment_strategy(spec: SpeculativeServerSpec, variant: str | Variant) -> dict[str, Any]:
    """The base rolls (base_rolling_update); the speculative server is recreated, since the operator has already
    walked the traffic to the base before its template changes (a speculative pod cannot surge on a full node)."""
    if _v(variant) == Variant.BASE.value:
        return {"type": "RollingUpdate", "rollingUpdate": base_rolling_update(spec)}
    return {"type": "Recreate"}


def deployment(
    name: str,
    namespace: str,
    spec: SpeculativeServerSpec,
    variant: str | Variant,
    *,
    command: list[str] | None = None,
    replicas: int,
    revision: str,
    settings: ManifestSettings = ManifestSettings(),
    template: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Deployment ``<name>-base`` or ``<name>-spec`` (owner reference added by the caller).

    ``template``: this variant's ``pod_template`` rendered earlier for the same arguments (the caller's cache;
    it is shared, not copied, so nobody may modify it); without it, ``command`` is rendered into a new one.
    """
    variant = _v(variant)
    if template is None and command is None:
        raise ValueError("deployment() needs the server command or a rendered template")
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _server_metadata(name, namespace, variant),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector_labels(name, variant)},
            "strategy": deployment_strategy(spec, variant),
            "revisionHistoryLimit": 3,
            # The startup probe allows long loads; the Deployment must not call that a stalled rollout first.
            "progressDeadlineSeconds": settings.startup_allowance_s + 600,
            "template": template if template is not None else pod_template(name, spec, variant, command or [], revision, settings),
        },
    }


# ---------------------------------------------------------------------------------------------------------
# Multi-node servers: one LeaderWorkerSet per variant, one group (of resources.nodes pods) per server.

LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
LWS_KIND = "LeaderWorkerSet"
LWS_PLURAL = "leaderworkersets"
LWS_CRD_NAME = "leaderworkersets.leaderworkerset.x-k8s.io"
# Labels the LeaderWorkerSet controller and its pod webhook put on every pod of a group.
LWS_LABEL_NAME = "leaderworkerset.sigs.k8s.io/name"
LWS_LABEL_GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"
LWS_LABEL_GROUP_KEY = "leaderworkerset.sigs.k8s.io/group-key"
LWS_LABEL_WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
# Our own label of a group's pods: the leader serves HTTP (and the Services select it alone); a worker runs its
# ranks' schedulers and SGLang's small health server on the same port.
LABEL_ROLE = "specdec.io/role"
ROLE_LEADER = "leader"
ROLE_WORKER = "worker"
# A group comes up when its last rank has loaded its shard and joined the rendezvous: each extra node adds this
# much to the startup probe's allowance (image pull and load on a node that may start last, NCCL set-up).
STARTUP_PER_EXTRA_NODE_S = 10 * 60


def multi_node(spec: SpeculativeServerSpec) -> bool:
    """Whether each server of this spec is a LeaderWorkerSet group rather than a Deployment's pod."""
    return spec.resources.nodes > 1


def _rank_template(template: dict[str, Any], role: str, command: list[str], spec: SpeculativeServerSpec) -> dict[str, Any]:
    """A leader or worker pod template made from a variant's pod template."""
    out = copy.deepcopy(template)
    out["metadata"]["labels"][LABEL_ROLE] = role
    pod_spec = out["spec"]
    container = pod_spec["containers"][0]
    container["command"] = list(command)
    startup = container["startupProbe"]
    startup["failureThreshold"] += -(-STARTUP_PER_EXTRA_NODE_S * (spec.resources.nodes - 1) // startup["periodSeconds"])
    if role == ROLE_WORKER:
        # The drafter is checked once per group, by the leader's init container.
        pod_spec.pop("initContainers", None)
    # The ranks of a group on distinct nodes: no two pods with the same group key (the LeaderWorkerSet webhook
    # labels each pod with it; matchLabelKeys adds the pod's own value to the selector). gpuFamily's node
    # affinity (in the template already) keeps every rank of the group on one GPU generation.
    affinity = pod_spec.setdefault("affinity", {})
    anti = affinity.setdefault("podAntiAffinity", {})
    anti.setdefault("requiredDuringSchedulingIgnoredDuringExecution", []).append(
        {
            "labelSelector": {"matchLabels": {LABEL_INSTANCE: out["metadata"]["labels"][LABEL_INSTANCE]}},
            "matchLabelKeys": [LWS_LABEL_GROUP_KEY],
            "topologyKey": "kubernetes.io/hostname",
        }
    )
    # ... and on nodes of one GPU family even when gpuFamily is any (the first rank picks it).
    affinity.setdefault("podAffinity", {}).setdefault("requiredDuringSchedulingIgnoredDuringExecution", []).append(
        {
            "labelSelector": {"matchLabels": {LABEL_INSTANCE: out["metadata"]["labels"][LABEL_INSTANCE]}},
            "matchLabelKeys": [LWS_LABEL_GROUP_KEY],
            "topologyKey": GPU_FAMILY_LABEL,
        }
    )
    out["metadata"]["annotations"][ANNOTATION_TEMPLATE_HASH] = template_hash(out)
    return out


def leader_worker_set(
    name: str,
    namespace: str,
    spec: SpeculativeServerSpec,
    variant: str | Variant,
    *,
    leader_command: list[str],
    worker_command: list[str],
    replicas: int,
    revision: str,
    settings: ManifestSettings = ManifestSettings(),
    adaptive_config_hash: str | None = None,
) -> dict[str, Any]:
    """LeaderWorkerSet ``<name>-base`` or ``<name>-spec``: ``replicas`` groups of resources.nodes pods each.

    The commands come from ``sglang.render_argv`` (``worker=True`` for the workers'). The walk between variants is
    the operator's (like the Deployments', through spec.replicas), so the LeaderWorkerSet's own rolling update
    only ever replaces whole groups one at a time when the template changes; a pod that restarts takes its group
    down with it (RecreateGroupOnPodRestart: the other ranks cannot go on without it).
    """
    variant = _v(variant)
    template = pod_template(name, spec, variant, leader_command, revision, settings, adaptive_config_hash=adaptive_config_hash)
    return {
        "apiVersion": LWS_API_VERSION,
        "kind": LWS_KIND,
        "metadata": _server_metadata(name, namespace, variant),
        "spec": {
            "replicas": replicas,
            "startupPolicy": "LeaderCreated",
            "rolloutStrategy": {
                "type": "RollingUpdate",
                "rollingUpdateConfiguration": base_rolling_update(spec) if variant == Variant.BASE.value else _GROUP_AT_A_TIME,
            },
            # One headless Service per group, named after its leader pod (the controller makes it, owned by the
            # leader, publishing not-ready addresses): LWS_LEADER_ADDRESS is <set>-<group>.<set>-<group>.<ns>. With
            # Shared the controller would make a Service named <set> only if none exists, and <name>-base /
            # <name>-spec are our own per-variant Services (headless, Ready leaders only), so the workers could not
            # resolve a leader that is not Ready yet, and it is not Ready until they have joined.
            "networkConfig": {"subdomainPolicy": "UniquePerReplica"},
            "leaderWorkerTemplate": {
                "size": spec.resources.nodes,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": _rank_template(template, ROLE_LEADER, leader_command, spec),
                "workerTemplate": _rank_template(template, ROLE_WORKER, worker_command, spec),
            },
        },
    }


def with_replicas(server: dict[str, Any], replicas: int) -> dict[str, Any]:
    """A rendered LeaderWorkerSet with another spec.replicas (the templates are shared, not copied)."""
    return {**server, "spec": {**server["spec"], "replicas": replicas}}


def replicas_only(kind: str, name: str, namespace: str, variant: str | Variant, replicas: int) -> dict[str, Any]:
    """A server object (Deployment or LeaderWorkerSet) that says only its spec.replicas: written as a merge patch
    of that one field, so the pod template it has stays (a fleet walking back before its speculative template
    changes scales the old template's servers down; the operator's index keeps no template to re-apply)."""
    api_version = "apps/v1" if kind == "Deployment" else LWS_API_VERSION
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": child_name(name, variant), "namespace": namespace},
        "spec": {"replicas": replicas},
    }


def is_replicas_only(obj: dict[str, Any]) -> bool:
    """Whether a desired server object is replicas_only's (to be merge-patched, never applied)."""
    return obj.get("kind") in ("Deployment", LWS_KIND) and set(obj.get("spec") or {}) == {"replicas"}


def leader_template(server: dict[str, Any]) -> dict[str, Any]:
    """The leader's pod template of a rendered LeaderWorkerSet (its hash is the group's: the leader serves)."""
    return server["spec"]["leaderWorkerTemplate"]["leaderTemplate"]


def lws_missing_message(spec: SpeculativeServerSpec, installed_crds: set[str] | frozenset[str]) -> str | None:
    """Why a multi-node spec cannot be served here, or None: it needs the LeaderWorkerSet CRD (and controller).

    ``installed_crds``: the names of the cluster's CustomResourceDefinitions (or just whether LWS_CRD_NAME is one).
    The message is for a condition (InvalidSpec) and names what to install.
    """
    if not multi_node(spec) or LWS_CRD_NAME in installed_crds:
        return None
    return (
        f"spec.resources.nodes is {spec.resources.nodes}: a multi-node server runs as a LeaderWorkerSet group, and "
        f"this cluster has no {LWS_CRD_NAME} CustomResourceDefinition; install the LeaderWorkerSet controller "
        "(sigs.k8s.io/lws, e.g. its Helm chart or manifests of release v0.9.0 or later) or set resources.nodes to 1"
    )


def service(
    name: str,
    namespace: str,
    variant: str | Variant | None,
    *,
    active: str | Variant = Variant.BASE,
    settings: ManifestSettings = ManifestSettings(),
    leaders_only: bool = False,
    both: bool = False,
) -> dict[str, Any]:
    """Service ``<name>-base``/``<name>-spec`` (variant given) or the stable ``<name>`` selecting ``active``.

    leaders_only: select only the leaders of multi-node groups (rank 0 serves HTTP; the workers' port answers
    health checks only). both (stable Service only): select the servers of both variants, while a fleet walks
    from one to the other (they produce the same tokens); the annotation still names the decided variant.
    """
    selected = _v(variant if variant is not None else active)
    labels = dict(instance_labels(name))
    annotations: dict[str, str] = {}
    if variant is not None:
        labels[LABEL_VARIANT] = _v(variant)
    else:
        annotations[ANNOTATION_ACTIVE_VARIANT] = selected
    metadata: dict[str, Any] = {"name": child_name(name, variant), "namespace": namespace, "labels": labels}
    if annotations:
        metadata["annotations"] = annotations
    selector = selector_labels(name, selected)
    if both and variant is None:
        del selector[LABEL_VARIANT]
    spec: dict[str, Any] = {
        "type": "ClusterIP",
        "selector": {**selector, **({LABEL_ROLE: ROLE_LEADER} if leaders_only else {})},
        "ports": [{"name": PORT_NAME, "port": settings.port, "targetPort": PORT_NAME, "protocol": "TCP"}],
    }
    if variant is not None:
        # Headless: the per-variant Services exist for the probe and the monitor, which reach them by DNS (the
        # pod's own IP, same port); only the stable Service needs a virtual IP. ClusterIP allocation was what
        # broke first at 1,000 resources: the API server allocated a few per second (benchmarks/scale.py).
        spec["clusterIP"] = "None"
    return {"apiVersion": "v1", "kind": "Service", "metadata": metadata, "spec": spec}


def _server_metadata(name: str, namespace: str, variant: str) -> dict[str, Any]:
    """Metadata of a variant's server object (Deployment or LeaderWorkerSet)."""
    return {"name": child_name(name, variant), "namespace": namespace, "labels": {**instance_labels(name), LABEL_VARIANT: variant}}


PROBE_EVIDENCE_KEY = "evidence.json"


def probe_evidence_config_map_name(name: str) -> str:
    return f"{name}-probe-evidence"


def probe_evidence_config_map(name: str, namespace: str, evidence_json: str) -> dict[str, Any]:
    """ConfigMap ``<name>-probe-evidence``: what the running probe has measured so far (probe/evidence.py), written by
    the probe scheduler after every round so that a restarted operator resumes the probe (owner reference added by the
    caller). Not labelled managed-by: the operator's watch does not see it, so its writes start no reconcile step."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": probe_evidence_config_map_name(name),
            "namespace": namespace,
            "labels": {LABEL_NAME: APP_NAME, LABEL_INSTANCE: name, "specdec.io/probe-evidence": "true"},
        },
        "data": {PROBE_EVIDENCE_KEY: evidence_json},
    }


def adaptive_config_map(name: str, namespace: str, config_json: str) -> dict[str, Any]:
    """ConfigMap ``<name>-adaptive``: the speculative server's --speculative-adaptive-config (owner reference added by the caller)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": adaptive_config_map_name(name), "namespace": namespace, "labels": dict(instance_labels(name))},
        "data": {ADAPTIVE_CONFIG_KEY: config_json},
    }


def service_variant(svc: dict[str, Any]) -> Variant | None:
    """Which variant a Service's selector selects (None if it selects neither, or both: see selects_both)."""
    selector = (svc.get("spec") or {}).get("selector") or {}
    value = selector.get(LABEL_VARIANT)
    return Variant(value) if value in SUFFIX else None


def selects_both(svc: dict[str, Any]) -> bool:
    """Whether a stable Service selects the servers of both variants (a fleet walking from one to the other)."""
    selector = (svc.get("spec") or {}).get("selector") or {}
    return LABEL_INSTANCE in selector and LABEL_VARIANT not in selector


# ---------------------------------------------------------------------------------------------------------
# The reader pod of a File prompt source (controller/datasetreader.py creates it when a probe starts, reads the
# dataset it serves and deletes it; docs/probe.md).

READER_CONTAINER = "reader"
READER_VOLUME = "dataset"
READER_MOUNT = "/dataset"
READER_PORT = reader.DEFAULT_PORT
READER_APP = "specdec-dataset-reader"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_PART_OF = "app.kubernetes.io/part-of"
LABEL_DATASET_FOR = "specdec.io/dataset-for"
COMPONENT = "dataset-reader"
# The reader's own unprivileged user (the operator image's), as the validator init container runs.
READER_UID = 65532


def reader_pod_name(name: str, workload: str) -> str:
    return f"{name}-dataset-{workload}"


def describe_file(workload: Workload) -> str:
    """How errors name a File source: ``dataset file PATH on claim CLAIM`` (or ``on the model volume``)."""
    return f"dataset {describe_source(workload)}"


def reader_labels(name: str) -> dict[str, str]:
    # Not the server pods' labels (no app.kubernetes.io/name=sglang, no managed-by): the operator's pod index and
    # status.selector (HPA) must never count a reader as a server.
    labels = {"app.kubernetes.io/name": READER_APP, LABEL_COMPONENT: COMPONENT, LABEL_PART_OF: MANAGED_BY}
    if len(name) <= 63:
        labels[LABEL_DATASET_FOR] = name
    return labels


def reader_pod(
    name: str, namespace: str, owner_uid: str, workload: Workload, spec: SpeculativeServerSpec, settings: ManifestSettings
) -> dict[str, Any]:
    """The reader pod of one workload's File source (pure). The operator's image, no GPU, the volume read-only."""
    file = workload.prompts.file
    if workload.prompts.source != "File" or file is None:
        raise ValueError(f"workload {workload.name}: prompts.source is {workload.prompts.source}, not File")
    if file.claim_name:
        volume: dict[str, Any] = {"name": READER_VOLUME, "persistentVolumeClaim": {"claimName": file.claim_name, "readOnly": True}}
    else:  # the model volume, exactly as the servers mount it
        volume = {"name": READER_VOLUME, **copy.deepcopy(spec.model.volume)}
    container = {
        "name": READER_CONTAINER,
        "image": settings.validator_image,
        "command": [
            "specdec",
            "dataset-serve",
            "--file",
            f"{READER_MOUNT}/{file.path}",
            "--format",
            workload.prompts.format or "Auto",
            "--source",
            describe_file(workload),
            "--port",
            str(READER_PORT),
        ],
        "ports": [{"name": "http", "containerPort": READER_PORT, "protocol": "TCP"}],
        # Ready once the file is read, whatever its verdict: the verdict is the answer to GET /dataset.
        "readinessProbe": {"httpGet": {"path": reader.HEALTH_PATH, "port": READER_PORT}, "periodSeconds": 2, "failureThreshold": 3},
        # A dataset is at most 64 MiB (datasets.MAX_BYTES); parsed, it takes a few times that.
        "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}},
        "volumeMounts": [{"name": READER_VOLUME, "mountPath": READER_MOUNT, "readOnly": True}],
        "securityContext": {
            **_container_security(),
            "runAsNonRoot": True,
            "runAsUser": READER_UID,
            "runAsGroup": READER_UID,
        },
    }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "hostNetwork": False,
        "hostIPC": False,
        "hostPID": False,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}, "runAsNonRoot": True},
        "terminationGracePeriodSeconds": 5,
        # A reader the operator could not delete (a crash) ends by itself; the owner reference removes it later.
        "activeDeadlineSeconds": 3600,
        # Where the servers run: a hostPath model volume exists on those nodes, and a ReadWriteOnce claim the
        # servers hold can only be mounted on their node. The tolerations let it land there; it asks for no GPU.
        "tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}] + copy.deepcopy(spec.pod_template.tolerations or []),
        "volumes": [volume],
        "containers": [container],
    }
    if spec.pod_template.node_selector:
        pod_spec["nodeSelector"] = dict(spec.pod_template.node_selector)
    # Its image is the operator's (the validator's): a private mirror needs the same pull secrets as the servers.
    if spec.pod_template.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": ref.name} for ref in spec.pod_template.image_pull_secrets]
    affinity = _gpu_affinity(spec)
    if affinity:
        pod_spec["affinity"] = affinity
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": reader_pod_name(name, workload.name),
            "namespace": namespace,
            "labels": reader_labels(name),
            "ownerReferences": [
                {
                    "apiVersion": f"{API_GROUP}/{API_VERSION}",
                    "kind": KIND,
                    "name": name,
                    "uid": owner_uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": pod_spec,
    }
