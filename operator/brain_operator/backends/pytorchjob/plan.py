"""The Kubeflow backend's plan (pure): create the PyTorchJob, pass a user's changes on to it, and read its status.

The training operator makes and replaces the pods; this backend only keeps the PyTorchJob in line with the
job's spec (suspend, replica counts, the trainer.yaml digest) and reads why its pods wait.
"""

from __future__ import annotations

from typing import Any, Mapping

from ...objects.names import CONFIG_HASH_ANNOTATION, SUSPEND_ANNOTATION
from ...objects.refs import ObjectRef
from ...spec import Job, effective_batch_size, resolved_strategy
from ...status.compute import container_restart_count, is_terminal, pytorchjob_status
from ...status.events import compute_events
from ...status.waiting import waiting
from .. import kueue
from ..shared.common import selector
from ..writes import POD, PYTORCHJOB, Plan, Seen, annotations_of, config_patches, missing_others
from .render import KUBEFLOW_JOB_NAME_LABEL


def plan_pytorchjob(seen: Seen) -> Plan:
    """The PyTorchJob and the other children created once, the patches carrying the spec's changes, the status."""
    job, desired, existing, before, now = seen.job, seen.desired, seen.existing, seen.before, seen.now
    rendered = next(o for o in desired if (o["apiVersion"], o["kind"]) == PYTORCHJOB)
    ref = ObjectRef.of(rendered)
    current = existing.get(ref)
    terminal = is_terminal(before)
    creates = [] if terminal else missing_others(desired, existing)
    patches = [] if terminal else config_patches(desired, existing)
    if current is not None and not terminal:
        queued = bool(job.spec.scheduling.queue_name)
        changed = drift(current, rendered, kueue=queued)
        if changed:
            patches.append((ref, changed))
        if queued:
            patches += kueue.activation(job, current, existing)
    status = pytorchjob_status(
        before,
        current,
        generation=job.generation,
        desired=job.spec.nodes,
        strategy=resolved_strategy(job.spec),
        effective_batch_size=effective_batch_size(job),
        selector=selector(job),
        now=now,
        queued=kueue.reason(job, existing) if current is not None and kueue.holds(job, current) else None,
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


def drift(current: Mapping[str, Any], rendered: Mapping[str, Any], *, kueue: bool) -> dict[str, Any]:
    """The merge patch carrying what a user changes in flight: suspend, replica counts, the trainer.yaml digest.

    With a Kueue queue, Kueue owns runPolicy.suspend (it creates the
    PyTorchJob suspended, admits it by unsuspending, and unsuspends an
    admitted job that anyone else suspends): the job's own suspend goes to
    Kueue's Workload instead (`kueue.activation`). Without one,
    runPolicy.suspend follows it.
    """
    out: dict[str, Any] = {}
    spec: dict[str, Any] = {}
    want_suspend = (rendered["spec"].get("runPolicy") or {}).get("suspend", False)
    have_suspend = (current.get("spec", {}).get("runPolicy") or {}).get("suspend", False)
    noted = annotations_of(rendered)[SUSPEND_ANNOTATION]
    if not kueue and annotations_of(current).get(SUSPEND_ANNOTATION) != noted:
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
        digest = annotations_of(want["template"])[CONFIG_HASH_ANNOTATION]
        if annotations_of(have[role].get("template") or {}).get(CONFIG_HASH_ANNOTATION) != digest:
            # Pods the training operator creates from now on carry the new digest.
            change["template"] = {"metadata": {"annotations": {CONFIG_HASH_ANNOTATION: digest}}}
        if change:
            replicas[role] = change
    if replicas:
        spec["pytorchReplicaSpecs"] = replicas
    if spec:
        out["spec"] = spec
    return out


