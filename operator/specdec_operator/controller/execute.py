"""execute(plan): what one step's plan asks of the cluster and of the probe scheduler, through the one writer.

Children and the status patch are written together (Services first when a step re-points one and changes a
server; after a refusal retrying cannot fix, the children first and the status once they are accepted), the stable
Service beside the step, then the Events; the probe is started or stopped last. A refused
plan (reconcile/refused.py) writes its status and Events only. Objects with the children's names that this
resource does not own are never modified: they are remembered as foreign (the next step reports NameConflict).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from .. import manifests as m
from ..api import SpeculativeServerSpec
from ..monitor import remember
from ..reconcile import ApiRefusal, Observed, Plan, StartProbe, merge_patch, read_status, reconcile
from ..reconcile.refused import api_refusal_reason
from ..resource import dump
from .config import OperatorConfig
from .kopf_tuning import plain
from .kubewriter import KubernetesWriter
from .metrics import OperatorMetrics
from .probescheduler import ProbeScheduler
from .state import Key, Logger, ResourceState

LOG = logging.getLogger("specdec.operator")
# Stable Services created at once beside the steps. Not a limit of the API server (an idle local one creates
# ~230 ClusterIP Services a second with 4 or 32 clients alike); under load each creation takes seconds, and 4 at
# once left 500 of 1,000 stable Services uncreated when everything else had settled (docs/scale.md, run 17).
CREATIONS_AT_ONCE = 16


class Executor:
    """Carries out plans: the writer's applies, status patches and Events, and the probe scheduler's starts."""

    def __init__(
        self, config: OperatorConfig, metrics: OperatorMetrics, writer: KubernetesWriter, probes: ProbeScheduler, wake: Callable[[str, str], None]
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.writer = writer
        self.probes = probes
        self.wake = wake
        # At most one creation of a stable Service per resource, and at most CREATIONS_AT_ONCE in all, so that
        # they never hold all the API worker threads that the steps need.
        self._creation_slots: asyncio.Semaphore | None = None

    def _evidence_writer(self, body: Any, uid: str | None) -> Callable[[str, str, dict, bool], Awaitable[None]] | None:
        """How the probe scheduler keeps a probe's evidence: ConfigMap <name>-probe-evidence, owned by the resource (its
        first write of a run checks the name is free or ours, as for every child the index does not hold)."""
        if uid is None:
            return None

        async def write(namespace: str, name: str, doc: dict, first: bool) -> None:
            obj = m.probe_evidence_config_map(name, namespace, json.dumps(doc, separators=(",", ":")))
            taken_by = await self.writer.apply(obj, body, uid, known=not first)
            if taken_by is not None:
                raise RuntimeError(f"ConfigMap {namespace}/{obj['metadata']['name']} belongs to someone else; the evidence is not kept")

        return write

    async def execute(
        self, key: Key, state: ResourceState, body: Any, spec: SpeculativeServerSpec, plan: Plan, observed: Observed, logger: Logger
    ) -> None:
        """Carry out a plan: apply children and the status patch, post its Events, start or stop its probe."""
        namespace, name = key
        # Creating a Service with a virtual IP (the stable one) is the slowest write there is: the API server
        # allocates ClusterIPs a few per second under load (2-10 s each with 1,000 resources starting together,
        # docs/scale.md), and nothing in the lifecycle waits for that Service. So it is created beside the step.
        # After a refusal retrying cannot fix (state.refused), the children go first and the status only once they
        # were all accepted: written with them, a step would say Probing between two refusals (a flapping phase).
        refused_before = state.refused
        applying = []
        for obj in plan.apply:
            if creates_virtual_ip(obj, observed.services) and not refused_before:
                if state.creating is None:
                    state.creating = asyncio.create_task(
                        self._create_beside(key, state, obj, body, logger), name=f"create {namespace}/{obj['metadata']['name']}"
                    )
            else:
                applying.append(obj)
        written = dump(plan.new_status)
        patch = merge_patch(state.written, written)
        # One round trip where order does not matter: every child at once, and the status patch with them (it
        # describes what this step saw and did). Only when a step both re-points an existing Service and changes a
        # Deployment (switch, then scale the loser to 0) do the kinds go one after another, Services first.
        waves = by_kind(applying) if plan.switch_first or refused_before else [applying]
        if refused_before:
            waves.append([])  # the status patch alone, after every child was accepted
        for number, wave in enumerate(waves, 1):
            write_status = bool(patch) and number == len(waves)
            results = await asyncio.gather(
                *(self.writer.apply(obj, body, state.uid, known=_known(obj, observed)) for obj in wave),
                *([self.writer.patch_status(namespace, name, patch)] if write_status and patch else []),
            )
            for obj, taken_by in zip(wave, results):
                if taken_by is not None:
                    self._found_foreign(key, state, obj, taken_by, logger)
        state.refused = False
        # The old kind's servers after a resources.nodes change (retire.py): after the applies, so the Services
        # already select the new kind when the old servers go.
        for obj in plan.delete:
            await self.writer.delete(obj)
        state.written, state.status = written, plan.new_status
        for event in plan.events:
            await self.writer.post_event(body, event)
            if event.rollback:
                self.metrics.rollbacks.labels(namespace, name, event.reason).inc()
            LOG.info(f"{namespace}/{name}: {event.reason}: {event.message}")

        result = observed.probe_result
        if result is not None:  # recorded by this step's status
            self.probes.settle(key)
            # The evidence the probe kept for a restart (ConfigMap <name>-probe-evidence) is spent once its result is in
            # status: left there, a retry of the same revision (same probe id and generation) would resume the old
            # rounds and decide again on them instead of measuring, and 1,000 resources would keep 1,000 of them.
            # Housekeeping, never a reason to fail the step: under an RBAC without delete on ConfigMaps (a chart older
            # than the operator) the ConfigMap stays, keyed by its revision, and a retry of the revision resumes it.
            try:
                await self.writer.delete(m.probe_evidence_config_map(name, namespace, ""))
            except ApiException as exc:
                self.metrics.reconcile_errors.labels("api").inc()
                logger.warning(f"deleting the spent probe evidence {namespace}/{name}-probe-evidence failed: API {exc.status} {exc.reason}")
            if result.revision == plan.revision or result.revision in plan.measured:  # a race's candidates count too
                self.metrics.probes.labels(namespace, name, result.decision or "none", result.reason or "none").inc()
                if result.gpu_seconds is not None:  # this probe's own (a load-aware decision's plain probe was counted when it ended)
                    self.metrics.probe_gpu_seconds.labels(namespace, name).inc(result.gpu_seconds)
        if plan.probe is not None:  # a new probe replaces the running one
            self.probes.cancel(key)
        if isinstance(plan.probe, StartProbe):
            self.probes.start(
                key,
                plan.probe.spec or spec,  # a race's candidate is measured under its own spec
                plan.probe.revision,
                on_done=lambda: self.wake(namespace, name),
                probe_id=plan.probe.probe_id,
                load_aware_probe=plan.probe.load_aware_probe,
                race=(plan.probe.family, plan.probe.bar, plan.probe.candidate),
                owner_uid=state.uid,
                generation=int((body.get("metadata") or {}).get("generation") or 1),
                write_evidence=self._evidence_writer(body, state.uid),
            )
        if observed.scrape is not None:
            state.last_scrape = remember(state.last_scrape, observed.scrape)
        state.monitor_due = plan.monitor_due
        self.metrics.observe_status(namespace, name, written)

    def _found_foreign(self, key: Key, state: ResourceState, obj: dict[str, Any], taken_by: dict[str, Any], logger: Logger) -> None:
        state.foreign[obj["metadata"]["name"]] = (time.monotonic(), taken_by)
        logger.warning(f"{obj['kind']} {key[0]}/{obj['metadata']['name']} exists and is not owned by this SpeculativeServer: left alone")
        self.wake(*key)

    async def _create_beside(self, key: Key, state: ResourceState, obj: dict[str, Any], body: Any, logger: Logger) -> None:
        if self._creation_slots is None:
            self._creation_slots = asyncio.Semaphore(CREATIONS_AT_ONCE)
        try:
            async with self._creation_slots:
                taken_by = await self.writer.apply(obj, body, state.uid, known=False)
            if taken_by is not None:
                self._found_foreign(key, state, obj, taken_by, logger)
        except ApiException as exc:
            self.metrics.reconcile_errors.labels("api").inc()
            await self.api_failure(body, exc, logger, state)
        except Exception as exc:  # the next step tries again
            self.metrics.reconcile_errors.labels(type(exc).__name__).inc()
            logger.warning(f"creating {obj['kind']} {key[0]}/{obj['metadata']['name']} failed (will retry): {exc}")
        finally:
            state.creating = None
            self.wake(*key)

    # --- failures that end in status (reconcile decides which, and builds the status: reconcile/refused.py)
    async def api_failure(self, body: Any, exc: ApiException, logger: Logger, state: ResourceState | None) -> None:
        """Log a refused API call; hand it to reconcile, which puts the ones retrying cannot fix into status."""
        detail = exc.body[:300] if isinstance(exc.body, str) else ""
        logger.warning(f"reconcile step failed (will retry): API {exc.status} {exc.reason} {detail}".rstrip())
        meta = body["metadata"]
        refusal = ApiRefusal(status=int(exc.status or 0), message=_api_message(exc), body=exc.body if isinstance(exc.body, str) else "")
        if state is not None:  # the next step rereads the resource as the server has it
            state.forget_status()
            state.refused = api_refusal_reason(refusal) is not None
        observed = Observed(
            name=meta["name"],
            namespace=meta["namespace"],
            uid=meta.get("uid") or "",
            generation=int(meta.get("generation") or 1),
            api_refusal=refusal,
        )
        stored = stored_status(body)
        plan = reconcile(None, observed, stored, datetime.now(UTC), self.config.reconcile)
        try:  # reported from outside a step: the patch is against the stored status as typed
            await self.write_refused(body, None, plan, dump(read_status(stored)))
        except ApiException:
            return

    async def write_refused(self, body: Any, state: ResourceState | None, plan: Plan, written: dict[str, Any]) -> None:
        """Write a refused plan (reconcile/refused.py): its status patch against ``written``, then its Events."""
        new_written = dump(plan.new_status)
        patch = merge_patch(written, new_written)
        if not patch:
            return
        await self.writer.patch_status(body["metadata"]["namespace"], body["metadata"]["name"], patch)
        if state is not None:
            state.written, state.status = new_written, plan.new_status
        for event in plan.events:
            await self.writer.post_event(body, event)


def stored_status(body: Any) -> dict[str, Any]:
    """The resource's status as the API server stores it, without Kopf's own bookkeeping."""
    return {k: v for k, v in plain(body.get("status") or {}).items() if k != "kopf"}


def _api_message(exc: ApiException) -> str:
    """The message of the API server's Status answer, or the HTTP reason."""
    try:
        return json.loads(exc.body or "").get("message") or str(exc.reason)
    except (ValueError, AttributeError):
        return str(exc.reason)


def _known(obj: dict[str, Any], observed: Observed) -> bool:
    """Whether a child is in the operator's (label-filtered) index, i.e. known to be ours."""
    index = {"Deployment": observed.deployments, m.LWS_KIND: observed.deployments, "ConfigMap": observed.config_maps}.get(
        obj["kind"], observed.services
    )
    return obj["metadata"]["name"] in index


def creates_virtual_ip(obj: dict[str, Any], observed_services: dict[str, Any]) -> bool:
    """Whether applying ``obj`` creates a Service with a ClusterIP (not headless, not there yet)."""
    return obj["kind"] == "Service" and obj["metadata"]["name"] not in observed_services and (obj.get("spec") or {}).get("clusterIP") != "None"


def by_kind(objects: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Consecutive runs of the same kind, in order: [[svc, svc, svc], [deploy, deploy]]."""
    groups: list[list[dict[str, Any]]] = []
    for obj in objects:
        if groups and groups[-1][0]["kind"] == obj["kind"]:
            groups[-1].append(obj)
        else:
            groups.append([obj])
    return groups
