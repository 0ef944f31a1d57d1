"""Refusals named, polls bounded (issue 28, points 4 and 5).

A create the API server refuses (Pod Security Admission's 403, validation's
422) shows on the job as CreateRefused and a FailedCreate event with the
server's message, and is tried again in minutes; an exception while parsing
or rendering a job marks it Valid=False. A worker that answers byte by byte
costs its own job's progress document, never another job's pass, and a
document's NaN, Infinity and huge numbers are left out.
"""

import asyncio
import math
import socket
import threading
import time
from datetime import timedelta

import pytest
from fake_cluster import FakeCluster, invalid
from test_handlers import NS, T0, context, manifest

from brain_operator import handlers, reconcile
from brain_operator.status.job_status import JobStatus
from brain_operator.spec import OperatorDefaults
from brain_operator.spec.overlay_policy import OverlayPolicy
from brain_operator.status.progress import progress_status
from brain_trainer.contract import JSON_SAFE_INTEGER, METRICS_PORT, Progress

# The overlay may add a capability (RDMA wants IPC_LOCK); a restricted namespace refuses the pod.
IPC_LOCK = {"spec": {"containers": [{"name": "trainer", "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}}}]}}
PSA_MESSAGE = ('pods "demo-worker-0" is forbidden: violates PodSecurity "restricted:latest": unrestricted capabilities '
               '(container "trainer" must not include "IPC_LOCK" in securityContext.capabilities.add)')


def rdma_context(cluster):
    """The operator's overlay policy allows IPC_LOCK: only the namespace's Pod Security Admission refuses it."""
    defaults = OperatorDefaults(image="registry.example/brain:1", overlay_policy=OverlayPolicy(capabilities=["IPC_LOCK"]))
    return handlers.Context(client=cluster, defaults=defaults, clock=lambda: T0)


def condition(status, kind):
    return next((c for c in status.get("conditions") or () if c["type"] == kind), None)


def warnings(cluster):
    return [(e.reason, e.message) for _, e in cluster.events if e.type == "Warning"]


def refused_creates(cluster):
    return [ref.name for op, ref in cluster.writes if op == "refused"]


def test_a_pod_refused_by_pod_security_is_named_on_the_job_and_tried_again_in_minutes():
    cluster = FakeCluster(pod_security="restricted")
    ctx = rdma_context(cluster)
    cluster.apply_job(manifest(podTemplate=IPC_LOCK))
    handlers.handle(ctx, NS, "demo")

    status = cluster.get_job(NS, "demo")["status"]
    refused = condition(status, "CreateRefused")
    assert refused["status"] == "True" and refused["reason"] == "FailedCreate" and refused["message"] == PSA_MESSAGE
    assert status["reason"] == "FailedCreate" and status["phase"] == "Pending"
    assert condition(status, "Valid")["status"] == "True"  # the spec is valid: the namespace refuses it
    assert warnings(cluster) == [("FailedCreate", PSA_MESSAGE)]
    # The next attempt is minutes away (jitter shortens a wait by half at most), not the 3 s of a fault.
    assert ctx.retries.wait(time.monotonic()) >= handlers.REFUSAL_BACKOFF.base / 2 - 1
    assert refused_creates(cluster) == ["demo-worker-0"]

    # The resync leaves the job to its retry: no create is tried meanwhile.
    asyncio.run(handlers.resync(ctx))
    assert refused_creates(cluster) == ["demo-worker-0"]

    # Refused again the same way (a pod event, an edit elsewhere): no second event, no status write.
    writes = len(cluster.writes)
    handlers.handle(ctx, NS, "demo")
    assert len(warnings(cluster)) == 1 and [op for op, _ in cluster.writes[writes:]] == ["refused"]

    # The user drops the capability: the edit reconciles at once, the pods are created, the condition goes.
    cluster.apply_job(manifest())
    handlers.handle(ctx, NS, "demo")
    handlers.handle(ctx, NS, "demo")  # the new pods' event
    status = cluster.get_job(NS, "demo")["status"]
    assert sorted(cluster.pods()) == ["demo-worker-0", "demo-worker-1"] and condition(status, "CreateRefused") is None
    assert ctx.retries.wait(time.monotonic()) is None


def test_a_pod_refused_by_validation_carries_the_field_in_its_event():
    causes = [("FieldValueInvalid", 'Invalid value: "8": must be less than or equal to cpu limit of 4',
               "spec.containers[0].resources.requests")]
    cluster = FakeCluster(validate=lambda obj: invalid("Pod", obj["metadata"]["name"], causes)
                          if obj["kind"] == "Pod" else None)
    ctx = context(cluster)
    cluster.apply_job(manifest())
    handlers.handle(ctx, NS, "demo")

    message = ('Pod "demo-worker-0" is invalid: spec.containers[0].resources.requests: '
               'Invalid value: "8": must be less than or equal to cpu limit of 4')
    status = cluster.get_job(NS, "demo")["status"]
    assert condition(status, "CreateRefused")["message"] == message and status["reason"] == "FailedCreate"
    assert warnings(cluster) == [("FailedCreate", message)]
    assert ctx.retries.holds((NS, "demo"), time.monotonic())
    assert sorted(cluster.kinds()) == ["ConfigMap", "NetworkPolicy", "Service"]  # what was accepted stays


def test_an_exception_while_rendering_marks_the_job_invalid_instead_of_retrying(monkeypatch):
    def broken(job):
        raise KeyError("replicas")

    monkeypatch.setattr(reconcile, "render", broken)
    cluster = FakeCluster()
    ctx = context(cluster)
    cluster.apply_job(manifest())
    handlers.handle(ctx, NS, "demo")

    status = cluster.get_job(NS, "demo")["status"]
    valid = condition(status, "Valid")
    assert valid["status"] == "False" and valid["reason"] == "InternalError" and valid["message"] == "KeyError: 'replicas'"
    assert status["phase"] == "Failed" and cluster.pods() == {}
    assert ctx.retries.wait(time.monotonic()) is None  # nothing to retry: the condition says it
    writes = len(cluster.writes)
    handlers.handle(ctx, NS, "demo")
    assert len(cluster.writes) == writes

    # A fixed operator (or spec) runs the job: InternalError is not a terminal failure.
    monkeypatch.undo()
    handlers.handle(ctx, NS, "demo")
    assert sorted(cluster.pods()) == ["demo-worker-0", "demo-worker-1"]


@pytest.mark.parametrize("field, value", [
    ("eta_seconds", math.inf), ("eta_seconds", math.nan), ("loss", -math.inf), ("tokens_per_second", 10**400),
    ("total_steps", JSON_SAFE_INTEGER + 1), ("goodput", {"ratio": 0.5, "wall_seconds": math.inf}),
])
def test_a_progress_number_that_is_not_finite_or_in_range_is_left_out(field, value):
    progress = Progress.read({"step": 7, field: value})
    assert progress is not None and progress.step == 7 and getattr(progress, field) is None
    # What used to raise OverflowError (int(inf)) or carry NaN into the status patch: the rest is shown.
    status = progress_status({"step": 7, field: value}, JobStatus(), now=T0, root="/checkpoints")
    assert status.progress.step == 7 and status.progress.eta_seconds is None
    assert Progress.read({"step": 10**400}) is None and Progress.from_json('{"step": NaN}') is None
    assert Progress.from_json('{"step": 3, "eta_seconds": Infinity}') == Progress(step=3)


class Trickle:
    """An HTTP worker that answers one byte every 0.5 s (headers included) until the test is over."""

    REPLY = b'HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{"step": 99}' + b" " * 60

    def __init__(self):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.over = threading.Event()
        self.sent_all = threading.Event()
        self.thread = threading.Thread(target=self._serve)
        self.thread.start()

    def _serve(self):
        conn, _ = self.listener.accept()
        with conn:
            conn.recv(4096)
            for byte in self.REPLY:
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return  # the client cut it off
                if self.over.wait(0.5):
                    return
            self.sent_all.set()

    def close(self):
        self.over.set()
        self.thread.join()
        self.listener.close()


def test_a_trickled_reply_is_cut_at_the_fetch_deadline():
    trickle = Trickle()
    try:
        assert handlers.fetch_json(f"http://127.0.0.1:{trickle.port}/progress", deadline=0.5) is None
        assert not trickle.sent_all.is_set()  # cut off, not read to the end
    finally:
        trickle.close()


class Observing(FakeCluster):
    """Says when "due" failed, and whether the trickling worker was still sending then."""

    def __init__(self, trickle):
        super().__init__()
        self.trickle = trickle
        self.failed = {}
        self.due_failed = threading.Event()

    def patch_status(self, namespace, name, patch, resource_version=None):
        version = super().patch_status(namespace, name, patch, resource_version)
        if patch.get("phase") == "Failed":
            self.failed[name] = not self.trickle.over.is_set()
            if name == "due":
                self.due_failed.set()
        return version


def test_a_trickling_worker_cannot_delay_another_jobs_deadline():
    trickle = Trickle()
    cluster = Observing(trickle)
    ctx = context(cluster)
    # The workers of "slow" answer byte by byte; those of "due" not at all (no network in the test).
    slow_url = f"10.0.0.1:{METRICS_PORT}"
    ctx.fetch = lambda url: (handlers.fetch_json(url.replace(slow_url, f"127.0.0.1:{trickle.port}"), deadline=60)
                             if slow_url in url else None)
    try:
        for name, ip in (("slow", "10.0.0.1"), ("due", "10.0.0.2")):
            cluster.apply_job(manifest(name, runPolicy={"activeDeadlineSeconds": 60}))
            handlers.handle(ctx, NS, name)
            for pod in cluster.pods():
                if pod.startswith(name):
                    cluster.set_pod(pod, "Running", ready=True, podIP=ip)
            handlers.handle(ctx, NS, name)
            assert cluster.get_job(NS, name)["status"]["phase"] == "Running"
        ctx.clock = lambda: T0 + timedelta(minutes=5)  # past both jobs' deadline
        ctx.poll_budget = 60.0  # longer than the test runs: the budget is not what frees "due"

        async def scenario():
            resync = asyncio.create_task(handlers.resync(ctx))
            assert await asyncio.to_thread(cluster.due_failed.wait, 30)
            # "due" failed while "slow" still waited for its document.
            assert cluster.failed == {"due": True}
            trickle.close()  # the worker hangs up; "slow" goes on without a document
            await resync

        asyncio.run(scenario())
    finally:
        trickle.close()
    assert cluster.failed == {"due": True, "slow": False}
    assert "progress" not in cluster.get_job(NS, "slow")["status"]
