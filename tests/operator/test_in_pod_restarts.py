"""In-pod restarts in the job's status (issue 27): rank 0's progress document counts torchrun's restarts of the
workers inside its pod; a resync pass (against the in-memory cluster) puts the count and the latest reason beside
`status.restarts` and posts one Warning InPodRestart per increase."""

from datetime import timedelta

from fake_cluster import FakeCluster
from test_reconcile import NS, T0, manifest, started

from brain_operator.status.events import in_pod_restart_event
from brain_operator.status.job_status import JobStatus
from brain_operator.reconcile import reconcile


def poll(cluster, at, **doc):
    return reconcile(cluster.get_job(NS, "j"), cluster, at, progress={"step": 40, "total_steps": 200, **doc})


def in_pod_events(cluster):
    return [e for _, e in cluster.events if e.reason == "InPodRestart"]


def test_a_pod_reporting_an_in_pod_restart_yields_the_status_field_and_one_warning():
    cluster = FakeCluster()
    started(cluster, job=manifest())
    status = poll(cluster, T0 + timedelta(minutes=1), restarts=0, in_pod_restarts=0)
    assert status["inPodRestarts"] == 0 and "lastInPodRestart" not in status and in_pod_events(cluster) == []

    status = poll(cluster, T0 + timedelta(minutes=2), restarts=1, in_pod_restarts=1,
                  last_in_pod_restart="error: RuntimeError: boom")
    assert (status["restarts"], status["inPodRestarts"], status["lastInPodRestart"]) == (0, 1, "error: RuntimeError: boom")
    assert "inPodRestarts" not in status["progress"]  # shown once, beside the pod-level restarts
    (event,) = in_pod_events(cluster)
    assert event.type == "Warning"
    assert event.message == ("torchrun restarted the workers inside a pod after error: RuntimeError: boom (1 more, 1 in all; "
                             "elastic.maxRestarts bounds them per pod)")

    # The same count again, or an older document (a lower count): no event, and the count never goes down.
    for count in (1, 0):
        status = poll(cluster, T0 + timedelta(minutes=3 + count), step=41, in_pod_restarts=count)
        assert status["inPodRestarts"] == 1 and len(in_pod_events(cluster)) == 1


def test_the_event_counts_every_restart_a_poll_missed():
    before, after = JobStatus(in_pod_restarts=1), JobStatus(in_pod_restarts=3, last_in_pod_restart="out-of-memory: x")
    assert "(2 more, 3 in all;" in in_pod_restart_event(before, after).message
    assert in_pod_restart_event(after, after) is None
