"""One reconcile of a BrainTrainingJob: validate, render, plan, act.

`plan` is pure: from the parsed job, its rendered objects, the children that
exist, rank 0's progress document (when the caller polls), the previous
status and `now`, it returns the writes to make and the new status, a typed
`JobStatus`; the job's backend plans its own children (backends/, one table),
and `plan` adds what every backend shares (progress, Stalled, refusals).
`apply` makes them through a ClusterClient, serialising the status once.
`reconcile` strings the two together and is what every kopf
handler and the resync call, so creation, resume, spec changes, pod events
and the resync (with its progress poll) all follow one code path, which
writes status once per pass. The children come from the operator's watches
when it has them (cluster/children.py), else, and after a Conflict, from listing them.

The watches lag the API server, so what they show is corrected before the
plan: a Terminating child, or a name shown twice, is read again (a DELETED
event lost in a relist would keep the old object forever), the children this job's passes created and the
watches do not show yet are added (cluster/expectations.py: no create is sent
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
from dataclasses import replace
from datetime import datetime
from typing import Any, Callable, Mapping, Optional, Sequence

from brain_trainer.schema import ConfigError

from .backends import Plan, Seen, kueue, plan_backend, render
from .backends.kueue_integration import HOLD, ignored_by_kueue, still_ignored
from .backends.kueue_integration import message as ignored_message
from .backends.orphans import ended_groups
from .backends.refusals import (OVERLAID, field_errors, held_by_policy, internal_error, plan_invalid, plan_refused,
                                plan_unavailable, valid_message)
from .backends.regroup import old_group_stays
from .backends.writes import POD, kind_of
from .cluster.api import ClusterClient, Conflict, Refused, controller_uid
from .cluster.discovery import ServedApis, missing
from .cluster.expectations import Expectations
from .logs import job_logger
from .objects.refs import ObjectRef
from .sizing.storage import StorageTooSmall, check_storage, unchecked_claim_event
from .sizing.vocabulary import assumed
from .spec import Job, OperatorDefaults, OverlayRefused, job_or_none, parse_job
from .status.compute import CHECKPOINT_STORAGE_TOO_SMALL, INTERNAL_ERROR, carried_refusal
from .status.events import in_pod_restart_event
from .status.job_status import JobStatus
from .status.on_demand import answered_events, request_events
from .status.progress import progress_status, reports_progress
from .status.stalled import stalled_status
from .status.waiting import earlier_job

# Plans made again after a Conflict on create, each from children listed afresh.
CONFLICT_REPLANS = 3

log = logging.getLogger(__name__)

# The children of one kind of one job as the watches last saw them, or None when that kind is not watched.
Observed = Callable[[str, str, tuple[str, str]], Optional[list[dict]]]


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

    `apis`, what the cluster was last seen to serve (cluster/discovery.py), refuses a
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
        the_plan = plan_invalid(manifest, field_errors(err), now, CHECKPOINT_STORAGE_TOO_SMALL)
    except ConfigError as err:
        the_plan = plan_invalid(manifest, field_errors(err), now)
    except Exception as err:  # noqa: BLE001 - a bug of ours on this spec: every retry would fail the same way
        the_plan = plan_invalid(manifest, internal_error(err), now, INTERNAL_ERROR)
        if valid_message(previous) != valid_message(the_plan.status.to_dict()):
            # The traceback once, when the job is marked; the condition says it from then on.
            meta = manifest.get("metadata") or {}
            job_logger(log, meta.get("namespace", ""), meta.get("name", "")).exception("parsing or rendering failed")
    else:
        if unavailable:
            return apply(plan_unavailable(manifest, unavailable, now), client, manifest)["status"]
        ours, leftovers = owned(job, _children(job, desired, client, now, observed, expectations, key))
        if still_ignored(ours):
            return apply(plan_unavailable(manifest, ignored_message(job.spec.scheduling.queue_name), now), client,
                         manifest)["status"]
        if refusal is not None and not any(kind_of(child) in OVERLAID for child in ours):
            the_plan = plan_invalid(manifest, field_errors(refusal), now)  # nothing runs the overlay: an invalid spec
        else:
            the_plan = plan(job, desired, ours, previous, now, progress, leftovers=leftovers)
            if refusal is not None:
                the_plan = held_by_policy(the_plan, refusal, JobStatus.read(previous), now)
    stored: list[dict] = []
    created = _recorder(stored, expectations, key, now)
    after = write_status(the_plan, client, manifest)
    try:
        make_writes(the_plan, client, after, created)
    except Refused as err:
        # Over the status this pass wrote: the refusal, and its event once per message; then the handlers back off.
        apply(plan_refused(the_plan.status, err, now), client, after)
        raise
    if stored:
        after = _held_for_kueue(job, stored, client, after, now)
    return after["status"]


def _recorder(stored: list[dict], expectations: Optional[Expectations], key: tuple[str, str, str],
              now: datetime) -> Callable[[dict], None]:
    """What hears of each object a pass created (as stored): kept in `stored`, and told to `expectations`."""
    def created(obj: dict) -> None:
        stored.append(obj)
        if expectations is not None:
            expectations.created(key, obj, now)

    return created


def _held_for_kueue(job: Job, stored: Sequence[Mapping[str, Any]], client: ClusterClient, after: dict[str, Any],
                    now: datetime) -> dict[str, Any]:
    """The job as written after a queued PyTorchJob just created that Kueue's webhook left unsuspended is held
    suspended and said so (backends/kueue_integration.py); `after` unchanged when none was."""
    ignored = ignored_by_kueue(stored, job.spec.run_policy.suspend)
    for ref in ignored:
        client.patch(ref, HOLD)
    if not ignored:
        return after
    return apply(plan_unavailable(after, ignored_message(job.spec.scheduling.queue_name), now), client, after)


def _children(job: Job, desired: Sequence[Mapping[str, Any]], client: ClusterClient, now: datetime,
              observed: Optional[Observed], expectations: Optional[Expectations],
              key: tuple[str, str, str]) -> list[Mapping[str, Any]]:
    """The job's children as this pass sees them: the watches' (confirmed) or listed, with those this job's passes
    created and the watches do not show yet (`key` names the job in `expectations`), and the Kueue Workloads of a
    job Kueue holds back."""
    children: list[Mapping[str, Any]] = []
    for kind in watched_kinds(job, desired):
        seen = observed(job.namespace, job.name, kind) if observed is not None else None
        children += client.list_children(*kind, job.namespace, job.name) if seen is None else confirmed(seen, client)
    if expectations is not None:
        children = with_expected(children, expectations.unseen(key, children, now))
    return [*children, *kueue.workloads(job, children, client)]


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


def progress_pods(
    manifest: Mapping[str, Any], client: ClusterClient, defaults: Optional[OperatorDefaults] = None,
    observed: Optional[Observed] = None,
) -> list[dict]:
    """The pods to ask for rank 0's progress document: those of an elastic job that was Running, else none.

    The handlers ask them before the pass, outside the job's lock; the plan takes the answer if the job still runs.
    """
    job = job_or_none(manifest, defaults)
    if job is None:
        return []
    if not reports_progress(job.spec.backend, (manifest.get("status") or {}).get("phase")):
        return []
    seen = observed(job.namespace, job.name, POD) if observed is not None else None
    return seen if seen is not None else client.list_children(*POD, job.namespace, job.name)


def apply(
    the_plan: Plan, client: ClusterClient, manifest: Mapping[str, Any], created: Optional[Callable[[dict], None]] = None
) -> dict[str, Any]:
    """Make the planned writes, the status first (status/accounting.py says why), then its events, then the children;
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
    created, and a Kueue pod group of theirs is ended (backends/orphans.py).
    """
    existing = {ObjectRef.of(c): c for c in children}
    before = JobStatus.read(previous)
    the_plan = plan_backend(Seen(job, desired, existing, before, now, earlier_job(leftovers)))
    if leftovers:
        the_plan = replace(the_plan, creates=(), deletes=(*the_plan.deletes, *ended_groups(leftovers, job.uid)))
    if old_group_stays(job, existing, the_plan.deletes):  # backends/regroup.py: no pod of the new group yet
        the_plan = replace(the_plan, creates=tuple(obj for obj in the_plan.creates if kind_of(obj) != POD))
    status = the_plan.status
    if reports_progress(job.spec.backend, status.phase):
        # Before the Stalled condition, which reads the progress time.
        status = progress_status(progress, status, now=now, root=job.spec.checkpoint.location())
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


def status_patch(previous: Mapping[str, Any], status: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch from the previous status to the new one ({} when nothing changed)."""
    patch = {k: v for k, v in status.items() if previous.get(k) != v}
    patch.update({k: None for k in previous if k not in status})
    return patch
