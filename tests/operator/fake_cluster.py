"""An in-memory ClusterClient: the one fake the tests allow (a stand-in for our own thin client).

It keeps objects in a dict, answers create/list/delete/patch as the API
server would for these calls (409 on a duplicate name, 404 ignored on
delete, JSON merge patch), and records every write so a test can assert that
a second reconcile wrote nothing. Helpers let a test play the kubelet
(move a pod to Running, Failed, evicted or Succeeded), the garbage collector
(`delete_job` removes what the job owns) and, with `kueue=True`, Kueue: its
webhooks gate every queued pod and suspend every queued PyTorchJob on
creation, and `admit` lifts both, as Kueue's controller does. With
`pod_security="restricted"` it refuses a pod as Pod Security Admission
does, and `validate` refuses what a test says is invalid, each with the
Status body the API server sends (`forbidden`, `invalid`), read back by
the real client's own `Refused.of`. The scheduler's and the kubelet's words
for a pod that waits (`unschedulable`, `pull_fails`, `config_missing`,
`creating`) and a node lost under its pods (`lose_node`) are written where
Kubernetes writes them, each citing the upstream file; `now` is the clock
they read.
"""

from __future__ import annotations

import copy
import itertools
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Mapping, Optional

from brain_operator.cluster import ObjectRef, Refused
from brain_operator.discovery import OPTIONAL, ServedApis
from brain_operator.events import Event
from brain_operator.names import JOB_NAME_LABEL
from brain_operator.schedulers import ADMISSION_GATE, QUEUE_LABEL
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
    def __init__(self, *, graceful_pod_deletion: bool = False, kueue: bool = False, pod_security: str = "privileged",
                 validate: Optional[Callable[[Mapping[str, Any]], Optional[dict]]] = None,
                 served: Any = OPTIONAL, forbidden: Any = ()) -> None:
        self.kueue = kueue
        # The optional (apiVersion, kind)s the API server serves, and those RBAC refuses the operator to create.
        self.served, self.forbidden = set(served), set(forbidden)
        # Admission, in the API server's order: validation of the object, then the admission plugins (PSA).
        self.admission = [check for check in (validate, pod_security_restricted if pod_security == "restricted"
                                              else None) if check is not None]
        self.objects: dict[ObjectRef, dict] = {}
        self.writes: list[tuple[str, ObjectRef]] = []
        self.events: list[tuple[str, Event]] = []
        # A real pod lingers with a deletionTimestamp until the kubelet stops it.
        self.graceful_pod_deletion = graceful_pod_deletion
        # The time the fake's scheduler, kubelet and API server stamp (a test moves it with its reconciles).
        self.now = EPOCH
        self._uids = itertools.count(1)
        # Children by (apiVersion, kind, namespace, job label): listing stays O(children), as a label index does.
        self._children: dict[tuple[str, str, str, str], set[ObjectRef]] = {}

    # -- ClusterClient ---------------------------------------------------
    def get_job(self, namespace: str, name: str) -> Optional[dict]:
        found = self.objects.get(ObjectRef(API_VERSION, KIND, namespace, name))
        return copy.deepcopy(found) if found is not None else None

    def list_children(self, api_version: str, kind: str, namespace: str, job_name: str) -> list[dict]:
        refs = self._children.get((api_version, kind, namespace, job_name), set())
        # A test may delete objects behind the client's back: skip refs no longer stored.
        return [copy.deepcopy(self.objects[ref]) for ref in sorted(refs) if ref in self.objects]

    def list_objects(self, api_version, kind, namespace, *, label_selector="", field_selector=""):
        wanted = dict(pair.split("=", 1) for pair in (label_selector or field_selector).split(",") if pair)
        out = []
        for ref, obj in sorted(self.objects.items()):
            if (ref.api_version, ref.kind, ref.namespace) != (api_version, kind, namespace):
                continue
            meta = obj["metadata"]
            fields = {"metadata.name": meta["name"]} if field_selector else meta.get("labels") or {}
            if all(fields.get(k) == v for k, v in wanted.items()):
                out.append(copy.deepcopy(obj))
        return out

    def create(self, obj: Mapping[str, Any]) -> bool:
        ref = ObjectRef.of(obj)
        if ref in self.objects:
            return False
        for check in self.admission:
            status = check(obj)
            if status is not None:
                self.writes.append(("refused", ref))
                raise Refused.of(f"create {ref}", status["code"], status)
        stored = copy.deepcopy(dict(obj))
        if self.kueue and QUEUE_LABEL in (stored["metadata"].get("labels") or {}):
            self._kueue_webhook(stored)
        stored["metadata"].setdefault("uid", f"uid-{next(self._uids)}")
        stored["metadata"].setdefault("generation", 1)
        # As for a job (apply_job): the API server stamps every object it creates.
        stored["metadata"].setdefault("creationTimestamp", format_time(self.now))
        if ref.kind == "Pod":
            stored.setdefault("status", {"phase": "Pending"})
        self.objects[ref] = stored
        job_name = (stored["metadata"].get("labels") or {}).get(JOB_NAME_LABEL)
        if job_name is not None:
            self._children.setdefault((ref.api_version, ref.kind, ref.namespace, job_name), set()).add(ref)
        self.writes.append(("create", ref))
        return True

    def delete(self, ref: ObjectRef) -> None:
        if ref not in self.objects:
            return
        if ref.uid and self.objects[ref]["metadata"].get("uid") != ref.uid:
            return  # the uid precondition fails: the object meant is gone, another of its name stays
        self.writes.append(("delete", ref))
        if self.graceful_pod_deletion and ref.kind == "Pod":
            self._mark_deleted(self.objects[ref])
        else:
            del self.objects[ref]

    def patch(self, ref: ObjectRef, body: Mapping[str, Any]) -> None:
        self.objects[ref] = merge_patch(self.objects[ref], body)
        self.writes.append(("patch", ref))

    def patch_status(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        ref = ObjectRef(API_VERSION, KIND, namespace, name)
        job = self.objects[ref]
        job["status"] = merge_patch(job.get("status") or {}, patch)
        self.writes.append(("patch_status", ref))

    def post_event(self, job: Mapping[str, Any], event: Event) -> None:
        self.events.append((job["metadata"]["name"], event))

    def discover(self, namespaces: Any) -> ServedApis:
        """Discovery (/apis/<group>/<version>) and a SelfSubjectAccessReview of each served kind per namespace."""
        return ServedApis(served=frozenset(self.served), forbidden=frozenset(
            (namespace, *kind) for kind in self.served & self.forbidden for namespace in namespaces))

    # -- the test's side: the user, the kubelet, the garbage collector, Kueue --
    def _kueue_webhook(self, obj: dict) -> None:
        if obj["kind"] == "Pod":
            obj["spec"].setdefault("schedulingGates", []).append({"name": ADMISSION_GATE})
            obj["metadata"].setdefault("finalizers", []).append("kueue.x-k8s.io/managed")
            obj["metadata"]["labels"]["kueue.x-k8s.io/managed"] = "true"
        elif obj["kind"] == "PyTorchJob":
            obj["spec"].setdefault("runPolicy", {})["suspend"] = True

    def admit(self, namespace: str = "default") -> None:
        """Kueue admits everything queued: ungates the pods, unsuspends the PyTorchJobs."""
        for ref, obj in self.objects.items():
            if ref.namespace != namespace:
                continue
            if ref.kind == "Pod":
                gates = [g for g in obj["spec"].get("schedulingGates", []) if g["name"] != ADMISSION_GATE]
                obj["spec"]["schedulingGates"] = gates
            elif ref.kind == "PyTorchJob":
                obj["spec"]["runPolicy"]["suspend"] = False

    def put(self, obj: Mapping[str, Any]) -> None:
        """An object another controller made (a Kueue Workload, Kubeflow's pods): listed by the job label it carries,
        as a label selector finds it."""
        ref = ObjectRef.of(obj)
        self.objects[ref] = copy.deepcopy(dict(obj))
        job_name = (obj["metadata"].get("labels") or {}).get(JOB_NAME_LABEL)
        if job_name is not None:
            self._children.setdefault((ref.api_version, ref.kind, ref.namespace, job_name), set()).add(ref)

    def delete_job(self, name: str, namespace: str = "default") -> dict:
        """kubectl delete btj: the job goes, and the garbage collector takes everything it owns."""
        job = self.objects.pop(ObjectRef(API_VERSION, KIND, namespace, name))
        uid = job["metadata"]["uid"]
        for ref in [r for r, o in self.objects.items() if any(w.get("uid") == uid for w in o["metadata"].get("ownerReferences", []))]:
            del self.objects[ref]
        return job

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
        self.objects[ref] = job
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
        self.set_pod(name, "Failed", namespace=namespace, reason="Evicted",
                     message="The node was low on resource: memory.")

    def _mark_deleted(self, pod: dict) -> None:
        """Graceful deletion: deletionTimestamp is when the grace ends, not when the delete came
        (k8s.io/apiserver pkg/registry/rest/delete.go, BeforeDelete)."""
        grace = pod["spec"].get("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS)
        pod["metadata"]["deletionTimestamp"] = format_time(self.now + timedelta(seconds=grace))
        pod["metadata"]["deletionGracePeriodSeconds"] = grace

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
        """A node goes unreachable: the taint manager deletes its pods (DisruptionTarget DeletionByTaintManager,
        pkg/controller/tainteviction/taint_eviction.go), and with no kubelet to confirm they stay Terminating;
        only PodGC, once the Node is gone, would remove them (pkg/controller/podgc/gc_controller.go)."""
        for pod in self.pods(namespace).values():
            if pod["spec"].get("nodeName") == node and not pod["metadata"].get("deletionTimestamp"):
                pod["status"].setdefault("conditions", []).append(
                    {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager",
                     "message": "Taint manager: deleting due to NoExecute taint",
                     "lastTransitionTime": format_time(self.now)})
                self._mark_deleted(pod)

    def forget_pending_deletions(self) -> None:
        """The kubelet finished stopping every pod marked for deletion."""
        for ref in [r for r, o in self.objects.items() if o["metadata"].get("deletionTimestamp")]:
            del self.objects[ref]
