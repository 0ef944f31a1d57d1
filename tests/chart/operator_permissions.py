"""What the operator calls on the Kubernetes API, as RBAC grants: the chart's allow-list.

One place: the RBAC test requires the chart's rules to equal these, so a verb the
operator does not use fails, and so does one it uses but the chart forgets.
Keys are (apiGroup, resource); values the verbs, each with the call that needs it.
"""

from __future__ import annotations

Grants = dict[tuple[str, str], frozenset[str]]

# In every served namespace.
NAMESPACED: Grants = {
    # kopf (handlers.py): list + watch to follow jobs, patch for its annotations
    # (progress and diff base under brain.ai/); ClusterClient.get_job: get.
    ("brain.ai", "braintrainingjobs"): frozenset({"get", "list", "watch", "patch"}),
    # ClusterClient.patch_status (merge patch of the status subresource).
    ("brain.ai", "braintrainingjobs/status"): frozenset({"patch"}),
    # Creating children whose owner reference sets blockOwnerDeletion (render/common.py)
    # needs update on the owner's finalizers where OwnerReferencesPermissionEnforcement runs.
    ("brain.ai", "braintrainingjobs/finalizers"): frozenset({"update"}),
    # reconcile: list, create, delete (failed, surplus, suspended, finished pods);
    # kopf watches them so pod changes refresh the job's status. Every kind created is
    # also read (get) when a create meets AlreadyExists (ClusterClient.create: ours and
    # alive?), and a pod the watch shows Terminating is read again (reconcile.confirmed).
    # A failed job's Kueue pod group ends with a patch of its pods (backends/kueue.py, unretriable).
    ("", "pods"): frozenset({"get", "list", "watch", "create", "delete", "patch"}),
    # ClusterClient.patch_pod_status: a queued job's pod lost with its node, marked Failed (backends/lost_pods.py).
    ("", "pods/status"): frozenset({"patch"}),
    # kopf watches them (children.py) so a child deleted by hand comes back at once;
    # reconcile creates what is missing (and lists them after a Conflict). Never deleted
    # by the operator: owner references garbage-collect them with the job, and
    # a retained checkpoint claim outlives it.
    ("", "services"): frozenset({"get", "list", "watch", "create"}),
    ("", "persistentvolumeclaims"): frozenset({"get", "list", "watch", "create"}),
    # Each job's NetworkPolicy (render/network.py): watched, created when missing, never
    # patched or deleted (owner references garbage-collect it with the job).
    ("networking.k8s.io", "networkpolicies"): frozenset({"get", "list", "watch", "create"}),
    # The ConfigMap with trainer.yaml is also patched when a propagated spec field changes.
    ("", "configmaps"): frozenset({"get", "list", "watch", "create", "patch"}),
    # scheduling.gang: the job's PodGroup (Kubernetes', scheduler-plugins' or Volcano's),
    # watched and created like the other children, garbage-collected with the job.
    ("scheduling.k8s.io", "podgroups"): frozenset({"get", "list", "watch", "create"}),
    ("scheduling.x-k8s.io", "podgroups"): frozenset({"get", "list", "watch", "create"}),
    ("scheduling.volcano.sh", "podgroups"): frozenset({"get", "list", "watch", "create"}),
    # ClusterClient.list_objects: Kueue's Workload of a job it holds back, for its reason; patch: a queued
    # PyTorchJob's suspend and resume (backends/kueue.py activation, spec.active); delete: a pod group ended on
    # suspend, resize or the job's deletion (backends/kueue.py group_workload; backends/deleted.py).
    ("kueue.x-k8s.io", "workloads"): frozenset({"list", "patch", "delete"}),
    # kopf's handler events and ours (phase transitions, worker failures): posted only.
    # Core v1 events: kopf posts through the "v1" events resource.
    ("", "events"): frozenset({"create"}),
}

# backend: pytorchjob (values pytorchjob.enabled): reconcile lists and creates it,
# and patches a changed suspend flag or replica count into it; owner references
# delete it with the job.
PYTORCHJOB: Grants = {
    ("kubeflow.org", "pytorchjobs"): frozenset({"get", "list", "create", "patch"}),
}

# Cluster-wide mode only: kopf's resource observer lists and watches CRDs to follow
# resources that appear or change while it runs. (Namespaced mode grants nothing
# cluster-scoped: kopf then falls back to the initial discovery and the named
# namespaces; it needs neither namespaces nor peering objects when standalone.)
CLUSTER_WIDE: Grants = {
    ("apiextensions.k8s.io", "customresourcedefinitions"): frozenset({"list", "watch"}),
}


# Not the operator's: what Kubernetes' user-facing roles gain through the chart's aggregated
# ClusterRoles (values rbac.aggregateToDefaultRoles), by the role they aggregate into. Readers
# list jobs (`kubectl get all` includes them: the CRD is in the `all` category); editors and
# admins manage and scale them; nobody but the operator writes status.
_READ = frozenset({"get", "list", "watch"})
_MANAGE = frozenset({"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"})
_EDIT: Grants = {
    ("brain.ai", "braintrainingjobs"): _MANAGE,
    ("brain.ai", "braintrainingjobs/status"): _READ,
    ("brain.ai", "braintrainingjobs/scale"): frozenset({"get", "update", "patch"}),
}
DEFAULT_ROLES: dict[str, Grants] = {
    "view": {
        ("brain.ai", "braintrainingjobs"): _READ,
        ("brain.ai", "braintrainingjobs/status"): _READ,
        ("brain.ai", "braintrainingjobs/scale"): _READ,
    },
    "edit": _EDIT,
    "admin": _EDIT,
}


def expected(*, cluster_wide: bool, pytorchjob: bool) -> Grants:
    grants = dict(NAMESPACED)
    if pytorchjob:
        grants.update(PYTORCHJOB)
    if cluster_wide:
        grants.update(CLUSTER_WIDE)
    return grants


def allowed_verbs() -> frozenset[str]:
    """Every verb the operator uses on anything."""
    return frozenset().union(*NAMESPACED.values(), *PYTORCHJOB.values(), *CLUSTER_WIDE.values())
