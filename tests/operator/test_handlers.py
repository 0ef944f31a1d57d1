"""handlers.py: kopf routes every event into the one reconcile.

Two levels: the handler functions called directly against the in-memory
client, and the real kopf operator running in-process against kmock (an
HTTP emulator of the Kubernetes API), talking to it through the real
KubernetesClient.
"""

import asyncio
import json
import threading
from datetime import datetime, timedelta, timezone

import kmock
import kopf
import kubernetes.config.kube_config
import pytest
import yaml
from counting_cluster import CountingCluster, watched
from fake_cluster import FakeCluster

from brain_operator import handlers
from brain_operator.cluster.client import KubernetesClient
from brain_operator.spec import API_VERSION, KIND, PLURAL, OperatorDefaults
from brain_trainer.contract import METRICS_PORT, Progress
from brain_trainer.observe.metrics import MetricsServer

T0 = datetime(2026, 11, 22, 12, 0, 0, tzinfo=timezone.utc)
NS = "default"


def manifest(name="demo", nodes=2, meta=None, **spec):
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": NS, **(meta or {})},
        "spec": {"nodes": nodes, **spec},
    }


def context(cluster):
    # The image comes from the operator's defaults, as the Helm chart sets it.
    return handlers.Context(client=cluster, defaults=OperatorDefaults(image="registry.example/brain:1"), clock=lambda: T0)


def test_job_and_pod_events_all_reconcile_the_job():
    cluster = FakeCluster()
    memo = kopf.Memo(context=context(cluster))
    cluster.apply_job(manifest())
    # kopf passes a body too; the handlers ignore it and re-read the job.
    handlers.on_job(name="demo", namespace=NS, memo=memo, body={"status": {"restarts": 99}})
    assert sorted(cluster.pods()) == ["demo-worker-0", "demo-worker-1"]
    assert cluster.get_job(NS, "demo")["status"]["restarts"] == 0
    cluster.run_all()
    cluster.exit_pod("demo-worker-0", 1)
    handlers.on_pod(labels={"brain.ai/job-name": "demo"}, namespace=NS, memo=memo)
    status = cluster.get_job(NS, "demo")["status"]
    assert status["restarts"] == 1 and status["phase"] == "Restarting"
    cluster.run_all()
    handlers.on_pod(labels={"brain.ai/job-name": "demo"}, namespace=NS, memo=memo)
    assert cluster.get_job(NS, "demo")["status"]["phase"] == "Running"
    assert memo.context.known_jobs() == [(NS, "demo")]
    metrics = memo.context.metrics.registry
    assert metrics.get_sample_value("brain_operator_jobs", {"phase": "Running"}) == 1
    # A pod event for a job that is gone is a no-op; the job leaves the resync list and the metrics.
    del cluster.objects[next(r for r in cluster.objects if r.kind == KIND)]
    handlers.on_pod(labels={"brain.ai/job-name": "demo"}, namespace=NS, memo=memo)
    assert memo.context.known_jobs() == []
    assert metrics.get_sample_value("brain_operator_jobs", {"phase": "Running"}) == 0


class Signalling(FakeCluster):
    """Tells a waiting test when a status was written."""

    def __init__(self):
        super().__init__()
        self.patched = threading.Event()

    def patch_status(self, namespace, name, patch, resource_version=None):
        version = super().patch_status(namespace, name, patch, resource_version)
        self.patched.set()
        return version


def test_resync_reconciles_every_known_job_without_events():
    cluster = Signalling()
    ctx = context(cluster)
    cluster.apply_job(manifest(runPolicy={"activeDeadlineSeconds": 60}))
    handlers.reconcile_job(ctx, NS, "demo")
    cluster.run_all()
    handlers.reconcile_job(ctx, NS, "demo")
    assert cluster.get_job(NS, "demo")["status"]["phase"] == "Running"
    cluster.patched.clear()
    # No event arrives: only the periodic resync can notice the deadline passing.
    ctx.clock = lambda: T0 + timedelta(minutes=5)

    async def scenario():
        task = asyncio.create_task(handlers.resync_forever(ctx, interval=0.01))
        try:
            assert await asyncio.to_thread(cluster.patched.wait, 30)
        finally:
            task.cancel()

    asyncio.run(scenario())
    status = cluster.get_job(NS, "demo")["status"]
    assert status["phase"] == "Failed" and cluster.pods() == {}


def test_progress_is_read_from_whichever_pod_holds_rank_0():
    server = MetricsServer(0, host="127.0.0.1")
    cluster = FakeCluster()
    # Every worker serves on the trainer's port in its own pod; here one local server stands for it.
    ctx = context(cluster)
    asked = []
    ctx.fetch = lambda url: asked.append(url) or handlers.fetch_json(url.replace(f":{METRICS_PORT}/", f":{server.port}/"))
    try:
        server.publish(Progress(step=40, total_steps=200, loss=3.21, tokens_per_second=1234.5, last_checkpoint_step=25))
        cluster.apply_job(manifest())
        handlers.reconcile_job(ctx, NS, "demo")
        cluster.set_pod("demo-worker-0", "Running", ready=True)  # no IP yet: skipped
        cluster.set_pod("demo-worker-1", "Running", ready=True, podIP="127.0.0.1")
        # A pod event's pass asks no worker: only the resync polls.
        handlers.reconcile_job(ctx, NS, "demo")
        assert asked == [] and cluster.get_job(NS, "demo")["status"]["phase"] == "Running"
        handlers.reconcile_job(ctx, NS, "demo", poll=True)
        status = cluster.get_job(NS, "demo")["status"]
        assert asked == [f"http://127.0.0.1:{METRICS_PORT}/progress"]
        assert status["progress"]["step"] == 40 and status["progress"]["totalSteps"] == 200
        assert status["lastCheckpoint"] == {"step": 25, "path": "/checkpoints/step-00000025"}
        assert status["phase"] == "Running"
        writes = len(cluster.writes)
        handlers.reconcile_job(ctx, NS, "demo", poll=True)
        assert len(cluster.writes) == writes  # nothing new, nothing written
    finally:
        server.close()
    # The worker is gone: the last known progress stands.
    handlers.reconcile_job(ctx, NS, "demo", poll=True)
    assert cluster.get_job(NS, "demo")["status"]["progress"]["step"] == 40
    assert handlers.fetch_json("http://127.0.0.1:1/progress") is None


def test_one_pass_with_a_progress_document_writes_status_once():
    cluster = FakeCluster()
    counting = CountingCluster(cluster)
    ctx = context(counting)
    ctx.observed = watched(cluster)
    doc = {"step": 40, "total_steps": 200, "last_checkpoint_step": 25}
    ctx.fetch = lambda url: doc
    cluster.apply_job(manifest())
    handlers.reconcile_job(ctx, NS, "demo")
    for pod in cluster.pods():
        cluster.set_pod(pod, "Running", ready=True, podIP="10.1.0.7")
    handlers.reconcile_job(ctx, NS, "demo")
    assert cluster.get_job(NS, "demo")["status"]["phase"] == "Running"
    counting.take()
    # The counts and the progress change in the same pass: one PATCH carries both.
    cluster.set_pod("demo-worker-1", "Running", ready=False, podIP="10.1.0.8")
    handlers.reconcile_job(ctx, NS, "demo", poll=True)
    assert counting.take() == {"GET": 1, "PATCH status": 1}
    status = cluster.get_job(NS, "demo")["status"]
    assert status["nodes"] == "1/2" and status["progress"]["step"] == 40 and status["lastCheckpoint"]["step"] == 25
    # The same document again: the steady state writes nothing.
    handlers.reconcile_job(ctx, NS, "demo", poll=True)
    assert counting.take() == {"GET": 1}
    # An answered checkpoint request: the same one PATCH, and its event once.
    doc.update(checkpoint_request="r1", checkpoint_request_step=40)
    handlers.reconcile_job(ctx, NS, "demo", poll=True)
    handlers.reconcile_job(ctx, NS, "demo", poll=True)
    assert counting.take() == {"GET": 2, "PATCH status": 1, "CREATE event": 1}


def test_an_oversized_progress_answer_is_ignored():
    import http.server

    class Huge(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"step": 1, "pad": "x" * handlers.PROGRESS_MAX_BYTES}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Huge)
    thread = threading.Thread(target=server.serve_forever)
    thread.start()
    try:
        assert handlers.fetch_json(f"http://127.0.0.1:{server.server_port}/progress") is None
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_worker_that_does_not_speak_http_reads_as_no_answer():
    import socket

    with socket.create_server(("127.0.0.1", 0)) as listener:
        def answer_garbage():
            conn, _ = listener.accept()
            with conn:
                conn.recv(4096)
                conn.sendall(b"garbage\r\n\r\n")

        thread = threading.Thread(target=answer_garbage)
        thread.start()
        try:
            assert handlers.fetch_json(f"http://127.0.0.1:{listener.getsockname()[1]}/progress") is None
        finally:
            thread.join()


def test_run_needs_a_scope():
    with pytest.raises(ValueError, match="namespace"):
        handlers.run()


# ---- the real kopf operator against kmock ----------------------------------------------------


class Emulator(kmock.KubernetesEmulator):
    """kmock 0.8 with list responses that carry a kind, as the kubernetes client requires."""

    async def _serve_list(self, request):
        return {"apiVersion": "v1", "kind": "List", **await super()._serve_list(request)}


RESOURCES = {
    f"{API_VERSION}/{PLURAL}": ("BrainTrainingJob", True, {"status"}),
    "v1/pods": ("Pod", True, {"status"}),
    "v1/services": ("Service", True, set()),
    "v1/configmaps": ("ConfigMap", True, set()),
    "v1/persistentvolumeclaims": ("PersistentVolumeClaim", True, set()),
    "networking.k8s.io/v1/networkpolicies": ("NetworkPolicy", True, set()),
    "v1/events": ("Event", True, set()),
    "v1/namespaces": ("Namespace", False, set()),
    "apiextensions.k8s.io/v1/customresourcedefinitions": ("CustomResourceDefinition", False, set()),
}
VERBS = {"get", "list", "watch", "create", "patch", "delete"}


async def first_event(km, path, predicate, timeout=30.0):
    """Watch `path` (kmock replays what exists as ADDED, then streams changes) until an object matches."""

    async def watch():
        response = await km.get(f"{path}?watch=true")
        async for line in response.content:
            event = json.loads(line) if line.strip() else None
            if event and event["type"] != "DELETED" and predicate(event["object"]):
                response.close()
                return event["object"]

    return await asyncio.wait_for(watch(), timeout)


def pod_named(name, *, failed=False):
    def match(obj):
        return obj["metadata"]["name"] == name and ((obj.get("status") or {}).get("phase") == "Failed") == failed
    return match


def serve_resources(km, tmp_path, monkeypatch):
    """Our resources in kmock, and a kubeconfig that points the kubernetes client at it."""
    for key, (kind, namespaced, subresources) in RESOURCES.items():
        km.resources[key] = kmock.ResourceInfo(kind=kind, namespaced=namespaced, verbs=VERBS, subresources=subresources)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
        "clusters": [{"name": "kmock", "cluster": {"server": str(km.url).rstrip("/")}}],
        "users": [{"name": "kmock", "user": {"token": "test"}}],
        "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "kmock"}}],
    }))
    # What KUBECONFIG does, for a library that read the variable at import time.
    monkeypatch.setattr(kubernetes.config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))


async def operator_scenario(tmp_path, monkeypatch):
    async with Emulator() as km, kmock.Server(km):
        serve_resources(km, tmp_path, monkeypatch)
        client = await asyncio.to_thread(KubernetesClient)
        settings = kopf.OperatorSettings()
        # kmock cannot list cluster-scoped namespaces: watch the named namespace as given (what kopf
        # also falls back to when RBAC forbids listing namespaces).
        settings.scanning.disabled = True
        stop = asyncio.Event()
        operator = asyncio.create_task(kopf.operator(
            settings=settings, standalone=True, namespaces=[NS], stop_flag=stop,
            memo=kopf.Memo(context=handlers.Context(client=client, defaults=OperatorDefaults(image="img:1"))),
        ))
        try:
            jobs = f"/apis/{API_VERSION}/namespaces/{NS}/{PLURAL}"
            # kmock assigns no uid or resourceVersion; kopf's patches need the latter.
            created = await km.post(jobs, json=manifest(meta={"uid": "uid-1", "generation": 1, "resourceVersion": "1"}))
            assert created.status == 200
            pods = f"/api/v1/namespaces/{NS}/pods"
            worker = await first_event(km, pods, pod_named("demo-worker-1"))
            assert worker["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
            await first_event(km, pods, pod_named("demo-worker-0"))
            job = await first_event(km, jobs, lambda o: (o.get("status") or {}).get("phase") == "Pending"
                                    and "brain.ai/last-handled-configuration" in o["metadata"].get("annotations", {}))
            # A worker fails: the pod event reaches reconcile, which replaces the pod and counts it.
            failed = {"status": {"phase": "Failed", "containerStatuses": [
                {"name": "trainer", "state": {"terminated": {"exitCode": 1, "message": "boom"}}}]}}
            response = await km.patch(f"{pods}/demo-worker-1/status", json=failed,
                                      headers={"Content-Type": "application/merge-patch+json"})
            assert response.status == 200
            await first_event(km, pods, pod_named("demo-worker-1", failed=True))
            restarted = await first_event(km, jobs, lambda o: (o.get("status") or {}).get("restarts") == 1)
            fresh = await first_event(km, pods, pod_named("demo-worker-1"))
            return job, restarted, fresh
        finally:
            stop.set()
            await asyncio.wait_for(operator, 30)


def test_kopf_operator_in_process_against_kmock(tmp_path, monkeypatch):
    job, restarted, fresh = asyncio.run(operator_scenario(tmp_path, monkeypatch))
    annotations = job["metadata"].get("annotations") or {}
    # kopf's bookkeeping lives under brain.ai/, never in status; no finalizer is added.
    assert "brain.ai/last-handled-configuration" in annotations
    assert not job["metadata"].get("finalizers")
    assert set(job["status"]) >= {"phase", "conditions", "workers", "restarts", "observedGeneration"}
    assert job["status"]["workers"]["desired"] == 2
    assert restarted["status"]["phase"] in ("Restarting", "Pending")
    assert fresh["metadata"]["name"] == "demo-worker-1"
