"""The Stalled condition: set and cleared by reconcile from the progress timestamps its resync passes write (against
the in-memory cluster), and the limit it uses (pure)."""

from datetime import timedelta

from fake_cluster import FakeCluster
from test_reconcile import NS, T0, manifest, started, step

from brain_operator.reconcile import reconcile
from brain_operator.status.stalled import report_limit
from brain_trainer.config import WatchdogConfig
from brain_trainer.contract import Progress, format_time

WATCHDOG = {"stepTimeFactor": 10, "floorSeconds": 60, "startupSeconds": 300}
# 10 x logInterval 10 x 0.5 s a step = 50 s < floorSeconds: 60 s, plus one progress poll (30 s).
LIMIT = 90


def job():
    return manifest(watchdog=WATCHDOG, training={"steps": 200, "logInterval": 10})


def report(cluster, step_no, at):
    """A resync pass at `at` that finds rank 0's document changed: the operator's clock goes into updatedAt."""
    doc = {"step": step_no, "total_steps": 200, "eta_seconds": (200 - step_no) * 0.5}
    status = reconcile(cluster.get_job(NS, "j"), cluster, at, progress=doc)
    assert status["progress"]["updatedAt"] == format_time(at)


def stalled(status):
    return next((c for c in status["conditions"] if c["type"] == "Stalled"), None)


def events(cluster, *reasons):
    return [e for _, e in cluster.events if e.reason in reasons]


def test_a_job_without_news_past_the_limit_is_stalled_once_and_clears_when_progress_resumes():
    cluster = FakeCluster()
    started(cluster, job=job())
    reported_at = T0 + timedelta(minutes=1)
    report(cluster, 40, reported_at)
    status = step(cluster, reported_at + timedelta(seconds=LIMIT - 1))
    assert stalled(status)["status"] == "False" and events(cluster, "Stalled") == []

    status = step(cluster, reported_at + timedelta(seconds=LIMIT + 1))
    condition = stalled(status)
    assert condition["status"] == "True" and condition["reason"] == "NoProgress"
    assert condition["message"] == f"no progress since {format_time(reported_at)} at step 40 (limit {LIMIT} s: floorSeconds)"
    assert condition["lastTransitionTime"] == format_time(reported_at + timedelta(seconds=LIMIT + 1))
    (event,) = events(cluster, "Stalled")
    assert event.type == "Warning" and event.message == condition["message"]
    assert status["phase"] == "Running"  # a condition, not a phase: the watchdog or a person acts on it

    # Still stalled later: the same condition, no write, no second event.
    writes = len(cluster.writes)
    assert stalled(step(cluster, reported_at + timedelta(minutes=10))) == condition
    assert len(cluster.writes) == writes and len(events(cluster, "Stalled")) == 1

    resumed = reported_at + timedelta(minutes=11)
    report(cluster, 60, resumed)
    status = step(cluster, resumed + timedelta(seconds=5))
    assert stalled(status)["status"] == "False" and stalled(status)["reason"] == "Progressing"
    (event,) = events(cluster, "Progressing")
    assert event.type == "Normal" and event.message == "progress again at step 60"


def test_a_job_that_just_started_running_gets_the_startup_limit():
    cluster = FakeCluster()
    started(cluster, job=job())  # Running since T0, no report yet
    assert stalled(step(cluster, T0 + timedelta(seconds=300 + 30 - 1)))["status"] == "False"
    condition = stalled(step(cluster, T0 + timedelta(seconds=300 + 30 + 1)))
    assert condition["status"] == "True"
    assert condition["message"] == (f"no progress since {format_time(T0)} and no report yet "
                                    "(limit 330 s: startupSeconds, no report since the job started running)")


def test_a_report_from_before_a_restart_does_not_count_against_the_new_start():
    cluster = FakeCluster()
    started(cluster, job=job())
    report(cluster, 40, T0)
    cluster.exit_pod("j-worker-1", 1)
    assert step(cluster, T0 + timedelta(minutes=1))["phase"] == "Restarting"
    cluster.run_all()
    back = T0 + timedelta(minutes=2)
    assert step(cluster, back)["phase"] == "Running"
    # Two minutes past the old report, well past 90 s: but the trainers are starting again (startupSeconds).
    assert stalled(step(cluster, back + timedelta(seconds=120)))["status"] == "False"


def test_a_stalled_job_that_stops_running_is_no_longer_stalled():
    cluster = FakeCluster()
    started(cluster, job=job())
    report(cluster, 40, T0)
    assert stalled(step(cluster, T0 + timedelta(minutes=5)))["status"] == "True"
    cluster.exit_pod("j-worker-0", 1)
    status = step(cluster, T0 + timedelta(minutes=6))
    assert status["phase"] == "Restarting"
    assert (stalled(status)["status"], stalled(status)["reason"]) == ("False", "Restarting")
    (event,) = events(cluster, "Progressing")
    assert event.message == "no longer stalled: Restarting"


def test_the_limit_between_reports_follows_the_step_time():
    cfg = WatchdogConfig(step_time_factor=10, floor_seconds=60, startup_seconds=300)
    slow = Progress(step=100, total_steps=200, eta_seconds=100 * 2.0)
    assert report_limit(cfg, 10, slow) == (200.0, "10 x logInterval 10 x step time 2 s")
    fast = Progress(step=100, total_steps=200, eta_seconds=100 * 0.1)
    assert report_limit(cfg, 10, fast) == (60.0, "floorSeconds")
    for unknown in (None, Progress(step=200, total_steps=200, eta_seconds=0.0), Progress(step=3)):
        assert report_limit(cfg, 10, unknown) == (300.0, "startupSeconds, no step time reported yet")
