"""One incident, one count (issue 21, point 2): the pure rule (incidents.py) and scenarios against the fake
cluster, whose clock moves as a real one does."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from hypothesis import given
from hypothesis import strategies as st

from brain_operator.status.failure_policy import WorkerFailure, consequential
from brain_operator.status.incidents import CONSEQUENCE, EXCUSED, ROOT, Exit, judge, still_open
from brain_operator.status.job_status import Incident
from brain_operator.spec.model import FAIL_JOB, RESTART, RESTART_NOT_COUNTED
from brain_trainer import contract
from brain_trainer.contract import format_time

from test_reconcile import NS, condition, manifest, started, step  # noqa: F401 - the shared fixtures' helpers
from fake_cluster import FakeCluster

T = datetime(2026, 11, 22, 12, 0, 0, tzinfo=timezone.utc)
ACTIONS = {"out-of-memory": RESTART, "collective-timeout": RESTART, "error": RESTART, "stalled": RESTART,
           "preempted": RESTART_NOT_COUNTED, "data-error": FAIL_JOB}
RENDEZVOUS_LINE = "exit code 1: torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError"


def ex(pod, reason, created, ended, line=""):
    return Exit(WorkerFailure(pod, reason, line, ACTIONS[reason]), T + timedelta(seconds=created),
                T + timedelta(seconds=ended))


# -- the rule --

def test_a_failure_and_the_exits_it_caused_are_one_incident_named_after_the_root():
    exits = [ex("w0", "error", 0, 70, RENDEZVOUS_LINE), ex("w1", "out-of-memory", 0, 10),
             ex("w2", "collective-timeout", 0, 12)]
    verdicts, incident = judge(exits, None, {})
    assert [v.role for v in verdicts] == [CONSEQUENCE, ROOT, CONSEQUENCE]
    assert [v.charged for v in verdicts] == [False, True, False]
    assert (incident.reason, incident.pod, incident.since) == ("out-of-memory", "w1", format_time(T + timedelta(seconds=10)))
    assert "after w1's out-of-memory" in verdicts[0].why


def test_later_exits_of_the_broken_group_follow_it_and_a_replacement_starts_a_new_one():
    _, incident = judge([ex("w1", "out-of-memory", 0, 10)], None, {})
    later = [ex("w0", "stalled", 0, 400), ex("w1-new", "out-of-memory", 11, 500)]
    verdicts, after = judge(later, incident, {})
    assert [v.role for v in verdicts] == [CONSEQUENCE, ROOT]
    assert after.pod == "w1-new"


def test_a_consequential_exit_waiting_on_a_missing_peer_is_excused_a_cause_of_its_own_is_not():
    exits = [ex("w1", "error", 100, 200, RENDEZVOUS_LINE), ex("w2", "out-of-memory", 100, 210)]
    verdicts, incident = judge(exits, None, {"w0": "Pending"})
    assert [v.role for v in verdicts] == [EXCUSED, ROOT]
    assert verdicts[0].why == "while w0 is Pending"
    # Without a blocked peer the rendezvous error is a cause: nothing else explains it.
    alone, _ = judge([ex("w1", "error", 100, 200, RENDEZVOUS_LINE)], None, {})
    assert alone[0].role == ROOT and alone[0].charged


def test_a_failure_the_policy_ends_the_job_for_is_never_a_consequence():
    # The data error ends the job: it is the incident, and the out-of-memory beside it is charged nothing more.
    verdicts, incident = judge([ex("w1", "out-of-memory", 0, 10), ex("w2", "data-error", 0, 20)], None, {})
    assert [v.role for v in verdicts] == [CONSEQUENCE, ROOT] and incident.reason == "data-error"
    # Even after an incident already open, a FailJob reason is a root of its own.
    open_one = Incident("out-of-memory", "w1", format_time(T + timedelta(seconds=10)))
    verdicts, incident = judge([ex("w2", "data-error", 0, 20)], open_one, {"w0": "Pending"})
    assert verdicts[0].role == ROOT and incident.reason == "data-error"


def test_an_incident_ends_once_the_group_trains_past_it():
    incident = Incident("out-of-memory", "w1", format_time(T), step=100)
    assert still_open(incident, None) is incident and still_open(incident, 100) is incident
    assert still_open(incident, 101) is None
    assert still_open(Incident("preempted", "w1", format_time(T)), 0) is None


def test_an_incident_ends_on_time_when_rank_0_reports_no_progress():
    # Its consequences come within the rendezvous' join timeout (watchdog.startupSeconds); rank 0 silent or stuck.
    incident = Incident("out-of-memory", "w1", format_time(T), step=100)
    for step in (None, 100):
        assert still_open(incident, step, T + timedelta(seconds=1800), 1800) is incident
        assert still_open(incident, step, T + timedelta(seconds=1801), 1800) is None
    # A surviving pod of the broken group failing long after is its own root, charged.
    verdicts, after = judge([ex("w0", "out-of-memory", 0, 4000)],
                            still_open(incident, None, T + timedelta(seconds=4000), 1800), {})
    assert verdicts[0].role == ROOT and verdicts[0].charged and after.pod == "w0"


REASONS = st.sampled_from(sorted(ACTIONS))
EXITS = st.lists(st.tuples(REASONS, st.integers(0, 50), st.integers(0, 100)), min_size=1, max_size=8)


@given(EXITS, st.booleans())
def test_one_pass_of_one_group_charges_at_most_one_restart_per_fatal_free_incident(spec, blocked):
    """Pods of one group (created before any ended) failing together: at most one charge, unless a FailJob
    reason ends the job anyway; every exit gets a verdict; the root is one of the exits."""
    exits = [ex(f"w{i}", reason, 0, 60 + ended) for i, (reason, _, ended) in enumerate(spec)]
    verdicts, incident = judge(exits, None, {"w99": "Pending"} if blocked else {})
    assert len(verdicts) == len(exits)
    fatal = [v for v in verdicts if v.exit.failure.action == FAIL_JOB]
    assert all(v.role == ROOT for v in fatal)
    assert sum(v.charged for v in verdicts if v.exit.failure.action != FAIL_JOB) <= 1
    roots = [v for v in verdicts if v.role == ROOT]
    if roots:
        assert incident is not None and incident.pod in {v.exit.failure.pod for v in roots}
    # A cause of its own, when one is there, names the incident rather than an echo of it.
    primary = {v.exit.failure.reason for v in verdicts if not consequential(v.exit.failure)}
    if primary and not fatal:
        assert incident.reason in primary


@given(EXITS)
def test_replacements_are_never_consequences_of_an_older_incident(spec):
    old = Incident("out-of-memory", "w-old", format_time(T), step=None)
    exits = [ex(f"w{i}", reason, 1 + created, 60 + ended) for i, (reason, created, ended) in enumerate(spec)]
    verdicts, _ = judge(exits, old, {})
    assert CONSEQUENCE not in {v.role for v in verdicts if v.exit.failure.pod != "w-old"} or any(
        v.role == ROOT for v in verdicts)


# -- scenarios against the fake cluster --

def at(seconds):
    return T + timedelta(seconds=seconds)


def fail(cluster, pod, reason, line):
    cluster.exit_pod(pod, contract.EXIT_CODES[reason], message=contract.termination_message(reason, line))


def rendezvous_gave_up(cluster, pod):
    """torchrun's exit after its rendezvous timed out: no reason of the trainer's, the log's tail."""
    cluster.exit_pod(pod, 1, message="Traceback (most recent call last):\n  ...\n"
                     "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError")


def test_one_lost_worker_in_a_5_node_job_charges_1_not_5():
    cluster = FakeCluster()
    cluster.now = at(0)
    started(cluster, nodes=5, runPolicy={"backoffLimit": 2})
    cluster.now = at(600)
    cluster.exit_pod("j-worker-3", 137, message="Killed")  # the node's kernel killed it: a failure of its own
    status = step(cluster, at(600))
    assert status["restarts"] == 1 and status["incident"]["pod"] == "j-worker-3"
    # The survivors give up on the rendezvous one after another, while the replacement is still Pending.
    for i, pod in enumerate(["j-worker-0", "j-worker-1", "j-worker-2", "j-worker-4"]):
        cluster.now = at(700 + 60 * i)
        if i % 2:
            rendezvous_gave_up(cluster, pod)
        else:  # the watchdog's message from an earlier round in the pod, still in its termination log
            fail(cluster, pod, "stalled", "no step for 600 s")
        status = step(cluster, cluster.now)
    assert status["phase"] != "Failed" and status["restarts"] == 1
    failed_events = [e for _, e in cluster.events if e.reason == "WorkerFailed"]
    exited = [e for _, e in cluster.events if e.reason == "WorkerExited"]
    assert len(failed_events) == 1 and len(exited) == 4
    assert all("after j-worker-3's error" in e.message and e.type == "Normal" for e in exited)


def test_a_lost_node_is_a_free_preemption_and_its_peers_exits_follow_it():
    cluster = FakeCluster()  # deletion is graceful: a lost node's pods stay Terminating
    cluster.now = at(0)
    started(cluster, nodes=5)
    for i in range(5):
        cluster.place(f"j-worker-{i}", f"node-{i}")
    cluster.now = at(900)
    cluster.lose_node("node-2")  # Terminating for good, still Running: never Failed
    status = step(cluster, at(900))
    (event,) = [e for _, e in cluster.events if e.reason == "WorkerFailed"]
    assert "j-worker-2" in event.message and "DeletionByTaintManager" in event.message and ": preempted:" in event.message
    assert status["restarts"] == 0 and status["reason"] == "preempted"
    # Seen again: no second event.
    step(cluster, at(930))
    assert len([e for _, e in cluster.events if e.reason == "WorkerFailed"]) == 1
    cluster.now = at(1000)
    rendezvous_gave_up(cluster, "j-worker-0")
    status = step(cluster, at(1000))
    assert status["restarts"] == 0


def test_a_worker_0_that_starts_late_costs_nothing():
    cluster = FakeCluster()
    cluster.now = at(0)
    cluster.apply_job(manifest(nodes=3, runPolicy={"backoffLimit": 0}))
    step(cluster, at(0))
    cluster.set_pod("j-worker-1", "Running", ready=True)
    cluster.set_pod("j-worker-2", "Running", ready=True)
    cluster.pull_fails("j-worker-0", backoff=True)  # still pulling its image, minutes late
    cluster.now = at(120)
    rendezvous_gave_up(cluster, "j-worker-1")
    status = step(cluster, at(120))
    assert status["phase"] != "Failed" and status["restarts"] == 0
    (exited,) = [e for _, e in cluster.events if e.reason == "WorkerExited"]
    assert "while j-worker-0 is Pending" in exited.message


def test_out_of_memory_on_one_worker_and_rendezvous_errors_on_the_others_charge_once_as_out_of_memory():
    cluster = FakeCluster()
    cluster.now = at(0)
    started(cluster, nodes=4, runPolicy={"backoffLimit": 1})
    cluster.now = at(300)
    fail(cluster, "j-worker-2", "out-of-memory", "CUDA out of memory")
    cluster.now = at(301)
    for pod in ("j-worker-0", "j-worker-1", "j-worker-3"):
        rendezvous_gave_up(cluster, pod)
    status = step(cluster, at(302))
    assert status["restarts"] == 1 and status["reason"] == "out-of-memory"
    assert condition(status, "Restarting")["reason"] == "OutOfMemory"
    assert status["incident"]["reason"] == "out-of-memory"


def test_out_of_memory_and_a_data_error_in_one_pass_fail_the_job_with_the_data_error():
    cluster = FakeCluster()
    cluster.now = at(0)
    started(cluster, nodes=3)
    cluster.now = at(300)
    fail(cluster, "j-worker-0", "out-of-memory", "CUDA out of memory")
    fail(cluster, "j-worker-1", "data-error", "shard 7 is truncated")
    status = step(cluster, at(300))
    assert status["phase"] == "Failed" and condition(status, "Failed")["reason"] == "DataError"


def test_a_pass_that_sees_a_handled_failure_again_does_not_count_it_again():
    """A failed pod whose delete did not happen (refused, or the pass cut short) is listed again: its uid in
    status.handledFailures keeps it from counting twice."""
    cluster = FakeCluster()
    cluster.now = at(0)
    started(cluster, nodes=2, runPolicy={"backoffLimit": 1})
    cluster.now = at(300)
    fail(cluster, "j-worker-1", "out-of-memory", "CUDA out of memory")
    deletes = cluster.delete
    cluster.delete = lambda ref: None  # refused: the failed pod stays listed
    status = step(cluster, at(300))
    assert status["restarts"] == 1 and cluster.pods()["j-worker-1"]["status"]["phase"] == "Failed"
    cluster.delete = deletes
    status = step(cluster, at(330))
    assert status["restarts"] == 1 and status["phase"] != "Failed"
    assert len([e for _, e in cluster.events if e.reason == "WorkerFailed"]) == 1
    assert cluster.pods()["j-worker-1"]["status"]["phase"] == "Pending"  # replaced
