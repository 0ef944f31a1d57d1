"""The cluster as it really behaves (issue 21, points 0, 1, 6 and 7), against the faithful fake.

First the fake itself: each API-server, garbage-collector, kubelet and
taint-manager behaviour it imitates, so a test that leans on it leans on
Kubernetes' behaviour. Then the operator against it: a lost node never
blocks the job, children count only under this job's uid, and the operator
stays exact while its view lags and other writers race it.
"""

import re
from datetime import timedelta

import pytest
from counting_cluster import CountingCluster
from fake_cluster import FakeCluster, Watch
from faulty_cluster import FaultyCluster
from test_reconcile import NS, T0, condition, manifest, step

from brain_operator.cluster.api import ApiUnavailable, Conflict
from brain_operator.objects.refs import ObjectRef
from brain_operator.cluster.expectations import EXPECTATIONS_TIMEOUT, Expectations
from brain_operator.objects.names import POD_NAME_MAX, worker_pod_name
from brain_operator.reconcile import reconcile
from brain_operator.spec import API_VERSION, KIND
from brain_operator.spec.kube import NAME_PATTERN
from brain_operator.status.waiting import STUCK_TERMINATING, TERMINATING_MARGIN_SECONDS
from brain_trainer import contract

GRACE = 300  # the worker pods' rendered terminationGracePeriodSeconds


def pod_ref(name):
    return ObjectRef("v1", "Pod", NS, name)


def running_on_nodes(cluster, **spec):
    """A job whose pods were scheduled (worker i on node-i) and run."""
    cluster.apply_job(manifest(**spec))
    step(cluster)
    for i, name in enumerate(sorted(cluster.pods())):
        cluster.place(name, f"node-{i}")
    cluster.run_all()
    assert step(cluster)["phase"] == "Running"


def warnings(cluster, reason):
    return [e for _, e in cluster.events if e.type == "Warning" and e.reason == reason]


# ---- the fake is as faithful as the API server ----


def test_a_running_pod_is_terminating_until_its_kubelet_confirms_and_an_unscheduled_or_failed_one_goes_at_once():
    cluster = FakeCluster()
    running_on_nodes(cluster, nodes=3)
    cluster.now = T0 + timedelta(seconds=5)
    cluster.delete(pod_ref("j-worker-0"))
    meta = cluster.pods()["j-worker-0"]["metadata"]
    assert meta["deletionTimestamp"] == "2026-11-22T12:05:05Z" and meta["deletionGracePeriodSeconds"] == GRACE
    assert cluster.kubelet_confirms() == ["j-worker-0"] and "j-worker-0" not in cluster.pods()
    cluster.exit_pod("j-worker-1", 1)  # finished: nothing left to stop
    cluster.delete(pod_ref("j-worker-1"))
    cluster.objects[pod_ref("j-worker-2")]["spec"].pop("nodeName")  # never scheduled
    cluster.delete(pod_ref("j-worker-2"))
    assert cluster.pods() == {}


def test_a_force_delete_removes_a_pod_no_kubelet_confirms():
    cluster = FakeCluster()
    running_on_nodes(cluster)
    cluster.lose_node("node-1")
    assert cluster.kubelet_confirms() == [] and cluster.pods()["j-worker-1"]["metadata"]["deletionTimestamp"]
    cluster.delete(pod_ref("j-worker-1"), grace=0)  # kubectl delete pod --force
    assert "j-worker-1" not in cluster.pods()


def test_finalizers_hold_any_kind_and_a_name_held_by_a_terminating_object_is_not_created_over():
    cluster = FakeCluster()
    cluster.apply_job(manifest())
    step(cluster)
    ref = next(r for r in cluster.objects if r.kind == "ConfigMap")
    cluster.objects[ref]["metadata"]["finalizers"] = ["example.com/hold"]
    wanted = {**cluster.objects[ref], "metadata": {**cluster.objects[ref]["metadata"]}}
    cluster.delete(ref)
    assert cluster.objects[ref]["metadata"]["deletionTimestamp"]
    # 409 AlreadyExists, and the object there is on its way out: not "exists already".
    with pytest.raises(Conflict, match="being deleted"):
        cluster.create(wanted)
    cluster.remove_finalizer(ref.name, "example.com/hold", kind="ConfigMap")
    assert ref not in cluster.objects


def test_a_409_is_success_only_for_our_own_live_object():
    cluster = FakeCluster()
    cluster.apply_job(manifest())
    step(cluster)
    pod = cluster.pods()["j-worker-0"]
    assert cluster.create(pod) is None  # ours, alive: exists already
    stranger = {**pod, "metadata": {**pod["metadata"], "ownerReferences": [
        {**pod["metadata"]["ownerReferences"][0], "uid": "another-job"}]}}
    with pytest.raises(Conflict, match="another owner"):
        cluster.create(stranger)
    assert [kind for kind, ref in cluster.writes if ref.name == "j-worker-0"][-2:] == ["already_exists"] * 2


def test_a_delete_whose_uid_precondition_fails_and_a_status_write_from_a_stale_version_are_conflicts():
    cluster = FakeCluster()
    job = cluster.apply_job(manifest())
    step(cluster)
    old = ObjectRef.of(cluster.pods()["j-worker-0"])
    cluster.exit_pod("j-worker-0", 1)
    step(cluster)  # deleted and replaced: the same name, another uid
    cluster.delete(old)
    assert ("conflict", old) in cluster.writes and "j-worker-0" in cluster.pods()
    with pytest.raises(Conflict):
        cluster.patch_status(NS, "j", {"restarts": 7}, job["metadata"]["resourceVersion"])


def test_the_garbage_collector_works_later_and_by_owner_uid():
    cluster = FakeCluster()
    running_on_nodes(cluster)
    cluster.delete_job("j")
    assert "Pod" in cluster.kinds()  # not at once
    cluster.apply_job(manifest())  # the same name, another uid
    gone = cluster.collect_garbage()
    assert {ref.kind for ref in gone} == {"Pod", "Service", "ConfigMap", "NetworkPolicy"}
    # Gracefully: the old pods run out their grace, then their kubelets confirm.
    assert all(pod["metadata"]["deletionTimestamp"] for pod in cluster.pods().values())
    cluster.kubelet_confirms()
    assert cluster.kinds() == []


def test_a_watch_lags_the_store_by_its_passes():
    cluster = FakeCluster()
    cluster.apply_job(manifest())
    watch = Watch(cluster, lag=1)
    watch.tick()
    reconcile(cluster.get_job(NS, "j"), cluster, T0, observed=watch)
    watch.tick()
    assert watch(NS, "j", ("v1", "Pod")) == []  # the creates of the pass before are not delivered yet
    watch.tick()
    assert sorted(p["metadata"]["name"] for p in watch(NS, "j", ("v1", "Pod"))) == ["j-worker-0", "j-worker-1"]


def test_a_lost_nodes_pods_stay_terminating_until_podgc_and_every_victim_says_why():
    cluster = FakeCluster()
    running_on_nodes(cluster, nodes=4)
    cluster.lose_node("node-0")
    cluster.preempt("j-worker-1")
    cluster.evict("j-worker-2")
    cluster.evict_pod("j-worker-3")
    reasons = {name: next(c["reason"] for c in pod["status"]["conditions"] if c["type"] == "DisruptionTarget")
               for name, pod in cluster.pods().items()}
    assert reasons == {"j-worker-0": "DeletionByTaintManager", "j-worker-1": "PreemptionByScheduler",
                       "j-worker-2": "EvictionByEvictionAPI", "j-worker-3": "TerminationByKubelet"}
    assert cluster.kubelet_confirms() == ["j-worker-1", "j-worker-2"]
    assert cluster.kubelet_confirms() == [] and "j-worker-0" in cluster.pods()  # no kubelet answers for node-0
    cluster.out_of_service("node-0")
    assert "j-worker-0" not in cluster.pods()


# ---- 1. a lost node never blocks the job ----


def test_a_worker_stuck_terminating_on_a_lost_node_is_replaced_under_a_new_name_with_the_same_dns_name():
    cluster = FakeCluster()
    running_on_nodes(cluster)
    cluster.lose_node("node-1")
    stuck_until = T0 + timedelta(seconds=GRACE + TERMINATING_MARGIN_SECONDS)
    # Within its grace and the margin, a Terminating pod still holds its place.
    step(cluster, stuck_until - timedelta(seconds=1))
    assert sorted(cluster.pods()) == ["j-worker-0", "j-worker-1"]
    status = step(cluster, stuck_until)
    old, new = cluster.pods()["j-worker-1"], cluster.pods()["j-worker-1-1"]
    assert (new["spec"]["hostname"], new["spec"]["subdomain"]) == (old["spec"]["hostname"], old["spec"]["subdomain"])
    assert new["spec"]["hostname"] == "j-worker-1"
    env = {e["name"]: e.get("value") for e in new["spec"]["containers"][0]["env"]}
    assert env["PET_RDZV_ENDPOINT"].startswith("j-worker-0.j-workers:")
    # The stuck pod is named, with its node and the remedy, in the condition and one Warning.
    ready = condition(status, "WorkersReady")
    assert ready["reason"] == STUCK_TERMINATING and "j-worker-1" in ready["message"] and "node-1" in ready["message"]
    assert "kubectl delete pod j-worker-1 --force" in ready["message"] and "out-of-service" in ready["message"]
    (warning,) = warnings(cluster, STUCK_TERMINATING)
    assert "j-worker-1" in warning.message and "node-1" in warning.message
    # The node lost costs no restart; nothing more is created; PodGC frees the old name later.
    assert status["restarts"] == 0
    mark = len(cluster.writes)
    step(cluster, stuck_until)
    assert [w for w in cluster.writes[mark:] if w[0] == "create"] == []
    cluster.delete_node("node-1")
    cluster.set_pod("j-worker-1-1", "Running", ready=True)
    status = step(cluster, stuck_until)
    assert sorted(cluster.pods()) == ["j-worker-0", "j-worker-1-1"] and status["phase"] == "Running"
    assert condition(status, "WorkersReady")["status"] == "True"


def test_a_replacement_that_is_itself_stuck_gets_the_next_free_name():
    cluster = FakeCluster()
    running_on_nodes(cluster)
    cluster.lose_node("node-1")
    later = T0 + timedelta(seconds=GRACE + TERMINATING_MARGIN_SECONDS)
    step(cluster, later)
    cluster.place("j-worker-1-1", "node-9")
    cluster.set_pod("j-worker-1-1", "Running", ready=True)
    cluster.now = later
    cluster.lose_node("node-9")
    step(cluster, later + timedelta(seconds=GRACE + TERMINATING_MARGIN_SECONDS))
    assert sorted(cluster.pods()) == ["j-worker-0", "j-worker-1", "j-worker-1-1", "j-worker-1-2"]


@pytest.mark.parametrize("job_name", ["j", "a" * 54, "b" * 45 + "-x"])
def test_replacement_names_are_dns_labels_and_long_job_names_stay_apart(job_name):
    names = {worker_pod_name(job_name, i, attempt) for i in (0, 7) for attempt in (0, 1, 12)}
    assert len(names) == 6
    assert all(len(n) <= POD_NAME_MAX and re.fullmatch(NAME_PATTERN, n) for n in names)
    other = worker_pod_name(job_name[:-1] + "z", 7, 12)
    assert other not in names


# ---- 6. ownership by uid ----


def test_a_job_recreated_under_its_name_never_adopts_the_old_jobs_failed_pod():
    cluster = FakeCluster()
    running_on_nodes(cluster)
    cluster.exit_pod("j-worker-0", 1)
    old_uid = cluster.delete_job("j")["metadata"]["uid"]
    new_uid = cluster.apply_job(manifest())["metadata"]["uid"]
    status = step(cluster)
    # Nothing adopted, nothing counted, nothing created while the old job's children are there.
    assert status["restarts"] == 0 and status["phase"] == "Pending" and not status.get("handledFailures")
    assert status["reason"] == "EarlierJobTerminating" and "Pod j-worker-0" in condition(status, "WorkersReady")["message"]
    assert {p["metadata"]["ownerReferences"][0]["uid"] for p in cluster.pods().values()} == {old_uid}
    cluster.collect_garbage()
    cluster.kubelet_confirms()
    step(cluster)
    status = step(cluster)
    assert {p["metadata"]["ownerReferences"][0]["uid"] for p in cluster.pods().values()} == {new_uid}
    assert status["restarts"] == 0 and status["phase"] == "Pending" and len(cluster.pods()) == 2


# ---- 7. exact under concurrency ----


class Raced(FakeCluster):
    """Another writer (a second replica, or this one before a restart) writes the job's status right after this
    pass read it."""

    def __init__(self):
        super().__init__()
        self.race = None

    def get_job(self, namespace, name):
        job = super().get_job(namespace, name)
        if self.race is not None:
            patch, self.race = self.race, None
            super().patch_status(namespace, name, patch)
        return job


def test_a_status_write_planned_from_a_stale_read_is_refused_and_planned_again():
    cluster = Raced()
    running_on_nodes(cluster)
    cluster.exit_pod("j-worker-1", 1)
    failed_uid = cluster.pods()["j-worker-1"]["metadata"]["uid"]
    # The other writer already counted four incidents, this failure among them.
    cluster.race = {"restarts": 4, "handledFailures": [failed_uid]}
    status = step(cluster)
    assert ("conflict", ObjectRef(API_VERSION, KIND, NS, "j")) in cluster.writes
    # Planned again from what the other wrote: nothing lost (4, not 1), nothing doubled (not 5).
    assert status["restarts"] == 4


def test_a_terminating_pod_the_watch_never_saw_go_is_read_again_before_it_blocks_its_worker():
    cluster = FakeCluster()
    running_on_nodes(cluster)
    cluster.preempt("j-worker-1")
    watch = Watch(cluster)
    watch.tick()
    frozen = watch(NS, "j", ("v1", "Pod"))  # the DELETED event that follows is lost (a 410 relist gap)
    cluster.kubelet_confirms()
    counting = CountingCluster(cluster)

    def observed(namespace, name, kind):
        return [dict(p) for p in frozen] if kind == ("v1", "Pod") else watch(namespace, name, kind)

    reconcile(cluster.get_job(NS, "j"), counting, T0, observed=observed)
    assert counting.calls["GET"] == 1  # the Terminating pod, read again: gone
    assert cluster.pods()["j-worker-1"]["metadata"].get("deletionTimestamp") is None  # its replacement, at once


def test_a_failed_pod_the_watch_never_saw_go_does_not_shadow_its_replacement():
    cluster = FakeCluster()
    running_on_nodes(cluster)
    cluster.exit_pod("j-worker-1", 1)
    ghost = Watch(cluster)
    ghost.tick()
    (failed,) = [p for p in ghost(NS, "j", ("v1", "Pod")) if p["metadata"]["name"] == "j-worker-1"]
    step(cluster)  # counted, deleted at once (nothing to stop), replaced under its name
    cluster.set_pod("j-worker-1", "Running", ready=True)
    watch, counting = Watch(cluster), CountingCluster(cluster)
    watch.tick()

    def observed(namespace, name, kind):  # kopf keys its index by uid: the old pod stays beside the new one
        return [*watch(namespace, name, kind), *([failed] if kind == ("v1", "Pod") else [])]

    mark = len(cluster.writes)
    status = reconcile(cluster.get_job(NS, "j"), counting, T0, observed=observed)
    assert status["restarts"] == 1 and status["phase"] == "Running" and counting.calls["GET"] == 1
    assert cluster.writes[mark:] == [("patch_status", ObjectRef(API_VERSION, KIND, NS, "j"))]


def test_a_lagging_watch_never_gets_a_create_sent_twice():
    cluster = FakeCluster()
    watch, expectations = Watch(cluster, lag=2), Expectations()
    cluster.apply_job(manifest(nodes=4))
    for _ in range(4):
        watch.tick()
        reconcile(cluster.get_job(NS, "j"), cluster, T0, observed=watch, expectations=expectations)
    creates = [ref for kind, ref in cluster.writes if kind == "create"]
    assert len(creates) == len(set(creates)) == 4 + 3  # the pods, the Service, ConfigMap and NetworkPolicy
    assert [w for w in cluster.writes if w[0] == "already_exists"] == []


def test_without_expectations_the_same_lag_sends_creates_twice():
    cluster = FakeCluster()
    watch = Watch(cluster, lag=2)
    cluster.apply_job(manifest(nodes=4))
    for _ in range(3):
        watch.tick()
        reconcile(cluster.get_job(NS, "j"), cluster, T0, observed=watch)
    assert len([w for w in cluster.writes if w[0] == "already_exists"]) == 2 * 7


def test_an_expectation_never_met_expires_and_the_child_is_created_again():
    cluster = FakeCluster()
    expectations = Expectations()
    cluster.apply_job(manifest())
    reconcile(cluster.get_job(NS, "j"), cluster, T0, expectations=expectations)
    # The pod was removed and the watch never said so (nor shows it): it is expected, not created again ...
    cluster._remove(pod_ref("j-worker-0"))
    mark = len(cluster.writes)
    never = lambda namespace, name, kind: []  # noqa: E731 - a watch that delivers nothing
    reconcile(cluster.get_job(NS, "j"), cluster, T0 + EXPECTATIONS_TIMEOUT - timedelta(seconds=1),
              observed=never, expectations=expectations)
    assert not [w for w in cluster.writes[mark:] if w[0] == "create" and w[1].kind == "Pod"]
    # ... until ExpectationsTimeout is over.
    reconcile(cluster.get_job(NS, "j"), cluster, T0 + EXPECTATIONS_TIMEOUT, observed=never, expectations=expectations)
    assert ("create", pod_ref("j-worker-0")) in cluster.writes[mark:]


def test_a_second_pass_while_a_handled_failed_pod_is_still_listed_does_not_count_it_again():
    cluster = FaultyCluster(FakeCluster())
    running_on_nodes(cluster)
    cluster.exit_pod("j-worker-1", 1)
    cluster.fail("delete", kind="Pod")  # the status is written, then the delete is answered 500
    with pytest.raises(ApiUnavailable):
        step(cluster)
    assert cluster.pods()["j-worker-1"]["status"]["phase"] == "Failed"
    assert cluster.get_job(NS, "j")["status"]["restarts"] == 1
    status = step(cluster)  # the failed pod is still there: handled already
    assert status["restarts"] == 1 and cluster.pods()["j-worker-1"]["status"]["phase"] == "Pending"
    assert len([e for _, e in cluster.events if e.reason == "WorkerFailed"]) == 1


def test_a_fail_job_reason_beside_a_restart_reason_in_one_pass_fails_the_job_with_the_data_error():
    cluster = FakeCluster()
    running_on_nodes(cluster)
    cluster.exit_pod("j-worker-0", contract.EXIT_CODES[contract.OUT_OF_MEMORY],
                     message=contract.termination_message(contract.OUT_OF_MEMORY, "CUDA out of memory"))
    cluster.exit_pod("j-worker-1", contract.EXIT_CODES[contract.DATA_ERROR],
                     message=contract.termination_message(contract.DATA_ERROR, "shard 3 is damaged"))
    status = step(cluster)
    failed = condition(status, "Failed")
    assert status["phase"] == "Failed" and failed["reason"] == "DataError"
    assert "j-worker-1" in failed["message"] and "shard 3 is damaged" in failed["message"]
    assert status["restarts"] == 0
