"""`specdec run`: the operator process (Kopf's runner with the SpeculativeServer handlers).

    specdec run --all-namespaces --metrics-port 8080 --liveness http://0.0.0.0:8081/healthz --peering specdec-operator
    specdec run --namespace demo --endpoints endpoints.yaml --standalone      # outside the cluster

Credentials come from the pod's service account in the cluster, else from KUBECONFIG / ~/.kube/config.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import time
from concurrent.futures import ThreadPoolExecutor

from ..cliparse import ArgumentParser
from ..errors import InputError
from ..trainjob import TrainingJobSettings


def _positive(kind: type):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text!r} must be > 0")
        return value

    return parse


def _quantity(text: str) -> str:
    import re

    if not re.fullmatch(r"[1-9][0-9]*(Ki|Mi|Gi|K|M|G)?", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a memory quantity such as 256Mi or 1Gi")
    return text


def build_parser() -> argparse.ArgumentParser:
    from ..manifests import DEFAULT_VALIDATOR_IMAGE

    p = ArgumentParser(prog="specdec run", description="Run the SpeculativeServer operator.")
    scope = p.add_mutually_exclusive_group()
    scope.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        metavar="NS",
        help="serve SpeculativeServers in this namespace (repeatable; glob patterns as in kopf)",
    )
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="serve every namespace (the default when no --namespace is given)")
    p.add_argument(
        "--endpoints",
        metavar="FILE",
        help="YAML/JSON mapping 'namespace/service' -> URL, for running outside the cluster (default: cluster DNS http://<service>.<namespace>.svc:<port>)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=8080,
        metavar="PORT",
        help="serve the operator's Prometheus metrics on this port at /metrics (0: off; default 8080)",
    )
    p.add_argument("--metrics-address", default="0.0.0.0", metavar="ADDR", help="address the metrics server binds (default 0.0.0.0)")
    p.add_argument("--liveness", metavar="URL", help="Kopf's liveness endpoint, e.g. http://0.0.0.0:8081/healthz")
    peering = p.add_mutually_exclusive_group()
    peering.add_argument(
        "--peering", metavar="NAME", help="leader election through this Kopf peering object (needs the KopfPeering CRDs); the oldest replica leads"
    )
    peering.add_argument("--standalone", action="store_true", help="no peering: the only replica (development, tests)")
    p.add_argument("--priority", type=int, help="peering priority (default: older replicas win, so a new replica never preempts a running one)")
    p.add_argument(
        "--peering-lifetime",
        type=_positive(int),
        default=60,
        metavar="S",
        help="how long this replica's peering record is trusted; after a crash the next replica takes over within it (default 60, Kopf's; at least 15)",
    )
    p.add_argument(
        "--validator-image",
        default=DEFAULT_VALIDATOR_IMAGE,
        metavar="IMAGE",
        help=f"image of the drafter validator init container (default {DEFAULT_VALIDATOR_IMAGE})",
    )
    p.add_argument(
        "--validator-memory-limit",
        type=_quantity,
        default="512Mi",
        metavar="QUANTITY",
        help="memory limit of the validator init container, e.g. 256Mi (default 512Mi)",
    )
    p.add_argument(
        "--server-pod-defaults",
        default="",
        metavar="JSON",
        help="operator-wide defaults of the server pods, merged under each resource's spec.podTemplate (the resource wins; "
        'lists are merged): {"imagePullSecrets": [{"name": ...}], "priorityClassName": ..., "tolerations": [...], "securityContext": {...}}',
    )
    _add_intervals_and_limits(p)
    _add_training(p)
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    p.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only")
    return p


def _add_intervals_and_limits(p: argparse.ArgumentParser) -> None:
    """The flags of how often the operator steps, how long it waits, and how much it does at once."""
    from ..manifests import STARTUP_ALLOWANCE_S

    p.add_argument(
        "--reconcile-interval",
        type=_positive(float),
        default=10.0,
        metavar="S",
        help="seconds between reconcile steps while a resource changes with time: servers loading, a probe running (events wake it earlier; default 10)",
    )
    p.add_argument(
        "--resync-interval",
        type=_positive(float),
        default=300.0,
        metavar="S",
        help="seconds between steps of a settled resource (decided, its servers ready); events wake it at once (default 300)",
    )
    p.add_argument(
        "--probe-timeout", type=_positive(float), default=3600.0, metavar="S", help="upper bound of one probe; Inconclusive when spent (default 3600)"
    )
    p.add_argument(
        "--probe-request-timeout", type=_positive(float), default=600.0, metavar="S", help="upper bound of one probe request (default 600)"
    )
    p.add_argument(
        "--probe-script",
        metavar="FILE",
        default=None,
        help="tests and demos: probes of the resources this YAML file names decide on its scripted rounds instead of "
        "measuring the servers (docs/probe.md, probe/scripted.py); read when each probe starts",
    )
    p.add_argument(
        "--dataset-reader-timeout",
        type=_positive(float),
        default=300.0,
        metavar="S",
        help="how long a File prompt source's reader pod may take to serve the dataset (default 300)",
    )
    p.add_argument(
        "--startup-allowance",
        type=_positive(int),
        default=STARTUP_ALLOWANCE_S,
        metavar="S",
        help=f"how long a server may load before its startup probe fails (default {STARTUP_ALLOWANCE_S})",
    )
    p.add_argument(
        "--crash-restart-limit",
        type=_positive(int),
        default=3,
        metavar="N",
        help="restarts after which a crash-looping speculative server is given up (ProbeFailed) and scaled to 0 (default 3)",
    )
    p.add_argument(
        "--max-concurrent-probes",
        type=_positive(int),
        default=8,
        metavar="N",
        help="probes run at once by this replica; more wait for a slot (each streams from two servers through this process, and a CPU-starved client would bias its measurements; default 8)",
    )
    p.add_argument(
        "--max-concurrent-races",
        type=_positive(int),
        default=2,
        metavar="N",
        help="races of candidates (spec.candidates) running at once; a new race waits Queued, the base serving and no speculative server held, until one ends (default 2)",
    )
    p.add_argument(
        "--max-concurrent-scrapes",
        type=_positive(int),
        default=32,
        metavar="N",
        help="drift-monitor scrapes of speculative pods in flight at once, over all resources (default 32)",
    )
    p.add_argument(
        "--max-concurrent-reconciles",
        type=_positive(int),
        default=16,
        metavar="N",
        help="reconcile steps making API calls at once; woken resources wait their turn (default 16)",
    )
    p.add_argument(
        "--api-workers",
        type=_positive(int),
        default=32,
        metavar="N",
        help="Kubernetes API calls in flight at once (threads and connections of the API client; default 32)",
    )


def _add_training(p: argparse.ArgumentParser) -> None:
    """spec.retraining.training's Jobs (trainjob.TrainingJobSettings; chart values training.*)."""
    from ..trainjob import DEFAULT_PRIORITY_CLASS, DEFAULT_TRAINING_IMAGE

    p.add_argument(
        "--training-image", default=DEFAULT_TRAINING_IMAGE, metavar="IMAGE", help=f"image of the training Jobs (default {DEFAULT_TRAINING_IMAGE})"
    )
    p.add_argument(
        "--training-cpu-image", default="", metavar="IMAGE", help="image of the training Jobs with budget.gpus 0 (default: --training-image)"
    )
    p.add_argument(
        "--training-priority-class",
        default=DEFAULT_PRIORITY_CLASS,
        metavar="NAME",
        help=f"PriorityClass of the training Jobs' pods, below serving (the chart creates it; '' for the cluster's default; default {DEFAULT_PRIORITY_CLASS})",
    )
    p.add_argument(
        "--training-cluster-cap",
        type=_positive(int),
        default=1,
        metavar="N",
        help="training Jobs running at once over every resource the operator serves; a resource whose Job would exceed it waits (ClusterCap; default 1)",
    )


def _training_settings(args: argparse.Namespace) -> TrainingJobSettings:

    return TrainingJobSettings(
        image=args.training_image,
        cpu_image=args.training_cpu_image,
        priority_class_name=args.training_priority_class,
        cluster_cap=args.training_cluster_cap,
    )


def default_priority() -> int:
    """Older replicas get higher priorities (milliseconds before 2^42, past 2100), with a random tie-breaker."""
    return ((1 << 42) - int(time.time() * 1000)) * 1000 + random.randrange(1000)


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)

    import kopf
    from kubernetes import client as k8s
    from kubernetes import config as k8s_config

    from .. import manifests as m
    from .. import poddefaults
    from ..reconcile import Settings
    from .config import Endpoints, OperatorConfig
    from .handlers import register
    from .kopf_tuning import configure
    from .metrics import OperatorMetrics
    from .runtime import Runtime

    endpoints = Endpoints.from_file(args.endpoints) if args.endpoints else Endpoints()
    config = OperatorConfig(
        server_pod_defaults=poddefaults.parse(args.server_pod_defaults),
        reconcile=Settings(
            manifests=m.ManifestSettings(
                validator_image=args.validator_image, startup_allowance_s=args.startup_allowance, validator_memory_limit=args.validator_memory_limit
            ),
            crash_restart_limit=args.crash_restart_limit,
            max_concurrent_races=args.max_concurrent_races,
            training=_training_settings(args),
        ),
        endpoints=endpoints,
        reconcile_interval=args.reconcile_interval,
        resync_interval=args.resync_interval,
        probe_timeout=args.probe_timeout,
        probe_request_timeout=args.probe_request_timeout,
        dataset_reader_timeout=args.dataset_reader_timeout,
        probe_script=args.probe_script,
        max_concurrent_probes=args.max_concurrent_probes,
        max_concurrent_scrapes=args.max_concurrent_scrapes,
        max_concurrent_reconciles=args.max_concurrent_reconciles,
    )

    kopf.configure(verbose=args.verbose, quiet=args.quiet)
    if not args.verbose:
        # Kopf logs every handler run at INFO (one line per pod event); the operator logs its decisions itself.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    try:
        k8s_config.load_incluster_config()
    except k8s_config.ConfigException:
        try:
            k8s_config.load_kube_config()
        except (k8s_config.ConfigException, OSError) as exc:
            raise InputError(f"no Kubernetes credentials: not in a cluster and no usable kubeconfig ({exc}); set KUBECONFIG") from None

    metrics = OperatorMetrics()
    if args.metrics_port:
        try:
            metrics.serve(args.metrics_port, args.metrics_address)
        except OSError as exc:
            raise InputError(f"--metrics-port {args.metrics_port}: cannot listen: {exc.strerror}") from None

    registry = kopf.OperatorRegistry()
    settings = kopf.OperatorSettings()
    configure(settings)
    settings.peering.name = args.peering or "specdec-operator"
    settings.peering.mandatory = bool(args.peering)
    # Kopf refreshes the record 5-10 s before it expires, so shorter lifetimes would flap.
    settings.peering.lifetime = max(15, args.peering_lifetime)
    # The handlers call the blocking kubernetes client through asyncio.to_thread. With asyncio's default pool
    # (min(32, CPUs + 4) threads: 6 on 2 cores) and the client's 10 pooled connections, 1,000 resources queued
    # behind 6 requests in flight and the first status took minutes (benchmarks/scale.py, docs/scale.md).
    settings.execution.max_workers = args.api_workers  # Kopf's pool for its synchronous handlers (the indexes)
    client_config = k8s.Configuration.get_default_copy()
    client_config.connection_pool_maxsize = args.api_workers
    runtime = Runtime(config, metrics, k8s.ApiClient(client_config))
    register(registry, runtime)

    logging.getLogger("specdec").info(
        f"starting: {'all namespaces' if not args.namespace else ', '.join(args.namespace)}, endpoints from {args.endpoints or 'cluster DNS'}"
    )

    async def operate() -> None:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(args.api_workers, thread_name_prefix="kube-api"))
        await kopf.operator(
            registry=registry,
            settings=settings,
            standalone=True if args.standalone else None,
            priority=args.priority if args.priority is not None else default_priority(),
            peering_name=args.peering,
            liveness_endpoint=args.liveness,
            clusterwide=not args.namespace,
            namespaces=args.namespace,
        )

    asyncio.run(operate())
    return 0
