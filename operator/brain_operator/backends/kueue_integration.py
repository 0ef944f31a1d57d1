"""A queued PyTorchJob that Kueue does not manage (pure): found at create time, held suspended, said in Valid=False.

Kueue manages a kind only when its integration is enabled in the manager's
configuration, `integrations.frameworks` (kueue pkg/controller/jobframework
setup.go enables the configured integrations and their webhooks only), and
its releases from v0.19 ship with "kubeflow.org/pytorchjob" off. The
Workload API is served either way, so discovery cannot tell. What tells is
the create: Kueue's webhook suspends every queued job of a managed kind
(jobframework ApplyDefaultForSuspend), so a queued PyTorchJob stored
unsuspended, though rendered for a job that is not suspended, is one no
Workload will ever hold: it would run at once, outside any quota.

The operator then suspends it itself and marks it (UNMANAGED_ANNOTATION),
and the job says Valid=False (BackendUnavailable) naming the setting, on
every pass while the PyTorchJob is suspended, marked and has no Workload.
Once Kueue manages the kind (the setting changed, Kueue restarted), its job
reconciler makes a Workload for the existing suspended PyTorchJob and
admits it as any other: the job runs in its queue, without being re-created.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from ..cluster.discovery import PYTORCHJOB
from ..objects.refs import ObjectRef
from ..objects.schedulers import JOB_UID_LABEL, QUEUE_LABEL, WORKLOAD

UNMANAGED_ANNOTATION = "brain.ai/kueue-unmanaged"
# Kueue's name for the integration (kueue pkg/controller/jobs/kubeflow/jobs/pytorchjob, FrameworkName).
FRAMEWORK = "kubeflow.org/pytorchjob"
# The patch that holds such a PyTorchJob: suspended by the operator, and marked so later passes know why.
HOLD = {"metadata": {"annotations": {UNMANAGED_ANNOTATION: "true"}}, "spec": {"runPolicy": {"suspend": True}}}


def message(queue: str) -> str:
    return (f"spec.scheduling.queueName: {queue}: Kueue does not manage kubeflow.org/v1 PyTorchJob (its webhook did "
            f"not suspend the PyTorchJob, so no Workload will hold it): add \"{FRAMEWORK}\" to Kueue's "
            f"integrations.frameworks (off by default since Kueue v0.19) and restart Kueue, or remove "
            f"spec.scheduling.queueName; the operator keeps the PyTorchJob suspended meanwhile")


def _suspended(obj: Mapping[str, Any]) -> bool:
    return bool(((obj.get("spec") or {}).get("runPolicy") or {}).get("suspend"))


def _kind(obj: Mapping[str, Any]) -> tuple[str, str]:
    return obj.get("apiVersion", ""), obj.get("kind", "")


def ignored_by_kueue(stored: Iterable[Mapping[str, Any]], suspend: bool) -> list[ObjectRef]:
    """The queued PyTorchJobs just created that Kueue's webhook left unsuspended, for a job not suspended."""
    if suspend:
        return []  # rendered suspended: the create cannot tell
    return [ObjectRef.of(obj) for obj in stored if _kind(obj) == PYTORCHJOB
            and QUEUE_LABEL in ((obj.get("metadata") or {}).get("labels") or {}) and not _suspended(obj)]


def still_ignored(children: Iterable[Mapping[str, Any]]) -> bool:
    """A PyTorchJob the operator held for Kueue's not managing it, still suspended, and no Workload made for it."""
    children = list(children)
    uids = {((c.get("metadata") or {}).get("labels") or {}).get(JOB_UID_LABEL) for c in children if _kind(c) == WORKLOAD}
    return any(_kind(c) == PYTORCHJOB and _suspended(c)
               and ((c.get("metadata") or {}).get("annotations") or {}).get(UNMANAGED_ANNOTATION) == "true"
               and (c.get("metadata") or {}).get("uid") not in uids for c in children)
