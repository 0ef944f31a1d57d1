"""One reconcile of a BrainTrainingJob: validate, render, plan, act.

`plan` is pure: from the parsed job, its rendered objects, the children that
exist, the previous status and `now`, it returns the writes to make and the
new status. `apply` makes them through a ClusterClient. `reconcile` strings
the two together and is what every kopf handler calls, so creation, resume,
spec changes, pod events and the timer all follow one code path.

Idempotent by construction: a second pass over the same cluster plans no
writes, and the status is patched only when it changed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Mapping, Optional, Sequence

from brain_trainer.contract import parse_time
from brain_trainer.schema import ConfigError

from .cluster import ClusterClient, ObjectRef
from .events import Event, compute_events
from .job_status import FAILED, SUCCEEDED, JobStatus
from .pods import PodView, pod_view
from .render import render, selector
from .spec import Job, OperatorDefaults, effective_batch_size, node_range, parse_job, resolved_strategy
from .status import (
    BACKOFF_LIMIT_EXCEEDED,
    DEADLINE_EXCEEDED,
    Failure,
    Observation,
    elastic_status,
    invalid_status,
    is_terminal,
    pytorchjob_status,
)

POD = ("v1", "Pod")
PYTORCHJOB = ("kubeflow.org/v1", "PyTorchJob")


@dataclass(frozen=True)
class Plan:
    """The writes one reconcile makes, and the status they lead to."""

    status: dict[str, Any]
    status_patch: dict[str, Any] = field(default_factory=dict)
    creates: tuple[dict, ...] = ()
    deletes: tuple[ObjectRef, ...] = ()
    patches: tuple[tuple[ObjectRef, dict], ...] = ()
    events: tuple[Event, ...] = ()


def reconcile(
    manifest: Mapping[str, Any], client: ClusterClient, now: datetime, defaults: Optional[OperatorDefaults] = None
) -> dict[str, Any]:
    """Bring one job's children and status in line with its spec; returns the new status."""
    previous = manifest.get("status") or {}
    try:
        job = parse_job(manifest, defaults=defaults)
    except ConfigError as err:
        the_plan = plan_invalid(manifest, err, now)
    else:
        desired = render(job)
        children = [
            child
            for api_version, kind in watched_kinds(job, desired)
            for child in client.list_children(api_version, kind, job.namespace, job.name)
        ]
        the_plan = plan(job, desired, children, previous, now)
    apply(the_plan, client, manifest)
    return the_plan.status


def apply(the_plan: Plan, client: ClusterClient, manifest: Mapping[str, Any]) -> None:
    """Make the planned writes: deletions first, so a replaced pod's name is free again; events last."""
    for ref in the_plan.deletes:
        client.delete(ref)
    for obj in the_plan.creates:
        client.create(obj)
    for ref, body in the_plan.patches:
        client.patch(ref, body)
    if the_plan.status_patch:
        meta = manifest.get("metadata") or {}
        client.patch_status(meta.get("namespace", ""), meta.get("name", ""), the_plan.status_patch)
    for event in the_plan.events:
        client.post_event(manifest, event)


def watched_kinds(job: Job, desired: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """The kinds of child to list: what the renderer makes, and pods for the elastic backend even when none is wanted."""
    kinds = {(obj["apiVersion"], obj["kind"]) for obj in desired}
    if job.spec.backend == "elastic":
        kinds.add(POD)
    return sorted(kinds)


def plan_invalid(manifest: Mapping[str, Any], err: ConfigError, now: datetime) -> Plan:
    """An invalid spec: no child is touched; the status names every bad field."""
    previous = manifest.get("status") or {}
    generation = (manifest.get("metadata") or {}).get("generation")
    generation = generation if isinstance(generation, int) else 0
    status = invalid_status(previous, generation, "; ".join(str(e) for e in err.errors), now)
    return Plan(status=status, status_patch=status_patch(previous, status), events=tuple(compute_events(previous, status, [])))


def plan(
    job: Job,
    desired: Sequence[Mapping[str, Any]],
    children: Sequence[Mapping[str, Any]],
    previous: Mapping[str, Any],
    now: datetime,
) -> Plan:
    """Everything one reconcile decides, for either backend."""
    existing = {ObjectRef.of(c): c for c in children}
    if job.spec.backend == "pytorchjob":
        return _plan_pytorchjob(job, desired, existing, previous, now)
    return _plan_elastic(job, desired, existing, previous, now)


@dataclass
class _PodPlan:
    """What happens to an elastic job's worker pods in one pass."""

    restarts: int
    deletes: list[ObjectRef] = field(default_factory=list)
    creates: list[dict] = field(default_factory=list)
    replaced: int = 0
    failure: Optional[Failure] = None


def _plan_elastic(
    job: Job,
    desired: Sequence[Mapping[str, Any]],
    existing: Mapping[ObjectRef, Mapping[str, Any]],
    previous: Mapping[str, Any],
    now: datetime,
) -> Plan:
    spec, policy = job.spec, job.spec.run_policy
    wanted = {ObjectRef.of(o): o for o in desired if (o["apiVersion"], o["kind"]) == POD}
    pods = {ref: pod_view(obj) for ref, obj in existing.items() if (ref.api_version, ref.kind) == POD}
    live = {ref: p for ref, p in pods.items() if not p.terminating}
    before = JobStatus.read(previous)
    restarts = before.restarts
    terminal = is_terminal(before)
    if terminal:
        # Stop what still runs (a failed job's siblings); after the TTL, remove every pod.
        expired = _ttl_expired(before, policy.ttl_seconds_after_finished, now)
        pod_plan = _PodPlan(restarts, deletes=[ref for ref, p in live.items() if expired or not p.finished])
    elif policy.suspend:
        pod_plan = _PodPlan(restarts, deletes=list(live))
    else:
        pod_plan = _plan_pods(job, wanted, pods, live, restarts, _deadline_failure(before, policy.active_deadline_seconds, now))
    creates = pod_plan.creates if terminal else _missing_others(desired, existing) + pod_plan.creates

    gone = set(pod_plan.deletes)
    # A failed pod is reported once: when it is replaced, or when it ends the job.
    reported = [
        existing[ref] for ref, p in live.items()
        if not terminal and p.phase == FAILED and (ref in gone or pod_plan.failure)
    ]
    seen = Observation(
        generation=job.generation,
        desired=spec.nodes,
        min_running=node_range(spec)[0],
        pods=[p for ref, p in pods.items() if ref not in gone],
        restarts=pod_plan.restarts,
        replaced=pod_plan.replaced,
        suspended=policy.suspend,
        failure=pod_plan.failure,
        strategy=resolved_strategy(spec),
        effective_batch_size=effective_batch_size(job),
        selector=selector(job),
    )
    status = elastic_status(before, seen, now)
    return Plan(
        status=status,
        status_patch=status_patch(previous, status),
        creates=tuple(creates),
        deletes=tuple(pod_plan.deletes),
        events=tuple(compute_events(previous, status, reported)),
    )


def _plan_pods(
    job: Job,
    wanted: Mapping[ObjectRef, Mapping[str, Any]],
    pods: Mapping[ObjectRef, PodView],
    live: Mapping[ObjectRef, PodView],
    restarts: int,
    failure: Optional[Failure],
) -> _PodPlan:
    """A running job: replace failed workers within the budget, add and remove pods to match spec.nodes."""
    limit = job.spec.run_policy.backoff_limit
    surplus = [ref for ref in live if ref not in wanted]
    failed = [ref for ref, p in live.items() if ref in wanted and p.phase == FAILED]
    counted = [ref for ref in failed if not live[ref].disrupted]
    if failure is None and restarts + len(counted) > limit:
        failure = Failure(
            BACKOFF_LIMIT_EXCEEDED,
            f"{len(counted)} worker pod(s) failed with {restarts} of runPolicy.backoffLimit={limit} "
            f"restarts already used: {', '.join(r.name for r in counted)}",
        )
    if failure is not None:
        return _PodPlan(restarts, deletes=[ref for ref, p in live.items() if not p.finished], failure=failure)
    if any(p.phase == SUCCEEDED for p in live.values()):
        # Training is over once a worker succeeded: a new pod would wait for a rendezvous that never comes.
        still_running = any(not p.finished for ref, p in live.items() if ref in wanted)
        return _PodPlan(restarts, deletes=surplus, failure=None if still_running else _incomplete_success(live, wanted))
    present = {ref for ref in pods if ref not in failed}
    return _PodPlan(
        restarts + len(counted),
        deletes=surplus + failed,
        creates=[dict(obj) for ref, obj in wanted.items() if ref not in present],
        replaced=len(failed),
    )


def _plan_pytorchjob(
    job: Job,
    desired: Sequence[Mapping[str, Any]],
    existing: Mapping[ObjectRef, Mapping[str, Any]],
    previous: Mapping[str, Any],
    now: datetime,
) -> Plan:
    rendered = next(o for o in desired if (o["apiVersion"], o["kind"]) == PYTORCHJOB)
    ref = ObjectRef.of(rendered)
    current = existing.get(ref)
    terminal = is_terminal(JobStatus.read(previous))
    creates = [] if terminal else _missing_others(desired, existing)
    patches = []
    if current is not None and not terminal:
        drift = _pytorchjob_drift(current, rendered)
        if drift:
            patches.append((ref, drift))
    status = pytorchjob_status(
        previous,
        current,
        generation=job.generation,
        desired=job.spec.nodes,
        strategy=resolved_strategy(job.spec),
        effective_batch_size=effective_batch_size(job),
        selector=selector(job),
        now=now,
    )
    return Plan(
        status=status,
        status_patch=status_patch(previous, status),
        creates=tuple(creates),
        patches=tuple(patches),
        events=tuple(compute_events(previous, status, [])),
    )


def _pytorchjob_drift(current: Mapping[str, Any], rendered: Mapping[str, Any]) -> dict[str, Any]:
    """The merge patch carrying a changed suspend flag or replica counts (what a user changes in flight)."""
    spec: dict[str, Any] = {}
    want_suspend = (rendered["spec"].get("runPolicy") or {}).get("suspend", False)
    if (current.get("spec", {}).get("runPolicy") or {}).get("suspend", False) != want_suspend:
        spec["runPolicy"] = {"suspend": want_suspend}
    have = current.get("spec", {}).get("pytorchReplicaSpecs") or {}
    wanted = rendered["spec"]["pytorchReplicaSpecs"]
    # A fixed-size job changing size may gain or lose its Worker role altogether.
    replicas: dict[str, Any] = {role: None for role in have if role not in wanted}
    for role, want in wanted.items():
        if role not in have:
            replicas[role] = want
        elif have[role].get("replicas") != want["replicas"]:
            replicas[role] = {"replicas": want["replicas"]}
    if replicas:
        spec["pytorchReplicaSpecs"] = replicas
    return {"spec": spec} if spec else {}


def _missing_others(desired: Sequence[Mapping[str, Any]], existing: Mapping[ObjectRef, Any]) -> list[dict]:
    return [dict(o) for o in desired if (o["apiVersion"], o["kind"]) != POD and ObjectRef.of(o) not in existing]


def _deadline_failure(before: JobStatus, deadline: Optional[int], now: datetime) -> Optional[Failure]:
    started = before.start_time
    if deadline is None or not started or now - parse_time(started) < timedelta(seconds=deadline):
        return None
    return Failure(DEADLINE_EXCEEDED, f"ran longer than runPolicy.activeDeadlineSeconds={deadline}")


def _ttl_expired(before: JobStatus, ttl: Optional[int], now: datetime) -> bool:
    done = before.completion_time
    return ttl is not None and bool(done) and now - parse_time(done) >= timedelta(seconds=ttl)


def _incomplete_success(live: Mapping[ObjectRef, PodView], wanted: Mapping[ObjectRef, Any]) -> Optional[Failure]:
    missed = sorted(ref.name for ref in wanted if ref not in live or live[ref].phase != SUCCEEDED)
    if not missed:
        return None
    return Failure("WorkersFailed", f"training ended but these workers did not succeed: {', '.join(missed)}")


def status_patch(previous: Mapping[str, Any], status: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch from the previous status to the new one ({} when nothing changed)."""
    patch = {k: v for k, v in status.items() if previous.get(k) != v}
    patch.update({k: None for k in previous if k not in status})
    return patch
