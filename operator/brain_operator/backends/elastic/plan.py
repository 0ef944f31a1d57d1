"""The elastic backend's plan (pure): the operator itself keeps one pod per node.

Each pass replaces failed workers within runPolicy.backoffLimit (only a new incident's root costs a restart:
status/incidents.py), adds and removes pods to match spec.nodes, stops them on suspend, after the TTL and once
training is over, and fails the job past activeDeadlineSeconds. A lost node's pod is replaced under another
name (replacement.py); Kueue's pod group is ended where a suspend, a resize or a failure asks (../kueue.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Mapping, Optional, Sequence

from brain_trainer.contract import parse_time

from ...objects.pods import PENDING, PodView, created_at, ended_at, is_disruption, pod_view
from ...objects.refs import ObjectRef
from ...spec import Job, effective_batch_size, node_range, resolved_strategy
from ...spec.model import FAIL_JOB
from ...status.accounting import still_handled, unhandled
from ...status.compute import (BACKOFF_LIMIT_EXCEEDED, DEADLINE_EXCEEDED, Failure, Observation, clock_start,
                               elastic_status, is_terminal)
from ...status.events import Event, compute_events, worker_exit_event
from ...status.failure_policy import WorkerFailure, consequence, explain, first_cause
from ...status.incidents import ROOT, Exit, Verdict, judge, still_open
from ...status.job_status import FAILED, SUCCEEDED, Incident, JobStatus
from ...status.waiting import waiting
from .. import kueue
from ..lost_pods import fail_lost_pods
from ..shared.common import selector
from ..writes import POD, Plan, Seen, config_patches, missing_others
from .replacement import kept_pods, names_taken, places_held, replacement, stuck_pods


@dataclass(frozen=True)
class _Pods:
    """A pass's view of the job's worker pods."""

    wanted: Mapping[Optional[int], Mapping[str, Any]]  # by replica index: a pod of it under another name is one
    pods: Mapping[ObjectRef, PodView]
    live: Mapping[ObjectRef, PodView]  # not Terminating
    kept: set[ObjectRef]  # replacement.kept_pods
    stuck: set[ObjectRef]  # replacement.stuck_pods
    new: set[ObjectRef]  # failed pods no earlier pass handled (status/accounting.py)
    disrupted: list[ObjectRef]  # deleted for a disruption while they ran, and not handled yet


@dataclass
class _PodPlan:
    """What happens to an elastic job's worker pods in one pass."""

    restarts: int
    deletes: list[ObjectRef] = field(default_factory=list)
    creates: list[dict] = field(default_factory=list)
    replaced: int = 0
    failure: Optional[Failure] = None
    cause: Optional[WorkerFailure] = None  # the handled worker failure that explains the others
    verdicts: dict[ObjectRef, Verdict] = field(default_factory=dict)  # this pass's judged exits
    incident: Optional[Incident] = None  # the incident they opened or joined
    regroup: list[ObjectRef] = field(default_factory=list)  # pods replaced to join a resized Kueue pod group


def plan_elastic(seen: Seen) -> Plan:
    """The worker pods' creates and deletes, the other children created once, the ConfigMap's patch, the status
    and its events."""
    job, desired, existing, before = seen.job, seen.desired, seen.existing, seen.before
    policy, terminal, view = job.spec.run_policy, is_terminal(before), _view(seen)
    if terminal:
        # Stop what still runs (a failed job's siblings); after the TTL, remove every pod.
        expired = _ttl_expired(before, policy.ttl_seconds_after_finished, seen.now)
        pod_plan = _PodPlan(before.restarts, deletes=[ref for ref, p in view.live.items() if expired or not p.finished])
    elif policy.suspend:
        pod_plan = _PodPlan(before.restarts, deletes=list(view.live))
    else:
        pod_plan = _running(seen, view)
    queued = bool(job.spec.scheduling.queue_name)
    # Suspend and resize end the Kueue pod group: its Workload deleted, Kueue stops and finalizes every pod of it
    # (kueue pkg/controller/jobframework/reconciler.go, "The workload is marked for deletion"; pod_controller.go
    # Stop with StopReasonWorkloadDeleted then Finalize). Deleting the pods alone would leave them on the finalizer.
    ends_group = queued and not terminal and ((policy.suspend and bool(view.live)) or bool(pod_plan.regroup))
    gone = set(pod_plan.deletes)
    # A failed pod is reported once: when it is replaced, or when it ends the job.
    reported = [existing[ref] for ref in view.live
                if not terminal and ref in view.new and (ref in gone or pod_plan.failure)]
    reported += [existing[ref] for ref in view.disrupted if ref in pod_plan.verdicts]
    status = elastic_status(before, _observation(seen, view, pod_plan, reported), seen.now)
    return Plan(
        status=status,
        creates=tuple(pod_plan.creates if terminal else missing_others(desired, existing) + pod_plan.creates),
        deletes=(*pod_plan.deletes, *([kueue.group_workload(job)] if ends_group else [])),
        patches=(*(() if terminal else config_patches(desired, existing)),
                 *(kueue.unretriable(job, existing) if queued and status.phase == FAILED else ())),
        events=tuple(_exit_events(before, status, reported, pod_plan.verdicts, policy.failure_policy)),
        pod_statuses=tuple(fail_lost_pods(existing, seen.now) if queued else ()),
    )


def _view(seen: Seen) -> _Pods:
    """The worker pods as this pass sees them (`_Pods` says what each part is)."""
    existing, before = seen.existing, seen.before
    pods = {ref: pod_view(obj) for ref, obj in existing.items() if (ref.api_version, ref.kind) == POD}
    live = {ref: p for ref, p in pods.items() if not p.terminating}
    kept = kept_pods(existing, pods)
    failed_now = [existing[ref] for ref, p in live.items() if p.phase == FAILED]
    # A pod deleted for a disruption while it still runs (a lost node, an eviction, a preemption) is never Failed
    # here: its DisruptionTarget is what says it ended.
    gone = [existing[ref] for ref, p in pods.items()
            if ref not in live and not p.finished and is_disruption(existing[ref])]
    return _Pods(
        wanted={pod_view(o).index: o for o in seen.desired if (o["apiVersion"], o["kind"]) == POD},
        pods=pods,
        live=live,
        kept=kept,
        stuck=stuck_pods(existing, pods, kept, seen.now),
        new={ObjectRef.of(pod) for pod in unhandled(failed_now, before.handled_failures or ())},
        disrupted=[ObjectRef.of(pod) for pod in unhandled(gone, before.handled_failures or ())],
    )


def _running(seen: Seen, view: _Pods) -> _PodPlan:
    """A job that runs: each new exit judged (status/incidents.py), then its pods planned (`_plan_pods`)."""
    job, existing, before, now = seen.job, seen.existing, seen.before, seen.now
    policy = job.spec.run_policy
    # A Kueue pod group's size is fixed at admission: after a resize every worker joins the new group.
    regroup = [ref for ref, p in view.live.items()
               if p.index in view.wanted and kueue.group_size(existing[ref]) != kueue.group_size(view.wanted[p.index])]
    failure = _deadline_failure(clock_start(before, job.created, kueue.all_gated(view.live.values())),
                                policy.active_deadline_seconds, now)
    # Why each failed worker failed, and what runPolicy.failurePolicy does about it.
    fates = {ref: explain(existing[ref], policy.failure_policy) for ref, p in view.live.items() if p.phase == FAILED}
    fates.update({ref: explain(existing[ref], policy.failure_policy) for ref in view.disrupted})
    # Which of the new exits start an incident, and which follow one (status/incidents.py).
    judged = [ref for ref in fates if ref in view.new or ref in view.disrupted]
    step = before.progress.step if before.progress is not None else None
    found, incident = judge([_exit(existing[ref], fates[ref], now) for ref in judged],
                            still_open(before.incident, step, now, job.spec.watchdog.startup_seconds),
                            _blocked(view.wanted, view.pods, existing), step)
    verdicts = dict(zip(judged, found))
    pod_plan = _plan_pods(job, view, before.restarts, failure, fates, verdicts, regroup)
    return replace(pod_plan, verdicts=verdicts, incident=incident, regroup=regroup)


def _observation(seen: Seen, view: _Pods, pod_plan: _PodPlan, reported: Sequence[Mapping[str, Any]]) -> Observation:
    """What the status is computed from, once this pass's deletions are made."""
    job, existing, before = seen.job, seen.existing, seen.before
    spec, gone = job.spec, set(pod_plan.deletes)
    return Observation(
        generation=job.generation,
        desired=spec.nodes,
        min_running=node_range(spec)[0],
        pods=[p for ref, p in view.pods.items() if ref not in gone],
        restarts=pod_plan.restarts,
        replaced=pod_plan.replaced,
        suspended=spec.run_policy.suspend,
        failure=pod_plan.failure,
        strategy=resolved_strategy(spec),
        effective_batch_size=effective_batch_size(job),
        selector=selector(job),
        queued=(kueue.reason(job, existing) if kueue.all_gated(p for ref, p in view.live.items() if ref not in gone)
                else None),
        cause=pod_plan.cause,
        handled_failures=still_handled(before.handled_failures or (), [existing[ref] for ref in view.pods], reported),
        waiting=(None if is_terminal(before)
                 else seen.leftovers or waiting([existing[ref] for ref in view.pods if ref not in gone], seen.now)),
        created=job.created,
        incident=pod_plan.incident or before.incident,
    )


def _plan_pods(
    job: Job,
    view: _Pods,
    restarts: int,
    failure: Optional[Failure],
    fates: Mapping[ObjectRef, WorkerFailure],
    verdicts: Mapping[ObjectRef, Verdict],
    regroup: Sequence[ObjectRef] = (),
) -> _PodPlan:
    """A running job: replace failed workers within the budget, add and remove pods to match spec.nodes.

    `fates` says why each failed pod failed and what runPolicy.failurePolicy
    does: a Restart counts against backoffLimit, a RestartNotCounted does
    not, a FailJob ends the job. Only new failures (`view.new`, accounting.py) cost
    anything: an earlier pass handled the others before it failed to delete
    them. `regroup` pods are replaced too (deleted now, created once gone),
    without counting as failures. A pod that will not go away (a lost node's)
    gives up its worker's place but keeps its name (replacement.py).
    """
    live, wanted = view.live, view.wanted
    surplus = [ref for ref, p in live.items() if p.index not in wanted or ref in regroup]
    failed = [ref for ref, p in live.items() if p.index in wanted and p.phase == FAILED]
    handling = [fates[ref] for ref in failed if ref in view.new]
    counted = [ref for ref in failed if ref in view.new and verdicts[ref].charged]
    # The cause named in status: this pass's root causes (a disrupted pod's included), else what its exits followed.
    cause = first_cause([v.exit.failure for v in verdicts.values() if v.role == ROOT]) or first_cause(handling)
    if failure is None:
        failure = _failure(job, restarts, handling, counted, fates)
    if failure is not None:
        return _PodPlan(restarts, deletes=[ref for ref, p in live.items() if not p.finished], failure=failure,
                        cause=cause)
    if any(p.phase == SUCCEEDED for p in live.values()):
        # Training is over once a worker succeeded: a new pod would wait for a rendezvous that never comes.
        still_running = any(not p.finished for p in live.values() if p.index in wanted)
        return _PodPlan(restarts, deletes=surplus, failure=None if still_running else _incomplete_success(live, wanted))
    held = places_held(view.pods, failed, view.stuck)
    taken = names_taken(view.pods, failed, view.kept)
    return _PodPlan(
        restarts + len(counted),
        deletes=surplus + failed,
        creates=[replacement(job, obj, index, taken) for index, obj in wanted.items() if index not in held],
        replaced=len(failed),
        cause=cause,
    )


def _failure(job: Job, restarts: int, handling: Sequence[WorkerFailure], counted: Sequence[ObjectRef],
             fates: Mapping[ObjectRef, WorkerFailure]) -> Optional[Failure]:
    """What ends a running job in this pass: a FailJob exit, else restarts past runPolicy.backoffLimit."""
    fatal = first_cause([f for f in handling if f.action == FAIL_JOB])
    if fatal is not None:
        return Failure(fatal.condition_reason, f"worker pod {fatal.text()}; {consequence(fatal)}")
    limit = job.spec.run_policy.backoff_limit
    if restarts + len(counted) > limit:
        return Failure(
            BACKOFF_LIMIT_EXCEEDED,
            f"{len(counted)} worker pod(s) failed with {restarts} of runPolicy.backoffLimit={limit} "
            f"restarts already used: {'; '.join(fates[r].text() for r in counted)}",
        )
    return None


def _exit(pod: Mapping[str, Any], failure: WorkerFailure, now: datetime) -> Exit:
    return Exit(failure, created_at(pod), ended_at(pod) or now)


def _blocked(wanted: Mapping[Optional[int], Mapping[str, Any]], pods: Mapping[ObjectRef, PodView],
             existing: Mapping[ObjectRef, Mapping[str, Any]]) -> dict[str, str]:
    """The job's worker pods a peer would wait for in vain (name -> why): Pending, Terminating, disrupted, or
    wanted and missing (no pod of its index)."""
    held = {p.index for p in pods.values()}
    out = {obj["metadata"]["name"]: "missing" for index, obj in wanted.items() if index not in held}
    for ref, p in pods.items():
        if p.terminating:
            out[p.name] = "Terminating"
        elif p.phase == PENDING:
            out[p.name] = PENDING
        elif not p.finished and is_disruption(existing[ref]):
            out[p.name] = "disrupted"
    return out


def _exit_events(before: JobStatus, status: JobStatus, reported: Sequence[Mapping[str, Any]],
                 verdicts: Mapping[ObjectRef, Verdict], policy: Any) -> list[Event]:
    """WorkerFailed for each incident's root (the events count incidents, as `restarts` does), a Normal
    WorkerExited for each exit that followed one or waited on a peer; then the status's own events."""
    roots = [pod for pod in reported if _role(verdicts, pod) == ROOT]
    followers = [worker_exit_event(pod, policy, verdicts[ObjectRef.of(pod)].why) for pod in reported
                 if _role(verdicts, pod) not in (None, ROOT)]
    events = compute_events(before, status, roots, policy)
    return [*events[:len(roots)], *followers, *events[len(roots):]]


def _role(verdicts: Mapping[ObjectRef, Verdict], pod: Mapping[str, Any]) -> Optional[str]:
    """A reported pod's verdict; one an earlier pass judged (its delete failed) is a root as it was then."""
    verdict = verdicts.get(ObjectRef.of(pod))
    return verdict.role if verdict is not None else ROOT


def _deadline_failure(started: Optional[str], deadline: Optional[int], now: datetime) -> Optional[Failure]:
    """DeadlineExceeded once `deadline` seconds passed since the clock `started` (status/compute.py clock_start)."""
    if deadline is None or not started or now - parse_time(started) < timedelta(seconds=deadline):
        return None
    return Failure(DEADLINE_EXCEEDED, f"not finished runPolicy.activeDeadlineSeconds={deadline} s after it was "
                                      f"created, admitted or resumed ({started})")


def _ttl_expired(before: JobStatus, ttl: Optional[int], now: datetime) -> bool:
    done = before.completion_time
    return ttl is not None and bool(done) and now - parse_time(done) >= timedelta(seconds=ttl)


def _incomplete_success(live: Mapping[ObjectRef, PodView], wanted: Mapping[Optional[int], Any]) -> Optional[Failure]:
    succeeded = {p.index for p in live.values() if p.phase == SUCCEEDED}
    missed = sorted(obj["metadata"]["name"] for index, obj in wanted.items() if index not in succeeded)
    if not missed:
        return None
    return Failure("WorkersFailed", f"training ended but these workers did not succeed: {', '.join(missed)}")
