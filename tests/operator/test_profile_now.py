"""A profile on demand through the operator: the brain.ai/profile-now annotation -> the job's ConfigMap -> (kubelet)
the file beside trainer.yaml in every worker; rank 0's progress document names the traces' folder, which becomes
the job's status.progress.profile and one event."""

from fake_cluster import FakeCluster
from test_checkpoint_now import CONFIG_MAP, config_data, polled
from test_reconcile import NS, manifest, started, step

from brain_operator.status.job_status import JobStatus
from brain_operator.status.on_demand import answered_events
from brain_trainer.contract import CONFIG_FILE, Progress


def asking(value, name="j", **spec):
    job = manifest(name=name, **spec)
    if value is not None:
        job["metadata"]["annotations"] = {"brain.ai/profile-now": value}
    return job


def events(cluster, *reasons):
    return [e for _, e in cluster.events if e.reason in reasons]


def test_a_new_annotation_value_reaches_the_workers_config_once_with_one_event():
    cluster = FakeCluster()
    started(cluster)
    trainer_yaml = config_data(cluster)[CONFIG_FILE]
    cluster.apply_job(asking("5 2026-11-29T04:00:00Z"))
    mark = len(cluster.writes)
    step(cluster)
    assert cluster.writes[mark:] == [("patch", CONFIG_MAP)]
    assert config_data(cluster) == {CONFIG_FILE: trainer_yaml, "profile-request": "5 2026-11-29T04:00:00Z"}
    (event,) = events(cluster, "ProfileRequested")
    assert event.type == "Normal"
    assert event.message.startswith("brain.ai/profile-now=5 2026-11-29T04:00:00Z: every worker profiles the next 5 step(s)")
    # Not a spec change: the pods stay, the generation too; the same value again is no new request.
    assert sorted(cluster.pods()) == ["j-worker-0", "j-worker-1"] and cluster.get_job(NS, "j")["metadata"]["generation"] == 1
    mark = len(cluster.writes)
    step(cluster)
    assert cluster.writes[mark:] == [] and len(events(cluster, "ProfileRequested")) == 1


def test_a_malformed_value_is_a_warning_naming_the_annotation():
    cluster = FakeCluster()
    started(cluster)
    cluster.apply_job(asking("five"))
    step(cluster)
    assert events(cluster, "ProfileRequested") == []
    (event,) = events(cluster, "ProfileRequestInvalid")
    assert event.type == "Warning"
    assert event.message.startswith("brain.ai/profile-now: a profile request is '<steps> [anything]' with steps a "
                                    "whole number >= 1, got 'five'")


def test_the_folder_in_rank_0s_progress_becomes_the_status_and_one_event():
    folder = "/checkpoints/profiles/step-45"
    with polled(asking("3", name="demo")) as (cluster, server, poll):
        server.publish(Progress(step=44, total_steps=200))
        poll()
        assert events(cluster, "ProfileWritten") == []
        server.publish(Progress(step=48, total_steps=200, profile=folder))
        poll()
        poll()  # seen again: no second event
        assert cluster.get_job(NS, "demo")["status"]["progress"]["profile"] == folder
        (event,) = events(cluster, "ProfileWritten")
        assert event.message == f"every worker's trace written to {folder}/rank-<rank>.json.gz on the checkpoint volume"


def test_answered_events_need_a_new_folder():
    first = JobStatus.read({"progress": {"step": 5, "profile": "/c/profiles/step-3"}})
    later = JobStatus.read({"progress": {"step": 9, "profile": "/c/profiles/step-8"}})
    assert list(answered_events(JobStatus(), JobStatus.read({"progress": {"step": 5}}))) == []
    assert [e.reason for e in answered_events(JobStatus(), first)] == ["ProfileWritten"]
    assert list(answered_events(first, first)) == []
    assert [e.reason for e in answered_events(first, later)] == ["ProfileWritten"]
