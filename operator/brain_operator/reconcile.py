"""One reconcile of a BrainTrainingJob: validate, render, plan, act.

`plan` is pure: from the parsed job, its rendered objects, the children that
exist, rank 0's progress document (when the caller polls), the previous
status and `now`, it returns the writes to make and the new status, a typed
`JobStatus`. `apply` makes them through a ClusterClient, serialising the
status once. `reconcile` strings the two together and is what every kopf
handler and the resync call, so creation, resume, spec changes, pod events
and the resync (with its progress poll) all follow one code path, which
writes status once per pass. The children come from the operator's watches
when it has them (children.py), else, and after a Conflict, from listing them.

The watches lag the API server, so what they show is corrected before the
plan: a Terminating child, or a name shown twice, is read again (a DELETED
event lost in a relist would keep the old object forever), the children this job's passes created and the
watches do not show yet are added (expectations.py: no create is sent
twice), and only children whose controller is this job's uid count (a job
re-created under its name waits for the old one's children to go). The
status is written with the resourceVersion the pass planned from: a write
in between is a Conflict, and the pass is planned again.

Idempotent by construction: a second pass over the same cluster plans no
writes, and the status is patched only when it changed.

A job whose pods run an overlay that the operator's policy no longer allows
(the policy was tightened since they were created) keeps them, as admission
keeps running pods: its status follows them, Valid=False names each field and
setting, and no pod (or PyTorchJob) is created for it until the policy or the
overlay changes. With nothing running yet, it is an invalid spec.

Two things end a pass without retrying it soon: a create the API server
refuses (`Refused`: Pod Security Admission, a quota, validation) writes the
CreateRefused condition and posts FailedCreate, then raises for the handlers
to back off in minutes; and an exception while parsing or rendering the job
(a bug of ours on this spec) marks it Valid=False with InternalError.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Callable, Collection, Iterable, Mapping, Optional, Sequence

from brain_trainer.contract import parse_time
from brain_trainer.schema import ConfigError

from .accounting import still_handled, unhandled
from .cluster import ClusterClient, Conflict, ObjectRef, Refused, controller_uid
from .discovery import ServedApis, missing
from .events import (NORMAL, WARNING, Event, compute_events, in_pod_restart_event, overlay_refusal_event,
                     refusal_event, worker_exit_event)
from .expectations import Expectations
from .failure_policy import WorkerFailure, consequence, explain, first_cause
from .incidents import ROOT, Exit, Verdict, judge, still_open
from .job_status import FAILED, SUCCEEDED, VALID, JobStatus, read_status
from .logs import job_logger
from .kueue_integration import HOLD, ignored_by_kueue, still_ignored
from .kueue_integration import message as ignored_message
from .lost_pods import PodStatusPatch, fail_lost_pods
from .orphans import ended_groups
from .regroup import in_transition, old_group_stays
from .names import CONFIG_HASH_ANNOTATION, SUSPEND_ANNOTATION, worker_pod_name
from .on_demand import answered_events, request_events
from .stalled import stalled_status
from .pods import PENDING, PodView, created_at, ended_at, is_disruption, pod_view
from .progress import progress_status, reports_progress
from .render import KUBEFLOW_JOB_NAME_LABEL, checkpoint_claim_name, render, selector
from .schedulers import (JOB_UID_LABEL, KUEUE_POD_FINALIZER, POD_GROUP_COUNT_ANNOTATION, POD_GROUP_LABEL, RETRIABLE_IN_GROUP_ANNOTATION,
                         WORKLOAD, held_by_kueue, pending_reason)
from .spec import Job, OperatorDefaults, OverlayRefused, effective_batch_size, node_range, parse_job, resolved_strategy
from .spec.model import FAIL_JOB, RETAIN
from .status import (
    BACKEND_UNAVAILABLE,
    BACKOFF_LIMIT_EXCEEDED,
    CHECKPOINT_STORAGE_TOO_SMALL,
    DEADLINE_EXCEEDED,
    INTERNAL_ERROR,
    INVALID_SPEC,
    Failure,
    Observation,
    carried_refusal,
    clock_start,
    container_restart_count,
    elastic_status,
    invalid_status,
    is_terminal,
    overlay_refused_status,
    pytorchjob_status,
    refused_status,
)
from .storage import StorageTooSmall, check_storage, unchecked_claim_event
from .vocabulary import assumed
from .waiting import Waiting, earlier_job, stuck_terminating, waiting

POD = ("v1", "Pod")
CONFIG_MAP = ("v1", "ConfigMap")
PYTORCHJOB = ("kubeflow.org/v1", "PyTorchJob")
# The children that carry the pod overlay: none is created while the policy refuses the overlay.
OVERLAID = (POD, PYTORCHJOB)
# Plans made again after a Conflict on create, each from children listed afresh.
CONFLICT_REPLANS = 3

log = logging.getLogger(__name__)

# The children of one kind of one job as the watches last saw them, or None when that kind is not watched.
Observed = Callable[[str, str, tuple[str, str]], Optional[list[dict]]]


@dataclass(frozen=True)
class Plan:
    """The writes one reconcile makes, and the status they lead to."""

    status: JobStatus
    creates: tuple[dict, ...] = ()
    deletes: tuple[ObjectRef, ...] = ()
    patches: tuple[tuple[ObjectRef, dict], ...] = ()
    events: tuple[Event, ...] = ()
    pod_statuses: tuple[PodStatusPatch, ...] = ()  # made first: lost_pods.py


def reconcile(
    manifest: Mapping[str, Any],
    client: ClusterClient,
    now: datetime,
    defaults: Optional[OperatorDefaults] = None,
    observed: Optional[Observed] = None,
    progress: Optional[Mapping[str, Any]] = None,
    apis: Optional[ServedApis] = None,
    expectations: Optional[Expectations] = None,
) -> Optional[dict[str, Any]]:
    """Bring one job's children and status in line with its spec; returns the new status as written.

    `expectations` (the operator's, kept across passes) remembers what each
    pass created until the watches show it.

    `apis`, what the cluster was last seen to serve (discovery.py), refuses a
    job that needs what is missing and picks the native PodGroup's version;
    None (no discovery yet, or a test) takes the job as it asks.

    `progress`, rank 0's document asked for before the pass (`progress_pods`),
    is part of what a running elastic job's pass observes. On a Conflict the job is read again (its status may be
    written already) and planned again from children listed afresh; None when
    it is gone.
    """
    replans = 0
    while True:
        try:
            return _reconcile_once(manifest, client, now, defaults, observed if replans == 0 else None, progress, apis,
                                   expectations)
        except Conflict:
            replans += 1
            if replans > CONFLICT_REPLANS:
                raise
            meta = manifest.get("metadata") or {}
            fresh = client.get_job(meta.get("namespace", ""), meta.get("name", ""))
            if fresh is None:
                return None
            manifest = fresh


def _reconcile_once(
    manifest: Mapping[str, Any],
    client: ClusterClient,
    now: datetime,
    defaults: Optional[OperatorDefaults],
    observed: Optional[Observed],
    progress: Optional[Mapping[str, Any]],
    apis: Optional[ServedApis] = None,
    expectations: Optional[Expectations] = None,
) -> dict[str, Any]:
    previous = manifest.get("status") or {}
    meta = manifest.get("metadata") or {}
    key = (meta.get("namespace", ""), meta.get("name", ""), meta.get("uid") or "")
    unavailable = None
    refusal: Optional[OverlayRefused] = None
    try:
        try:
            job = parse_job(manifest, defaults=defaults)
        except OverlayRefused as err:
            job, refusal = err.job, err
        check_storage(job, assumed(job, "the operator does not read the data volume"))
        if apis is not None:
            job = replace(job, native_pod_group=apis.native_pod_group() or job.native_pod_group)
            unavailable = missing(job, apis)
        desired = [] if unavailable else render(job)
    except StorageTooSmall as err:
        the_plan = plan_invalid(manifest, _errors(err), now, CHECKPOINT_STORAGE_TOO_SMALL)
    except ConfigError as err:
        the_plan = plan_invalid(manifest, _errors(err), now)
    except Exception as err:  # noqa: BLE001 - a bug of ours on this spec: every retry would fail the same way
        the_plan = plan_invalid(manifest, internal_error(err), now, INTERNAL_ERROR)
        if _valid_message(previous) != _valid_message(the_plan.status.to_dict()):
            # The traceback once, when the job is marked; the condition says it from then on.
            meta = manifest.get("metadata") or {}
            job_logger(log, meta.get("namespace", ""), meta.get("name", "")).exception("parsing or rendering failed")
    else:
        if unavailable:
            return apply(plan_unavailable(manifest, unavailable, now), client, manifest)["status"]
        children = []
        for kind in watched_kinds(job, desired):
            seen = observed(job.namespace, job.name, kind) if observed is not None else None
            children += client.list_children(*kind, job.namespace, job.name) if seen is None else confirmed(seen, client)
        if expectations is not None:
            children = with_expected(children, expectations.unseen(key, children, now))
        children += kueue_workloads(job, children, client)
        ours, leftovers = owned(job, children)
        if still_ignored(ours):
            return apply(plan_unavailable(manifest, ignored_message(job.spec.scheduling.queue_name), now), client,
                         manifest)["status"]
        if refusal is not None and not any(_kind(child) in OVERLAID for child in ours):
            the_plan = plan_invalid(manifest, _errors(refusal), now)  # nothing runs the overlay: an invalid spec
        else:
            the_plan = plan(job, desired, ours, previous, now, progress, leftovers=leftovers)
            if refusal is not None:
                the_plan = held_by_policy(the_plan, refusal, JobStatus.read(previous), now)
    stored: list[dict] = []

    def created(obj: dict) -> None:
        stored.append(obj)
        if expectations is not None:
            expectations.created(key, obj, now)

    after = write_status(the_plan, client, manifest)
    try:
        make_writes(the_plan, client, after, created)
    except Refused as err:
        # Over the status this pass wrote: the refusal, and its event once per message; then the handlers back off.
        apply(plan_refused(the_plan.status, err, now), client, after)
        raise
    ignored = ignored_by_kueue(stored, job.spec.run_policy.suspend) if stored else []
    for ref in ignored:  # kueue_integration.py: held suspended, and said so
        client.patch(ref, HOLD)
    if ignored:
        after = apply(plan_unavailable(after, ignored_message(job.spec.scheduling.queue_name), now), client, after)
    return after["status"]


def confirmed(seen: Sequence[Mapping[str, Any]], client: ClusterClient) -> list[Mapping[str, Any]]:
    """The watches' children, each one that could be a ghost read again: kopf keys its index by uid and keeps an
    object whose DELETED event fell into a `410 Gone` relist gap for the operator's lifetime, so a Terminating
    child (which would hold its name) and a name the index holds twice (an old object beside its replacement) are
    checked with a GET, keeping only the object the API server has under that name."""
    names = Counter(ObjectRef.of(child) for child in seen)  # by name: ObjectRef compares without the uid
    read: dict[ObjectRef, Optional[dict]] = {}
    out = []
    for child in seen:
        ref = ObjectRef.of(child)
        if (child.get("metadata") or {}).get("deletionTimestamp") or names[ref] > 1:
            if ref not in read:
                read[ref] = client.get(ref)
            fresh = read[ref]
            if fresh is None or (fresh.get("metadata") or {}).get("uid") != ref.uid:
                continue  # gone, or the name is another object's now
            child = fresh
        out.append(child)
    return out


def with_expected(children: Sequence[Mapping[str, Any]], expected: Sequence[Mapping[str, Any]]) -> list:
    """The children with those created and not yet seen; a created object wins over an older one of its name that
    the watch still shows (its create succeeded, so that one is gone)."""
    refs = {ObjectRef.of(obj) for obj in expected}
    return [*(c for c in children if ObjectRef.of(c) not in refs), *expected]


def owned(job: Job, children: Sequence[Mapping[str, Any]]) -> tuple[list, list]:
    """(this job's children, an earlier job's): a child controlled by a BrainTrainingJob of another uid is not
    ours, whatever its labels say; one controlled by none (a checkpoint claim kept by reclaimPolicy: Retain) is."""
    ours, leftovers = [], []
    for child in children:
        uid = controller_uid(child)
        (leftovers if job.uid and uid is not None and uid != job.uid else ours).append(child)
    return ours, leftovers


def plan_unavailable(manifest: Mapping[str, Any], message: str, now: datetime) -> Plan:
    """A job the cluster cannot run as asked (discovery.missing): Failed, Valid=False BackendUnavailable, nothing
    created, and a Warning saying what to install or set, once per message; it starts once the API is there."""
    the_plan = plan_invalid(manifest, message, now, BACKEND_UNAVAILABLE)
    if _valid_message(manifest.get("status") or {}) == message:
        return the_plan
    return replace(the_plan, events=(Event(WARNING, BACKEND_UNAVAILABLE, message), *the_plan.events))


def held_by_policy(the_plan: Plan, refusal: OverlayRefused, before: JobStatus, now: datetime) -> Plan:
    """The plan of a job whose running pods' overlay the policy no longer allows: it creates no pod (nor
    PyTorchJob), its status says Valid=False naming each field and setting, with a Warning once per message.

    The pods that run are left alone, as Pod Security Admission leaves running pods when a namespace's level
    is raised; a finished job's status stays as it was.
    """
    creates = tuple(obj for obj in the_plan.creates if _kind(obj) not in OVERLAID)
    if is_terminal(the_plan.status):
        return replace(the_plan, creates=creates)
    message = f"{_errors(refusal)} (running pods are left alone; none is created until the policy or the overlay changes)"
    status = overlay_refused_status(the_plan.status, before, message, now)
    event = overlay_refusal_event(before, status)
    return replace(the_plan, status=status, creates=creates, events=(*the_plan.events, *([event] if event else [])))


def plan_refused(status: JobStatus, err: Refused, now: datetime) -> Plan:
    """A create the API server refused: CreateRefused=True and `reason` FailedCreate with its message, and a
    Warning FailedCreate event when the message is new."""
    refused = refused_status(status, err.message, now)
    event = refusal_event(status, refused)
    return Plan(status=refused, events=(event,) if event else ())


def internal_error(err: Exception) -> str:
    """What Valid=False says of an exception the operator raised on a job: its type and first line."""
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0] if lines else 'no message'}"


def _errors(err: ConfigError) -> str:
    return "; ".join(str(e) for e in err.errors)


def _job_of(manifest: Mapping[str, Any], defaults: Optional[OperatorDefaults]) -> Optional[Job]:
    """The job, also one whose overlay only the policy refuses (its pods may run); None for an invalid spec."""
    try:
        return parse_job(manifest, defaults=defaults)
    except OverlayRefused as err:
        return err.job
    except ConfigError:
        return None


def _valid_message(status: Mapping[str, Any]) -> Optional[str]:
    return next((c.get("message") for c in status.get("conditions") or () if c.get("type") == VALID), None)


def progress_pods(
    manifest: Mapping[str, Any], client: ClusterClient, defaults: Optional[OperatorDefaults] = None,
    observed: Optional[Observed] = None,
) -> list[dict]:
    """The pods to ask for rank 0's progress document: those of an elastic job that was Running, else none.

    The handlers ask them before the pass, outside the job's lock; the plan takes the answer if the job still runs.
    """
    job = _job_of(manifest, defaults)
    if job is None:
        return []
    if not reports_progress(job.spec.backend, (manifest.get("status") or {}).get("phase")):
        return []
    seen = observed(job.namespace, job.name, POD) if observed is not None else None
    return seen if seen is not None else client.list_children(*POD, job.namespace, job.name)


def apply(
    the_plan: Plan, client: ClusterClient, manifest: Mapping[str, Any], created: Optional[Callable[[dict], None]] = None
) -> dict[str, Any]:
    """Make the planned writes, the status first (accounting.py says why), then its events, then the children;
    returns the job as written (its status and resourceVersion)."""
    job = write_status(the_plan, client, manifest)
    make_writes(the_plan, client, job, created)
    return job


def write_status(the_plan: Plan, client: ClusterClient, manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The status, serialised here once and patched only where it changed, with the resourceVersion `manifest`
    was read at (a write since is a Conflict); returns the job as written. A status write that fails stops the
    pass before any pod is deleted."""
    previous, written = manifest.get("status") or {}, the_plan.status.to_dict()
    meta = dict(manifest.get("metadata") or {})
    patch = status_patch(previous, written)
    if patch:
        meta["resourceVersion"] = client.patch_status(meta.get("namespace", ""), meta.get("name", ""), patch,
                                                      meta.get("resourceVersion"))
    return {**manifest, "metadata": meta, "status": written}


def make_writes(
    the_plan: Plan, client: ClusterClient, job: Mapping[str, Any], created: Optional[Callable[[dict], None]] = None
) -> None:
    """The status's events, then the children: a lost pod marked Failed before its replacement is created,
    deletions before creations, so a replaced pod's name is free again; `created` hears of each object created
    (as stored)."""
    for event in the_plan.events:
        client.post_event(job, event)
    for lost in the_plan.pod_statuses:
        client.patch_pod_status(lost.ref, lost.status, lost.resource_version)
    for ref in the_plan.deletes:
        client.delete(ref)
    for obj in the_plan.creates:
        stored = client.create(obj)
        if stored is not None and created is not None:
            created(stored)
    for ref, body in the_plan.patches:
        client.patch(ref, body)


def watched_kinds(job: Job, desired: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """The kinds of child to list: what the renderer makes, and pods (ours, or Kubeflow's for a PyTorchJob: why they
    wait) even when none is wanted."""
    return sorted({(obj["apiVersion"], obj["kind"]) for obj in desired} | {POD})


def kueue_workloads(job: Job, children: Sequence[Mapping[str, Any]], client: ClusterClient) -> list[dict]:
    """Kueue's Workloads for a job it holds back (none otherwise: a running job costs no call).

    A plain pod group's Workload is named after the group (the job), and is
    read also while the group may be changing (regroup.in_transition); a
    PyTorchJob's carries the PyTorchJob's uid in JOB_UID_LABEL, and is read
    also while the job's suspend is not yet applied to it (`_kueue_activation`).
    """
    if not job.spec.scheduling.queue_name:
        return []
    if job.spec.backend == "elastic":
        pods = [c for c in children if _kind(c) == POD]
        if not _all_gated(pod_view(c) for c in pods) and not in_transition(job, pods):
            return []
        return client.list_objects(*WORKLOAD, job.namespace, field_selector=f"metadata.name={job.name}")
    noted = str(job.spec.run_policy.suspend).lower()
    held = [c for c in children if _kind(c) == PYTORCHJOB
            and (_kueue_holds(job, c) or _annotations(c).get(SUSPEND_ANNOTATION) != noted)]
    return [
        workload
        for pytorchjob in held
        for workload in client.list_objects(
            *WORKLOAD, job.namespace, label_selector=f"{JOB_UID_LABEL}={(pytorchjob.get('metadata') or {}).get('uid', '')}"
        )
    ]


def deletion_events(manifest: Mapping[str, Any], defaults: Optional[OperatorDefaults] = None) -> list[Event]:
    """Events for a deleted job: the checkpoint claim that outlives it, and how to resume from it or free it."""
    job = _job_of(manifest, defaults)
    if job is None:
        return []  # an invalid job made no claim
    claim, ckpt = checkpoint_claim_name(job), job.spec.checkpoint
    if claim is None or (ckpt.claim_name is None and ckpt.reclaim_policy != RETAIN):
        return []
    how = (
        f"a new job named {job.name} resumes from its newest checkpoint (so does any job naming it in "
        f"spec.checkpoint.claimName); kubectl delete pvc {claim} -n {job.namespace} frees it"
    )
    return [Event(NORMAL, "CheckpointClaimKept", f"checkpoint claim {claim} is kept after the job: {how}")]


def deletion_deletes(manifest: Mapping[str, Any], defaults: Optional[OperatorDefaults] = None) -> list[ObjectRef]:
    """What to delete for a deleted job: a queued elastic job's Kueue Workload. The garbage collector deletes its
    pods, but Kueue's finalizer would keep them, and the group's quota, for good; a deleted Workload makes Kueue
    stop and finalize every pod of the group (pod_controller.go Stop, StopReasonWorkloadDeleted)."""
    job = _job_of(manifest, defaults)
    if job is None or job.spec.backend != "elastic" or not job.spec.scheduling.queue_name:
        return []
    return [group_workload(job)]


def plan_invalid(manifest: Mapping[str, Any], message: str, now: datetime, reason: str = INVALID_SPEC) -> Plan:
    """A spec the operator cannot run: no child is touched; the status says why (Valid=False with `reason` and
    `message`, every bad field for an invalid spec)."""
    before = read_status(manifest)
    generation = (manifest.get("metadata") or {}).get("generation")
    generation = generation if isinstance(generation, int) else 0
    status = invalid_status(before, generation, message, now, reason)
    return Plan(status=status, events=tuple(compute_events(before, status, [])))


def plan(
    job: Job,
    desired: Sequence[Mapping[str, Any]],
    children: Sequence[Mapping[str, Any]],
    previous: Mapping[str, Any],
    now: datetime,
    progress: Optional[Mapping[str, Any]] = None,
    leftovers: Sequence[Mapping[str, Any]] = (),
) -> Plan:
    """Everything one reconcile decides, for either backend; `progress` is rank 0's document if it was asked for.

    `leftovers` are children an earlier job of this name left (reconcile.owned): until they are gone nothing is
    created, and a Kueue pod group of theirs is ended (orphans.py).
    """
    existing = {ObjectRef.of(c): c for c in children}
    before = JobStatus.read(previous)
    if job.spec.backend == "pytorchjob":
        the_plan = _plan_pytorchjob(job, desired, existing, before, now)
    else:
        the_plan = _plan_elastic(job, desired, existing, before, now, earlier_job(leftovers))
    if leftovers:
        the_plan = replace(the_plan, creates=(), deletes=(*the_plan.deletes, *ended_groups(leftovers, job.uid)))
    if old_group_stays(job, existing, the_plan.deletes):  # regroup.py: no pod of the new group yet
        the_plan = replace(the_plan, creates=tuple(obj for obj in the_plan.creates if _kind(obj) != POD))
    status = the_plan.status
    if reports_progress(job.spec.backend, status.phase):
        # Before the Stalled condition, which reads the progress time.
        status = progress_status(progress, status, now=now, mount_path=job.spec.checkpoint.mount_path)
    status, stall_events = stalled_status(job.spec.watchdog, job.spec.training.log_interval, status, before, now)
    status = carried_refusal(status, before, creating=bool(the_plan.creates))
    # Once, at the first reconcile: a claim the operator cannot size.
    unchecked = None if before.phase else unchecked_claim_event(job)
    return replace(
        the_plan,
        status=status,
        events=(*([unchecked] if unchecked else []), *the_plan.events, *request_events(the_plan.patches, existing),
                *answered_events(before, status), *stall_events,
                *filter(None, [in_pod_restart_event(before, status)])),
    )


@dataclass
class _PodPlan:
    """What happens to an elastic job's worker pods in one pass."""

    restarts: int
    deletes: list[ObjectRef] = field(default_factory=list)
    creates: list[dict] = field(default_factory=list)
    replaced: int = 0
    failure: Optional[Failure] = None
    cause: Optional[WorkerFailure] = None  # the handled worker failure that explains the others


def _plan_elastic(
    job: Job,
    desired: Sequence[Mapping[str, Any]],
    existing: Mapping[ObjectRef, Mapping[str, Any]],
    before: JobStatus,
    now: datetime,
    leftovers: Optional[Waiting] = None,
) -> Plan:
    spec, policy = job.spec, job.spec.run_policy
    # The worker pods wanted, by replica index: a pod of that index under another name (a replacement) is one.
    wanted = {pod_view(o).index: o for o in desired if (o["apiVersion"], o["kind"]) == POD}
    pods = {ref: pod_view(obj) for ref, obj in existing.items() if (ref.api_version, ref.kind) == POD}
    live = {ref: p for ref, p in pods.items() if not p.terminating}
    # Ended pods Kueue's finalizer keeps until a replacement exists: they hold their names, not their places.
    kept = {ref for ref in pods if held_by_kueue(existing[ref])}
    stuck = {ref for ref in pods if stuck_terminating(existing[ref], now) or (ref in kept and pods[ref].terminating)}
    restarts = before.restarts
    terminal = is_terminal(before)
    failed_now = [existing[ref] for ref, p in live.items() if p.phase == FAILED]
    new = {ObjectRef.of(pod) for pod in unhandled(failed_now, before.handled_failures or ())}
    # A pod deleted for a disruption while it still runs (a lost node, an eviction, a preemption) is never Failed
    # here: its DisruptionTarget is what says it ended.
    gone = [existing[ref] for ref, p in pods.items() if ref not in live and not p.finished and is_disruption(existing[ref])]
    disrupted = [ObjectRef.of(pod) for pod in unhandled(gone, before.handled_failures or ())]
    verdicts: dict[ObjectRef, Verdict] = {}
    incident = before.incident
    regroup: list[ObjectRef] = []
    if terminal:
        # Stop what still runs (a failed job's siblings); after the TTL, remove every pod.
        expired = _ttl_expired(before, policy.ttl_seconds_after_finished, now)
        pod_plan = _PodPlan(restarts, deletes=[ref for ref, p in live.items() if expired or not p.finished])
    elif policy.suspend:
        pod_plan = _PodPlan(restarts, deletes=list(live))
    else:
        # A Kueue pod group's size is fixed at admission: after a resize every worker joins the new group.
        regroup = [ref for ref, p in live.items()
                   if p.index in wanted and _group_size(existing[ref]) != _group_size(wanted[p.index])]
        failure = _deadline_failure(clock_start(before, job.created, _all_gated(live.values())),
                                    policy.active_deadline_seconds, now)
        # Why each failed worker failed, and what runPolicy.failurePolicy does about it.
        fates = {ref: explain(existing[ref], policy.failure_policy) for ref, p in live.items() if p.phase == FAILED}
        fates.update({ref: explain(existing[ref], policy.failure_policy) for ref in disrupted})
        # Which of the new exits start an incident, and which follow one (incidents.py).
        judged = [ref for ref in fates if ref in new or ref in disrupted]
        step = before.progress.step if before.progress is not None else None
        found, incident = judge([_exit(existing[ref], fates[ref], now) for ref in judged],
                                still_open(before.incident, step, now, job.spec.watchdog.startup_seconds),
                                _blocked(wanted, pods, existing), step)
        verdicts = dict(zip(judged, found))
        incident = incident or before.incident
        pod_plan = _plan_pods(job, wanted, pods, live, restarts, failure, fates, new, verdicts, regroup, stuck, kept)
    creates = pod_plan.creates if terminal else _missing_others(desired, existing) + pod_plan.creates
    queued = bool(spec.scheduling.queue_name)
    # Suspend and resize end the Kueue pod group: its Workload deleted, Kueue stops and finalizes every pod of it
    # (kueue pkg/controller/jobframework/reconciler.go, "The workload is marked for deletion"; pod_controller.go
    # Stop with StopReasonWorkloadDeleted then Finalize). Deleting the pods alone would leave them on the finalizer.
    ends_group = queued and not terminal and ((policy.suspend and bool(live)) or bool(regroup))

    gone = set(pod_plan.deletes)
    # A failed pod is reported once: when it is replaced, or when it ends the job.
    reported = [existing[ref] for ref in live if not terminal and ref in new and (ref in gone or pod_plan.failure)]
    reported += [existing[ref] for ref in disrupted if ref in verdicts]
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
        queued=_kueue_reason(job, existing) if _all_gated(p for ref, p in live.items() if ref not in gone) else None,
        cause=pod_plan.cause,
        handled_failures=still_handled(before.handled_failures or (), [existing[ref] for ref in pods], reported),
        waiting=None if terminal else leftovers or waiting([existing[ref] for ref in pods if ref not in gone], now),
        created=job.created,
        incident=incident,
    )
    status = elastic_status(before, seen, now)
    return Plan(
        status=status,
        creates=tuple(creates),
        deletes=(*pod_plan.deletes, *([group_workload(job)] if ends_group else [])),
        patches=(*(() if terminal else _config_patches(desired, existing)),
                 *(_unretriable(job, existing) if queued and status.phase == FAILED else ())),
        events=tuple(_exit_events(before, status, reported, verdicts, policy.failure_policy)),
        pod_statuses=tuple(fail_lost_pods(existing, now) if queued else ()),
    )


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


def _plan_pods(
    job: Job,
    wanted: Mapping[Optional[int], Mapping[str, Any]],
    pods: Mapping[ObjectRef, PodView],
    live: Mapping[ObjectRef, PodView],
    restarts: int,
    failure: Optional[Failure],
    fates: Mapping[ObjectRef, WorkerFailure],
    new: Collection[ObjectRef],
    verdicts: Mapping[ObjectRef, Verdict],
    regroup: Sequence[ObjectRef] = (),
    stuck: Collection[ObjectRef] = (),
    kept: Collection[ObjectRef] = (),
) -> _PodPlan:
    """A running job: replace failed workers within the budget, add and remove pods to match spec.nodes.

    `fates` says why each failed pod failed and what runPolicy.failurePolicy
    does: a Restart counts against backoffLimit, a RestartNotCounted does
    not, a FailJob ends the job. Only `new` failures (accounting.py) cost
    anything: an earlier pass handled the others before it failed to delete
    them. `regroup` pods are replaced too (deleted now, created once gone),
    without counting as failures. A worker's place is held by its pod until
    that pod is gone, unless it is `stuck` Terminating (a lost node's, or one
    Kueue `kept`): then its replacement is created under another name
    (`_replacement`). A failed pod Kueue `kept` keeps its name too: Kueue lets
    it go only once that replacement exists.
    """
    limit = job.spec.run_policy.backoff_limit
    surplus = [ref for ref, p in live.items() if p.index not in wanted or ref in regroup]
    failed = [ref for ref, p in live.items() if p.index in wanted and p.phase == FAILED]
    handling = [fates[ref] for ref in failed if ref in new]
    counted = [ref for ref in failed if ref in new and verdicts[ref].charged]
    # The cause named in status: this pass's root causes (a disrupted pod's included), else what its exits followed.
    cause = first_cause([v.exit.failure for v in verdicts.values() if v.role == ROOT]) or first_cause(handling)
    fatal = first_cause([f for f in handling if f.action == FAIL_JOB])
    if failure is None and fatal is not None:
        failure = Failure(fatal.condition_reason, f"worker pod {fatal.text()}; {consequence(fatal)}")
    if failure is None and restarts + len(counted) > limit:
        failure = Failure(
            BACKOFF_LIMIT_EXCEEDED,
            f"{len(counted)} worker pod(s) failed with {restarts} of runPolicy.backoffLimit={limit} "
            f"restarts already used: {'; '.join(fates[r].text() for r in counted)}",
        )
    if failure is not None:
        return _PodPlan(restarts, deletes=[ref for ref, p in live.items() if not p.finished], failure=failure,
                        cause=cause)
    if any(p.phase == SUCCEEDED for p in live.values()):
        # Training is over once a worker succeeded: a new pod would wait for a rendezvous that never comes.
        still_running = any(not p.finished for p in live.values() if p.index in wanted)
        return _PodPlan(restarts, deletes=surplus, failure=None if still_running else _incomplete_success(live, wanted))
    held = {p.index for ref, p in pods.items() if ref not in failed and ref not in stuck}
    # Names that stay taken after this pass's deletions: a failed pod goes at once (it has nothing to stop), unless
    # Kueue's finalizer keeps it.
    taken = {ref.name for ref in pods if ref not in failed or ref in kept}
    return _PodPlan(
        restarts + len(counted),
        deletes=surplus + failed,
        creates=[_replacement(job, obj, index, taken) for index, obj in wanted.items() if index not in held],
        replaced=len(failed),
        cause=cause,
    )


def _replacement(job: Job, pod: Mapping[str, Any], index: Optional[int], taken: Collection[str]) -> dict[str, Any]:
    """Worker `index`'s pod under its own name, or, while a pod that will not go away (a lost node's) holds that
    name, under the first free `<job>-worker-<i>-<attempt>`: the same hostname and subdomain, so its DNS name and
    the rendezvous endpoint stay put."""
    name = pod["metadata"]["name"]
    attempt = 0
    while name in taken:
        attempt += 1
        name = worker_pod_name(job.name, index or 0, attempt)
    return {**pod, "metadata": {**pod["metadata"], "name": name}}


def group_workload(job: Job) -> ObjectRef:
    """Kueue's Workload of the job's plain pod group, named after the group (the job; pod_controller.go
    workloadName)."""
    return ObjectRef(*WORKLOAD, job.namespace, job.name)


def _unretriable(job: Job, existing: Mapping[ObjectRef, Mapping[str, Any]]) -> list[tuple[ObjectRef, dict]]:
    """A failed job's pod group ends: each of its pods annotated retriable-in-group "false", so Kueue finishes
    the group once none runs, releasing its quota and every pod's finalizer (pod_controller.go Finished; the
    job reconciler's finalizeJob). The failed pods stay for their logs."""
    return [(ref, {"metadata": {"annotations": {RETRIABLE_IN_GROUP_ANNOTATION: "false"}}})
            for ref, obj in existing.items() if (ref.api_version, ref.kind) == POD
            and ((obj.get("metadata") or {}).get("labels") or {}).get(POD_GROUP_LABEL) == job.name
            and KUEUE_POD_FINALIZER in ((obj.get("metadata") or {}).get("finalizers") or ())
            and _annotations(obj).get(RETRIABLE_IN_GROUP_ANNOTATION) != "false"]


def _plan_pytorchjob(
    job: Job,
    desired: Sequence[Mapping[str, Any]],
    existing: Mapping[ObjectRef, Mapping[str, Any]],
    before: JobStatus,
    now: datetime,
) -> Plan:
    rendered = next(o for o in desired if (o["apiVersion"], o["kind"]) == PYTORCHJOB)
    ref = ObjectRef.of(rendered)
    current = existing.get(ref)
    terminal = is_terminal(before)
    creates = [] if terminal else _missing_others(desired, existing)
    patches = [] if terminal else _config_patches(desired, existing)
    if current is not None and not terminal:
        kueue = bool(job.spec.scheduling.queue_name)
        drift = _pytorchjob_drift(current, rendered, kueue=kueue)
        if drift:
            patches.append((ref, drift))
        if kueue:
            patches += _kueue_activation(job, current, existing)
    status = pytorchjob_status(
        before,
        current,
        generation=job.generation,
        desired=job.spec.nodes,
        strategy=resolved_strategy(job.spec),
        effective_batch_size=effective_batch_size(job),
        selector=selector(job),
        now=now,
        queued=_kueue_reason(job, existing) if current is not None and _kueue_holds(job, current) else None,
        waiting=None if terminal else waiting(_kubeflow_pods(job, existing), now),
        container_restarts=container_restart_count(_kubeflow_pods(job, existing)),
    )
    return Plan(
        status=status,
        creates=tuple(creates),
        patches=tuple(patches),
        events=tuple(compute_events(before, status, [])),
    )


def _kubeflow_pods(job: Job, existing: Mapping[ObjectRef, Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The pods the training operator made for the job's PyTorchJob (named after the job), by its own label."""
    return [obj for ref, obj in existing.items() if (ref.api_version, ref.kind) == POD
            and ((obj.get("metadata") or {}).get("labels") or {}).get(KUBEFLOW_JOB_NAME_LABEL) == job.name]


def _pytorchjob_drift(current: Mapping[str, Any], rendered: Mapping[str, Any], *, kueue: bool) -> dict[str, Any]:
    """The merge patch carrying what a user changes in flight: suspend, replica counts, the trainer.yaml digest.

    With a Kueue queue, Kueue owns runPolicy.suspend (it creates the
    PyTorchJob suspended, admits it by unsuspending, and unsuspends an
    admitted job that anyone else suspends): the job's own suspend goes to
    Kueue's Workload instead (`_kueue_activation`). Without one,
    runPolicy.suspend follows it.
    """
    out: dict[str, Any] = {}
    spec: dict[str, Any] = {}
    want_suspend = (rendered["spec"].get("runPolicy") or {}).get("suspend", False)
    have_suspend = (current.get("spec", {}).get("runPolicy") or {}).get("suspend", False)
    noted = _annotations(rendered)[SUSPEND_ANNOTATION]
    if not kueue and _annotations(current).get(SUSPEND_ANNOTATION) != noted:
        out["metadata"] = {"annotations": {SUSPEND_ANNOTATION: noted}}
    if not kueue and have_suspend != want_suspend:
        spec["runPolicy"] = {"suspend": want_suspend}
    have = current.get("spec", {}).get("pytorchReplicaSpecs") or {}
    wanted = rendered["spec"]["pytorchReplicaSpecs"]
    # A fixed-size job changing size may gain or lose its Worker role altogether.
    replicas: dict[str, Any] = {role: None for role in have if role not in wanted}
    for role, want in wanted.items():
        if role not in have:
            replicas[role] = want
            continue
        change: dict[str, Any] = {}
        if have[role].get("replicas") != want["replicas"]:
            change["replicas"] = want["replicas"]
        digest = _annotations(want["template"])[CONFIG_HASH_ANNOTATION]
        if _annotations(have[role].get("template") or {}).get(CONFIG_HASH_ANNOTATION) != digest:
            # Pods the training operator creates from now on carry the new digest.
            change["template"] = {"metadata": {"annotations": {CONFIG_HASH_ANNOTATION: digest}}}
        if change:
            replicas[role] = change
    if replicas:
        spec["pytorchReplicaSpecs"] = replicas
    if spec:
        out["spec"] = spec
    return out


def _kueue_activation(job: Job, current: Mapping[str, Any],
                      existing: Mapping[ObjectRef, Mapping[str, Any]]) -> list[tuple[ObjectRef, dict]]:
    """The job's suspend, applied to a queued PyTorchJob through Kueue's Workload when it changes.

    Kueue un-suspends an admitted job that is suspended (kueue
    pkg/controller/jobframework/reconciler.go, "Job admitted, unsuspending"),
    so suspending means deactivating its Workload (`spec.active: false`:
    Kueue evicts it, suspends the PyTorchJob and frees its quota); resuming
    reactivates it, and Kueue queues it again. SUSPEND_ANNOTATION on the
    PyTorchJob records the suspend last applied, so a Workload that Kueue
    itself deactivated is never reactivated by us; with no Workload yet,
    the next pass tries again.
    """
    noted = str(job.spec.run_policy.suspend).lower()
    if _annotations(current).get(SUSPEND_ANNOTATION) == noted:
        return []
    uid = (current.get("metadata") or {}).get("uid")
    workloads = [ref for ref, obj in existing.items() if (ref.api_version, ref.kind) == WORKLOAD
                 and ((obj.get("metadata") or {}).get("labels") or {}).get(JOB_UID_LABEL) == uid]
    if not workloads:
        return []
    active = {"spec": {"active": not job.spec.run_policy.suspend}}
    return [*((ref, active) for ref in workloads),
            (ObjectRef.of(current), {"metadata": {"annotations": {SUSPEND_ANNOTATION: noted}}})]


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return (obj.get("metadata") or {}).get("annotations") or {}


def _kind(obj: Mapping[str, Any]) -> tuple[str, str]:
    return obj["apiVersion"], obj["kind"]


def _config_patches(desired: Sequence[Mapping[str, Any]], existing: Mapping[ObjectRef, Mapping[str, Any]]) -> list:
    """trainer.yaml changed by a propagated field (docs/operator.md, "Changing a running job"): patch the ConfigMap."""
    patches = []
    for obj in desired:
        current = existing.get(ObjectRef.of(obj)) if _kind(obj) == CONFIG_MAP else None
        if current is not None and current.get("data") != obj["data"]:
            # A merge patch removes a key (a checkpoint request whose annotation went) only when it says null.
            gone = {key: None for key in current.get("data") or {} if key not in obj["data"]}
            patches.append((ObjectRef.of(obj), {"data": {**obj["data"], **gone}}))
    return patches


def _all_gated(pods: Iterable[PodView]) -> bool:
    """Kueue holds the whole group back (after a preemption too); one gated replacement pod is a restart."""
    waiting = [p for p in pods if not p.finished]
    return bool(waiting) and all(p.gated for p in waiting)


def _group_size(pod: Mapping[str, Any]) -> Optional[str]:
    return _annotations(pod).get(POD_GROUP_COUNT_ANNOTATION)


def _kueue_holds(job: Job, pytorchjob: Mapping[str, Any]) -> bool:
    """A PyTorchJob suspended while its BrainTrainingJob is not: Kueue has not admitted it."""
    suspended = (pytorchjob.get("spec", {}).get("runPolicy") or {}).get("suspend", False)
    return bool(job.spec.scheduling.queue_name) and suspended and not job.spec.run_policy.suspend


def _kueue_reason(job: Job, existing: Mapping[ObjectRef, Mapping[str, Any]]) -> tuple[str, str]:
    """Kueue's own reason for holding the job back, from its Workload; a plain one until Kueue has written it."""
    workloads = [obj for ref, obj in existing.items() if (ref.api_version, ref.kind) == WORKLOAD]
    return pending_reason(workloads) or (
        "WaitingForAdmission",
        f"waiting for Kueue to admit the job in queue {job.spec.scheduling.queue_name}",
    )


def _missing_others(desired: Sequence[Mapping[str, Any]], existing: Mapping[ObjectRef, Any]) -> list[dict]:
    return [dict(o) for o in desired if (o["apiVersion"], o["kind"]) != POD and ObjectRef.of(o) not in existing]


def _deadline_failure(started: Optional[str], deadline: Optional[int], now: datetime) -> Optional[Failure]:
    """DeadlineExceeded once `deadline` seconds passed since the clock `started` (status.clock_start)."""
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


def status_patch(previous: Mapping[str, Any], status: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch from the previous status to the new one ({} when nothing changed)."""
    patch = {k: v for k, v in status.items() if previous.get(k) != v}
    patch.update({k: None for k in previous if k not in status})
    return patch
