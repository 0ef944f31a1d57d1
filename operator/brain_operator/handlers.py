"""kopf glue: every event about a BrainTrainingJob ends in the one `reconcile`.

Creation, resume after an operator restart, spec changes (including
`kubectl scale` and Kueue's suspend), any change to a worker pod and a
periodic resync all call `reconcile_job`, which re-reads the job and
reconciles it under a per-job lock: pod events and job events arrive on
different kopf workers, and a stale copy of the status must never be
written back (restarts only grow).

kopf keeps its bookkeeping in annotations under the `brain.ai/` prefix, not
in `status`. There is no finalizer: children carry owner references and
are garbage-collected with the job.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Collection, Optional

import kopf

from .cluster import ClusterClient, KubernetesClient
from .metrics import OperatorMetrics
from .reconcile import reconcile
from .render.common import JOB_NAME_LABEL
from .spec import GROUP, PLURAL, VERSION, OperatorDefaults

log = logging.getLogger(__name__)

# How often every job is reconciled even when nothing happened: it enforces
# activeDeadlineSeconds and ttlSecondsAfterFinished, and heals missed events.
RESYNC_SECONDS = 30.0


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


@dataclass
class Context:
    """What the handlers share, carried in kopf's memo."""

    client: ClusterClient
    defaults: OperatorDefaults
    metrics: OperatorMetrics = field(default_factory=OperatorMetrics)
    clock: Callable[[], datetime] = utc_now
    _jobs: set[tuple[str, str]] = field(default_factory=set)
    _locks: defaultdict = field(default_factory=lambda: defaultdict(threading.Lock))
    _guard: threading.Lock = field(default_factory=threading.Lock)

    def lock(self, namespace: str, name: str) -> threading.Lock:
        with self._guard:
            return self._locks[(namespace, name)]

    def remember(self, namespace: str, name: str, exists: bool) -> None:
        with self._guard:
            (self._jobs.add if exists else self._jobs.discard)((namespace, name))

    def known_jobs(self) -> list[tuple[str, str]]:
        with self._guard:
            return sorted(self._jobs)


def reconcile_job(context: Context, namespace: str, name: str) -> Optional[dict[str, Any]]:
    """Reconcile the job as it is now in the API server; None when it is gone."""
    with context.lock(namespace, name), context.metrics.reconcile():
        manifest = context.client.get_job(namespace, name)
        context.remember(namespace, name, manifest is not None)
        if manifest is None:
            context.metrics.observe_phase(namespace, name, None)
            return None
        status = reconcile(manifest, context.client, context.clock(), context.defaults)
    context.metrics.observe_phase(namespace, name, status.get("phase"))
    return status


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    memo.resync = asyncio.create_task(resync_forever(memo.context))


@kopf.on.cleanup()
async def stop_resync(memo: kopf.Memo, **_: Any) -> None:
    memo.resync.cancel()


async def resync_forever(context: Context, interval: float = RESYNC_SECONDS) -> None:
    """Reconcile every known job periodically (a kopf timer would add a finalizer to each job)."""
    while True:
        await asyncio.sleep(interval)
        for namespace, name in context.known_jobs():
            try:
                await asyncio.to_thread(reconcile_job, context, namespace, name)
            except Exception:  # one broken job must not stop the others' resync
                log.exception("resync of %s/%s failed", namespace, name)


# Handlers return None: kopf would store a returned value in the job's status.
@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
def on_job(name: str, namespace: str, memo: kopf.Memo, **_: Any) -> None:
    reconcile_job(memo.context, namespace, name)


@kopf.on.event("", "v1", "pods", labels={JOB_NAME_LABEL: kopf.PRESENT})
def on_pod(labels: kopf.Labels, namespace: str, memo: kopf.Memo, **_: Any) -> None:
    reconcile_job(memo.context, namespace, labels[JOB_NAME_LABEL])


@kopf.on.delete(GROUP, VERSION, PLURAL, optional=True)
def on_delete(name: str, namespace: str, memo: kopf.Memo, **_: Any) -> None:
    # optional=True: no finalizer; this only forgets the job.
    memo.context.remember(namespace, name, False)
    memo.context.metrics.observe_phase(namespace, name, None)


def run(
    *,
    namespaces: Collection[str] = (),
    all_namespaces: bool = False,
    liveness_endpoint: Optional[str] = None,
    metrics_port: Optional[int] = None,
) -> None:
    """Run the operator until it is stopped (what `braintrain operator` calls).

    Standalone: one replica, no kopf peering objects to grant RBAC for.
    """
    if not all_namespaces and not namespaces:
        raise ValueError("name at least one namespace to watch, or all_namespaces=True")
    context = Context(client=KubernetesClient(), defaults=OperatorDefaults.from_env())
    if metrics_port:
        context.metrics.serve(metrics_port)
    kopf.run(
        standalone=True,
        clusterwide=all_namespaces,
        namespaces=() if all_namespaces else tuple(namespaces),
        liveness_endpoint=liveness_endpoint,
        memo=kopf.Memo(context=context),
    )
