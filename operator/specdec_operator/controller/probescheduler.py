"""The probe scheduler: the only code of the operator that talks to the servers (SGLang or vLLM, through engines/).

It runs each resource's probe as an asyncio task beside the reconcile loop (at most ``max_concurrent_probes``
measuring at once, since the client must not set the pace of what it measures), keeps the finished result until
a step has recorded it, and scrapes every Ready speculative pod's /metrics for the drift monitor (concurrently, bounded). Every URL is
derived from the resource's own name and namespace and the operator's endpoints configuration; nothing in a spec
names a host.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import aiohttp

from .. import manifests as m
from ..api import LoadAwareStatus, ProbeStatus, SpeculativeServerSpec, Variant, Workload
from ..choices import DRAFTER_FREE_ALGORITHMS
from ..engines import Engine, engine_for
from ..errors import InputError
from ..monitor import Sample, sample_from_metrics
from ..probe import ProbeRequestError, scrape_metrics
from ..probe.datasets import Prompt, parse_dataset
from ..probe.decide import normalize_policy
from ..probe.evidence import Continue, Decide, Decided, Evidence, RaceRules, from_compact
from ..probe.priors import priors_after, with_round_priors
from ..probe.run import run_probe
from ..probe.scripted import load_script, scripted_for
from ..probe.stats import RoundPrior
from ..probecost import probed_gpus, unit_seconds
from ..reconcile.attempts import dataset_invalid, dataset_unreadable, next_attempt_in, probe_failed_status, with_run_notes
from ..reconcile.race import decide
from ..textutil import clip, rfc3339
from .config import OperatorConfig

LOG = logging.getLogger("specdec.operator")
Key = tuple[str, str]  # (namespace, name)
ReadConfigMap = Callable[[str, str], Awaitable["dict | None"]]  # (namespace, name) -> the ConfigMap or None
# (namespace, name, owner uid, workload, spec) -> the prompts of a File source (datasetreader.FileDatasetReader.read)
ReadFileDataset = Callable[[str, str, str, Workload, SpeculativeServerSpec], Awaitable[list[Prompt]]]
# (namespace, name) -> the probe evidence ConfigMap's document (manifests.probe_evidence_config_map) or None
ReadEvidence = Callable[[str, str], Awaitable["dict | None"]]
# (namespace, name, document, first write of this run) -> None: keep the evidence (owner: the resource)
WriteEvidence = Callable[[str, str, dict, bool], Awaitable[None]]


@dataclass
class _Probe:
    key: Key
    revision: str
    probe_id: str  # the revision, or "<revision>/adaptive-<hash>" for the load-aware server (Facts.probe_id)
    load_aware_probe: LoadAwareStatus | None = None  # set for the load-aware probe (the adaptive server); its result carries it
    owner_uid: str | None = None  # the resource's uid: the owner reference of a File source's reader pod
    generation: int | None = None  # the resource's metadata.generation when the probe started (the evidence's key)
    write_evidence: WriteEvidence | None = None  # keeps the evidence after every round (None: not kept)
    # A race's candidate (StartProbe.family, .bar, .candidate): the arms the race's error budget is shared with, the low
    # end to beat, and the candidate's name (a probe script's entry under `arms` named after it scripts its rounds).
    race: tuple[int, float | None, str | None] = (1, None, None)
    task: asyncio.Task[ProbeStatus] | None = None
    progress: str | None = None  # what it has done so far: "round 2 of up to 6: chat 1.90x"


def config_map_dataset(namespace: str, config_map: dict | None, name: str, key: str, fmt: str) -> list[Prompt]:
    """The prompts in a ConfigMap key (pure: the operator has read the object); InputError names the source and line."""
    source = f"dataset configmap/{name} key {key}"
    if config_map is None:
        raise InputError(f"{source}: ConfigMap {namespace}/{name} not found; create it (kubectl create configmap {name} --from-file={key}=FILE)")
    data = config_map.get("data") or {}
    if key not in data:
        if key in (config_map.get("binaryData") or {}):
            raise InputError(f"{source}: the key is in binaryData; store the dataset as UTF-8 text (data)")
        keys = ", ".join(sorted(data)) or "none"
        raise InputError(f"{source}: ConfigMap {namespace}/{name} has no key {key!r} (keys: {keys}); name an existing key")
    return parse_dataset(data[key], source=source, fmt=fmt)


def race_decide(family: int, bar: float | None) -> Decide:
    """reconcile/race.decide with a race's share of the error budget and its bar (one candidate of several)."""
    if family <= 1 and bar is None:
        return decide

    def decide_in_race(evidence: Evidence, rules: RaceRules, arms: Sequence[str], workloads: Sequence[str]) -> Continue | Decided:
        return decide(evidence, dataclasses.replace(rules, family=max(family, rules.family), bar=bar), arms, workloads)

    return decide_in_race


def _round_line(partial: object, candidate: str | None) -> str:
    """One probe round for the log: per workload, the interval so far and every round's ratio (speculative / base)."""
    parts = []
    for w in getattr(partial, "workloads", []):
        if not w.ratios:
            continue
        # One round bounds nothing, and the first few bound little: an end past 1000x is shown as unbounded.
        low = f"{w.speedup_low:.3f}" if w.speedup_low is not None else "-"
        high = f"{w.speedup_high:.3f}" if w.speedup_high is not None and w.speedup_high < 1000 else "inf"
        estimate = f"{w.speedup:.3f}x [{low}, {high}]" if w.speedup else "no interval yet"
        parts.append(f"{w.name} {estimate}, rounds {' '.join(f'{r:.3f}' for r in w.ratios)}")
    who = f"candidate {candidate}" if candidate else "probe"
    return f"{who} round {getattr(partial, 'rounds', 0)}: " + ("; ".join(parts) or "nothing measured yet")


def accept_length_floor(spec: SpeculativeServerSpec, adaptive: bool) -> float | None:
    """rollout.acceptLengthFloor, where it means what it is for (a drafter that accepts nothing: the seed's bf16-trained
    drafter on an INT4 target). Not for an adaptive server (it does not draft from its no-draft batch size up), nor for a
    method without a drafter (NGRAM, SUFFIX: they draft only where the context has a match, so on free chat their
    acceptance is 1.00 by design, and the speed alone says whether they pay)."""
    if adaptive or spec.drafter.algorithm in DRAFTER_FREE_ALGORITHMS:
        return None
    return spec.rollout.accept_length_floor


def fresh_evidence(probe: _Probe) -> Evidence:
    return Evidence(probe.probe_id, probe.generation or 0)


async def resume_evidence(probe: _Probe, read: ReadEvidence | None) -> tuple[Evidence, int]:
    """The evidence an earlier run of this very probe kept (same probe id, i.e. revision and adaptive table, and the
    same generation: evidence.from_compact), and the rounds it holds; otherwise fresh evidence and 0. Reading it never
    fails the probe: an unreadable or stale document means starting afresh."""
    fresh = fresh_evidence(probe)
    if read is None or probe.generation is None:
        return fresh, 0
    try:
        doc = await read(*probe.key)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        LOG.warning(
            f"{probe.key[0]}/{probe.key[1]}: reading the probe's evidence failed ({type(exc).__name__}: {clip(str(exc), 200)}); probing afresh"
        )
        return fresh, 0
    found = from_compact(doc, probe.probe_id, probe.generation)
    if found is None:
        return fresh, 0
    return found, found.rounds(Variant.SPECULATIVE.value)


class ProbeScheduler:
    def __init__(self, config: OperatorConfig) -> None:
        self.config = config
        self._probes: dict[Key, _Probe] = {}
        self._slots: asyncio.Semaphore | None = None  # created in the event loop, on the first probe
        self._session: aiohttp.ClientSession | None = None
        self.read_config_map: ReadConfigMap | None = None  # set by the runtime: the writer's API client
        self.read_file_dataset: ReadFileDataset | None = None  # set by the runtime: a reader pod per File source
        self._scrape_slots: asyncio.Semaphore | None = None  # created in the event loop, on the first scrape
        self.read_evidence: ReadEvidence | None = None  # set by the runtime: the evidence ConfigMap of an earlier run
        # (namespace, name, uid, load-aware) -> workload -> the between-round variance the resource's earlier probes
        # measured (probe/priors.py): the next probe's decision pools it with its own rounds. In memory only: a restarted
        # operator starts without (each probe on its own rounds, as before); a race's candidates take none.
        self.round_priors: dict[tuple[str, str, str | None, bool], dict[str, RoundPrior]] = {}

    def url(self, key: Key, variant: Variant) -> str:
        namespace, name = key
        return self.config.endpoints.url(namespace, m.child_name(name, variant.value))

    # --- probes
    def _running(self, key: Key) -> _Probe | None:
        probe = self._probes.get(key)
        return probe if probe is not None and probe.task is not None and not probe.task.done() else None

    def running(self, key: Key) -> str | None:
        """What is being probed for this resource (its probe id), if a probe is still running."""
        probe = self._running(key)
        return probe.probe_id if probe is not None else None

    def finished(self, key: Key) -> ProbeStatus | None:
        """The result of this resource's finished probe, kept until ``settle`` (a step recorded it)."""
        probe = self._probes.get(key)
        if probe is None or probe.task is None or not probe.task.done():
            return None
        if probe.task.cancelled():
            self._probes.pop(key, None)
            return None
        exc = probe.task.exception()
        if exc is not None:  # run() catches everything; belt and braces
            result = probe_failed_status(probe.revision, f"probe failed: {exc}")
        else:
            result = probe.task.result()
        # The adaptive server's result says so: reconcile judges it by the never-slower rule, not as a plain probe.
        return result.model_copy(update={"load_aware": probe.load_aware_probe}) if probe.load_aware_probe is not None else result

    def settle(self, key: Key) -> None:
        """Forget a finished probe whose result a step has recorded."""
        if self.finished(key) is not None:
            self._probes.pop(key, None)

    def progress(self, key: Key) -> str | None:
        probe = self._running(key)
        return probe.progress if probe is not None else None

    def start(
        self,
        key: Key,
        spec: SpeculativeServerSpec,
        revision: str,
        on_done: Callable[[], None],
        *,
        probe_id: str | None = None,
        load_aware_probe: LoadAwareStatus | None = None,
        race: tuple[int, float | None, str | None] = (1, None, None),
        owner_uid: str | None = None,
        generation: int | None = None,
        write_evidence: WriteEvidence | None = None,
    ) -> None:
        """Probe ``revision`` of this resource; ``on_done`` is called when it finishes (and when it waits for a slot).

        ``owner_uid``: the resource's uid, which a File source's reader pod is owned by.

        ``load_aware_probe``: the speculative server runs the load-aware probe's adaptive table. An adaptive server does not
        draft from its no-draft batch size up, so the acceptance-length floor does not apply to it."""
        probe = self._probes[key] = _Probe(key, revision, probe_id or revision, load_aware_probe, owner_uid, generation, write_evidence, race=race)
        probe.task = asyncio.create_task(self._run(probe, spec, on_done), name=f"probe {key[0]}/{key[1]}")
        probe.task.add_done_callback(lambda _t: on_done())

    def cancel(self, key: Key) -> None:
        probe = self._probes.pop(key, None)
        if probe is not None and probe.task is not None and not probe.task.done():
            probe.task.cancel()

    def forget(self, key: Key) -> None:
        """A deleted resource: its probe stops and what its probes taught (its round priors) goes with it."""
        self.cancel(key)
        for prior_key in [k for k in self.round_priors if k[:2] == key]:
            del self.round_priors[prior_key]

    async def _run(self, probe: _Probe, spec: SpeculativeServerSpec, wake: Callable[[], None]) -> ProbeStatus:
        rollout, key, revision = spec.rollout, probe.key, probe.revision

        def on_round(partial: object) -> None:
            speedups = ", ".join(f"{w.name} {w.speedup:.2f}x" for w in getattr(partial, "workloads", []) if w.speedup)
            # Shown by the next periodic step (--reconcile-interval) rather than by a step of its own: a status patch
            # per round, for every probing resource at once, was a large share of the status writes at scale.
            probe.progress = f"round {getattr(partial, 'rounds', 0)} of up to {rollout.max_rounds}" + (f": {speedups}" if speedups else "")
            # Every round's own ratio beside the interval so far: what an Inconclusive race was made of (a noisy round,
            # an order effect, a drift) can be read from the log afterwards, where status keeps only the last figures.
            LOG.info(f"{key[0]}/{key[1]}: {_round_line(partial, probe.race[2])}")

        if self._slots is None:
            self._slots = asyncio.Semaphore(self.config.max_concurrent_probes)
        if self._slots.locked():
            probe.progress = f"waiting for a probe slot ({self.config.max_concurrent_probes} probes running, the most at once)"
            wake()
        async with self._slots:
            probe.progress = None
            try:
                datasets = await self._datasets(key, spec, probe.owner_uid)
            except InputError as exc:
                return dataset_invalid(revision, str(exc))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the API refused the read (RBAC, unreachable): no probe, no promotion
                return dataset_unreadable(revision, exc)
            try:
                script = scripted_for(load_script(self.config.probe_script), *key) if self.config.probe_script else None
                candidate = probe.race[2]
                if script is not None and candidate is not None:  # a race's candidate: its own entry under `arms`
                    script = dataclasses.replace(script.for_arm(candidate), arms={})
            except InputError as exc:
                return probe_failed_status(revision, str(exc))
            failures: list[str] = []
            spent = 0.0  # seconds measuring, over every attempt: the GPU-seconds' time
            evidence, resumed = await resume_evidence(probe, self.read_evidence)
            spent += evidence.seconds  # what the runs before a restart measured (a resumed probe's cost is all of it)
            first_write = True

            async def keep(found: Evidence) -> None:
                # After every round: a restarted operator (or a new leader) resumes from here (_resume). A write that
                # fails costs only the resumption, never the probe.
                nonlocal first_write
                if probe.write_evidence is None:
                    return
                try:
                    await probe.write_evidence(key[0], key[1], found.to_compact(), first_write)
                    first_write = False
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    LOG.warning(f"{key[0]}/{key[1]}: keeping the probe's evidence failed ({type(exc).__name__}: {clip(str(exc), 200)})")

            prior_key = (key[0], key[1], probe.owner_uid, probe.load_aware_probe is not None) if probe.race == (1, None, None) else None
            priors = self.round_priors.get(prior_key, {}) if prior_key is not None else {}
            for attempt in range(self.config.probe_attempts):
                if attempt:  # a half-measured attempt is not mixed with the next: its evidence is dropped
                    evidence, resumed = fresh_evidence(probe), 0
                try:
                    result = await run_probe(
                        self.url(key, Variant.BASE),
                        self.url(key, Variant.SPECULATIVE),
                        rollout.workloads,
                        min_speedup=rollout.min_speedup,
                        max_rounds=rollout.max_rounds,
                        accept_length_floor=accept_length_floor(spec, probe.load_aware_probe is not None),
                        policy=rollout.policy,
                        timeout=self.config.probe_timeout,
                        request_timeout=self.config.probe_request_timeout,
                        on_round=on_round,
                        datasets=datasets,
                        output_check=rollout.output_check,
                        engine=engine_for(spec),
                        decide=with_round_priors(race_decide(*probe.race[:2]), priors),
                        evidence=evidence,
                        on_evidence=keep,
                        script=script,
                    )
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # an unusable argument or a bug still ends in a reason, never a promotion
                    return probe_failed_status(revision, f"probe failed: {exc}")
                spent += result.wall_seconds or 0.0
                delay = next_attempt_in(result.transient, attempt, self.config.probe_attempts, self.config.probe_retry_backoff)
                if delay is None:
                    break
                # Measured again from the start after a backoff (a half-measured attempt is not mixed with the next).
                failures.append(result.message)
                probe.progress = f"attempt {attempt + 1} of {self.config.probe_attempts} failed ({clip(result.message, 160)}); again in {delay:g}s"
                wake()
                await asyncio.sleep(delay)
            if prior_key is not None and evidence.facts.failure is None:
                weights = {w.name: w.weight for w in rollout.workloads} if normalize_policy(rollout.policy) == "weighted" else None
                self.round_priors[prior_key] = priors_after(evidence, priors, weights)
            return with_run_notes(result.to_status(revision, gpu_seconds=unit_seconds(probed_gpus(spec), spent)), resumed, failures)

    async def _datasets(self, key: Key, spec: SpeculativeServerSpec, owner_uid: str | None) -> dict[str, list[Prompt]]:
        """The prompts of the workloads whose source is a ConfigMap or a File, read now, before any request."""
        namespace, name = key
        out: dict[str, list[Prompt]] = {}
        for w in spec.rollout.workloads:
            if w.prompts.source == "File":
                if self.read_file_dataset is None or owner_uid is None:
                    raise InputError(f"workload {w.name}: prompts.source File, but this operator has no API client to start a reader pod")
                out[w.name] = await self.read_file_dataset(namespace, name, owner_uid, w, spec)
                continue
            ref = w.prompts.config_map
            if w.prompts.source != "ConfigMap" or ref is None:
                continue
            if self.read_config_map is None:
                raise InputError(f"workload {w.name}: prompts.source ConfigMap, but this operator has no API client to read it")
            config_map = await self.read_config_map(namespace, ref.name)
            out[w.name] = config_map_dataset(namespace, config_map, ref.name, ref.key, w.prompts.format or "Auto")
        return out

    # --- the drift monitor's scrapes
    async def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        return self._session

    def pod_url(self, key: Key, pod: str, pod_ip: str | None) -> str | None:
        namespace, name = key
        return self.config.endpoints.pod_url(namespace, pod, pod_ip, m.child_name(name, Variant.SPECULATIVE.value))

    async def scrape(self, key: Key, pods: Mapping[str, str | None], engine: Engine | None = None) -> dict[str, Sample]:
        """One scrape of each speculative pod's /metrics (pod name -> pod IP), reduced to what the drift rule reads.

        Concurrent, and bounded over all resources by ``max_concurrent_scrapes``: a slow pod holds one slot for at
        most ``scrape_timeout`` seconds and delays no other pod's scrape beyond that. ``engine``: the servers' engine
        (its metrics; default SGLang)."""
        engine = engine or engine_for(None)
        if self._scrape_slots is None:
            self._scrape_slots = asyncio.Semaphore(self.config.max_concurrent_scrapes)
        session = await self.session()
        slots = self._scrape_slots

        async def one(pod: str, url: str | None) -> Sample:
            async with slots:
                now = rfc3339(datetime.now(UTC))
                if url is None:
                    return Sample(time=now, error="the pod has no IP yet")
                try:
                    metrics = await scrape_metrics(session, url, timeout=self.config.scrape_timeout, engine=engine)
                except ProbeRequestError as exc:
                    return Sample(time=now, error=str(exc))
                return sample_from_metrics(metrics, now, engine)

        names = sorted(pods)
        samples = await asyncio.gather(*(one(pod, self.pod_url(key, pod, pods[pod])) for pod in names))
        return dict(zip(names, samples, strict=True))

    async def close(self) -> None:
        for key in list(self._probes):
            self.cancel(key)
        if self._session is not None:
            await self._session.close()
