"""The real kopf operator against kmock (issues 14 and 17): watches, indexes and API faults.

kmock emulates the Kubernetes API over HTTP; the operator runs in-process
with the real KubernetesClient. `FaultyEmulator` answers a duplicate create
as the API server does (409 AlreadyExists) and injects faults: an answer
instead of the call, or an error after the call was carried out.
"""

import asyncio
import contextlib
import json
import re
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Optional

import aiohttp.web
import kmock
import kopf
import pytest
from fake_cluster import forbidden, invalid
from test_handlers import NS, VERBS, Emulator, first_event, manifest, pod_named, serve_resources

from brain_operator import handlers
from brain_operator.cluster.api import ApiUnavailable, Conflict, Refused
from brain_operator.cluster.client import CALL_DEADLINE_SECONDS, KubernetesClient
from brain_operator.objects.refs import ObjectRef
from brain_operator.objects.names import JOB_NAME_LABEL
from brain_operator.spec import API_VERSION, PLURAL, OperatorDefaults
from brain_operator.status.waiting import STUCK_TERMINATING, TERMINATING_MARGIN_SECONDS
from brain_trainer.contract import format_time

JOBS = f"/apis/{API_VERSION}/namespaces/{NS}/{PLURAL}"
PODS = f"/api/v1/namespaces/{NS}/pods"
MERGE = {"Content-Type": "application/merge-patch+json"}
CONVERGED_WITHIN = 5.0


@dataclass
class Fault:
    method: str
    path: str  # a regular expression the request's path must match in full
    status: int
    times: int = 1
    after: bool = False  # carry the call out, then answer the error
    retry_after: Optional[str] = None
    body: Optional[dict] = None  # the Status object answered; an InternalError's by default


class FaultyEmulator(Emulator):
    def __attrs_post_init__(self):
        super().__attrs_post_init__()
        self.faults = []
        self.served = []

    def _take(self, request):
        for fault in self.faults:
            if fault.times and request.method == fault.method and re.fullmatch(fault.path, request.url.path):
                fault.times -= 1
                self.served.append((fault.method, request.url.path, fault.status))
                return fault
        return None

    async def _handle(self, request):
        if request.action == kmock.action.CREATE and isinstance(request.data, dict):
            # The API server gives every object a uid (kmock does not); failure accounting relies on it.
            request.data.setdefault("metadata", {}).setdefault("uid", str(uuid.uuid4()))
        fault = self._take(request)
        if fault is not None and not fault.after:
            return self._status(fault)
        response = await super()._handle(request)
        return self._status(fault) if fault is not None else response

    @staticmethod
    def _status(fault):
        headers = {"Retry-After": fault.retry_after} if fault.retry_after else {}
        body = fault.body or {"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": fault.status,
                              "reason": "InternalError", "message": "injected"}
        return aiohttp.web.json_response(body, status=fault.status, headers=headers)

    async def _render_error(self, exc):
        response = await super()._render_error(exc)
        if getattr(exc, "status", None) == 409:  # kmock's duplicate name; the API server's reason is AlreadyExists
            body = json.loads(response.body)
            return aiohttp.web.json_response({**body, "reason": "AlreadyExists"}, status=409)
        return response


@contextlib.asynccontextmanager
async def operator(tmp_path, monkeypatch, *, spec=None, kueue=False, pytorchjob=False, before=(), job=True,
                   kueue_version="v1beta2", emulator=FaultyEmulator, **client_options):
    """kmock serving our resources, and the kopf operator running against it; yields (kmock, waits asked).

    The job's spec takes `spec`'s keys; `kueue` serves Kueue's Workload API, which the operator's discovery must
    see (and be allowed to list) before it runs a queued job. `before` are (path, object)s already there when
    the operator starts; without `job` no job is created; `pytorchjob` serves Kubeflow's PyTorchJob; `emulator`:
    a FaultyEmulator that serves more."""
    async with emulator() as km, kmock.Server(km):
        serve_resources(km, tmp_path, monkeypatch)
        if kueue:
            serve_kueue(km, kueue_version)
        if pytorchjob:
            km.resources["kubeflow.org/v1/pytorchjobs"] = kmock.ResourceInfo(kind="PyTorchJob", namespaced=True,
                                                                             verbs=VERBS)
        for path, body in before:
            assert (await km.post(path, json=body)).status == 200
        waits = []

        def sleep(seconds):  # the client's retry waits, recorded and really waited
            waits.append(seconds)
            time.sleep(seconds)

        client = await asyncio.to_thread(KubernetesClient, sleep=sleep, **client_options)
        settings = kopf.OperatorSettings()
        settings.scanning.disabled = True
        stop = asyncio.Event()
        task = asyncio.create_task(kopf.operator(
            settings=settings, standalone=True, namespaces=[NS], stop_flag=stop,
            memo=kopf.Memo(context=handlers.Context(client=client, defaults=OperatorDefaults(image="img:1"))),
        ))
        try:
            if job:
                await create_demo(km, spec)
            yield km, waits
        finally:
            for session in km.clients:  # the test's kept-alive connections, else kopf waits 5 s for their handlers
                await session.close()
            stop.set()
            await asyncio.wait_for(task, 30)


async def create_demo(km, spec):
    """The demo job created; the operator has made its two pods and said Pending."""
    created = await km.post(JOBS, json=manifest(meta={"uid": "uid-1", "generation": 1, "resourceVersion": "1"},
                                                **(spec or {})))
    assert created.status == 200
    await first_event(km, PODS, pod_named("demo-worker-0"))
    await first_event(km, PODS, pod_named("demo-worker-1"))
    await first_event(km, JOBS, lambda o: (o.get("status") or {}).get("phase") == "Pending")


def serve_kueue(km, version="v1beta2"):
    """Kueue's Workload API served (at `version`), and every SelfSubjectAccessReview answered allowed (kmock would
    echo the review back without a status)."""
    km.resources[f"kueue.x-k8s.io/{version}/workloads"] = kmock.ResourceInfo(kind="Workload", namespaced=True,
                                                                             verbs=VERBS)
    km.faults.append(Fault("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", 201, times=1000, body={
        "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview", "spec": {},
        "status": {"allowed": True}}))


def is_kopf(request):
    return request.headers.get("User-Agent", "").startswith("kopf/")


def is_cluster_client(request):
    """A call of brain_operator.cluster.client.KubernetesClient (the kubernetes package's user agent)."""
    return request.headers.get("User-Agent", "").startswith("OpenAPI-Generator/")


async def both_workers_running(km) -> None:
    """The demo job's two workers run, and the operator has said so."""
    await set_pod(km, "demo-worker-0", "Running", ready=True)
    await set_pod(km, "demo-worker-1", "Running", ready=True)
    await first_event(km, JOBS, lambda o: (o.get("status") or {}).get("phase") == "Running")


async def set_pod(km, name, phase, *, ready=False, exit_code=None):
    status = {"phase": phase, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    if exit_code is not None:
        status["containerStatuses"] = [{"name": "trainer", "state": {"terminated": {"exitCode": exit_code}}}]
    response = await km.patch(f"{PODS}/{name}/status", json={"status": status}, headers=MERGE)
    assert response.status == 200


async def kueue_finalizers(km):
    """Kueue's webhook put its finalizer on each queued pod (kmock has no webhook: the test puts it)."""
    for name in ("demo-worker-0", "demo-worker-1"):
        response = await km.patch(f"{PODS}/{name}", headers=MERGE,
                                  json={"metadata": {"finalizers": ["kueue.x-k8s.io/managed"]}})
        assert response.status == 200


async def lose_node(km, metadata):
    """node-7 is lost: the taint manager deleted demo-worker-1, whose grace ended long ago, and no kubelet answers.
    The API server keeps such a pod; kmock would drop one marked for deletion at once unless a finalizer holds
    it: `metadata` adds one where Kueue's is not on, standing in for the kubelet that never confirms."""
    ended = handlers.utc_now() - timedelta(seconds=TERMINATING_MARGIN_SECONDS + 30)
    response = await km.patch(f"{PODS}/demo-worker-1", headers=MERGE, json={
        "metadata": {"deletionTimestamp": format_time(ended), "deletionGracePeriodSeconds": 300, **metadata},
        "spec": {"nodeName": "node-7"},
        "status": {"conditions": [{"type": "Ready", "status": "False"}, {
            "type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager",
            "message": "Taint manager: deleting due to NoExecute taint"}]}})
    assert response.status == 200


async def objects(km, path):
    response = await km.get(path)
    return (await response.json())["items"]


def test_children_are_watched_with_a_server_side_selector_and_a_steady_reconcile_lists_nothing(tmp_path, monkeypatch):
    async def scenario():
        async with operator(tmp_path, monkeypatch) as (km, _):
            await set_pod(km, "demo-worker-0", "Running")
            await set_pod(km, "demo-worker-1", "Running")
            await first_event(km, JOBS, lambda o: (o.get("status") or {}).get("phase") == "Running"
                              and "brain.ai/last-handled-configuration" in o["metadata"].get("annotations", {}))
            # Events follow the status write: wait for the transition's too.
            await first_event(km, f"/api/v1/namespaces/{NS}/events", lambda e: e.get("reason") == "Running")
            mark = len(list(km))
            # A pod becomes ready: its event reaches reconcile, which reads the children from the indexes.
            await set_pod(km, "demo-worker-1", "Running", ready=True)
            await first_event(km, JOBS, lambda o: (o.get("status") or {}).get("nodes") == "1/2")
            return list(km), mark

    requests, mark = asyncio.run(scenario())
    watches = {r.resource.plural: r.params.get("labelSelector") for r in requests if is_kopf(r) and r.action == kmock.action.WATCH}
    for plural in ("pods", "services", "configmaps", "persistentvolumeclaims", "networkpolicies"):
        assert watches[plural] == JOB_NAME_LABEL, plural
    assert watches[PLURAL] is None  # the jobs themselves: every one
    # The operator's cluster client since: each reconcile (one per pod event) reads the job and lists
    # nothing; the one that saw the readiness change patched the status once.
    steady = [(r.method, r.url.path) for r in requests[mark:] if is_cluster_client(r)]
    assert set(steady) == {("GET", f"{JOBS}/demo"), ("PATCH", f"{JOBS}/demo/status")}
    assert steady.count(("PATCH", f"{JOBS}/demo/status")) == 1


@pytest.mark.parametrize("kind, group, plural", [
    ("Service", "api/v1", "services"), ("ConfigMap", "api/v1", "configmaps"),
    ("NetworkPolicy", "apis/networking.k8s.io/v1", "networkpolicies"),
])
def test_a_child_deleted_by_hand_is_back_within_5_s(tmp_path, monkeypatch, kind, group, plural):
    async def scenario():
        async with operator(tmp_path, monkeypatch) as (km, _):
            path = f"/{group}/namespaces/{NS}/{plural}"
            (child,) = await objects(km, path)
            response = await km.delete(f"{path}/{child['metadata']['name']}")
            assert response.status == 200
            assert await objects(km, path) == []
            return await first_event(km, path, lambda o: o["metadata"]["name"] == child["metadata"]["name"],
                                     timeout=CONVERGED_WITHIN)

    back = asyncio.run(scenario())
    assert back["kind"] == kind and back["metadata"]["labels"][JOB_NAME_LABEL] == "demo"


def test_a_worker_failure_under_api_faults_is_counted_and_reported_once(tmp_path, monkeypatch):
    async def scenario():
        async with operator(tmp_path, monkeypatch) as (km, waits):
            await both_workers_running(km)
            failed_uid = (await (await km.get(f"{PODS}/demo-worker-1")).json())["metadata"]["uid"]
            km.faults += [
                Fault("PATCH", f"{JOBS}/demo/status", 500, times=2),  # the status write fails twice
                Fault("DELETE", f"{PODS}/demo-worker-1", 500, after=True),  # deleted, then answered 500
                Fault("POST", PODS, 429, retry_after="1"),  # the replacement's create is throttled
            ]
            await set_pod(km, "demo-worker-1", "Failed", exit_code=1)
            restarted = await first_event(km, JOBS, lambda o: (o.get("status") or {}).get("restarts") == 1,
                                          timeout=CONVERGED_WITHIN)
            # The replacement: a pod of that name that has not failed.
            await first_event(km, PODS, lambda o: o["metadata"]["name"] == "demo-worker-1"
                                      and (o.get("status") or {}).get("phase") != "Failed", timeout=CONVERGED_WITHIN)
            await first_event(km, JOBS, lambda o: not (o.get("status") or {}).get("handledFailures"),
                              timeout=CONVERGED_WITHIN)
            events = [e for e in await objects(km, f"/api/v1/namespaces/{NS}/events") if e["reason"] == "WorkerFailed"]
            return km.served, waits, restarted, events, failed_uid

    served, waits, restarted, events, failed_uid = asyncio.run(scenario())
    assert [status for _, _, status in served] == [500, 500, 500, 429]
    assert 1.0 in waits  # Retry-After honoured
    # Counted and recorded in one status write; the uid left the list once its pod was gone.
    assert restarted["status"]["restarts"] == 1 and restarted["status"]["handledFailures"] == [failed_uid]
    assert len(events) == 1 and "demo-worker-1" in events[0]["message"]


def test_a_worker_stuck_terminating_on_a_lost_node_is_replaced_under_a_new_name(tmp_path, monkeypatch):
    async def scenario():
        async with operator(tmp_path, monkeypatch) as (km, _):
            await both_workers_running(km)
            await lose_node(km, {"finalizers": ["test.brain.ai/kubelet-never-confirms"]})
            replacement = await first_event(km, PODS, pod_named("demo-worker-1-1"), timeout=CONVERGED_WITHIN)
            warning = await first_event(km, f"/api/v1/namespaces/{NS}/events",
                                        lambda e: e.get("reason") == STUCK_TERMINATING, timeout=CONVERGED_WITHIN)
            stuck = (await (await km.get(f"{PODS}/demo-worker-1")).json())
            return replacement, warning, stuck

    replacement, warning, stuck = asyncio.run(scenario())
    assert replacement["spec"]["hostname"] == "demo-worker-1" and replacement["spec"]["subdomain"] == "demo-workers"
    assert warning["type"] == "Warning" and "demo-worker-1" in warning["message"] and "node-7" in warning["message"]
    assert "kubectl delete pod demo-worker-1 --force" in warning["message"]
    assert stuck["metadata"]["deletionTimestamp"]  # left for PodGC or the admin: never deleted by the operator


def test_a_failed_worker_that_kueue_keeps_is_replaced_at_once_under_a_new_name(tmp_path, monkeypatch):
    async def scenario():
        async with operator(tmp_path, monkeypatch, spec={"scheduling": {"queueName": "q"}}, kueue=True) as (km, _):
            await kueue_finalizers(km)
            for name in ("demo-worker-0", "demo-worker-1"):
                await set_pod(km, name, "Running", ready=True)
            await first_event(km, JOBS, lambda o: (o.get("status") or {}).get("phase") == "Running")
            await set_pod(km, "demo-worker-1", "Failed", exit_code=1)
            # Kueue lets the failed pod go only once a replacement exists: it comes at once, under a new name.
            replacement = await first_event(km, PODS, pod_named("demo-worker-1-1"), timeout=CONVERGED_WITHIN)
            job = await first_event(km, JOBS, lambda o: (o.get("status") or {}).get("restarts") == 1,
                                    timeout=CONVERGED_WITHIN)
            kept = await (await km.get(f"{PODS}/demo-worker-1")).json()
            return replacement, job, kept

    replacement, job, kept = asyncio.run(scenario())
    assert replacement["spec"]["hostname"] == "demo-worker-1" and replacement["spec"]["subdomain"] == "demo-workers"
    assert job["status"]["phase"] in ("Restarting", "Pending")
    # Deleted by the operator, and left on Kueue's finalizer for Kueue to take off now that the replacement exists.
    assert kept["metadata"]["deletionTimestamp"] and kept["metadata"]["finalizers"] == ["kueue.x-k8s.io/managed"]


def test_a_lost_nodes_worker_under_kueue_is_marked_failed_through_its_status_before_its_replacement(tmp_path,
                                                                                                   monkeypatch):
    async def scenario():
        async with operator(tmp_path, monkeypatch, spec={"scheduling": {"queueName": "q"}}, kueue=True) as (km, _):
            await kueue_finalizers(km)
            await both_workers_running(km)
            mark = len(list(km))
            await lose_node(km, {"resourceVersion": "7"})
            failed = await first_event(km, PODS, lambda o: o["metadata"]["name"] == "demo-worker-1"
                                       and (o.get("status") or {}).get("phase") == "Failed", timeout=CONVERGED_WITHIN)
            await first_event(km, PODS, pod_named("demo-worker-1-1"), timeout=CONVERGED_WITHIN)
            warning = await first_event(km, f"/api/v1/namespaces/{NS}/events",
                                        lambda e: e.get("reason") == STUCK_TERMINATING, timeout=CONVERGED_WITHIN)
            return failed, warning, [(r.method, r.url.path, r.data) for r in list(km)[mark:] if is_cluster_client(r)]

    failed, warning, calls = asyncio.run(scenario())
    writes = [(method, path) for method, path, _ in calls if method in ("PATCH", "POST", "DELETE")]
    status_patch = ("PATCH", f"{PODS}/demo-worker-1/status")
    # Failed through pods/status, with the version read as its precondition, before the replacement's create.
    assert writes.index(status_patch) < writes.index(("POST", PODS))
    body = next(data for method, path, data in calls if (method, path) == status_patch)
    assert body["metadata"] == {"resourceVersion": "7"} and body["status"]["phase"] == "Failed"
    assert failed["metadata"]["finalizers"] == ["kueue.x-k8s.io/managed"]  # Kueue's to take off, never ours
    assert ("DELETE", f"{PODS}/demo-worker-1") not in writes
    assert "marks it Failed so Kueue counts it gone" in warning["message"]


def test_an_operator_started_after_a_queued_job_was_deleted_ends_its_kueue_group(tmp_path, monkeypatch):
    workloads = f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{NS}/workloads"
    # What a queued job deleted while no operator ran leaves: its pods, deleted by the garbage collector and held
    # by Kueue's finalizer, and their group's admitted Workload, held by Kueue's own.
    leftovers = [(PODS, {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": f"demo-worker-{i}", "namespace": NS, "deletionTimestamp": "2026-11-22T12:00:00Z",
        "labels": {JOB_NAME_LABEL: "demo", "kueue.x-k8s.io/pod-group-name": "demo"},
        "finalizers": ["kueue.x-k8s.io/managed"],
        "ownerReferences": [{"apiVersion": API_VERSION, "kind": "BrainTrainingJob", "name": "demo", "uid": "uid-gone",
                             "controller": True}]},
        "spec": {"containers": [{"name": "trainer", "image": "img:1"}]}, "status": {"phase": "Failed"}})
        for i in range(2)]
    leftovers.append((workloads, {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload", "metadata": {
        "name": "demo", "namespace": NS, "finalizers": ["kueue.x-k8s.io/resource-in-use"]}, "spec": {}}))

    async def scenario():
        async with operator(tmp_path, monkeypatch, kueue=True, before=leftovers, job=False) as (km, _):
            return await first_event(km, workloads, lambda o: bool(o["metadata"].get("deletionTimestamp")),
                                     timeout=CONVERGED_WITHIN)

    ended = asyncio.run(scenario())
    assert ended["metadata"]["name"] == "demo"  # Kueue now stops and finalizes every pod of the group


def test_a_queued_pytorchjob_that_kueues_webhook_left_unsuspended_is_suspended_and_the_job_says_why(tmp_path,
                                                                                                     monkeypatch):
    pytorchjobs = f"/apis/kubeflow.org/v1/namespaces/{NS}/pytorchjobs"

    async def scenario():
        # Kueue serves its Workload API but not the PyTorchJob integration: kmock, like that cluster, runs no webhook.
        async with operator(tmp_path, monkeypatch, kueue=True, pytorchjob=True, job=False) as (km, _):
            created = await km.post(JOBS, json=manifest(meta={"uid": "uid-1", "generation": 1, "resourceVersion": "1"},
                                                        backend="pytorchjob", scheduling={"queueName": "q"}))
            assert created.status == 200
            held = await first_event(km, pytorchjobs, lambda o: ((o.get("spec") or {}).get("runPolicy") or {})
                                     .get("suspend") is True, timeout=CONVERGED_WITHIN)
            job = await first_event(km, JOBS, lambda o: any(c.get("type") == "Valid" and c.get("status") == "False"
                                                            for c in (o.get("status") or {}).get("conditions") or ()),
                                    timeout=CONVERGED_WITHIN)
            return held, job

    held, job = asyncio.run(scenario())
    assert held["metadata"]["annotations"]["brain.ai/kueue-unmanaged"] == "true"
    valid = next(c for c in job["status"]["conditions"] if c["type"] == "Valid")
    assert valid["reason"] == "BackendUnavailable" and "integrations.frameworks" in valid["message"]


def test_a_queued_job_runs_where_kueue_serves_only_v1beta1_workloads_and_reads_its_reason_there(tmp_path,
                                                                                                  monkeypatch):
    workloads = f"/apis/kueue.x-k8s.io/v1beta1/namespaces/{NS}/workloads"
    waiting = {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload", "metadata": {"name": "demo", "namespace": NS},
               "spec": {}, "status": {"conditions": [{"type": "QuotaReserved", "status": "False", "reason": "Pending",
                                                      "message": "couldn't assign flavors to pod set main"}]}}

    async def scenario():
        async with operator(tmp_path, monkeypatch, spec={"scheduling": {"queueName": "q"}}, kueue=True,
                            kueue_version="v1beta1", before=[(workloads, waiting)]) as (km, _):
            # Kueue 0.14's webhook gated both pods (kmock has none: the test gates them).
            for name in ("demo-worker-0", "demo-worker-1"):
                response = await km.patch(f"{PODS}/{name}", headers=MERGE, json={
                    "spec": {"schedulingGates": [{"name": "kueue.x-k8s.io/admission"}]}})
                assert response.status == 200
            return await first_event(km, JOBS, lambda o: (o.get("status") or {}).get("phase") == "Queued",
                                     timeout=CONVERGED_WITHIN)

    job = asyncio.run(scenario())
    queued = next(c for c in job["status"]["conditions"] if c["type"] == "Queued")
    assert "couldn't assign flavors to pod set main" in queued["message"]


def test_a_preempted_worker_is_free_named_in_its_event_and_back_under_its_name(tmp_path, monkeypatch):
    async def scenario():
        async with operator(tmp_path, monkeypatch) as (km, _):
            await both_workers_running(km)
            old = await (await km.get(f"{PODS}/demo-worker-1")).json()
            # The scheduler preempts it: DisruptionTarget, then a graceful delete; its kubelet stops it within the
            # grace (a finalizer stands in for the kubelet that has not confirmed yet: kmock drops a deleted pod).
            response = await km.patch(f"{PODS}/demo-worker-1", headers=MERGE, json={
                "metadata": {"deletionTimestamp": format_time(handlers.utc_now() + timedelta(seconds=300)),
                             "deletionGracePeriodSeconds": 300, "finalizers": ["test.brain.ai/kubelet-stopping"]},
                "status": {"conditions": [{"type": "Ready", "status": "True"}, {
                    "type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
                    "message": "default-scheduler: preempting to accommodate a higher priority pod",
                    "lastTransitionTime": format_time(handlers.utc_now())}]}})
            assert response.status == 200
            event = await first_event(km, f"/api/v1/namespaces/{NS}/events",
                                      lambda e: "demo-worker-1" in e.get("message", "") and "preempted" in e.get("message", ""),
                                      timeout=CONVERGED_WITHIN)
            # The kubelet confirms: the pod goes, and its worker comes back under its own name.
            response = await km.patch(f"{PODS}/demo-worker-1", headers=MERGE, json={"metadata": {"finalizers": None}})
            assert response.status == 200
            await km.delete(f"{PODS}/demo-worker-1")
            back = await first_event(km, PODS, lambda o: o["metadata"]["name"] == "demo-worker-1"
                                     and o["metadata"]["uid"] != old["metadata"]["uid"], timeout=CONVERGED_WITHIN)
            job = await (await km.get(f"{JOBS}/demo")).json()
            return event, back, job

    event, back, job = asyncio.run(scenario())
    assert "PreemptionByScheduler" in event["message"]
    assert back["spec"]["hostname"] == "demo-worker-1"
    assert job["status"]["restarts"] == 0


async def served_client(tmp_path, monkeypatch, km, **options):
    """The real KubernetesClient against `km`, its retry waits recorded on a clock of their own."""
    serve_resources(km, tmp_path, monkeypatch)
    clock = [0.0]
    waits = []

    def sleep(seconds):  # time passes only on the client's own clock: no test waits for real
        waits.append(seconds)
        clock[0] += seconds

    client = await asyncio.to_thread(KubernetesClient, sleep=sleep, clock=lambda: clock[0], **options)
    return client, waits


def config_map(name="cm"):
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": NS}, "data": {}}


def test_the_client_retries_throttling_and_errors_and_tells_already_exists_from_conflict(tmp_path, monkeypatch):
    async def scenario():
        async with FaultyEmulator() as km, kmock.Server(km):
            client, waits = await served_client(tmp_path, monkeypatch, km)
            path = f"/api/v1/namespaces/{NS}/configmaps"
            km.faults += [Fault("POST", path, 429, retry_after="7"), Fault("POST", path, 503, times=2)]
            created = await asyncio.to_thread(client.create, config_map())
            again = await asyncio.to_thread(client.create, config_map())
            km.faults.append(Fault("POST", path, 409))  # a conflict that is not a duplicate name
            with pytest.raises(Conflict, match="create ConfigMap default/other"):
                await asyncio.to_thread(client.create, config_map("other"))
            km.faults.append(Fault("PATCH", f"{path}/cm", 500, times=1000))
            with pytest.raises(ApiUnavailable, match=r"^patch ConfigMap default/cm: gave up after \d+ attempt\(s\): 500"):
                await asyncio.to_thread(client.patch, ObjectRef("v1", "ConfigMap", NS, "cm"), {"data": {"a": "1"}})
            return created, again, waits

    created, again, waits = asyncio.run(scenario())
    # A second create of the same name, ours and not Terminating, is "exists already".
    assert created["metadata"]["name"] == "cm" and again is None
    # Retry-After is honoured as asked; then jittered exponential waits, within the call's deadline.
    assert waits[0] == 7.0 and 0.2 <= waits[1] <= 0.4 and 0.4 <= waits[2] <= 0.8
    patch_waits = waits[3:]
    assert sum(patch_waits) <= CALL_DEADLINE_SECONDS and max(patch_waits) <= 2.0


def test_the_client_takes_already_exists_as_success_only_for_its_own_live_object(tmp_path, monkeypatch):
    async def scenario():
        async with FaultyEmulator() as km, kmock.Server(km):
            client, _ = await served_client(tmp_path, monkeypatch, km)
            held = {**config_map(), "metadata": {**config_map()["metadata"], "finalizers": ["example.com/hold"]}}
            await asyncio.to_thread(client.create, held)
            await asyncio.to_thread(client.delete, ObjectRef("v1", "ConfigMap", NS, "cm"))  # Terminating: held
            with pytest.raises(Conflict, match="being deleted"):
                await asyncio.to_thread(client.create, config_map())
            owned = {**config_map("owned"), "metadata": {**config_map("owned")["metadata"], "ownerReferences": [
                {"apiVersion": API_VERSION, "kind": "BrainTrainingJob", "name": "j", "uid": "old", "controller": True}]}}
            await asyncio.to_thread(client.create, owned)
            again = await asyncio.to_thread(client.create, owned)
            mine = {**owned, "metadata": {**owned["metadata"], "ownerReferences": [
                {**owned["metadata"]["ownerReferences"][0], "uid": "new"}]}}
            with pytest.raises(Conflict, match="another owner"):
                await asyncio.to_thread(client.create, mine)
            return again

    assert asyncio.run(scenario()) is None  # the same owner: exists already


def test_the_client_reads_a_refused_create_from_the_api_servers_status_and_does_not_retry_it(tmp_path, monkeypatch):
    psa = forbidden("pods", "cm", 'violates PodSecurity "restricted:latest": privileged '
                                  '(container "c" must not set securityContext.privileged=true)')
    bad = invalid("ConfigMap", "cm", [("FieldValueTooLong", "Too long: must have at most 1048576 bytes", "data")])

    async def scenario():
        async with FaultyEmulator() as km, kmock.Server(km):
            client, waits = await served_client(tmp_path, monkeypatch, km)
            path = f"/api/v1/namespaces/{NS}/configmaps"
            refusals = []
            for status in (psa, bad):
                km.faults.append(Fault("POST", path, status["code"], body=status))
                with pytest.raises(Refused) as caught:
                    await asyncio.to_thread(client.create, config_map())
                refusals.append(caught.value)
            return refusals, waits, km.served

    refusals, waits, served = asyncio.run(scenario())
    assert [(r.code, r.reason, r.message) for r in refusals] == [
        (403, "Forbidden", psa["message"]), (422, "Invalid", 'ConfigMap "cm" is invalid: data: Too long: must have at '
                                                              'most 1048576 bytes')]
    assert waits == [] and len(served) == 2  # asked once each: a refusal is not retried
