"""Issue 17: the operator under API faults, through the handlers and their per-job retry.

Each case fails a worker while the API server fails some call, through a
fault-injecting layer around the in-memory cluster client, with the
handlers' retry loop running. Whatever the fault, the failure is counted
exactly once, its WorkerFailed event is posted exactly once, and the job
converges within 5 s after the fault clears (polled with a deadline).
"""

import asyncio
import time
from datetime import datetime, timezone

import kopf
import pytest
from fake_cluster import FakeCluster
from faulty_cluster import FaultyCluster

from brain_operator import handlers
from brain_operator.cluster.api import Conflict
from brain_operator.spec import API_VERSION, KIND, OperatorDefaults

T0 = datetime(2026, 11, 22, 12, 0, 0, tzinfo=timezone.utc)
NS = "default"
CONVERGED_WITHIN = 5.0


def manifest(name="demo", nodes=2):
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": NS},
        "spec": {"nodes": nodes, "runPolicy": {"backoffLimit": 3}},
    }


def running(cluster):
    ctx = handlers.Context(client=cluster, defaults=OperatorDefaults(image="registry.example/brain:1"), clock=lambda: T0)
    cluster.apply_job(manifest())
    handlers.handle(ctx, NS, "demo")
    cluster.run_all()
    handlers.handle(ctx, NS, "demo")
    assert cluster.get_job(NS, "demo")["status"]["phase"] == "Running"
    return ctx


def worker_failed_events(cluster):
    return [e for _, e in cluster.inner.events if e.reason == "WorkerFailed"]


def converged(cluster, failed_uid):
    """One failure counted and reported, its pod replaced by a new one, nothing left to retry."""
    status = cluster.inner.get_job(NS, "demo")["status"]
    pod = cluster.inner.pods().get("demo-worker-1")
    return (
        status["restarts"] == 1
        and len(worker_failed_events(cluster)) == 1
        and pod is not None
        and pod["metadata"]["uid"] != failed_uid
        and pod["status"]["phase"] == "Pending"
    )


async def poll(predicate, timeout):
    """Check `predicate` until it holds; False once `timeout` seconds passed without it."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


def fail_worker_during(inject, clears):
    """A worker fails while `inject`ed faults last; the job must converge within 5 s of `clears` holding."""
    cluster = FaultyCluster(FakeCluster())
    ctx = running(cluster)
    failed_uid = cluster.pods()["demo-worker-1"]["metadata"]["uid"]

    async def scenario():
        retry = asyncio.create_task(handlers.retry_forever(ctx))
        try:
            inject(cluster)
            cluster.exit_pod("demo-worker-1", 1)
            # The pod event: kopf would drop what it raises; the handler schedules a retry instead.
            await asyncio.to_thread(handlers.on_pod, labels={"brain.ai/job-name": "demo"}, namespace=NS,
                                    memo=kopf.Memo(context=ctx))
            assert cluster.refused, "the fault never happened"
            assert await poll(lambda: clears(cluster), 60), "the fault never cleared"
            assert await poll(lambda: converged(cluster, failed_uid), CONVERGED_WITHIN)
            assert await poll(lambda: ctx.retries.wait(time.monotonic()) is None, CONVERGED_WITHIN)
        finally:
            retry.cancel()

    asyncio.run(scenario())
    # Another pass (a resync) neither counts nor reports the failure again, and drops the uid of the gone pod.
    handlers.handle(ctx, NS, "demo")
    status = cluster.get_job(NS, "demo")["status"]
    assert status["restarts"] == 1 and len(worker_failed_events(cluster)) == 1
    assert "handledFailures" not in status
    return cluster


def exhausted(call):
    return lambda cluster: all(f.times == 0 for f in cluster._faults if f.call == call)


@pytest.mark.parametrize("call, kind, times, after", [
    ("patch_status", None, 2, False),  # the status write fails: nothing is deleted, nothing posted
    ("create", "Pod", 2, False),  # the replacement's create fails after the failure was recorded
    ("delete", "Pod", 1, True),  # the failed pod is deleted, then the call is answered 500
    ("get_job", None, 3, False),  # the job cannot even be read
], ids=["status-write", "replacement-create", "delete-then-500", "job-read"])
def test_a_worker_failure_is_counted_and_reported_once_whatever_call_fails(call, kind, times, after):
    cluster = fail_worker_during(lambda c: c.fail(call, kind=kind, times=times, after=after), exhausted(call))
    assert cluster.refused == [f"{call} {kind or ''}".strip()] * times


def test_an_outage_of_several_seconds():
    def outage(cluster):
        cluster.down = True

    def back_after_four_refusals(cluster):
        # The per-job retry backs off 0.5, 1, 2 s (jittered): four refused passes take seconds.
        if len(cluster.refused) >= 4:
            cluster.down = False
        return not cluster.down

    cluster = fail_worker_during(outage, back_after_four_refusals)
    assert len(cluster.refused) >= 4


def test_the_failure_is_in_the_status_before_the_failed_pod_is_deleted():
    cluster = FaultyCluster(FakeCluster())
    ctx = running(cluster)
    uid = cluster.pods()["demo-worker-1"]["metadata"]["uid"]
    cluster.fail("delete", kind="Pod")
    cluster.exit_pod("demo-worker-1", 1)
    with pytest.raises(Exception, match="delete Pod"):
        handlers.reconcile_job(ctx, NS, "demo")
    status = cluster.get_job(NS, "demo")["status"]
    # Counted, recorded and reported, though the failed pod is still there.
    assert status["restarts"] == 1 and status["handledFailures"] == [uid]
    assert cluster.pods()["demo-worker-1"]["status"]["phase"] == "Failed"
    assert len(worker_failed_events(cluster)) == 1


def test_a_conflict_on_create_is_planned_again_from_a_fresh_read():
    cluster = FaultyCluster(FakeCluster())
    ctx = running(cluster)
    service = next(ref for ref in cluster.objects if ref.kind == "Service")
    del cluster.objects[service]  # deleted by hand
    cluster.fail("create", kind="Service", error=lambda what: Conflict(f"{what}: 409 Conflict"))
    handlers.reconcile_job(ctx, NS, "demo")
    assert cluster.refused == ["create Service"]
    # Not taken as "already exists": the re-read found it missing and created it.
    assert service in cluster.objects


def test_a_conflict_that_persists_fails_the_pass_and_is_retried():
    cluster = FaultyCluster(FakeCluster())
    ctx = running(cluster)
    del cluster.objects[next(ref for ref in cluster.objects if ref.kind == "ConfigMap")]
    cluster.fail("create", kind="ConfigMap", times=100, error=lambda what: Conflict(f"{what}: 409 Conflict"))
    handlers.handle(ctx, NS, "demo")
    # The first plan and every plan again hit the conflict; the job is scheduled for another try.
    assert cluster.refused == ["create ConfigMap"] * 4
    assert ctx.retries.wait(time.monotonic()) is not None
