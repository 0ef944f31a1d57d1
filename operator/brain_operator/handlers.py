"""kopf glue: every event about a BrainTrainingJob ends in the one `reconcile`.

Creation, resume after an operator restart, spec changes (including
`kubectl scale` and Kueue's suspend), any change to a child (a worker pod,
or a Service deleted by hand) and a periodic resync all call
`reconcile_job`, which re-reads the job and reconciles it under a per-job
lock: child events and job events arrive on different kopf workers, and a
stale copy of the status must never be written back (restarts only grow).
The resync's pass also asks rank 0 for its progress document (step, loss,
throughput, last checkpoint), which the plan copies into status with the
rest: one pass, one status write. The document is asked for before the
pass, outside the job's lock, for every job at once within one budget, and
each fetch has a total deadline: a worker that answers byte by byte costs
its own job's document, never another job's pass.

Children are watched with a server-side label selector and kept in kopf
indexes (cluster/children.py), which reconcile reads instead of listing. A pass
that fails (the API server down, throttling past the client's retries) is
tried again for that job after a short jittered backoff (`retry_forever`):
kopf drops the errors of event handlers, and the resync is 30 s away. A
create the API server refused (the job shows CreateRefused and a
FailedCreate event) is tried again in minutes, and the resync leaves it be
until then.

kopf keeps its bookkeeping in annotations under the `brain.ai/` prefix, not
in `status`. There is no finalizer: children carry owner references and
are garbage-collected with the job, except a checkpoint claim kept by
`reclaimPolicy: Retain`, which an Event on the deleted job names. A queued
job's Kueue pod group, which the garbage collector cannot end, is ended on
the job's DELETED event and, for a job deleted while the operator was down
or whose event was lost, on any pass that finds the job gone while its pods
remain (backends/orphans.py): every such pod's event starts one.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import socket
import threading
import time
import urllib.parse
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Collection, Mapping, Optional, Sequence

import kopf
from brain_trainer.contract import METRICS_PORT, PROGRESS_PATH

from . import __version__
from .backends.deleted import deletion_deletes, deletion_events
from .backends.orphans import ended_groups
from .cluster.backoff import Backoff, JobRetries
from .cluster.children import WATCH_SELECTOR, WATCHED, observed_child
from .cluster.api import ClusterClient, Refused
from .cluster.client import KubernetesClient
from .cluster.discovery import ServedApis
from .cluster.expectations import Expectations
from .cluster.ghosts import RELIST_SECONDS, ghosts
from .logs import configure as configure_logging
from .logs import job_logger
from .metrics import OperatorMetrics
from .objects.names import CHECKPOINT_NOW_ANNOTATION, JOB_NAME_LABEL
from .objects.pods import RUNNING as POD_RUNNING
from .status.progress import POLL_SECONDS
from .reconcile import POD, Observed, progress_pods, reconcile
from .spec import GROUP, PLURAL, VERSION, OperatorDefaults

log = logging.getLogger(__name__)

# How often every job is reconciled even when nothing happened: it enforces
# activeDeadlineSeconds and ttlSecondsAfterFinished, and heals missed events.
RESYNC_SECONDS = POLL_SECONDS
# A worker that has not answered in full by then, connection to last byte, is skipped until the next resync.
PROGRESS_DEADLINE_SECONDS = 2.0
# A progress document is a few hundred bytes; a worker answering more is not trusted with the operator's memory.
PROGRESS_MAX_BYTES = 64 * 1024
# How long one resync waits for all its jobs' progress documents together; a job without one by then is
# reconciled without it.
POLL_BUDGET_SECONDS = 10.0
# Progress documents asked for at once (each ask holds a thread while it waits).
POLL_CONCURRENCY = 16
# A job whose reconcile failed is tried again after about 0.5, 1, 2, then every 3 s until it succeeds.
JOB_RETRY_BACKOFF = Backoff(base=0.5, cap=3.0)
# A job whose create the API server refused is tried again after 1-2, 2-4, ... up to 15 minutes: the refusal
# stands until someone changes the job (which reconciles it at once) or the namespace (its policy, its quota).
REFUSAL_BACKOFF = Backoff(base=120.0, cap=900.0)
# How often the operator asks again which optional APIs the cluster serves (a CRD installed, a chart value set).
DISCOVERY_SECONDS = 300.0


def fetch_json(url: str, deadline: float = PROGRESS_DEADLINE_SECONDS) -> Optional[dict[str, Any]]:
    """GET a JSON object within `deadline` seconds in all; None when the worker is unreachable, slow, or answers
    garbage (or too much)."""
    parts = urllib.parse.urlsplit(url)
    # The socket timeout bounds each read, not their sum: a reply trickled out a byte at a time would hold the
    # caller for as long as the worker likes. The timer shuts the connection at the deadline, whatever is read.
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=deadline)
    cut = threading.Event()
    timer = threading.Timer(deadline, _cut_off, (connection, cut))
    timer.start()
    try:
        connection.request("GET", parts.path or "/")
        response = connection.getresponse()
        body = response.read(PROGRESS_MAX_BYTES + 1) if response.status == 200 else b""
    except (OSError, ValueError, http.client.HTTPException):  # HTTPException: not HTTP, or cut short
        return None
    finally:
        timer.cancel()
        connection.close()
    if cut.is_set() or not body or len(body) > PROGRESS_MAX_BYTES:
        return None
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _cut_off(connection: http.client.HTTPConnection, cut: threading.Event) -> None:
    cut.set()
    sock = connection.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)  # wakes the read blocked in the fetching thread
        except OSError:
            pass  # closed by the fetch meanwhile


def progress_urls(pods: Sequence[Mapping[str, Any]], port: int) -> list[str]:
    """Where rank 0 may be serving: torchrun's rendezvous decides which pod holds it, so ask each running pod."""
    return [
        f"http://{pod['status']['podIP']}:{port}{PROGRESS_PATH}"
        for pod in pods
        if (pod.get("status") or {}).get("phase") == POD_RUNNING and (pod.get("status") or {}).get("podIP")
    ]


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


@dataclass
class Context:
    """What the handlers share, carried in kopf's memo."""

    client: ClusterClient
    defaults: OperatorDefaults
    metrics: OperatorMetrics = field(default_factory=OperatorMetrics)
    clock: Callable[[], datetime] = utc_now
    fetch: Callable[[str], Optional[dict[str, Any]]] = fetch_json
    # The children as the watches saw them (kopf's indexes, from startup); None lists them from the API server.
    observed: Optional[Observed] = None
    retries: JobRetries = field(default_factory=lambda: JobRetries(JOB_RETRY_BACKOFF, REFUSAL_BACKOFF))
    # One resync's wait for all its progress documents.
    poll_budget: float = POLL_BUDGET_SECONDS
    # Tells `retry_forever` that a job was scheduled (set by it; callable from any thread).
    wake: Callable[[], None] = lambda: None
    # The namespaces the operator serves ("": every one), where discovery asks whether it may create.
    namespaces: tuple[str, ...] = ("",)
    # What the cluster serves of the optional APIs, as last discovered; None before the first answer.
    apis: Optional[ServedApis] = None
    # What each job's passes created and the watches have not shown yet (cluster/expectations.py).
    expectations: Expectations = field(default_factory=Expectations)
    # The uids of index entries whose object is gone, their DELETED lost in a relist gap (ghosts.py).
    ghosts: set[str] = field(default_factory=set)
    _jobs: set[tuple[str, str]] = field(default_factory=set)
    # Each job as its last pass left it (the status as written): what the next resync's progress ask starts from.
    _seen: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    _locks: defaultdict = field(default_factory=lambda: defaultdict(threading.Lock))
    _guard: threading.Lock = field(default_factory=threading.Lock)

    def lock(self, namespace: str, name: str) -> threading.Lock:
        with self._guard:
            return self._locks[(namespace, name)]

    def remember(self, namespace: str, name: str, exists: bool) -> None:
        with self._guard:
            (self._jobs.add if exists else self._jobs.discard)((namespace, name))
            if not exists:
                self._seen.pop((namespace, name), None)
        if not exists:
            self.expectations.forget(namespace, name)

    def saw(self, manifest: Mapping[str, Any], status: Mapping[str, Any]) -> None:
        meta = manifest["metadata"]
        with self._guard:
            self._seen[(meta["namespace"], meta["name"])] = {**manifest, "status": status}

    def last_seen(self, namespace: str, name: str) -> Optional[dict[str, Any]]:
        with self._guard:
            return self._seen.get((namespace, name))

    def known_jobs(self) -> list[tuple[str, str]]:
        with self._guard:
            return sorted(self._jobs)

    def rank0_progress(self, pods: Sequence[Mapping[str, Any]]) -> Optional[dict[str, Any]]:
        """Rank 0's progress document: the first worker that answers holds rank 0 (the others serve nothing).

        Workers are asked one after another until one answers or a deadline's worth of time has gone.
        """
        give_up = time.monotonic() + PROGRESS_DEADLINE_SECONDS
        for url in progress_urls(pods, METRICS_PORT):
            doc = self.fetch(url)
            if doc is not None or time.monotonic() >= give_up:
                return doc
        return None


def poll_progress(context: Context, namespace: str, name: str) -> Optional[dict[str, Any]]:
    """Rank 0's document for a job its last pass left running, asked for without the job's lock: no pass waits on
    a worker. None before the job's first pass."""
    manifest = context.last_seen(namespace, name)
    if manifest is None:
        return None
    return context.rank0_progress(progress_pods(manifest, context.client, context.defaults, context.observed))


def reconcile_job(
    context: Context, namespace: str, name: str, *, poll: bool = False, progress: Optional[dict[str, Any]] = None
) -> Optional[dict[str, Any]]:
    """Reconcile the job as it is now in the API server; None when it is gone.

    `progress` is rank 0's document, asked for beforehand; `poll` asks for
    it first (`poll_progress`). The resync does, never a pod event, whose
    pass an unresponsive worker would hold up.
    """
    if poll:
        progress = poll_progress(context, namespace, name)
    with context.lock(namespace, name), context.metrics.reconcile():
        manifest = context.client.get_job(namespace, name)
        context.remember(namespace, name, manifest is not None)
        if manifest is None:
            end_orphaned_groups(context, namespace, name)
        status = None if manifest is None else reconcile(
            manifest, context.client, context.clock(), context.defaults, context.observed, progress, context.apis,
            context.expectations,
        )
        if manifest is not None and status is not None:
            context.saw(manifest, status)
        # Under the job's lock: a slower reconcile must not record its older phase after a newer one.
        context.metrics.observe_phase(namespace, name, None if status is None else status.get("phase"))
    return status


def end_orphaned_groups(context: Context, namespace: str, name: str) -> None:
    """The Kueue pod groups a gone job's pods are still held in, ended by deleting their Workloads (backends/orphans.py)."""
    seen = context.observed(namespace, name, POD) if context.observed is not None else None
    pods = seen if seen is not None else context.client.list_children(*POD, namespace, name)
    for ref in ended_groups(pods):
        job_logger(log, namespace, name).info("the job is gone: ending its Kueue pod group (deleting %s)", ref)
        context.client.delete(ref)


def handle(context: Context, namespace: str, name: str, progress: Optional[dict[str, Any]] = None) -> None:
    """Reconcile for an event (or the resync, with `progress`); a pass that fails is tried again for this job soon,
    one the API server refused in minutes."""
    # Known before its first read, which may fail: the resync includes it either way.
    context.remember(namespace, name, True)
    try:
        reconcile_job(context, namespace, name, progress=progress)
    except Refused as err:
        delay = context.retries.failed((namespace, name), time.monotonic(), refused=True)
        # No traceback: the refusal is the API server's answer, and the job's status and events carry it.
        job_logger(log, namespace, name).warning("%s; trying again in %.0f s", err, delay)
        context.wake()
    except Exception:
        delay = context.retries.failed((namespace, name), time.monotonic())
        job_logger(log, namespace, name).exception("reconcile failed; trying again in %.1f s", delay)
        context.wake()
    else:
        context.retries.succeeded((namespace, name))


async def retry_forever(context: Context) -> None:
    """Reconcile each job whose last pass failed again once its backoff is over."""
    loop = asyncio.get_running_loop()
    woken = asyncio.Event()
    context.wake = lambda: loop.call_soon_threadsafe(woken.set)
    while True:
        try:
            await asyncio.wait_for(woken.wait(), context.retries.wait(time.monotonic()))
        except asyncio.TimeoutError:
            pass
        woken.clear()
        due = context.retries.take_due(time.monotonic())
        await asyncio.gather(*(asyncio.to_thread(handle, context, namespace, name) for namespace, name in due))


def indexed(indexes: Mapping[tuple[str, str], kopf.Index],
            ghosts: Callable[[], Collection[str]] = frozenset) -> Observed:
    """Children from kopf's indexes by kind, copied out, less the `ghosts` (uids: ghosts.py); None for a kind no
    index holds."""

    def observed(namespace: str, name: str, kind: tuple[str, str]) -> Optional[list[dict]]:
        index = indexes.get(kind)
        if index is None:
            return None
        gone = ghosts()
        return [child for child in _copied(index.get((namespace, name), ()))
                if (child.get("metadata") or {}).get("uid") not in gone]

    return observed


def _copied(store: Any) -> list[dict]:
    while True:
        try:
            return list(store)
        except RuntimeError:
            continue  # the watch (on the event loop's thread) changed the store mid-copy: copy again


def find_ghosts(context: Context, indexes: Mapping[tuple[str, str], kopf.Index]) -> set[tuple[str, str]]:
    """One check of the indexes against a fresh list per watched kind (ghosts.py): new ghosts are added to
    `context.ghosts`; returns the jobs (namespace, name) that held a new one."""
    jobs: set[tuple[str, str]] = set()
    for kind, index in indexes.items():
        held = {key: _copied(index.get(key, ())) for key in list(index.keys())}
        try:
            listed = [obj for namespace in context.namespaces for obj in context.client.list_objects(
                *kind, namespace, label_selector=WATCH_SELECTOR)]
        except Exception:  # noqa: BLE001 - the next check may succeed; until then the index is taken as it is
            log.warning("listing %s %s to check the index failed", *kind, exc_info=True)
            continue
        found = ghosts([child for children in held.values() for child in children], listed) - context.ghosts
        for key, children in held.items():
            if any((child.get("metadata") or {}).get("uid") in found for child in children):
                jobs.add(key)
        context.ghosts = context.ghosts | found  # a new set: passes on other threads read the old one whole
    return jobs


async def relist_forever(context: Context, indexes: Mapping[tuple[str, str], kopf.Index],
                         interval: float = RELIST_SECONDS) -> None:
    """Every `interval`, find the index's ghosts and reconcile each job that held one."""
    while True:
        await asyncio.sleep(interval)
        jobs = await asyncio.to_thread(find_ghosts, context, indexes)
        await asyncio.gather(*(asyncio.to_thread(handle, context, namespace, name) for namespace, name in sorted(jobs)))


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **indices: Any) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    # `kubectl describe btj` shows the operator's own events; kopf's "handler succeeded" only when it goes wrong.
    settings.posting.level = logging.WARNING
    for api_version, _, plural, _ in WATCHED:
        # Server-side: only our children reach the operator, not every pod of the cluster.
        settings.watching.label_selectors[api_version, plural] = WATCH_SELECTOR
    indexes = {(api_version, kind): indices[index] for api_version, kind, _, index in WATCHED}
    memo.context.observed = indexed(indexes, lambda: memo.context.ghosts)
    # Before the first job: a job that needs what the cluster lacks is refused, not half created.
    await asyncio.to_thread(discover_apis, memo.context)
    memo.discovery = asyncio.create_task(discover_forever(memo.context))
    memo.resync = asyncio.create_task(resync_forever(memo.context))
    memo.retry = asyncio.create_task(retry_forever(memo.context))
    memo.relist = asyncio.create_task(relist_forever(memo.context, indexes))


@kopf.on.cleanup()
async def stop_resync(memo: kopf.Memo, **_: Any) -> None:
    memo.discovery.cancel()
    memo.resync.cancel()
    memo.retry.cancel()
    memo.relist.cancel()


def discover_apis(context: Context) -> None:
    """Learn which optional APIs the cluster serves (cluster/discovery.py); a failed ask keeps what was known."""
    try:
        context.apis = context.client.discover(context.namespaces)
    except Exception:  # noqa: BLE001 - the next ask may succeed; until then jobs are judged by the last answer
        log.warning("discovering the cluster's optional APIs failed; keeping the last answer", exc_info=True)
        return
    log.info("optional APIs served: %s", ", ".join(sorted(f"{v} {k}" for v, k in context.apis.served)) or "none")


async def discover_forever(context: Context, interval: float = DISCOVERY_SECONDS) -> None:
    while True:
        await asyncio.sleep(interval)
        await asyncio.to_thread(discover_apis, context)


async def resync_forever(context: Context, interval: float = RESYNC_SECONDS) -> None:
    """Reconcile every known job, with its progress, periodically (a kopf timer would add a finalizer)."""
    while True:
        await asyncio.sleep(interval)
        await resync(context)


async def resync(context: Context) -> None:
    """One resync: every known job at once, each reconciled as soon as its own progress document is in.

    The documents are asked for outside the jobs' locks, at most
    POLL_CONCURRENCY at a time, and all within `context.poll_budget`: a job
    whose worker has not answered by then is reconciled without it. A job
    waiting out a refusal is left to its own retry.
    """
    loop = asyncio.get_running_loop()
    ends = loop.time() + context.poll_budget
    asks = asyncio.Semaphore(POLL_CONCURRENCY)

    async def one(namespace: str, name: str) -> None:
        if context.retries.holds((namespace, name), time.monotonic()):
            return
        progress = None
        try:
            async with asks:
                progress = await asyncio.wait_for(
                    asyncio.to_thread(poll_progress, context, namespace, name), max(0.0, ends - loop.time()))
        except asyncio.TimeoutError:
            job_logger(log, namespace, name).info("no progress document within the resync's %.0f s",
                                                  context.poll_budget)
        except Exception:  # the job's read failed: its pass below meets the same fault and is retried
            job_logger(log, namespace, name).exception("asking for progress failed")
        # One broken job does not stop the others' resync: a failed pass is retried like any other.
        await asyncio.to_thread(handle, context, namespace, name, progress)

    await asyncio.gather(*(one(namespace, name) for namespace, name in context.known_jobs()))


# Handlers return None: kopf would store a returned value in the job's status.
@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
def on_job(name: str, namespace: str, memo: kopf.Memo, **_: Any) -> None:
    handle(memo.context, namespace, name)


@kopf.on.update(GROUP, VERSION, PLURAL, field=("metadata", "annotations", CHECKPOINT_NOW_ANNOTATION))
def on_checkpoint_now(name: str, namespace: str, memo: kopf.Memo, **_: Any) -> None:
    # Not part of the spec: without this the request would wait for the next resync.
    handle(memo.context, namespace, name)


def on_pod(labels: kopf.Labels, namespace: str, memo: kopf.Memo, body: Optional[kopf.Body] = None, **_: Any) -> None:
    """Any change to a child, a worker pod or another (a Service deleted by hand comes back at once); the event
    observes the child's create (expectations.py)."""
    uid = ((body or {}).get("metadata") or {}).get("uid")
    if uid:
        memo.context.expectations.observed(uid)
    handle(memo.context, namespace, labels[JOB_NAME_LABEL])


def index_child(namespace: str, labels: kopf.Labels, body: kopf.Body, **_: Any) -> dict[tuple[str, str], dict]:
    """A child under its job's (namespace, name), as much of it as reconcile reads."""
    return {(namespace, labels[JOB_NAME_LABEL]): observed_child(body)}


for _api_version, _, _plural, _index in WATCHED:
    _ours = {JOB_NAME_LABEL: kopf.PRESENT}
    kopf.index(_api_version, _plural, id=_index, labels=_ours)(index_child)
    kopf.on.event(_api_version, _plural, id=f"{_index}_event", labels=_ours)(on_pod)


@kopf.on.event(GROUP, VERSION, PLURAL)
def on_job_event(type: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    # Gone for good (no finalizer holds it): say which checkpoint claim outlives it, and end its Kueue pod group.
    if type == "DELETED":
        for event in deletion_events(body, memo.context.defaults):
            memo.context.client.post_event(body, event)
        for ref in deletion_deletes(body, memo.context.defaults):
            memo.context.client.delete(ref)


@kopf.on.delete(GROUP, VERSION, PLURAL, optional=True)
def on_delete(name: str, namespace: str, memo: kopf.Memo, **_: Any) -> None:
    # optional=True: no finalizer; this only forgets the job.
    context = memo.context
    with context.lock(namespace, name):
        context.remember(namespace, name, False)
        context.metrics.observe_phase(namespace, name, None)


def run(
    *,
    namespaces: Collection[str] = (),
    all_namespaces: bool = False,
    liveness_endpoint: Optional[str] = None,
    metrics_port: Optional[int] = None,
    log_format: str = "text",
    verbose: bool = False,
) -> None:
    """Run the operator until it is stopped (what `braintrain operator` calls).

    Standalone: one replica, no kopf peering objects to grant RBAC for.
    """
    if not all_namespaces and not namespaces:
        raise ValueError("name at least one namespace to watch, or all_namespaces=True")
    configure_logging(log_format, verbose)
    scope = "every namespace" if all_namespaces else f"namespaces {', '.join(namespaces)}"
    log.info("brain-operator %s watching %s", __version__, scope)
    context = Context(client=KubernetesClient(), defaults=OperatorDefaults.from_env(),
                      namespaces=("",) if all_namespaces else tuple(namespaces))
    if metrics_port:
        context.metrics.serve(metrics_port)
    kopf.run(
        standalone=True,
        clusterwide=all_namespaces,
        namespaces=() if all_namespaces else tuple(namespaces),
        liveness_endpoint=liveness_endpoint,
        memo=kopf.Memo(context=context),
    )
