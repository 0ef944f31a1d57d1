"""Kueue pod groups whose job is gone (pure): the Workloads to delete so their quota and pods go too.

A queued elastic job's pods carry Kueue's finalizer, which Kueue takes off
only when their group finishes or its Workload is deleted (kueue
pkg/controller/jobs/pod/pod_controller.go, Finished and Stop with
StopReasonWorkloadDeleted). The operator deletes the Workload when it sees
the job's DELETED event (backends/deleted.py); an operator that was
down, restarting or upgrading then, or whose watch lost the event in a
relist gap, never sees it: the garbage collector deletes the pods, the
finalizer keeps them, and the Workload stays admitted, holding the quota for
good, while a job re-created under the name waits on the old pods
(EarlierJobTerminating) forever.

So the operator also ends such a group from what it sees later: any pod of
a job name whose controller is not the live job of that name (the job gone,
or re-created with another uid) and that Kueue still holds names its group,
whose Workload is named after the group (pod_controller.go workloadName).
The handlers do it on every pass for a job that is gone, which each of the
old pods' events starts (kopf lists every child at start and after a relist,
and the garbage collector's deletes are events too); a re-created job's own
passes do it for the pods an earlier job left (backends.plan_backend).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional

from ..cluster.api import controller_uid
from ..objects.refs import ObjectRef
from ..objects.schedulers import KUEUE_POD_FINALIZER, POD_GROUP_LABEL, WORKLOAD


def ended_groups(children: Iterable[Mapping[str, Any]], live_uid: Optional[str] = None) -> list[ObjectRef]:
    """The Workloads of the Kueue pod groups that pods of a gone job (controller uid other than `live_uid`) are
    still held in; each named once."""
    out: list[ObjectRef] = []
    for child in children:
        meta = child.get("metadata") or {}
        group = (meta.get("labels") or {}).get(POD_GROUP_LABEL)
        uid = controller_uid(child)
        if child.get("kind") != "Pod" or not group or uid is None or uid == live_uid:
            continue
        ref = ObjectRef(*WORKLOAD, meta.get("namespace", ""), group)
        if KUEUE_POD_FINALIZER in (meta.get("finalizers") or ()) and ref not in out:
            out.append(ref)
    return out
