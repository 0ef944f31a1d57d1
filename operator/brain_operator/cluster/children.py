"""The children the operator watches, and what of each it keeps in memory (pure).

The operator keeps every watched child of every job in kopf indexes keyed
by (namespace, job name), so a reconcile reads them from memory instead of
listing them from the API server. The watches select server-side on the
job label, so only our children reach the operator, and each child is kept
as the few fields the plan, the status and the events read: a pod is a few
hundred bytes instead of the several kilobytes the API server sends.

PyTorchJobs are not watched (the Kubeflow backend is optional and its RBAC
with it): reconcile lists them, as it lists Kueue's Workloads of a held job.
The pods Kubeflow makes for a PyTorchJob carry its template's job labels, so
the pod watch keeps them with ours: reconcile reads why they wait from them.
"""

from __future__ import annotations

from typing import Any, Mapping

from ..objects.names import JOB_NAME_LABEL
from ..objects.pods import DISRUPTION_TARGET
from ..objects.schedulers import POD_GROUP_KINDS, TERMINATION_TARGET

# (apiVersion, kind, plural, index name) of every watched child kind; the index name is kopf's handler id.
WATCHED: tuple[tuple[str, str, str, str], ...] = (
    ("v1", "Pod", "pods", "pod_children"),
    ("v1", "Service", "services", "service_children"),
    ("v1", "ConfigMap", "configmaps", "configmap_children"),
    ("v1", "PersistentVolumeClaim", "persistentvolumeclaims", "claim_children"),
    ("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies", "networkpolicy_children"),
    *(
        (api_version, kind, "podgroups", f"{gang}_podgroup_children")
        for gang, (api_version, kind) in sorted(POD_GROUP_KINDS.items())
    ),
)
WATCHED_KINDS = frozenset((api_version, kind) for api_version, kind, _, _ in WATCHED)
# The server-side selector of every watch: objects that carry the job label at all.
WATCH_SELECTOR = JOB_NAME_LABEL

# creationTimestamp and a container's finishedAt say which group a failed pod was in (status/incidents.py); finalizers
# say whether Kueue keeps an ended pod (schedulers.held_by_kueue).
_METADATA = ("name", "namespace", "uid", "labels", "annotations", "deletionTimestamp", "creationTimestamp", "finalizers")
# Of the controller's owner reference, what says whose child it is (reconcile counts only this job's uid's).
_OWNER = ("apiVersion", "kind", "uid", "controller")
_POD_STATUS = ("phase", "reason", "message", "podIP")


def observed_child(body: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a child the plan reads (plain dicts, detached from the watch's copy)."""
    meta = body.get("metadata") or {}
    out: dict[str, Any] = {
        "apiVersion": body["apiVersion"],
        "kind": body["kind"],
        "metadata": {key: _plain(meta[key]) for key in _METADATA if meta.get(key) is not None},
    }
    controller = next((owner for owner in meta.get("ownerReferences") or () if owner.get("controller")), None)
    if controller is not None:
        out["metadata"]["ownerReferences"] = [{key: controller[key] for key in _OWNER if key in controller}]
    if body["kind"] == "Pod":
        spec, status = body.get("spec") or {}, body.get("status") or {}
        kept_spec = {key: _plain(spec[key]) for key in ("schedulingGates", "nodeName") if spec.get(key)}
        if kept_spec:
            out["spec"] = kept_spec
        kept = {key: status[key] for key in _POD_STATUS if status.get(key) is not None}
        # A condition that is not True keeps why (the scheduler's Unschedulable and its message: waiting.py).
        kept["conditions"] = [_condition(c) for c in status.get("conditions") or []]
        kept["containerStatuses"] = _containers(status.get("containerStatuses"))
        init = _containers(status.get("initContainerStatuses"))
        if init:
            kept["initContainerStatuses"] = init
        out["status"] = kept
    elif body["kind"] == "ConfigMap":
        out["data"] = _plain(body.get("data") or {})
    return out


def _condition(condition: Mapping[str, Any]) -> dict[str, Any]:
    """Type and status; why, when it is not True; PodScheduled's time too (how long a pod has been starting)."""
    keys = ("type", "status")
    if condition.get("status") != "True":
        keys += ("reason", "message")
    if condition.get("type") == "PodScheduled":
        keys += ("lastTransitionTime",)
    if condition.get("type") in (DISRUPTION_TARGET, TERMINATION_TARGET):
        # Which disruption, and when: a pod deleted while it runs ended then (failure_policy.py, incidents.py).
        keys += ("reason", "message", "lastTransitionTime")
    return {key: condition[key] for key in keys if condition.get(key) is not None}


def _containers(statuses: Any) -> list[dict[str, Any]]:
    """Each container that ended (its exit) or waits for a reason (the kubelet's reason, message and the image)."""
    out = []
    for c in statuses or ():
        state = c.get("state") or {}
        if state.get("terminated"):
            out.append({"name": c.get("name"), "state": {"terminated": _terminated(state["terminated"])}})
        elif (state.get("waiting") or {}).get("reason"):
            waiting = {key: state["waiting"][key] for key in ("reason", "message") if state["waiting"].get(key)}
            out.append({"name": c.get("name"), "image": c.get("image"), "state": {"waiting": waiting}})
    return out


def _terminated(state: Mapping[str, Any]) -> dict[str, Any]:
    return {key: state[key] for key in ("exitCode", "reason", "message", "finishedAt") if state.get(key) is not None}


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
