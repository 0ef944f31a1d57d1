"""Shared clusters, part 3 (issue 33), against the faithful fake: each point's operator behaviour over many passes.

The real kopf operator against kmock shows the same where the operator's own wiring is what is tested
(test_operator_kmock.py); the fake's rules themselves are shown in test_fake_shared_cluster.py.
"""

from datetime import timedelta

from fake_cluster import FakeCluster
from test_kueue import admitted, finalized, queued_job
from test_reconcile import T0, condition, step

from brain_operator.lost_pods import MESSAGE
from brain_operator.waiting import STUCK_TERMINATING, TERMINATING_MARGIN_SECONDS

GRACE = 300  # the worker pods' rendered terminationGracePeriodSeconds
STUCK = T0 + timedelta(seconds=GRACE + TERMINATING_MARGIN_SECONDS)


# ---- 1. a lost node under Kueue recovers with no human ----


def test_a_lost_nodes_worker_under_kueue_is_failed_as_podgc_would_and_its_replacement_runs():
    cluster = admitted(FakeCluster(kueue=True), queued_job())
    cluster.lose_node("node-j-worker-1")
    step(cluster, STUCK - timedelta(seconds=1))
    assert cluster.pods()["j-worker-1"]["status"]["phase"] == "Running"  # within its grace and margin: untouched
    status = step(cluster, STUCK)
    stuck = cluster.pods()["j-worker-1"]
    assert stuck["status"]["phase"] == "Failed" and stuck["status"]["message"] == MESSAGE
    writes = [kind for kind, ref in cluster.writes if ref.name.startswith("j-worker-1")]
    assert writes[-2:] == ["patch_pod_status", "create"]  # Kueue counts it gone before the replacement exists
    ready = condition(status, "WorkersReady")
    assert ready["reason"] == STUCK_TERMINATING and "marks it Failed so Kueue counts it gone" in ready["message"]
    for _ in range(3):  # Kueue's passes: the replacement is not excess, and the old pod is let go
        cluster.kueue_sync()
        step(cluster, STUCK)
    assert cluster.pods()["j-worker-1-1"]["spec"]["schedulingGates"] == []
    assert finalized(cluster.pods()["j-worker-1"])
    cluster.place("j-worker-1-1", "node-9")
    cluster.set_pod("j-worker-1-1", "Running", ready=True)
    status = step(cluster, STUCK)
    assert status["phase"] == "Running" and status["restarts"] == 0
    assert len([w for w in cluster.writes if w[0] == "patch_pod_status"]) == 1


def test_a_failed_job_with_a_worker_on_a_lost_node_ends_its_kueue_group_and_frees_the_quota():
    cluster = admitted(FakeCluster(kueue=True), queued_job(runPolicy={"backoffLimit": 0}))
    cluster.lose_node("node-j-worker-1")
    cluster.exit_pod("j-worker-0", 1)
    assert step(cluster, T0)["phase"] == "Failed"
    cluster.kueue_sync()
    assert not any(c["type"] == "Finished" for c in cluster.workload("j")["status"]["conditions"])
    step(cluster, STUCK)  # the stuck pod marked Failed: none of the group runs
    cluster.kueue_sync()
    finished = next(c for c in cluster.workload("j")["status"]["conditions"] if c["type"] == "Finished")
    assert finished["status"] == "True" and all(finalized(p) for p in cluster.pods().values())

