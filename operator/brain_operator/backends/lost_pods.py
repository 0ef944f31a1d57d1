"""A lost node's pod under Kueue, marked Failed as PodGC would (pure): what the operator writes to its status.

A pod on a node that stopped answering stays Terminating, phase Running, for
good: no kubelet confirms its end, and PodGC marks it Failed only once the
Node is deleted or tainted out-of-service (kubernetes
pkg/controller/podgc/gc_controller.go, gcOrphaned and gcTerminating, each
through markFailedAndDeletePodWithCondition). Kueue counts such a pod as
active (kueue pkg/controller/jobs/pod/pod_controller.go,
isPodRunnableOrSucceeded), so the worker's replacement makes one pod too
many, and Kueue deletes the replacement as the excess one (sortActivePods
keeps the older pod, which has its finalizer and no gate; removeExcessPods)
for as long as the old pod runs; a failed group never finishes either
(Finished waits for every pod to be Failed or Succeeded), holding its quota.

So for a queued job the operator does what PodGC would: once the pod is past
its grace plus the margin (status/waiting.py stuck_terminating), it sets the pod's
phase to Failed through the pods/status subresource, with the resourceVersion
it read as a precondition (a kubelet that came back and wrote since wins:
Conflict, and the pass is planned again). Kueue then counts the pod gone: the
replacement is kept, and the old pod's finalizer is removed once the
replacement exists. The pod object itself stays until PodGC or an admin
removes it (its grace was never confirmed), and its worker's replacement
runs under another name meanwhile.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Mapping

from ..objects.refs import ObjectRef
from ..objects.schedulers import KUEUE_POD_FINALIZER
from ..status.waiting import stuck_terminating

# What the failed pod's status.message says (PodGC writes none; ours says who and why).
MESSAGE = ("marked Failed by brain-operator: Terminating past its grace on a node that does not answer, so Kueue "
           "counts it gone and keeps its replacement")


@dataclass(frozen=True)
class PodStatusPatch:
    """A merge patch of one pod's status subresource, applied only to the version it was planned from."""

    ref: ObjectRef
    status: Mapping[str, Any]
    resource_version: str


def kueue_counts_it(pod: Mapping[str, Any]) -> bool:
    """A pod Kueue manages (its finalizer on) and still counts as active: not Failed nor Succeeded."""
    finalizers = (pod.get("metadata") or {}).get("finalizers") or ()
    return KUEUE_POD_FINALIZER in finalizers and (pod.get("status") or {}).get("phase") not in ("Failed", "Succeeded")


def fail_lost_pods(pods: Mapping[ObjectRef, Mapping[str, Any]], now: datetime) -> list[PodStatusPatch]:
    """Each Kueue-managed pod stuck Terminating that Kueue still counts, to be marked Failed."""
    out = []
    for ref, pod in pods.items():
        version = (pod.get("metadata") or {}).get("resourceVersion")
        if ref.kind == "Pod" and version and kueue_counts_it(pod) and stuck_terminating(pod, now):
            out.append(PodStatusPatch(ref, {"phase": "Failed", "message": MESSAGE}, version))
    return out
