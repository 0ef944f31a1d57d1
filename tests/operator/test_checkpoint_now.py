"""Checkpoint on demand through the operator: the brain.ai/checkpoint-now annotation -> the job's ConfigMap ->
(kubelet) the file beside trainer.yaml in every worker; rank 0's progress document answers it with an event."""

import contextlib

from fake_cluster import FakeCluster
from test_handlers import context
from test_reconcile import NS, manifest, started, step

from brain_operator import handlers
from brain_operator.objects.refs import ObjectRef
from brain_operator.status.job_status import JobStatus
from brain_operator.status.on_demand import answered_events
from brain_trainer.contract import CONFIG_FILE, Progress
from brain_trainer.observe.metrics import MetricsServer

CONFIG_MAP = ObjectRef("v1", "ConfigMap", NS, "j-config")


def annotated(value, name="j", **spec):
    job = manifest(name=name, **spec)
    if value is not None:
        job["metadata"]["annotations"] = {"brain.ai/checkpoint-now": value, "other": "kept out"}
    return job


def config_data(cluster):
    return cluster.objects[CONFIG_MAP]["data"]


def requested(cluster):
    return [e for _, e in cluster.events if e.reason == "CheckpointRequested"]


def test_a_new_annotation_value_reaches_the_workers_config_once_with_one_event():
    cluster = FakeCluster()
    started(cluster)
    trainer_yaml = config_data(cluster)[CONFIG_FILE]
    assert set(config_data(cluster)) == {CONFIG_FILE}

    cluster.apply_job(annotated("2026-11-22T12:00:00Z"))
    mark = len(cluster.writes)
    step(cluster)
    assert cluster.writes[mark:] == [("patch", CONFIG_MAP)]
    assert config_data(cluster) == {CONFIG_FILE: trainer_yaml, "checkpoint-request": "2026-11-22T12:00:00Z"}
    (event,) = requested(cluster)
    assert event.type == "Normal" and event.message.startswith("brain.ai/checkpoint-now=2026-11-22T12:00:00Z: ")
    # Not a spec change: the pods stay, the generation too.
    assert sorted(cluster.pods()) == ["j-worker-0", "j-worker-1"] and cluster.get_job(NS, "j")["metadata"]["generation"] == 1

    # The same value again is no new request: nothing written, no event.
    mark = len(cluster.writes)
    step(cluster)
    assert cluster.writes[mark:] == [] and len(requested(cluster)) == 1

    cluster.apply_job(annotated("again"))
    step(cluster)
    assert config_data(cluster)["checkpoint-request"] == "again" and len(requested(cluster)) == 2


def test_removing_the_annotation_removes_the_key_and_settles():
    cluster = FakeCluster()
    started(cluster, job=annotated("first"))
    assert config_data(cluster)["checkpoint-request"] == "first"
    # Present when the workers started: the ConfigMap was created with it, so nothing was passed on.
    assert requested(cluster) == []
    cluster.apply_job(annotated(None))
    step(cluster)
    assert set(config_data(cluster)) == {CONFIG_FILE}
    mark = len(cluster.writes)
    step(cluster)
    assert cluster.writes[mark:] == [] and requested(cluster) == []


def test_the_pytorchjob_backend_passes_both_requests_on_the_same_way():
    cluster = FakeCluster()
    cluster.apply_job(annotated(None, backend="pytorchjob"))
    step(cluster)
    job = annotated("now", backend="pytorchjob")
    job["metadata"]["annotations"]["brain.ai/profile-now"] = "2"
    cluster.apply_job(job)
    step(cluster)
    assert config_data(cluster)["checkpoint-request"] == "now" and len(requested(cluster)) == 1
    assert config_data(cluster)["profile-request"] == "2"
    assert [e.reason for _, e in cluster.events if e.reason == "ProfileRequested"] == ["ProfileRequested"]


@contextlib.contextmanager
def polled(job):
    """`job` running, its pods' /progress served by a real MetricsServer: yields (cluster, server, poll)."""
    server = MetricsServer(0, host="127.0.0.1")
    cluster = FakeCluster()
    ctx = context(cluster)
    ctx.fetch = lambda url: handlers.fetch_json(url.replace(url.split("/")[2], f"127.0.0.1:{server.port}"))
    name = job["metadata"]["name"]
    try:
        cluster.apply_job(job)
        handlers.reconcile_job(ctx, NS, name)
        cluster.run_all()
        handlers.reconcile_job(ctx, NS, name)
        for pod in cluster.pods():
            cluster.set_pod(pod, "Running", ready=True, podIP="127.0.0.1")
        yield cluster, server, lambda: handlers.reconcile_job(ctx, NS, name, poll=True)
    finally:
        server.close()


def test_the_answer_in_rank_0s_progress_becomes_one_event_with_its_step():
    with polled(annotated("r1", name="demo")) as (cluster, server, poll):
        server.publish(Progress(step=40, total_steps=200, last_checkpoint_step=30))
        poll()
        assert [e for _, e in cluster.events if e.reason == "CheckpointCommitted"] == []

        server.publish(Progress(step=44, total_steps=200, last_checkpoint_step=42, checkpoint_request="r1",
                                checkpoint_request_step=42))
        poll()
        poll()  # seen again: no second event
        status = cluster.get_job(NS, "demo")["status"]
        assert (status["progress"]["checkpointRequest"], status["progress"]["checkpointRequestStep"]) == ("r1", 42)
        (event,) = [e for _, e in cluster.events if e.reason == "CheckpointCommitted"]
        assert event.message == "checkpoint of step 42 committed for brain.ai/checkpoint-now=r1"


def test_answered_events_need_a_new_request():
    answered = JobStatus.read({"progress": {"step": 5, "checkpointRequest": "a", "checkpointRequestStep": 4}})
    assert list(answered_events(JobStatus(), JobStatus.read({"progress": {"step": 5}}))) == []
    assert [e.reason for e in answered_events(JobStatus(), answered)] == ["CheckpointCommitted"]
    assert list(answered_events(answered, answered)) == []
