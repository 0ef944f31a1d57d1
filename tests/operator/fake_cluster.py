"""An in-memory ClusterClient: the one fake the tests allow (a stand-in for our own thin client).

It keeps objects in a dict and answers create/get/list/delete/patch as the
API server does, each rule citing the upstream file it imitates, so that
it is never kinder than Kubernetes: every write stamps a resourceVersion; a
create of a name that exists, Terminating included, is 409 AlreadyExists; a
delete's uid precondition and a status patch's resourceVersion are enforced
(409 Conflict); deletion is graceful (a scheduled, unfinished pod stays
Terminating until its kubelet confirms, `kubelet_confirms`) and any object
with finalizers stays until they are removed; the garbage collector works
by owner uid and later (`collect_garbage`, after `delete_job`); a lost node's
pods stay Terminating for good (`lose_node`) until PodGC frees them
(`delete_node`, `out_of_service`); victims carry DisruptionTarget
(`preempt`, `evict`, `evict_pod`, `lose_node`). `Watch` is the operator's
kopf-index view of the children, lagging the store by a number of passes.

It records every write so a test can assert that a second reconcile wrote
nothing. Helpers let a test play the kubelet (move a pod to Running, Failed,
evicted or Succeeded) and, with `kueue=True`, Kueue: its webhooks gate every
queued pod and suspend every queued PyTorchJob on creation, and `admit`
lifts both, as Kueue's controller does. With `pod_security="restricted"` it
refuses a pod as Pod Security Admission does, and `validate` refuses what a
test says is invalid, each with the Status body the API server sends
(`forbidden`, `invalid`), read back by the real client's own `Refused.of`.
The scheduler's and the kubelet's words for a pod that waits
(`unschedulable`, `pull_fails`, `config_missing`, `creating`) are written
where Kubernetes writes them; `now` is the clock they read.
"""

from __future__ import annotations

import copy
import itertools
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Mapping, Optional

from brain_operator.cluster.children import WATCHED_KINDS, observed_child
from brain_operator.cluster.api import Conflict, Refused, already_exists
from brain_operator.objects.refs import ObjectRef
from brain_operator.cluster.discovery import OPTIONAL, ServedApis
from brain_operator.status.events import Event
from brain_operator.objects.names import JOB_NAME_LABEL
from brain_operator.objects.schedulers import (ADMISSION_GATE, JOB_UID_LABEL, KUEUE_POD_FINALIZER, POD_GROUP_COUNT_ANNOTATION,
                                       POD_GROUP_LABEL, QUEUE_LABEL, QUOTA_RESERVED, RETRIABLE_IN_GROUP_ANNOTATION,
                                       WORKLOAD, gated_by_kueue)
from brain_operator.spec import API_VERSION, KIND
from brain_trainer.contract import format_time
from pod_security import restricted_violations


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def status_error(code: int, reason: str, message: str, details: Mapping[str, Any]) -> dict:
    """The Status object of an API error as the API server writes it (k8s.io/apimachinery pkg/apis/meta/v1 Status)."""
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "details": dict(details), "code": code}


def forbidden(resource: str, name: str, err: str) -> dict:
    """403 as apimachinery's errors.NewForbidden words it: `<resource> "<name>" is forbidden: <err>`."""
    return status_error(403, "Forbidden", f'{resource} "{name}" is forbidden: {err}', {"name": name, "kind": resource})


def invalid(kind: str, name: str, causes: list[tuple[str, str, str]]) -> dict:
    """422 as apimachinery's errors.NewInvalid words it: `<Kind> "<name>" is invalid: [<field>: <detail>, ...]`,
    one cause (reason, message, field) per field error."""
    texts = [f"{field}: {message}" for _, message, field in causes]
    listed = texts[0] if len(texts) == 1 else f"[{', '.join(texts)}]"
    return status_error(422, "Invalid", f'{kind} "{name}" is invalid: {listed}', {
        "name": name, "kind": kind,
        "causes": [{"reason": reason, "message": message, "field": field} for reason, message, field in causes],
    })


# A pod's terminationGracePeriodSeconds when its spec says none (k8s.io/api core/v1 DefaultTerminationGracePeriodSeconds).
DEFAULT_GRACE_SECONDS = 30
# Where the fake's own clock starts: the tests' usual first reconcile.
EPOCH = datetime(2026, 11, 22, 12, 0, 0, tzinfo=timezone.utc)



def deletion_grace(obj: Mapping[str, Any]) -> int:
    """The grace a delete without one gets: a pod's terminationGracePeriodSeconds, but none for a pod never
    scheduled or already finished, whose kubelet has nothing to stop (pkg/registry/core/pod/strategy.go,
    CheckGracefulDelete); other kinds none (rest/delete.go: no graceful strategy)."""
    if obj.get("kind") != "Pod":
        return 0
    if not obj["spec"].get("nodeName") or (obj.get("status") or {}).get("phase") in ("Failed", "Succeeded"):
        return 0
    return obj["spec"].get("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS)


def disruption_target(reason: str, message: str, now: datetime) -> dict:
    """The condition a disrupted pod gets before it is deleted (pkg/apis/core/types.go DisruptionTarget and its
    reasons PreemptionByScheduler, EvictionByEvictionAPI, DeletionByTaintManager, DeletionByPodGC,
    TerminationByKubelet), stamped when it is set as every pod condition is."""
    return {"type": "DisruptionTarget", "status": "True", "reason": reason, "message": message,
            "lastTransitionTime": format_time(now)}


# Kueue's integrations.frameworks names of the two kinds a job queues (kueue pkg/controller/jobs/pod
# FrameworkName "pod"; jobs/kubeflow/jobs/pytorchjob "kubeflow.org/pytorchjob"). Kueue's shipped manager config
# (config/components/manager/controller_manager_config.yaml) leaves "pod" commented out, and releases from v0.19
# leave "kubeflow.org/pytorchjob" out too: a test says which it runs with; both on is the tests' usual cluster.
POD_FRAMEWORK, PYTORCHJOB_FRAMEWORK = "pod", "kubeflow.org/pytorchjob"
KUEUE_FRAMEWORKS = (POD_FRAMEWORK, PYTORCHJOB_FRAMEWORK)
# Kueue's TAS index of a pod in its group, and the annotation naming the label to copy it from (kueue
# apis/kueue/v1alpha1 topology_types.go PodGroupPodIndexLabel, PodGroupPodIndexLabelAnnotation; the pod webhook's
# Default copies it).
POD_INDEX_LABEL, POD_INDEX_LABEL_ANNOTATION = "kueue.x-k8s.io/pod-group-pod-index", "kueue.x-k8s.io/pod-group-pod-index-label"
# Kueue's own names (kueue pkg/constants: ManagedByKueueLabelKey, ResourceInUseFinalizerName).
KUEUE_MANAGED_LABEL = "kueue.x-k8s.io/managed"
WORKLOAD_FINALIZER = "kueue.x-k8s.io/resource-in-use"


def _active(workload: Mapping[str, Any]) -> bool:
    """A Workload's spec.active, true unless set false (apis/kueue workload_types.go)."""
    return (workload.get("spec") or {}).get("active", True) is not False


def _workload_condition(workload: Mapping[str, Any], kind: str) -> bool:
    return any(c.get("type") == kind and c.get("status") == "True"
               for c in (workload.get("status") or {}).get("conditions") or ())


def _set_workload_condition(workload: dict, kind: str, status: bool, reason: str, message: str) -> None:
    conditions = [c for c in workload.setdefault("status", {}).get("conditions") or () if c.get("type") != kind]
    workload["status"]["conditions"] = [*conditions, {"type": kind, "status": "True" if status else "False",
                                                      "reason": reason, "message": message}]


def _finished(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Failed", "Succeeded")


def _runnable_or_succeeded(pod: Mapping[str, Any]) -> bool:
    """pod_controller.go isPodRunnableOrSucceeded: not Failed, and not deleted before it was ever scheduled."""
    if pod["metadata"].get("deletionTimestamp") and not pod["spec"].get("nodeName"):
        return False
    return (pod.get("status") or {}).get("phase") != "Failed"


def _group_count(pods: list[dict]) -> int:
    """The group's size, from its pods' pod-group-total-count annotation (pod_controller.go groupTotalCount)."""
    return max(int((pod["metadata"].get("annotations") or {}).get(POD_GROUP_COUNT_ANNOTATION, "0")) for pod in pods)


class Watch:
    """The operator's kopf indexes over a FakeCluster, `lag` passes behind its store (an Observed).

    A watch delivers events some time after the writes: the pass after a
    create may not see the pod yet, and a deleted pod may still be listed.
    `tick()` starts a pass; each job's children are then read as they were
    `lag` passes before (nothing before its first), trimmed to what the
    indexes keep (children.observed_child). Upstream, kopf's @kopf.index is fed by the
    watch stream's events (kopf/_core/reactor/processing.py, _core/engines/indexing.py).
    """

    def __init__(self, cluster: "FakeCluster", lag: int = 0) -> None:
        self.cluster, self.lag = cluster, lag
        self.passes = 0
        self._seen: dict[tuple[str, str], list[tuple[int, dict]]] = {}
        # A relist gap: the children the index held when the watch broke (`gap`), and those whose DELETED fell
        # into it, which the index then keeps for good (`relisted`).
        self._broken: Optional[list[dict]] = None
        self.ghosts: list[dict] = []

    def tick(self) -> None:
        self.passes += 1

    def gap(self) -> None:
        """The watch stream breaks (a 410 Gone, a dropped connection): until `relisted`, deletions are missed."""
        self._broken = [child for (_, kind), child in self._everything()]

    def relisted(self) -> None:
        """kopf relists; a child deleted in the gap never gets its DELETED event, and the index, keyed by uid,
        keeps it as last seen for the operator's lifetime (kopf/_core/engines/indexing.py replaces an entry only
        on an event for its uid; kopf/_cogs/clients/watching.py restarts the watch without diffing the list)."""
        alive = {obj["metadata"].get("uid") for obj in self.cluster.objects.values()}
        self.ghosts += [child for child in self._broken or () if child["metadata"].get("uid") not in alive]
        self._broken = None

    def _everything(self) -> list[tuple[tuple[str, str], dict]]:
        return [((api, kind), observed_child(obj)) for ref, obj in sorted(self.cluster.objects.items())
                for api, kind in WATCHED_KINDS if (ref.api_version, ref.kind) == (api, kind)]

    def __call__(self, namespace: str, name: str, kind: tuple[str, str]) -> Optional[list[dict]]:
        if kind not in WATCHED_KINDS:
            return None
        history = self._seen.setdefault((namespace, name), [])
        if not history or history[-1][0] != self.passes:
            history.append((self.passes, {k: [observed_child(c) for c in self.cluster.list_children(*k, namespace, name)]
                                          for k in WATCHED_KINDS}))
        then = [i for i, (seen, _) in enumerate(history) if seen <= self.passes - self.lag]
        if not then:
            return []
        del history[:then[-1]]  # older views are never read again
        ghosts = [g for g in self.ghosts if (g["apiVersion"], g["kind"]) == kind and g["metadata"].get("namespace") == namespace
                  and (g["metadata"].get("labels") or {}).get(JOB_NAME_LABEL) == name]
        return copy.deepcopy([*history[0][1][kind], *ghosts])


# The restricted level allows adding this capability and no other (Pod Security Standards).
RESTRICTED_CAPABILITIES = {"NET_BIND_SERVICE"}
# The lines of pod_security's checker that the PSA wording below already says.
_WORDED = (".securityContext.privileged:", ".securityContext.capabilities.add:")


def pod_security_restricted(pod: Mapping[str, Any]) -> Optional[dict]:
    """Pod Security Admission enforcing `restricted:latest` on a pod: None, or its 403.

    Whether the pod is refused is decided by every control of the restricted
    level (the project's checker, tests/pod_security.py), never fewer. The
    message is k8s.io/pod-security-admission's wording (admission.go: `violates
    PodSecurity "<level>:<version>": <check> (<detail>), ...`; the checks under
    policy/) for the two checks a pod overlay trips most, privileged and added
    capabilities, and the checker's own line for any other. Other kinds pass.
    """
    if pod.get("kind") != "Pod":
        return None
    violations = restricted_violations(pod["spec"], pod["metadata"].get("annotations"))
    if not violations:
        return None
    failures = []
    containers = [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]
    privileged = [c["name"] for c in containers if (c.get("securityContext") or {}).get("privileged")]
    if privileged:
        failures.append(f"privileged ({_containers(privileged)} must not set securityContext.privileged=true)")
    added = {c["name"]: sorted(set(((c.get("securityContext") or {}).get("capabilities") or {}).get("add") or ())
                               - RESTRICTED_CAPABILITIES) for c in containers}
    added = {name: caps for name, caps in added.items() if caps}
    if added:
        caps = ", ".join(f'"{cap}"' for cap in sorted({cap for names in added.values() for cap in names}))
        failures.append(f"unrestricted capabilities ({_containers(list(added))} must not include {caps} in "
                        "securityContext.capabilities.add)")
    failures += [line for line in violations if not any(worded in line for worded in _WORDED)]
    return forbidden("pods", pod["metadata"]["name"], f'violates PodSecurity "restricted:latest": {", ".join(failures)}')


def _containers(names: list[str]) -> str:
    quoted = ", ".join(f'"{name}"' for name in names)
    return f"container {quoted}" if len(names) == 1 else f"containers {quoted}"


class FakeCluster:
    def __init__(self, *, kueue: bool = False, pod_security: str = "privileged",
                 validate: Optional[Callable[[Mapping[str, Any]], Optional[dict]]] = None,
                 served: Any = OPTIONAL, forbidden: Any = (), kueue_frameworks: Any = KUEUE_FRAMEWORKS) -> None:
        # Kueue's integrations.frameworks: the kinds its webhooks and controllers manage; a queued object of any
        # other kind is left alone, its queue label read by no one (kueue pkg/controller/jobframework/setup.go
        # SetupControllers enables only the configured integrations; their webhooks likewise).
        self.kueue_frameworks = frozenset(kueue_frameworks)
        # The optional (apiVersion, kind)s the API server serves, and those RBAC refuses the operator to create.
        self.served, self.forbidden = set(served), set(forbidden)
        # Admission, in the API server's order (k8s.io/apiserver pkg/admission): mutating webhooks change the
        # object (Kueue's), then validation of the object and the validating plugins (PSA) may refuse it.
        self.mutating: list[Callable[[dict], None]] = [self._kueue_webhook] if kueue else []
        self.admission = [check for check in (validate, pod_security_restricted if pod_security == "restricted"
                                              else None) if check is not None]
        self.objects: dict[ObjectRef, dict] = {}
        # Every write, and every 409 the API server answered ("already_exists", "conflict").
        self.writes: list[tuple[str, ObjectRef]] = []
        self.events: list[tuple[str, Event]] = []
        # The time the fake's scheduler, kubelet and API server stamp (a test moves it with its reconciles).
        self.now = EPOCH
        # Nodes whose kubelet no longer answers: nothing on them is ever confirmed stopped.
        self.lost_nodes: set[str] = set()
        self._uids = itertools.count(1)
        # etcd's revision: every write stamps the object it changes with the next one.
        self._revisions = itertools.count(1)
        # Children by (apiVersion, kind, namespace, job label): listing stays O(children), as a label index does.
        self._children: dict[tuple[str, str, str, str], set[ObjectRef]] = {}

    # -- ClusterClient ---------------------------------------------------
    def get_job(self, namespace: str, name: str) -> Optional[dict]:
        return self.get(ObjectRef(API_VERSION, KIND, namespace, name))

    def get(self, ref: ObjectRef) -> Optional[dict]:
        found = self.objects.get(ref)
        return copy.deepcopy(found) if found is not None else None

    def list_children(self, api_version: str, kind: str, namespace: str, job_name: str) -> list[dict]:
        refs = self._children.get((api_version, kind, namespace, job_name), set())
        # A test may delete objects behind the client's back: skip refs no longer stored.
        return [copy.deepcopy(self.objects[ref]) for ref in sorted(refs) if ref in self.objects]

    def list_objects(self, api_version, kind, namespace, *, label_selector="", field_selector=""):
        """A LIST with a selector: `key=value` pairs, or a bare `key` (the label exists); namespace "" is every
        namespace (k8s.io/apimachinery pkg/labels selector syntax)."""
        pairs = [pair.split("=", 1) for pair in (label_selector or field_selector).split(",") if pair]
        out = []
        for ref, obj in sorted(self.objects.items()):
            if (ref.api_version, ref.kind) != (api_version, kind) or namespace not in ("", ref.namespace):
                continue
            meta = obj["metadata"]
            fields = {"metadata.name": meta["name"]} if field_selector else meta.get("labels") or {}
            if all(pair[0] in fields if len(pair) == 1 else fields.get(pair[0]) == pair[1] for pair in pairs):
                out.append(copy.deepcopy(obj))
        return out

    def create(self, obj: Mapping[str, Any]) -> Optional[dict]:
        ref = ObjectRef.of(obj)
        existing = self.objects.get(ref)
        if existing is not None:
            # 409 AlreadyExists whatever the stored object is, Terminating included: a name is free only once
            # the object is removed (staging/src/k8s.io/apiserver/pkg/registry/generic/registry/store.go, Create).
            self.writes.append(("already_exists", ref))
            return already_exists(obj, copy.deepcopy(existing))
        stored = copy.deepcopy(dict(obj))
        for mutate in self.mutating:
            mutate(stored)
        for check in self.admission:
            status = check(stored)
            if status is not None:
                self.writes.append(("refused", ref))
                raise Refused.of(f"create {ref}", status["code"], status)
        stored["metadata"].setdefault("uid", f"uid-{next(self._uids)}")
        stored["metadata"].setdefault("generation", 1)
        stored["metadata"].setdefault("creationTimestamp", format_time(self.now))
        if ref.kind == "Pod":
            stored.setdefault("status", {"phase": "Pending"})
        self._stamp(stored)
        self.objects[ref] = stored
        job_name = (stored["metadata"].get("labels") or {}).get(JOB_NAME_LABEL)
        if job_name is not None:
            self._children.setdefault((ref.api_version, ref.kind, ref.namespace, job_name), set()).add(ref)
        self.writes.append(("create", ref))
        return copy.deepcopy(stored)

    def delete(self, ref: ObjectRef, *, grace: Optional[int] = None) -> None:
        """DELETE with propagationPolicy Background, as the client sends it (`grace` is kubectl's --grace-period).

        store.go Delete: a failed uid precondition is 409 Conflict (the real
        client reads it as "the object meant is gone"); then graceful deletion
        (BeforeDelete, k8s.io/apiserver pkg/registry/rest/delete.go) and the
        finalizers decide whether the object goes now or only gets its
        deletionTimestamp.
        """
        obj = self.objects.get(ref)
        if obj is None:
            return
        if ref.uid and obj["metadata"].get("uid") != ref.uid:
            self.writes.append(("conflict", ref))
            return
        self.writes.append(("delete", ref))
        self._delete(ref, grace)

    def patch(self, ref: ObjectRef, body: Mapping[str, Any]) -> None:
        """A JSON merge patch (RFC 7386; apiserver staging/src/k8s.io/apiserver/pkg/endpoints/handlers/patch.go)."""
        self.objects[ref] = self._stamp(merge_patch(self.objects[ref], body))
        self.writes.append(("patch", ref))
        self._finalized(ref)

    def patch_status(self, namespace: str, name: str, patch: Mapping[str, Any],
                     resource_version: Optional[str] = None) -> Optional[str]:
        """A merge patch of the status subresource; a resourceVersion in it is a precondition: another writer's
        change since is 409 Conflict (store.go GuaranteedUpdate, the object's resourceVersion compared)."""
        ref = ObjectRef(API_VERSION, KIND, namespace, name)
        job = self.objects[ref]
        if resource_version is not None and job["metadata"].get("resourceVersion") != resource_version:
            raise self._stale_status(ref)
        job["status"] = merge_patch(job.get("status") or {}, patch)
        self._stamp(job)
        self.writes.append(("patch_status", ref))
        return job["metadata"]["resourceVersion"]

    def _stale_status(self, ref: ObjectRef) -> Conflict:
        """The 409 of a status write planned from an older resourceVersion, recorded as a write that conflicted."""
        self.writes.append(("conflict", ref))
        return Conflict(f"patch {ref} status: the object has been modified; please apply your changes to the "
                        "latest version and try again")

    def patch_pod_status(self, ref: ObjectRef, status: Mapping[str, Any], resource_version: str) -> None:
        """A merge patch of a pod's status subresource (pods/status), as PodGC writes a lost pod Failed: only the
        status changes (pkg/registry/core/pod/strategy.go podStatusStrategy.PrepareForUpdate keeps the spec and
        metadata), and the resourceVersion is a precondition (409 Conflict on any write since); a pod gone is a
        404, which the client takes as done."""
        pod = self.objects.get(ref)
        if pod is None:
            return
        if pod["metadata"].get("resourceVersion") != resource_version:
            raise self._stale_status(ref)
        pod["status"] = merge_patch(pod.get("status") or {}, status)
        self._stamp(pod)
        self.writes.append(("patch_pod_status", ref))

    def post_event(self, job: Mapping[str, Any], event: Event) -> None:
        self.events.append((job["metadata"]["name"], event))

    def discover(self, namespaces: Any) -> ServedApis:
        """Discovery (/apis/<group>/<version>) and a SelfSubjectAccessReview of each served kind per namespace."""
        return ServedApis(served=frozenset(self.served), forbidden=frozenset(
            (namespace, *kind) for kind in self.served & self.forbidden for namespace in namespaces))

    # -- the API server's own bookkeeping ----------------------------------
    def _stamp(self, obj: dict) -> dict:
        obj["metadata"]["resourceVersion"] = str(next(self._revisions))
        return obj

    def _delete(self, ref: ObjectRef, grace: Optional[int]) -> None:
        obj = self.objects[ref]
        meta = obj["metadata"]
        grace = deletion_grace(obj) if grace is None else grace
        if meta.get("deletionTimestamp"):
            # A second delete may only shorten the grace (rest/delete.go BeforeDelete); grace 0 is the kubelet's
            # (or kubectl --force's) "stopped": the object goes once no finalizer holds it.
            if grace == 0:
                meta["deletionGracePeriodSeconds"] = 0
                self._finalized(ref)
            return
        if grace == 0 and not meta.get("finalizers"):
            self._remove(ref)
            return
        # deletionTimestamp is when the grace ends, not when the delete came (rest/delete.go, BeforeDelete).
        meta["deletionTimestamp"] = format_time(self.now + timedelta(seconds=grace))
        meta["deletionGracePeriodSeconds"] = grace
        self._stamp(obj)

    def _finalized(self, ref: ObjectRef) -> None:
        """An object marked for deletion goes once its grace is confirmed over and its last finalizer is removed
        (store.go, updateForGracefulDeletionAndFinalizers and Update's "deleteImmediately")."""
        obj = self.objects.get(ref)
        if obj is None:
            return
        meta = obj["metadata"]
        if meta.get("deletionTimestamp") and meta.get("deletionGracePeriodSeconds") == 0 and not meta.get("finalizers"):
            self._remove(ref)

    def _remove(self, ref: ObjectRef) -> None:
        obj = self.objects.pop(ref)
        job_name = (obj["metadata"].get("labels") or {}).get(JOB_NAME_LABEL)
        if job_name is not None:
            self._children.get((ref.api_version, ref.kind, ref.namespace, job_name), set()).discard(ref)

    # -- the test's side: the user, the kubelet, the garbage collector, Kueue --
    def _kueue_webhook(self, obj: dict) -> None:
        """Kueue's mutating webhooks on a queued object. A pod (kueue pkg/controller/jobs/pod/pod_webhook.go
        Default): the managed label, the admission gate and the finalizer kueue.x-k8s.io/managed. A PyTorchJob
        (jobframework ApplyDefaultForSuspend): suspended until its Workload is admitted."""
        if QUEUE_LABEL not in (obj["metadata"].get("labels") or {}):
            return
        if obj["kind"] == "Pod" and POD_FRAMEWORK in self.kueue_frameworks:
            obj["spec"].setdefault("schedulingGates", []).append({"name": ADMISSION_GATE})
            # With Topology Aware Scheduling: the index Kueue places by, copied from the label the annotation names.
            index_label = (obj["metadata"].get("annotations") or {}).get(POD_INDEX_LABEL_ANNOTATION)
            if index_label is not None:
                obj["metadata"]["labels"][POD_INDEX_LABEL] = obj["metadata"]["labels"].get(index_label, "")
            obj["metadata"].setdefault("finalizers", []).append(KUEUE_POD_FINALIZER)
            obj["metadata"]["labels"][KUEUE_MANAGED_LABEL] = "true"
        elif obj["kind"] == "PyTorchJob" and PYTORCHJOB_FRAMEWORK in self.kueue_frameworks:
            obj["spec"].setdefault("runPolicy", {})["suspend"] = True

    def admit(self, namespace: str = "default") -> None:
        """Kueue's scheduler admits every active Workload of the namespace (quota reserved, admitted), after its
        controllers made the missing ones; they then ungate the pods and unsuspend the PyTorchJobs (`kueue_sync`)
        (kueue pkg/scheduler/scheduler.go admit; pkg/workload/admissionchecks.go SyncAdmittedCondition)."""
        self.kueue_sync(namespace)
        for ref, obj in sorted(self.objects.items()):
            if (ref.api_version, ref.kind) == WORKLOAD and ref.namespace == namespace and _active(obj) \
                    and not obj["metadata"].get("deletionTimestamp") and not _workload_condition(obj, "Finished"):
                _set_workload_condition(obj, QUOTA_RESERVED, True, "QuotaReserved", "Quota reserved")
                _set_workload_condition(obj, "Admitted", True, "Admitted", "The workload is admitted")
                _set_workload_condition(obj, "Evicted", False, "Admitted", "")
                self._stamp(obj)
        self.kueue_sync(namespace)

    def kueue_sync(self, namespace: str = "default") -> None:
        """One pass of Kueue's pod-group and job controllers over the namespace (what Kueue does on its own,
        without the scheduler's admission, which `admit` plays)."""
        groups = sorted({(pod["metadata"].get("labels") or {}).get(POD_GROUP_LABEL) for pod in self.pods(namespace).values()
                         if (pod["metadata"].get("labels") or {}).get(KUEUE_MANAGED_LABEL) == "true"} - {None})
        for group in groups:
            self._sync_pod_group(namespace, group)
        for ref, obj in sorted(self.objects.items()):
            if ref.kind == "PyTorchJob" and ref.namespace == namespace and PYTORCHJOB_FRAMEWORK in self.kueue_frameworks \
                    and QUEUE_LABEL in (obj["metadata"].get("labels") or {}):
                self._sync_pytorchjob(ref, obj)

    def workload(self, name: str, namespace: str = "default") -> Optional[dict]:
        return self.objects.get(ObjectRef(*WORKLOAD, namespace, name))

    def _group_pods(self, namespace: str, group: str) -> list[ObjectRef]:
        return [ObjectRef("v1", "Pod", namespace, name) for name, pod in self.pods(namespace).items()
                if (pod["metadata"].get("labels") or {}).get(POD_GROUP_LABEL) == group]

    def _sync_pod_group(self, namespace: str, group: str) -> None:
        """The pod group reconciler (kueue pkg/controller/jobframework/reconciler.go ReconcileGenericJob, with
        pkg/controller/jobs/pod/pod_controller.go for a group), in its order."""
        refs = self._group_pods(namespace, group)
        pods = [self.objects[ref] for ref in refs]
        wl_ref = ObjectRef(*WORKLOAD, namespace, group)
        wl = self.objects.get(wl_ref)
        if wl is not None and _workload_condition(wl, "Finished"):
            # A finished Workload: finalizeJob (every pod of the group), then its own finalizer goes.
            self._finalize_pods(refs)
            self._drop_workload_finalizer(wl_ref)
            return
        if wl is not None and wl["metadata"].get("deletionTimestamp"):
            # "The workload is marked for deletion": Stop with StopReasonWorkloadDeleted deletes every pod of the
            # group, finished ones too, and, for a group, Finalize removes every pod's finalizer.
            for ref in refs:
                if ref in self.objects and not self.objects[ref]["metadata"].get("deletionTimestamp"):
                    self._delete(ref, None)
            self._finalize_pods(refs)
            self._drop_workload_finalizer(wl_ref)
            return
        if self._group_finished(pods):
            # Finished (pod_controller.go Finished): all succeeded, or none active and one not retriable in group;
            # active is any pod not Failed nor Succeeded (isPodTerminated), a lost node's pod still Running included;
            # the Workload is marked Finished (its quota released) and the pods finalized.
            if wl is not None:
                _set_workload_condition(wl, "Finished", True, "Succeeded", "Pods finished")
                _set_workload_condition(wl, QUOTA_RESERVED, False, "Finished", "Pods finished")
                self._stamp(wl)
                self._drop_workload_finalizer(wl_ref)
            self._finalize_pods(refs)
            return
        count = _group_count(pods)
        active = [ref for ref in refs if _runnable_or_succeeded(self.objects[ref])]
        inactive = [ref for ref in refs if not _runnable_or_succeeded(self.objects[ref])]
        if wl is None:
            # ConstructComposableWorkload: the inactive pods are finalized, and a Workload named after the group,
            # active, sized by the group's total count, owned by its pods.
            self._finalize_pods(inactive)
            if not active:
                return
            self.put({"apiVersion": WORKLOAD[0], "kind": WORKLOAD[1], "metadata": {
                "name": group, "namespace": namespace, "finalizers": [WORKLOAD_FINALIZER],
                "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": ref.name,
                                     "uid": self.objects[ref]["metadata"]["uid"]} for ref in active]},
                "spec": {"active": True, "podSets": [{"name": "main", "count": count}]},
                "status": {"conditions": [{"type": QUOTA_RESERVED, "status": "False", "reason": "Pending",
                                           "message": "waiting for quota"}]}})
            return
        # FindMatchingWorkloads: a failed pod is finalized only once a replacement exists (active plus inactive
        # beyond the Workload's count), the oldest-ended first; active pods beyond the count are finalized and
        # deleted, the newest first.
        wanted = ((wl.get("spec") or {}).get("podSets") or [{"count": count}])[0]["count"]
        finalizeable = min(len(inactive), len(inactive) + len(active) - wanted)
        if finalizeable > 0:
            inactive.sort(key=lambda ref: (KUEUE_POD_FINALIZER not in self.objects[ref]["metadata"].get("finalizers", ()),
                                           self.objects[ref]["metadata"]["creationTimestamp"]))
            self._finalize_pods(inactive[len(inactive) - finalizeable:])
        if len(active) > wanted:
            # sortActivePods: kept first are pods with Kueue's finalizer, then ungated ones, then the oldest; so a
            # lost node's pod, still Running with its finalizer, outranks its gated replacement, which goes
            # (removeExcessPods) until Kueue sees the old one Failed.
            active.sort(key=lambda ref: (KUEUE_POD_FINALIZER not in (self.objects[ref]["metadata"].get("finalizers") or ()),
                                         gated_by_kueue(self.objects[ref]),
                                         self.objects[ref]["metadata"]["creationTimestamp"]))
            for ref in active[wanted:]:
                self._finalize_pods([ref])
                if ref in self.objects and not self.objects[ref]["metadata"].get("deletionTimestamp"):
                    self._delete(ref, None)
        if not _active(wl):
            # Deactivated: the workload controller evicts it (WorkloadDeactivated), and the job reconciler's
            # "handle eviction" stops the group: Stop deletes each pod not already ended, gated or deleted, and
            # leaves every finalizer on (pod_controller.go Stop finalizes only for a deleted Workload); quota freed.
            self._evict_workload(wl, "Deactivated", "The workload is deactivated")
            for ref in refs:
                pod = self.objects.get(ref)
                if pod is not None and not pod["metadata"].get("deletionTimestamp") and not _finished(pod) \
                        and not gated_by_kueue(pod):
                    self._delete(ref, None)
            return
        if _workload_condition(wl, "Admitted"):
            # "Job admitted, unsuspending": Run ungates every gated pod of the group, replacements included.
            for ref in refs:
                pod = self.objects.get(ref)
                if pod is not None and gated_by_kueue(pod):
                    pod["spec"]["schedulingGates"] = [g for g in pod["spec"]["schedulingGates"]
                                                      if g["name"] != ADMISSION_GATE]
                    self._stamp(pod)

    def kueue_preempt(self, group: str, namespace: str = "default") -> None:
        """Kueue's scheduler preempts the group's Workload for a higher-priority one: Evicted (reason Preempted),
        its quota released and requeued; the job reconciler's "handle eviction" stops the group: each pod not
        already ended, gated or deleted gets TerminationTarget and a delete, and keeps its finalizer
        (pkg/scheduler/preemption/preemption.go; reconciler.go stopJob; pod_controller.go Stop)."""
        wl = self.objects[ObjectRef(*WORKLOAD, namespace, group)]
        self._evict_workload(wl, "Preempted", "Preempted to accommodate a higher priority Workload",
                             admitted_message="Preempted")
        for ref in self._group_pods(namespace, group):
            pod = self.objects[ref]
            if pod["metadata"].get("deletionTimestamp") or _finished(pod) or gated_by_kueue(pod):
                continue
            pod["status"].setdefault("conditions", []).append({
                "type": "TerminationTarget", "status": "True", "reason": "WorkloadEvicted",
                "message": "Preempted to accommodate a higher priority Workload", "lastTransitionTime": format_time(self.now)})
            self._delete(ref, None)

    def _evict_workload(self, wl: dict, reason: str, message: str, *, admitted_message: Optional[str] = None) -> None:
        """The Workload evicted: Evicted=True (`reason`), its quota released (QuotaReserved=False, Admitted=False,
        reason Pending) (pkg/workload/workload.go SetEvictedCondition, UnsetQuotaReservationWithCondition)."""
        _set_workload_condition(wl, "Evicted", True, reason, message)
        _set_workload_condition(wl, QUOTA_RESERVED, False, "Pending", message)
        _set_workload_condition(wl, "Admitted", False, "Pending", admitted_message if admitted_message is not None else message)
        self._stamp(wl)

    def _group_finished(self, pods: list[dict]) -> bool:
        if not pods:
            return False
        succeeded = sum(1 for pod in pods if pod["status"].get("phase") == "Succeeded")
        unretriable = any((pod["metadata"].get("annotations") or {}).get(RETRIABLE_IN_GROUP_ANNOTATION) == "false"
                          for pod in pods)
        return succeeded == _group_count(pods) or (unretriable and all(_finished(pod) for pod in pods))

    def _sync_pytorchjob(self, ref: ObjectRef, job: dict) -> None:
        """The PyTorchJob reconciler (jobframework/reconciler.go): a Workload labelled with the job's uid, made if
        missing; evicted and the job suspended while it is inactive; an admitted one unsuspends the job, whoever
        suspended it ("Job admitted, unsuspending")."""
        uid = job["metadata"]["uid"]
        found = [r for r, o in self.objects.items() if (r.api_version, r.kind) == WORKLOAD and r.namespace == ref.namespace
                 and (o["metadata"].get("labels") or {}).get(JOB_UID_LABEL) == uid]
        if not found:
            self.put({"apiVersion": WORKLOAD[0], "kind": WORKLOAD[1], "metadata": {
                "name": f"pytorchjob-{ref.name}-{uid[-5:]}", "namespace": ref.namespace,
                "labels": {JOB_UID_LABEL: uid, JOB_NAME_LABEL: (job["metadata"].get("labels") or {}).get(JOB_NAME_LABEL, "")},
                "ownerReferences": [{"apiVersion": ref.api_version, "kind": ref.kind, "name": ref.name, "uid": uid,
                                     "controller": True}]},
                "spec": {"active": True},
                "status": {"conditions": [{"type": QUOTA_RESERVED, "status": "False", "reason": "Pending",
                                           "message": "waiting for quota"}]}})
            return
        wl = self.objects[found[0]]
        run_policy = job["spec"].setdefault("runPolicy", {})
        if not _active(wl):
            self._evict_workload(wl, "Deactivated", "The workload is deactivated")
            if not run_policy.get("suspend"):
                run_policy["suspend"] = True
                self._stamp(job)
        elif _workload_condition(wl, "Admitted") and run_policy.get("suspend"):
            run_policy["suspend"] = False
            self._stamp(job)

    def _finalize_pods(self, refs: list[ObjectRef]) -> None:
        for ref in refs:
            if ref in self.objects and KUEUE_POD_FINALIZER in (self.objects[ref]["metadata"].get("finalizers") or ()):
                self.remove_finalizer(ref.name, KUEUE_POD_FINALIZER, namespace=ref.namespace)

    def _drop_workload_finalizer(self, ref: ObjectRef) -> None:
        if ref in self.objects:
            self.remove_finalizer(ref.name, WORKLOAD_FINALIZER, kind=WORKLOAD[1], namespace=ref.namespace)

    def put(self, obj: Mapping[str, Any]) -> None:
        """An object another controller made (a Kueue Workload, Kubeflow's pods): listed by the job label it carries,
        as a label selector finds it."""
        ref = ObjectRef.of(obj)
        self.objects[ref] = self._stamp(copy.deepcopy(dict(obj)))
        job_name = (obj["metadata"].get("labels") or {}).get(JOB_NAME_LABEL)
        if job_name is not None:
            self._children.setdefault((ref.api_version, ref.kind, ref.namespace, job_name), set()).add(ref)

    def delete_job(self, name: str, namespace: str = "default") -> dict:
        """kubectl delete btj, with no operator running to see it: the job goes at once unless a finalizer holds
        it, then it only gets its deletionTimestamp (store.go Delete, as for any object: `_delete`); what it
        owns stays until `collect_garbage`. Nobody hears of it: an operator that was down, or whose watch lost
        the DELETED event in a relist gap, learns of it only from what it lists later. Returns the job as it was."""
        ref = ObjectRef(API_VERSION, KIND, namespace, name)
        job = copy.deepcopy(self.objects[ref])
        self._delete(ref, None)
        return job

    def collect_garbage(self) -> list[ObjectRef]:
        """The garbage collector's pass, some time after an owner went: every object whose owner references
        all name uids that no longer exist is deleted in the background, gracefully (its pods Terminating for
        their grace), never by name: an owner re-created under the same name has another uid and owns nothing
        of the old one's (pkg/controller/garbagecollector/garbagecollector.go, attemptToDeleteItem; the graph
        is keyed by uid in graph.go)."""
        uids = {obj["metadata"].get("uid") for obj in self.objects.values()}
        orphans = [ref for ref, obj in sorted(self.objects.items())
                   if (owners := obj["metadata"].get("ownerReferences"))
                   and not any(owner.get("uid") in uids for owner in owners)
                   and not obj["metadata"].get("deletionTimestamp")]
        for ref in orphans:
            self._delete(ref, None)
        return orphans

    def apply_job(self, manifest: Mapping[str, Any]) -> dict:
        """kubectl apply: store or update the job, bumping generation when the spec changes."""
        ref = ObjectRef.of(manifest)
        old = self.objects.get(ref)
        job = copy.deepcopy(dict(manifest))
        meta = job.setdefault("metadata", {})
        if old is None:
            meta.setdefault("uid", f"uid-{next(self._uids)}")
            meta["generation"] = 1
            # The API server stamps every new object (k8s.io/apiserver pkg/registry/rest/create.go,
            # FillObjectMetaSystemFields).
            meta.setdefault("creationTimestamp", format_time(self.now))
        else:
            meta["uid"] = old["metadata"]["uid"]
            meta["creationTimestamp"] = old["metadata"]["creationTimestamp"]
            meta["generation"] = old["metadata"]["generation"] + (old.get("spec") != job.get("spec"))
            job["status"] = old.get("status") or {}
        self.objects[ref] = self._stamp(job)
        return copy.deepcopy(job)

    def pods(self, namespace: str = "default") -> dict[str, dict]:
        return {r.name: o for r, o in sorted(self.objects.items()) if r.kind == "Pod" and r.namespace == namespace}

    def kinds(self, namespace: str = "default") -> list[str]:
        return sorted(r.kind for r in self.objects if r.namespace == namespace and r.kind != KIND)

    def set_pod(self, name: str, phase: str, *, namespace: str = "default", ready: bool = False, **status: Any) -> None:
        pod = self.objects[ObjectRef("v1", "Pod", namespace, name)]
        conditions = list(status.pop("conditions", []))
        conditions.append({"type": "Ready", "status": "True" if ready else "False"})
        pod["status"] = {"phase": phase, "conditions": conditions, **status}
        self._stamp(pod)

    def run_all(self, namespace: str = "default") -> None:
        for name in self.pods(namespace):
            self.set_pod(name, "Running", namespace=namespace, ready=True)

    def place(self, name: str, node: str, *, namespace: str = "default") -> None:
        """The scheduler binds the pod to `node` (spec.nodeName)."""
        self.objects[ObjectRef("v1", "Pod", namespace, name)]["spec"]["nodeName"] = node

    def exit_pod(self, name: str, code: int, *, namespace: str = "default", message: str = "") -> None:
        # The kubelet records when the container ended (pkg/kubelet/kuberuntime, toKubeContainerStatus FinishedAt).
        terminated = {"exitCode": code, "reason": "Completed" if code == 0 else "Error", "message": message,
                      "finishedAt": format_time(self.now)}
        self.set_pod(
            name, "Succeeded" if code == 0 else "Failed", namespace=namespace,
            containerStatuses=[{"name": "trainer", "state": {"terminated": terminated}}],
        )

    def evict_pod(self, name: str, *, namespace: str = "default") -> None:
        """The kubelet's node-pressure eviction: the pod Failed, reason Evicted, and DisruptionTarget
        TerminationByKubelet (pkg/kubelet/eviction/eviction_manager.go evictPod; the condition from
        pkg/apis/core/types.go PodReasonTerminationByKubelet)."""
        self.set_pod(name, "Failed", namespace=namespace, reason="Evicted",
                     message="The node was low on resource: memory.",
                     conditions=[disruption_target("TerminationByKubelet", "The node was low on resource: memory.", self.now)])

    def reject_pod(self, name: str, reason: str, message: str, *, node: str = "node-1",
                   namespace: str = "default") -> None:
        """The kubelet on `node` refuses to start the pod (its admit handlers: not enough of a device, the device
        plugin not registered yet after a reboot, node affinity, a node shutting down): Failed with that reason
        and "Pod was rejected: <message>", no container ever run (pkg/kubelet/kubelet.go HandlePodAdditions,
        canAdmitPod then rejectPod)."""
        pod = self.objects[ObjectRef("v1", "Pod", namespace, name)]
        pod["spec"]["nodeName"] = node
        pod["status"] = {"phase": "Failed", "reason": reason, "message": f"Pod was rejected: {message}"}
        self._stamp(pod)

    def preempt(self, name: str, *, namespace: str = "default") -> None:
        """The scheduler preempts the pod for a higher-priority one: DisruptionTarget PreemptionByScheduler, then a
        graceful delete (pkg/scheduler/framework/preemption/preemption.go, prepareCandidate)."""
        self._disrupt(name, namespace, "PreemptionByScheduler", "default-scheduler: preempting to accommodate a "
                                                                "higher priority pod")

    def evict(self, name: str, *, namespace: str = "default") -> None:
        """An eviction through the Eviction API (kubectl drain): DisruptionTarget EvictionByEvictionAPI, then a
        graceful delete (pkg/registry/core/pod/storage/eviction.go, addConditionAndDeletePod)."""
        self._disrupt(name, namespace, "EvictionByEvictionAPI", "Eviction API: evicting")

    def _disrupt(self, name: str, namespace: str, reason: str, message: str) -> None:
        ref = ObjectRef("v1", "Pod", namespace, name)
        self.objects[ref]["status"].setdefault("conditions", []).append(disruption_target(reason, message, self.now))
        self._delete(ref, None)

    def remove_finalizer(self, name: str, finalizer: str, *, kind: str = "Pod", namespace: str = "default") -> None:
        """The controller that put `finalizer` on the object takes it off (a patch; the object goes if it was
        marked for deletion and nothing else holds it)."""
        ref = next(r for r in self.objects if (r.kind, r.namespace, r.name) == (kind, namespace, name))
        meta = self.objects[ref]["metadata"]
        meta["finalizers"] = [f for f in meta.get("finalizers") or () if f != finalizer]
        self._stamp(self.objects[ref])
        self._finalized(ref)

    def kubelet_confirms(self) -> list[str]:
        """Each kubelet still reachable finishes stopping the pods marked for deletion on its node (the trainer
        exited within its grace) and confirms with a delete of grace 0 (pkg/kubelet/status/status_manager.go,
        canBeDeleted then Delete with GracePeriodSeconds 0); a lost node's pods stay. A pod it stopped is Failed
        first, as the kubelet puts a deleted pod in a terminal phase before its last delete (pkg/kubelet/kubelet_pods.go
        generateAPIPodStatus; status_manager.go), so a finalizer that holds it holds a Failed pod. Returns the pods
        gone."""
        marked = [ref for ref, obj in sorted(self.objects.items()) if ref.kind == "Pod"
                  and obj["metadata"].get("deletionTimestamp") and obj["spec"].get("nodeName") not in self.lost_nodes]
        for ref in marked:
            status = self.objects[ref]["status"]
            if self.objects[ref]["spec"].get("nodeName") and status.get("phase") not in ("Failed", "Succeeded"):
                status["phase"] = "Failed"
            self._delete(ref, 0)
        return [ref.name for ref in marked if ref not in self.objects]

    def _pending(self, name: str, namespace: str, conditions: list[dict], **status: Any) -> dict:
        pod = self.objects[ObjectRef("v1", "Pod", namespace, name)]
        pod["status"] = {"phase": "Pending", "conditions": conditions, **status}
        return pod

    def unschedulable(self, name: str, message: str, *, namespace: str = "default") -> None:
        """The scheduler found no node: PodScheduled=False, reason Unschedulable, its FitError as the message
        (kubernetes pkg/scheduler/schedule_one.go handleSchedulingFailure; the message from FitError.Error in
        pkg/scheduler/framework/types.go, "0/8 nodes are available: 8 Insufficient nvidia.com/gpu.")."""
        self._pending(name, namespace, [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                         "message": message, "lastTransitionTime": format_time(self.now)}])

    def _waiting(self, name: str, namespace: str, node: str, reason: str, message: Optional[str]) -> None:
        """The kubelet on `node` holds the trainer container in state.waiting {reason, message}, the image as the
        spec names it (pkg/kubelet/kuberuntime/kuberuntime_container.go startContainer, pkg/kubelet/kubelet_pods.go
        convertToAPIContainerStatuses); the pod is scheduled and stays Pending."""
        pod = self.objects[ObjectRef("v1", "Pod", namespace, name)]
        pod["spec"]["nodeName"] = node
        container = pod["spec"]["containers"][0]
        waiting = {"reason": reason, **({"message": message} if message else {})}
        self._pending(name, namespace, [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": format_time(self.now)},
            {"type": "PodReadyToStartContainers", "status": "False"},
            {"type": "Ready", "status": "False", "reason": "ContainersNotReady",
             "message": f"containers with unready status: [{container['name']}]"},
        ], containerStatuses=[{"name": container["name"], "image": container["image"], "ready": False,
                               "restartCount": 0, "state": {"waiting": waiting}}])

    def pull_fails(self, name: str, *, backoff: bool, namespace: str = "default", node: str = "node-1") -> None:
        """The image cannot be pulled: ErrImagePull with the runtime's error, then ImagePullBackOff with
        'Back-off pulling image "<image>"' (pkg/kubelet/images/image_manager.go EnsureImageExists)."""
        image = self.objects[ObjectRef("v1", "Pod", namespace, name)]["spec"]["containers"][0]["image"]
        if backoff:
            self._waiting(name, namespace, node, "ImagePullBackOff", f'Back-off pulling image "{image}"')
        else:
            self._waiting(name, namespace, node, "ErrImagePull",
                          "rpc error: code = NotFound desc = failed to pull and unpack image: not found")

    def config_missing(self, name: str, kind: str, missing: str, *, namespace: str = "default",
                       node: str = "node-1") -> None:
        """An env source that does not exist: CreateContainerConfigError, '<kind> "<name>" not found' (kind
        "secret" or "configmap"; pkg/kubelet/kubelet_pods.go makeEnvironmentVariables, the kubelet's object cache)."""
        self._waiting(name, namespace, node, "CreateContainerConfigError", f'{kind} "{missing}" not found')

    def creating(self, name: str, *, namespace: str = "default", node: str = "node-1") -> None:
        """Scheduled, its volumes not mounted yet: the container waits as ContainerCreating with no message; the
        FailedMount/FailedAttachVolume reasons are events only (pkg/kubelet/kubelet_pods.go,
        pkg/kubelet/volumemanager/volume_manager.go WaitForAttachAndMount)."""
        self._waiting(name, namespace, node, "ContainerCreating", None)

    def lose_node(self, node: str, *, namespace: str = "default") -> None:
        """A node goes unreachable; once its pods' toleration of the unreachable taint is over (300 s by default,
        DefaultTolerationSeconds), the taint manager deletes them: DisruptionTarget DeletionByTaintManager, a
        graceful delete (pkg/controller/tainteviction/taint_eviction.go, addConditionAndDeletePod). With no kubelet
        to confirm, they stay Terminating for good, Ready=False (the node lifecycle controller, MarkPodsNotReady),
        until `delete_node` or `out_of_service` lets PodGC remove them."""
        self.lost_nodes.add(node)
        for ref, pod in sorted(self.objects.items()):
            if ref.kind == "Pod" and ref.namespace == namespace and pod["spec"].get("nodeName") == node \
                    and not pod["metadata"].get("deletionTimestamp"):
                conditions = [c for c in pod["status"].get("conditions") or () if c.get("type") != "Ready"]
                pod["status"]["conditions"] = [*conditions, {"type": "Ready", "status": "False"}, disruption_target(
                    "DeletionByTaintManager", "Taint manager: deleting due to NoExecute taint", self.now)]
                self._delete(ref, None)

    def delete_node(self, node: str) -> None:
        """The Node object is deleted: PodGC force-deletes every pod bound to it, DisruptionTarget DeletionByPodGC
        (gc_controller.go gcOrphaned)."""
        self.lost_nodes.discard(node)
        self._pod_gc(node, disruption_target("DeletionByPodGC", "PodGC: node no longer exists", self.now),
                     terminating_only=False)

    def out_of_service(self, node: str) -> None:
        """An admin taints the node node.kubernetes.io/out-of-service: PodGC force-deletes only its Terminating
        pods (those with a deletionTimestamp), adding no condition (gc_controller.go gcTerminating,
        markFailedAndDeletePod); the node stays NotReady, its other pods stay."""
        self._pod_gc(node, None, terminating_only=True)

    def _pod_gc(self, node: str, condition: Optional[dict], *, terminating_only: bool) -> None:
        """PodGC marks each pod not already Succeeded or Failed as Failed (with `condition`, if any) and deletes it
        with grace 0 (pkg/controller/podgc/gc_controller.go markFailedAndDeletePodWithCondition); a finalizer still
        holds it."""
        for ref, pod in sorted(self.objects.items()):
            if ref.kind != "Pod" or pod["spec"].get("nodeName") != node:
                continue
            if terminating_only and not pod["metadata"].get("deletionTimestamp"):
                continue
            if pod["status"].get("phase") not in ("Succeeded", "Failed"):
                pod["status"]["phase"] = "Failed"
                if condition is not None:
                    pod["status"].setdefault("conditions", []).append(dict(condition))
            self._delete(ref, 0)
