"""Kopf wiring: gather what exists, call ``reconcile``, apply the plan. Nothing clever lives here.

One Kopf daemon per SpeculativeServer runs the loop: observe -> ``reconcile.reconcile`` -> apply children
(server-side apply, owner-referenced), patch status, post Events, start or cancel the probe. It wakes up on
any event of the resource or of its children (pods, Deployments, Services, watched through label-filtered
Kopf indexes, so a step lists nothing), every ``reconcile_interval`` seconds while its status changes with time
(servers loading, a probe running), and every ``resync_interval`` seconds once it is settled.

The probe runs as an asyncio task next to the daemon; when it finishes, the next step records its decision in
status.probe. The drift monitor scrapes the speculative Service when ``reconcile`` says a scrape is due.

Every URL is derived from the resource's own name and namespace (``<name>-base``, ``<name>-spec``) and the
operator's endpoints configuration; nothing in a spec names a host. Objects with those names that this
resource does not own are never modified and never probed (phase Failed, NameConflict).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import re
import time
from datetime import datetime, timezone
from typing import Any

import aiohttp
import kopf
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from . import API_GROUP, API_VERSION, PLURAL
from . import manifests as m
from .api import dump, parse_spec
from .errors import InputError
from .metrics import OperatorMetrics
from .monitor import Sample, sample_from_metrics
from .probe import ProbeRequestError, run_probe, scrape_metrics
from .reconcile import Observed, Plan, Settings, merge_patch, reconcile, rfc3339

FIELD_MANAGER = "specdec-operator"
LOG = logging.getLogger("specdec.operator")
MANAGED = {m.LABEL_MANAGED_BY: m.MANAGED_BY}
ROLLBACK_REASONS = {"SpeedupBelowThreshold", "DrafterNotAccepting", "Inconclusive", "ProbeFailed", "AcceptanceDrift"}
# Stable Services created at once beside the steps. Not a limit of the API server (an idle local one creates
# ~230 ClusterIP Services a second with 4 or 32 clients alike); under load each creation takes seconds, and 4 at
# once left 500 of 1,000 stable Services uncreated when everything else had settled (docs/scale.md, run 17).
CREATIONS_AT_ONCE = 16
# How long a name found taken by a foreign object is remembered before it is looked up again.
FOREIGN_TTL_S = 30.0


# ---------------------------------------------------------------------------------------------------------
# Configuration


class Endpoints:
    """Where the operator reaches a Service: cluster DNS, or an explicit mapping (operator configuration).

    The mapping (``namespace/service: URL``) is for an operator running outside the cluster (a laptop, the
    tests); it comes from the operator's command line, never from a custom resource.
    """

    def __init__(self, mapping: dict[str, str] | None = None, port: int = m.DEFAULT_PORT, domain: str = "svc") -> None:
        self.mapping = dict(mapping or {})
        self.port = port
        self.domain = domain

    @classmethod
    def from_file(cls, path: str, port: int = m.DEFAULT_PORT) -> "Endpoints":
        try:
            with open(path, encoding="utf-8") as fh:
                data = yaml.safe_load(fh) or {}
        except OSError as exc:
            raise InputError(f"--endpoints {path}: cannot read: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise InputError(f"--endpoints {path}: not valid YAML/JSON: {str(exc).splitlines()[0]}") from None
        if not isinstance(data, dict):
            raise InputError(f"--endpoints {path}: must map 'namespace/service' to 'http://host:port'")
        for key, url in data.items():
            if not isinstance(key, str) or key.count("/") != 1 or not isinstance(url, str) or not url.startswith(("http://", "https://")):
                raise InputError(f"--endpoints {path}: entry {key!r}: must map 'namespace/service' to an http(s) URL, got {url!r}")
        return cls(data, port)

    def url(self, namespace: str, service: str) -> str:
        mapped = self.mapping.get(f"{namespace}/{service}")
        if mapped:
            return mapped.rstrip("/")
        return f"http://{service}.{namespace}.{self.domain}:{self.port}"


@dataclasses.dataclass
class OperatorConfig:
    """Everything `specdec run` configures about the handlers."""

    reconcile: Settings = dataclasses.field(default_factory=Settings)
    endpoints: Endpoints = dataclasses.field(default_factory=Endpoints)
    reconcile_interval: float = 10.0  # seconds between steps while a resource changes with time (loading, probing)
    # Seconds between steps of a settled resource (decided, its servers ready): a safety net only, since every
    # change that matters then arrives as an event. At 10 s, 1,000 settled resources kept 0.4 cores busy.
    resync_interval: float = 300.0
    probe_timeout: float = 3600.0  # bound of one whole probe (Inconclusive when spent)
    probe_request_timeout: float = 600.0
    scrape_timeout: float = 10.0
    # Probes measure throughput from this process: too many at once and the client, not the servers, sets the
    # pace (one probe streaming 28k tok/s takes 15 % of a core, docs/probe.md), biasing every measurement.
    max_concurrent_probes: int = 8
    # Steps making API calls at once (controller-runtime's MaxConcurrentReconciles). Without a bound, 1,000
    # resources woken together queued several thousand calls behind the client's connections, so every step
    # waited for all the others; bounded, a woken resource waits its turn (specdec_reconcile_queue_seconds) and
    # its step then runs at the API server's own pace.
    max_concurrent_reconciles: int = 16
    # A resource is stepped at most this often: child events arriving closer together (a pod scheduled,
    # started, ready within a second) are merged into one step and at most one status write.
    min_step_interval: float = 1.0


@dataclasses.dataclass
class ProbeTask:
    revision: str
    task: asyncio.Task


# ---------------------------------------------------------------------------------------------------------
# Slim copies of children for the indexes (what reconcile reads, nothing more)


def _meta(body: Any) -> dict[str, Any]:
    meta = body.get("metadata") or {}
    keep = ("name", "namespace", "labels", "annotations", "ownerReferences", "creationTimestamp", "deletionTimestamp", "uid")
    return {k: _plain(meta.get(k)) for k in keep if meta.get(k) is not None}


def _plain(value: Any) -> Any:
    if isinstance(value, dict) or hasattr(value, "items"):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def slim_pod(body: Any) -> dict[str, Any]:
    status = body.get("status") or {}
    keep = ("phase", "conditions", "initContainerStatuses", "containerStatuses", "startTime", "podIP")
    return {"metadata": _meta(body), "status": {k: _plain(status.get(k)) for k in keep if status.get(k) is not None}}


def slim_deployment(body: Any) -> dict[str, Any]:
    spec = body.get("spec") or {}
    template_meta = ((spec.get("template") or {}).get("metadata")) or {}
    return {
        "kind": "Deployment",
        "metadata": _meta(body),
        "spec": {"replicas": spec.get("replicas"), "template": {"metadata": {"annotations": _plain(template_meta.get("annotations") or {})}}},
        "status": _plain(body.get("status") or {}),
    }


# Characters YAML does not carry raw: non-printables and what YAML 1.1 folds as line breaks (NEL, LS, PS).
# (C0 controls are escaped by json.dumps already.)
_NOT_YAML_PRINTABLE = re.compile("[\x7f-\x9f\u2028\u2029\ufffe\uffff]")


def apply_body(obj: dict[str, Any]) -> bytes:
    """A server-side apply body (YAML content) that survives any Unicode in a spec.

    The client would send json.dumps' ASCII output, in which a character beyond the BMP (an emoji in an image
    name or a path) is a surrogate-pair escape: valid JSON, but the API server's YAML decoder refuses it ("found
    invalid Unicode character escape code"), so the children could not be applied (found by
    tests/test_reliability_api_fuzz.py). Non-ASCII goes as UTF-8; only what YAML cannot carry raw is escaped.
    """
    text = json.dumps(obj, ensure_ascii=False)
    return _NOT_YAML_PRINTABLE.sub(lambda c: f"\\u{ord(c.group()):04x}", text).encode("utf-8")


def slim_service(body: Any) -> dict[str, Any]:
    spec = body.get("spec") or {}
    return {"kind": "Service", "metadata": _meta(body), "spec": {"selector": _plain(spec.get("selector") or {}), "ports": _plain(spec.get("ports") or [])}}


# ---------------------------------------------------------------------------------------------------------
# The per-process runtime


class Runtime:
    """In-memory state of one operator process: wake-up events, probe tasks, last statuses and scrapes.

    None of it is needed to resume: a fresh process rebuilds everything from the cluster (status and children).
    """

    def __init__(self, config: OperatorConfig, metrics: OperatorMetrics, api_client: k8s.ApiClient | None = None) -> None:
        self.config = config
        self.metrics = metrics
        self.api_client = api_client
        self.wakeups: dict[tuple[str, str], asyncio.Event] = {}
        self.probes: dict[tuple[str, str], ProbeTask] = {}
        self.statuses: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {}  # (uid, status last written)
        self.scrapes: dict[tuple[str, str], Sample] = {}
        self.monitor_due: dict[tuple[str, str], bool] = {}
        self.foreign: dict[tuple[str, str], dict[str, tuple[float, dict[str, Any]]]] = {}
        self.progress: dict[tuple[str, str], str] = {}
        # Creations of the stable Service in flight (see step): at most one per resource, and at most
        # CREATIONS_AT_ONCE in all, so that they never hold all the API worker threads that the steps need.
        self.creating: dict[tuple[str, str], asyncio.Task] = {}
        self._creation_slots: asyncio.Semaphore | None = None
        # (uid, generation, parsed spec, rendered pod templates): parsed and rendered once per generation.
        self.rendered: dict[tuple[str, str], tuple[str, int, Any, dict[str, Any]]] = {}
        self._session: aiohttp.ClientSession | None = None
        self._probe_slots: asyncio.Semaphore | None = None  # created in the event loop, on the first probe
        self._step_slots: asyncio.Semaphore | None = None  # likewise, on the first step

    async def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        return self._session

    async def close(self) -> None:
        for probe in list(self.probes.values()):
            probe.task.cancel()
        for task in list(self.creating.values()):
            task.cancel()
        if self._session is not None:
            await self._session.close()

    def step_slot(self) -> asyncio.Semaphore:
        if self._step_slots is None:
            self._step_slots = asyncio.Semaphore(self.config.max_concurrent_reconciles)
        return self._step_slots

    def wake(self, namespace: str | None, name: str | None) -> None:
        if namespace and name:
            event = self.wakeups.get((namespace, name))
            if event is not None:
                event.set()

    # --- API calls (the blocking kubernetes client's ApiClient, called in threads)
    # Raw requests through ApiClient (auth, TLS, retries, errors as ApiException) rather than the generated
    # CoreV1Api/AppsV1Api/CustomObjectsApi classes: importing those (pydantic-validated methods) costs 27 MB of
    # RSS and 2.7 s of CPU, which buys nothing for the four requests made here (docs/scale.md).
    def _request(self, method: str, path: str, path_params: dict[str, str], *, query: list[tuple[str, str]] | None = None,
                 content_type: str | None = None, body: Any = None) -> Any:
        if self.api_client is None:
            self.api_client = k8s.ApiClient()
        headers = {"Accept": "application/json", **({"Content-Type": content_type} if content_type else {})}
        method, url, headers, _, _ = self.api_client.param_serialize(
            method, path, path_params=path_params, query_params=query or [], header_params=headers, auth_settings=["BearerToken"]
        )
        started = time.monotonic()
        try:
            response = self.api_client.call_api(method, url, headers, body=body)
            response.read()
        finally:
            verb = "APPLY" if content_type == "application/apply-patch+yaml" else method
            resource = path.split("{namespace}/", 1)[-1].replace("{name}", "").replace("//", "/").strip("/")
            self.metrics.api_request_seconds.labels(verb, resource).observe(time.monotonic() - started)
        return self.api_client.response_deserialize(response, {"2XX": "object"}).data  # raises ApiException otherwise

    # --- applying children
    def _read(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        try:
            return self._request("GET", _child_path(obj["kind"]), {"namespace": obj["metadata"]["namespace"], "name": obj["metadata"]["name"]})
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def apply_child(self, key: tuple[str, str], obj: dict[str, Any], owner: Any, uid: str, observed: bool) -> bool:
        """Create or update one child with server-side apply; False when the name belongs to someone else."""
        if not observed:
            # Not in our (label-filtered) index: make sure the name is free or ours before applying, so that an
            # object someone else owns is never taken over.
            existing = self._read(obj)
            if existing is not None and not any(ref.get("uid") == uid for ref in existing["metadata"].get("ownerReferences") or []):
                self.foreign.setdefault(key, {})[obj["metadata"]["name"]] = (time.monotonic(), existing)
                return False
        kopf.append_owner_reference(obj, owner=owner)
        # The body is serialized here (apply_body): the client would send json.dumps' ASCII output.
        self._request(
            "PATCH", _child_path(obj["kind"]), {"namespace": obj["metadata"]["namespace"], "name": obj["metadata"]["name"]},
            query=[("fieldManager", FIELD_MANAGER), ("force", "true")], content_type="application/apply-patch+yaml", body=apply_body(obj),
        )
        return True

    def patch_status(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        self._request(
            "PATCH", f"/apis/{API_GROUP}/{API_VERSION}/namespaces/{{namespace}}/{PLURAL}/{{name}}/status", {"namespace": namespace, "name": name},
            content_type="application/merge-patch+json", body={"status": patch},
        )

    def foreign_objects(self, key: tuple[str, str]) -> dict[str, dict[str, Any]]:
        now = time.monotonic()
        known = self.foreign.get(key, {})
        for child, (seen, _) in list(known.items()):
            if now - seen > FOREIGN_TTL_S:
                del known[child]
        return {child: obj for child, (_, obj) in known.items()}

    # --- probe and monitor
    async def _probe(self, namespace: str, name: str, spec_dict: dict[str, Any], revision: str) -> dict[str, Any]:
        spec = parse_spec(spec_dict)
        base_url = self.config.endpoints.url(namespace, m.child_name(name, "base"))
        candidate_url = self.config.endpoints.url(namespace, m.child_name(name, "speculative"))
        rollout = spec.rollout
        key = (namespace, name)

        def on_round(partial: Any) -> None:
            speedups = ", ".join(f"{w.name} {w.speedup:.2f}x" for w in partial.workloads if getattr(w, "speedup", None))
            # Shown by the next periodic step (--reconcile-interval) rather than by a step of its own: a status patch
            # per round, for every probing resource at once, was a large share of the status writes at scale.
            self.progress[key] = f"round {partial.rounds} of up to {rollout.max_rounds}" + (f": {speedups}" if speedups else "")

        if self._probe_slots is None:
            self._probe_slots = asyncio.Semaphore(self.config.max_concurrent_probes)
        if self._probe_slots.locked():
            self.progress[key] = f"waiting for a probe slot ({self.config.max_concurrent_probes} probes running, the most at once)"
            self.wake(namespace, name)
        async with self._probe_slots:
            self.progress.pop(key, None)
            return await self._probe_now(namespace, name, spec, base_url, candidate_url, revision, on_round)

    async def _probe_now(self, namespace: str, name: str, spec: Any, base_url: str, candidate_url: str, revision: str, on_round: Any) -> dict[str, Any]:
        rollout = spec.rollout
        try:
            result = await run_probe(
                base_url,
                candidate_url,
                [dump(w) for w in rollout.workloads],
                min_speedup=rollout.min_speedup,
                max_rounds=rollout.max_rounds,
                accept_length_floor=rollout.accept_length_floor,
                policy=rollout.policy,
                timeout=self.config.probe_timeout,
                request_timeout=self.config.probe_request_timeout,
                on_round=on_round,
            )
            status = result.to_status()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # an unusable argument or a bug still ends in a reason, never a promotion
            status = {"decision": "rollback", "reason": "ProbeFailed", "message": f"probe failed: {exc}", "rounds": 0}
        status["revision"] = revision
        return {k: v for k, v in status.items() if v is not None}

    async def due_scrape(self, namespace: str, name: str) -> Sample | None:
        """Scrape the speculative server when the last step said a scrape is due (before taking a step slot:
        a slow server must not hold one)."""
        return await self.scrape(namespace, name) if self.monitor_due.get((namespace, name)) else None

    async def scrape(self, namespace: str, name: str) -> Sample:
        now = rfc3339(datetime.now(timezone.utc))
        url = self.config.endpoints.url(namespace, m.child_name(name, "speculative"))
        try:
            metrics = await scrape_metrics(await self.session(), url, timeout=self.config.scrape_timeout)
        except ProbeRequestError as exc:
            return Sample(time=now, error=str(exc))
        return sample_from_metrics(metrics, now)

    # --- one step
    async def step(self, body: Any, pods: list, deployments: list, services: list, logger: logging.Logger, scrape: Sample | None = None) -> Plan | None:
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        key = (namespace, name)
        uid = body["metadata"]["uid"]
        cached = self.statuses.get(key)
        if cached is None or cached[0] != uid:  # first step, or a new object under the same name
            cached = self.statuses[key] = (uid, {k: v for k, v in _plain(body.get("status") or {}).items() if k != "kopf"})
        status = cached[1]
        spec_dict = _plain(body.get("spec") or {})
        generation = int(body["metadata"].get("generation") or 1)
        memo = self.rendered.get(key)
        if memo is None or memo[0] != uid or memo[1] != generation:  # the spec changes only with the generation
            try:
                memo = self.rendered[key] = (uid, generation, parse_spec(spec_dict, source=f"{namespace}/{name}"), {})
            except InputError as exc:
                self.rendered.pop(key, None)
                await self._invalid_spec(body, uid, status, exc)
                return None
        spec, rendered = memo[2], memo[3]

        probe = self.probes.get(key)
        probe_running = probe_result = None
        if probe is not None:
            if probe.task.done():
                if not probe.task.cancelled():
                    try:
                        probe_result = probe.task.result()
                    except Exception as exc:  # _probe catches everything; belt and braces
                        probe_result = {"decision": "rollback", "reason": "ProbeFailed", "message": f"probe failed: {exc}", "rounds": 0, "revision": probe.revision}
                else:
                    self.probes.pop(key, None)
            else:
                probe_running = probe.revision

        previous = self.scrapes.get(key) if scrape is not None else None

        observed_deployments = {d["metadata"]["name"]: d for d in deployments}
        observed_services = {s["metadata"]["name"]: s for s in services}
        for child, obj in self.foreign_objects(key).items():
            target = observed_deployments if obj.get("kind") == "Deployment" else observed_services
            target.setdefault(child, obj)
        observed = Observed(
            name=name,
            namespace=namespace,
            uid=uid,
            generation=generation,
            deployments=observed_deployments,
            services=observed_services,
            pods=list(pods),
            probe_running=probe_running,
            probe_result=probe_result,
            probe_progress=self.progress.get(key) if probe_running else None,
            scrape=scrape,
            previous_scrape=previous,
        )
        try:
            plan = reconcile(spec, observed, status, datetime.now(timezone.utc), self.config.reconcile, rendered=rendered)
        except InputError as exc:  # e.g. an sglangVersion the command-line renderer does not know
            await self._invalid_spec(body, uid, status, exc)
            return None

        # One round trip where order does not matter: every child at once, and the status patch with them (it
        # describes what this step saw and did). Only when a step both re-points an existing Service and changes a
        # Deployment (switch, then scale the loser to 0) do the kinds go one after another, Services first.
        # Creating a Service with a virtual IP (the stable one) is the slowest write there is: the API server
        # allocates ClusterIPs a few per second under load (2-10 s each with 1,000 resources starting together,
        # docs/scale.md), and nothing in the lifecycle waits for that Service - the servers start, validate and
        # are measured without it. So it is created beside the step rather than in it; the next step sees it.
        applying = []
        for obj in plan.apply:
            if _creates_virtual_ip(obj, observed_services):
                if key not in self.creating:
                    self.creating[key] = asyncio.create_task(self._create_in_background(key, obj, body, uid, logger), name=f"create {namespace}/{obj['metadata']['name']}")
            else:
                applying.append(obj)
        new_status = {k: v for k, v in plan.status.items() if v is not None}
        patch = merge_patch(status, new_status)
        waves = _by_kind(applying) if plan.switch_first else [applying]
        for number, wave in enumerate(waves, 1):
            write_status = bool(patch) and number == len(waves)
            results = await asyncio.gather(
                *(asyncio.to_thread(self.apply_child, key, obj, body, uid, obj["metadata"]["name"] in (observed_deployments if obj["kind"] == "Deployment" else observed_services))
                  for obj in wave),
                *([asyncio.to_thread(self.patch_status, namespace, name, patch)] if write_status else []),
            )
            for obj, applied in zip(wave, results):
                if not applied:
                    logger.warning(f"{obj['kind']} {namespace}/{obj['metadata']['name']} exists and is not owned by this SpeculativeServer: left alone")
                    self.wake(namespace, name)
        if patch:
            self.statuses[key] = (uid, new_status)
        for event in plan.events:
            kopf.event(body, type=event.type, reason=event.reason, message=event.message[:1024])
            if event.reason in ROLLBACK_REASONS:
                self.metrics.rollbacks.labels(namespace, name, event.reason).inc()
            LOG.info(f"{namespace}/{name}: {event.reason}: {event.message}")

        if probe_result is not None:
            self.probes.pop(key, None)
            if probe_result.get("revision") == plan.revision:
                self.metrics.probes.labels(
                    namespace, name, probe_result.get("decision") or "none", probe_result.get("reason") or "none"
                ).inc()
        if plan.cancel_probe and probe is not None and not probe.task.done():
            probe.task.cancel()
            self.probes.pop(key, None)
        if plan.start_probe:
            task = asyncio.create_task(self._probe(namespace, name, spec_dict, plan.revision), name=f"probe {namespace}/{name}")
            task.add_done_callback(lambda _t: self.wake(namespace, name))
            self.probes[key] = ProbeTask(plan.revision, task)
        if scrape is not None:
            self.scrapes[key] = scrape
        self.monitor_due[key] = plan.monitor_due
        self.metrics.observe_status(namespace, name, new_status)
        return plan

    async def _create_in_background(self, key: tuple[str, str], obj: dict[str, Any], body: Any, uid: str, logger: logging.Logger) -> None:
        namespace, name = key
        if self._creation_slots is None:
            self._creation_slots = asyncio.Semaphore(CREATIONS_AT_ONCE)
        try:
            async with self._creation_slots:
                applied = await asyncio.to_thread(self.apply_child, key, obj, body, uid, False)
            if not applied:
                logger.warning(f"{obj['kind']} {namespace}/{obj['metadata']['name']} exists and is not owned by this SpeculativeServer: left alone")
        except ApiException as exc:
            self.metrics.reconcile_errors.labels("api").inc()
            await self.api_failure(body, exc, logger)
        except Exception as exc:  # the next step tries again
            self.metrics.reconcile_errors.labels(type(exc).__name__).inc()
            logger.warning(f"creating {obj['kind']} {namespace}/{obj['metadata']['name']} failed (will retry): {exc}")
        finally:
            self.creating.pop(key, None)
            self.wake(namespace, name)

    async def api_failure(self, body: Any, exc: ApiException, logger: logging.Logger) -> None:
        """Log a refused API call; put the ones retrying cannot fix into status (report_failure)."""
        detail = exc.body[:300] if isinstance(exc.body, str) else ""
        logger.warning(f"reconcile step failed (will retry): API {exc.status} {exc.reason} {detail}".rstrip())
        # Forget the cached status: the next step rereads the resource as the server has it.
        self.statuses.pop((body["metadata"]["namespace"], body["metadata"]["name"]), None)
        # Retrying will not fix these: tell the user where they look. Server-side apply answers 500 "failed to
        # create typed patch object" when a child does not fit its type (a free-form spec field such as
        # sglang.env holding a number where EnvVar wants a string).
        typed_patch = exc.status == 500 and "failed to create typed patch object" in (exc.body if isinstance(exc.body, str) else "")
        if exc.status in (400, 403, 422) or typed_patch:
            await self.report_failure(body, exc)

    async def _invalid_spec(self, body: Any, uid: str, status: dict[str, Any], exc: InputError) -> None:
        """A spec the API server admitted but the operator cannot serve: phase Failed with the one-line reason."""
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        new = {**status, "phase": "Failed", "reason": "InvalidSpec", "message": str(exc), "observedGeneration": body["metadata"].get("generation")}
        patch = merge_patch(status, new)
        if patch:
            await asyncio.to_thread(self.patch_status, namespace, name, patch)
            self.statuses[(namespace, name)] = (uid, new)
            kopf.event(body, type="Warning", reason="InvalidSpec", message=str(exc))

    async def report_failure(self, body: Any, exc: ApiException) -> None:
        """Put an API refusal that retrying cannot fix (forbidden, invalid object) into status and an Event, once."""
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        reason = "Forbidden" if exc.status == 403 else "ApplyRejected"
        detail = str(exc.reason)
        try:
            import json as _json

            detail = _json.loads(exc.body).get("message") or detail
        except Exception:
            pass
        message = f"the API server refused a request ({exc.status}): {detail}"[:1024]
        current = body.get("status") or {}
        if current.get("reason") == reason and current.get("message") == message:
            return
        try:
            await asyncio.to_thread(self.patch_status, namespace, name, {"phase": "Failed", "reason": reason, "message": message})
        except ApiException:
            return
        kopf.event(body, type="Warning", reason=reason, message=message)

    def forget(self, namespace: str, name: str) -> None:
        key = (namespace, name)
        probe = self.probes.pop(key, None)
        if probe is not None:
            probe.task.cancel()
        creating = self.creating.pop(key, None)
        if creating is not None:
            creating.cancel()
        for table in (self.wakeups, self.statuses, self.scrapes, self.monitor_due, self.foreign, self.progress, self.rendered):
            table.pop(key, None)
        self.metrics.forget(namespace, name)


def _child_path(kind: str) -> str:
    return "/apis/apps/v1/namespaces/{namespace}/deployments/{name}" if kind == "Deployment" else "/api/v1/namespaces/{namespace}/services/{name}"


def _creates_virtual_ip(obj: dict[str, Any], observed_services: dict[str, Any]) -> bool:
    """Whether applying ``obj`` creates a Service with a ClusterIP (not headless, not there yet)."""
    return obj["kind"] == "Service" and obj["metadata"]["name"] not in observed_services and (obj.get("spec") or {}).get("clusterIP") != "None"


def _by_kind(objects: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Consecutive runs of the same kind, in order: [[svc, svc, svc], [deploy, deploy]]."""
    groups: list[list[dict[str, Any]]] = []
    for obj in objects:
        if groups and groups[-1][0]["kind"] == obj["kind"]:
            groups[-1].append(obj)
        else:
            groups.append([obj])
    return groups


async def _sleep(wake: asyncio.Event, stopped: Any, timeout: float) -> None:
    """Wait until woken, stopped, or `timeout` seconds."""
    waiters = [asyncio.ensure_future(wake.wait()), asyncio.ensure_future(stopped.wait())]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


class LeanDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    """Kopf's default essence storage (same essence, same annotation) without copying what it throws away.

    Kopf builds the essence of every watched object on every event (for change detection) by deep-copying the
    whole object, status included, and then deleting metadata and status. With 8,000 watched pods, Deployments
    and Services that copy was about 5 % of the operator's CPU at 1,000 resources (docs/scale.md); here only
    what the essence keeps is handed over.
    """

    def build(self, *, body: Any, extra_fields: Any = None) -> Any:
        fields = list(extra_fields or [])
        if fields:  # handlers that watch status fields need the whole object
            return super().build(body=body, extra_fields=fields)
        meta = body.get("metadata") or {}
        lean = {k: v for k, v in body.items() if k not in ("metadata", "status")}
        lean["metadata"] = {k: meta[k] for k in ("labels", "annotations", "ownerReferences") if k in meta}
        return super().build(body=kopf.Body(lean))


class LeanProgressStorage(kopf.SmartProgressStorage):
    """Kopf's default progress storage, whose clear() does not copy an essence that holds no progress records.

    Before diffing, Kopf strips its progress records (``status.kopf.progress``, ``kopf.zalando.org/*``
    annotations) from the old and new essence of every event of every watched object, and each of the two
    storages deep-copies the essence to do it: with LeanDiffBaseStorage's copy, three deep copies per event, about a
    tenth of the operator's busy CPU while 1,000 resources settle (py-spy, docs/scale.md). The essences handed in are
    fresh objects that nobody else holds; when there is nothing to strip and no empty stanza to drop, the result
    would equal the input, so the input is returned as it is.
    """

    def __init__(self) -> None:
        super().__init__()
        # The annotation prefixes its storages write under (kopf.zalando.org/), looked up once, not per event.
        self.prefixes = tuple(f"{storage.prefix}/" for storage in self.storages if getattr(storage, "prefix", None))

    def clear(self, *, essence: Any) -> Any:
        metadata = essence.get("metadata")
        annotations = (metadata or {}).get("annotations")
        if ("status" in essence or metadata == {} or annotations == {} or (metadata or {}).get("labels") == {}
                or any(key.startswith(self.prefixes) for key in annotations or ())):
            return super().clear(essence=essence)
        return essence


# ---------------------------------------------------------------------------------------------------------
# Registration


def configure(settings: kopf.OperatorSettings) -> None:
    """Kopf settings the operator needs: server-side label filters on the children's watches, Event names."""
    selector = f"{m.LABEL_MANAGED_BY}={m.MANAGED_BY}"
    for resource in ("pods", "deployments", "services"):
        settings.watching.label_selectors[resource] = selector
    settings.posting.reporting_component = FIELD_MANAGER
    # Kopf's own log lines are not Events; the operator posts its Events explicitly.
    settings.posting.level = logging.WARNING
    settings.persistence.finalizer = f"{API_GROUP}/finalizer"
    settings.persistence.diffbase_storage = LeanDiffBaseStorage()
    settings.persistence.progress_storage = LeanProgressStorage()


def register(registry: kopf.OperatorRegistry, runtime: Runtime) -> None:
    """Register the handlers of one operator instance."""
    instance = m.LABEL_INSTANCE

    @kopf.index("pods", id="specdec_pods", labels=MANAGED, registry=registry)
    def specdec_pods(namespace: str, labels: dict, body: Any, **_: Any) -> dict | None:
        return {(namespace, labels[instance]): slim_pod(body)} if labels.get(instance) else None

    @kopf.index("apps", "v1", "deployments", id="specdec_deployments", labels=MANAGED, registry=registry)
    def specdec_deployments(namespace: str, labels: dict, body: Any, **_: Any) -> dict | None:
        return {(namespace, labels[instance]): slim_deployment(body)} if labels.get(instance) else None

    @kopf.index("v1", "services", id="specdec_services", labels=MANAGED, registry=registry)
    def specdec_services(namespace: str, labels: dict, body: Any, **_: Any) -> dict | None:
        return {(namespace, labels[instance]): slim_service(body)} if labels.get(instance) else None

    @kopf.on.event("pods", id="pod_changed", labels=MANAGED, registry=registry)
    @kopf.on.event("apps", "v1", "deployments", id="deployment_changed", labels=MANAGED, registry=registry)
    @kopf.on.event("v1", "services", id="service_changed", labels=MANAGED, registry=registry)
    def child_changed(namespace: str, labels: dict, **_: Any) -> None:
        runtime.wake(namespace, labels.get(instance))

    @kopf.on.event(API_GROUP, API_VERSION, PLURAL, id="resource_changed", registry=registry)
    def resource_changed(namespace: str, name: str, **_: Any) -> None:
        runtime.wake(namespace, name)

    # On deletion or shutdown the loop is asked to stop (it exits within a step) and cancelled only after 5 s.
    @kopf.daemon(API_GROUP, API_VERSION, PLURAL, id="reconcile", cancellation_backoff=5.0, cancellation_timeout=10.0, registry=registry)
    async def serve(body: Any, namespace: str, name: str, stopped: Any, logger: logging.Logger, specdec_pods: Any, specdec_deployments: Any, specdec_services: Any, **_: Any) -> None:
        key = (namespace, name)
        wake = runtime.wakeups.setdefault(key, asyncio.Event())
        failures = 0
        last_step = -math.inf
        try:
            while not stopped:
                pause = last_step + runtime.config.min_step_interval - time.monotonic()
                if pause > 0:  # events closer together than that are merged into this one step
                    await _sleep(asyncio.Event(), stopped, pause)
                    if stopped:
                        break
                queued = time.monotonic()
                plan = None
                try:
                    scrape = await runtime.due_scrape(namespace, name)
                    async with runtime.step_slot():
                        wake.clear()  # after the wait: what happened while queued is seen by this step
                        started = time.monotonic()
                        runtime.metrics.reconcile_queue_seconds.observe(started - queued)
                        try:
                            plan = await runtime.step(body, list(specdec_pods.get(key, [])), list(specdec_deployments.get(key, [])),
                                                      list(specdec_services.get(key, [])), logger, scrape)
                        finally:
                            last_step = time.monotonic()
                            runtime.metrics.reconcile_seconds.observe(last_step - started)
                    failures = 0
                except ApiException as exc:
                    failures += 1
                    runtime.metrics.reconcile_errors.labels("api").inc()
                    await runtime.api_failure(body, exc, logger)
                except Exception as exc:  # never let one bad step kill the loop; it is retried with backoff
                    failures += 1
                    runtime.metrics.reconcile_errors.labels(type(exc).__name__).inc()
                    logger.exception(f"reconcile step failed (will retry): {exc}")
                    runtime.statuses.pop(key, None)
                if failures:
                    delay = min(60.0, 0.5 * 2**failures)
                elif plan is not None and plan.settled:
                    delay = runtime.config.resync_interval
                else:
                    delay = runtime.config.reconcile_interval
                if plan is not None and plan.next_scrape_in is not None:
                    delay = min(delay, max(0.2, plan.next_scrape_in))
                await _sleep(wake, stopped, delay)
        finally:
            if stopped.reason is not None and kopf.DaemonStoppingReason.RESOURCE_DELETED in stopped.reason:
                runtime.forget(namespace, name)
            else:
                probe = runtime.probes.pop(key, None)
                if probe is not None:
                    probe.task.cancel()

    @kopf.on.login(id="login", registry=registry)
    def login(**kwargs: Any) -> Any:
        # A registry of our own has none of Kopf's default handlers: log in as the kubernetes client does
        # (service account in the cluster, else KUBECONFIG).
        return kopf.login_via_client(**kwargs)

    @kopf.on.cleanup(id="shutdown", registry=registry)
    async def shutdown(**_: Any) -> None:
        await runtime.close()
