"""Reconcile on a cluster as a real one behaves (issues 13 and 14): retained checkpoint claims, Kueue on both
backends, gang PodGroups and honest spec edits, against the in-memory client."""

from datetime import timedelta

import kopf
import pytest
from fake_cluster import FakeCluster
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_reconcile import NS, T0, condition, manifest, step

from brain_operator import handlers
from brain_operator.backends.deleted import deletion_events
from brain_operator.objects.schedulers import ADMISSION_GATE, POD_GROUP_COUNT_ANNOTATION, POD_GROUP_LABEL
from brain_operator.spec import KIND, OperatorDefaults

TEMPLATE = {"volumeClaimTemplate": {"accessModes": ["ReadWriteMany"], "storage": "5Gi"}}


def writes_since(cluster, mark, kind=None):
    return [(verb, ref) for verb, ref in cluster.writes[mark:] if kind is None or ref.kind == kind]


def claim(cluster, name="j-checkpoints"):
    return next(o for r, o in cluster.objects.items() if r.kind == "PersistentVolumeClaim" and r.name == name)


def mounted_claim(pod):
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "checkpoints")
    return volume["persistentVolumeClaim"]["claimName"]


# ---- checkpoints outlive the job ----


def test_a_retained_claim_outlives_its_job_and_a_recreated_job_resumes_from_it():
    cluster = FakeCluster()
    first = cluster.apply_job(manifest(checkpoint=TEMPLATE))
    step(cluster)
    kept = claim(cluster)
    assert "ownerReferences" not in kept["metadata"] and kept["metadata"]["labels"]["brain.ai/job-name"] == "j"
    gone = cluster.delete_job("j")
    # The garbage collector takes the pods, Service and ConfigMap, some time later; the claim stays.
    assert "Pod" in cluster.kinds()
    cluster.collect_garbage()
    assert cluster.kinds() == ["PersistentVolumeClaim"]
    (event,) = deletion_events(gone)
    assert event.reason == "CheckpointClaimKept" and "j-checkpoints" in event.message
    assert "a new job named j resumes" in event.message and "kubectl delete pvc j-checkpoints -n default" in event.message

    again = cluster.apply_job(manifest(checkpoint=TEMPLATE))
    assert again["metadata"]["uid"] != first["metadata"]["uid"]
    mark = len(cluster.writes)
    step(cluster)
    assert ("create", next(r for r in cluster.objects if r.kind == "PersistentVolumeClaim")) not in cluster.writes[mark:]
    assert {mounted_claim(pod) for pod in cluster.pods().values()} == {"j-checkpoints"}
    assert claim(cluster)["metadata"]["uid"] == kept["metadata"]["uid"]  # the very same claim


def test_reclaim_policy_delete_hands_the_claim_to_the_garbage_collector():
    cluster = FakeCluster()
    cluster.apply_job(manifest(checkpoint={**TEMPLATE, "reclaimPolicy": "Delete"}))
    step(cluster)
    assert claim(cluster)["metadata"]["ownerReferences"][0]["kind"] == KIND
    gone = cluster.delete_job("j")
    cluster.collect_garbage()
    assert cluster.kinds() == [] and deletion_events(gone) == []


def test_deleting_a_job_posts_an_event_naming_the_kept_claim():
    cluster = FakeCluster()
    memo = kopf.Memo(context=handlers.Context(client=cluster, defaults=OperatorDefaults()))
    cluster.apply_job(manifest(checkpoint={"claimName": "team-ckpt"}))
    step(cluster)
    body = cluster.delete_job("j")
    before = len(cluster.events)
    handlers.on_job_event(type="MODIFIED", body=body, memo=memo)
    assert len(cluster.events) == before
    handlers.on_job_event(type="DELETED", body=body, memo=memo)
    [(name, event)] = cluster.events[before:]
    assert name == "j" and "checkpoint claim team-ckpt is kept" in event.message


# ---- honest spec edits: propagated fields reach the ConfigMap and new pods ----


def config_hashes(cluster):
    return {name: pod["metadata"]["annotations"]["brain.ai/config-hash"] for name, pod in cluster.pods().items()}


def test_a_propagated_field_patches_the_config_map_and_new_pods_carry_its_hash():
    cluster = FakeCluster()
    cluster.apply_job(manifest(training={"steps": 100}))
    step(cluster)
    cluster.run_all()
    step(cluster)
    before = config_hashes(cluster)
    assert len(set(before.values())) == 1
    cluster.apply_job(manifest(training={"steps": 300, "logInterval": 5}))
    mark = len(cluster.writes)
    step(cluster)
    (verb, ref), *_ = writes_since(cluster, mark, "ConfigMap")
    assert (verb, ref.name) == ("patch", "j-config")
    assert "steps: 300" in cluster.objects[ref]["data"]["trainer.yaml"]
    assert "log_interval: 5" in cluster.objects[ref]["data"]["trainer.yaml"]
    # Running pods are left alone (they read the new file at their next start)...
    assert config_hashes(cluster) == before and writes_since(cluster, mark, "Pod") == []
    # ...and a pod created from now on carries the new digest.
    cluster.exit_pod("j-worker-1", 1)
    step(cluster)
    hashes = config_hashes(cluster)
    assert hashes["j-worker-0"] == before["j-worker-0"] and hashes["j-worker-1"] != before["j-worker-1"]
    mark = len(cluster.writes)
    step(cluster)
    assert writes_since(cluster, mark, "ConfigMap") == []


def test_a_propagated_field_reaches_the_pytorchjob_pod_templates():
    cluster = FakeCluster()
    cluster.apply_job(manifest(backend="pytorchjob", training={"steps": 100}))
    step(cluster)
    ref = next(r for r in cluster.objects if r.kind == "PyTorchJob")
    digest = cluster.objects[ref]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["metadata"]["annotations"]["brain.ai/config-hash"]
    cluster.apply_job(manifest(backend="pytorchjob", training={"steps": 200}))
    step(cluster)
    replicas = cluster.objects[ref]["spec"]["pytorchReplicaSpecs"]
    new = {role: r["template"]["metadata"]["annotations"]["brain.ai/config-hash"] for role, r in replicas.items()}
    assert set(new) == {"Master", "Worker"} and digest not in new.values() and len(set(new.values())) == 1
    assert replicas["Worker"]["template"]["spec"]["containers"]  # a merge patch: the template is still whole


# ---- Kueue, elastic backend: a plain pod group that Kueue gates and ungates ----


def workload(name, uid=None, reserved=False, reason="Pending", message="couldn't assign flavors to pod set main: insufficient quota for nvidia.com/gpu"):
    labels = {"kueue.x-k8s.io/job-uid": uid} if uid else {}
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "status": {"conditions": [{"type": "QuotaReserved", "status": "True" if reserved else "False", "reason": reason, "message": message}]},
    }


def test_elastic_workers_form_a_kueue_pod_group_that_kueue_alone_gates():
    cluster = FakeCluster(kueue=True)
    cluster.apply_job(manifest(nodes=2, scheduling={"queueName": "team-a"}))
    assert step(cluster)["phase"] == "Pending"  # the pods are being created
    status = step(cluster)  # as the pod events that follow do
    for pod in cluster.pods().values():
        assert pod["metadata"]["labels"][POD_GROUP_LABEL] == "j"
        assert pod["metadata"]["annotations"][POD_GROUP_COUNT_ANNOTATION] == "2"
        assert pod["spec"]["schedulingGates"] == [{"name": ADMISSION_GATE}]  # Kueue's webhook, not us
    assert status["phase"] == "Queued" and condition(status, "Queued")["reason"] == "WaitingForAdmission"
    # Kueue's own reason, from the Workload it named after the group.
    cluster.put(workload("j"))
    mark = len(cluster.writes)
    status = step(cluster)
    queued = condition(status, "Queued")
    assert (queued["reason"], queued["status"]) == ("Pending", "True") and "insufficient quota" in queued["message"]
    assert writes_since(cluster, mark, "Pod") == []
    cluster.admit()
    cluster.run_all()
    assert step(cluster)["phase"] == "Running"
    # A replaced worker rejoins its group: same label and count; Kueue gates it, we never touch the gate. Kueue's
    # finalizer holds the failed pod until a replacement exists, so the replacement takes a new name at once, with
    # the old one's hostname; then Kueue lets the failed pod go.
    cluster.exit_pod("j-worker-1", 1)
    status = step(cluster)
    assert status["phase"] == "Restarting" and cluster.pods()["j-worker-1"]["metadata"]["deletionTimestamp"]
    fresh = cluster.pods()["j-worker-1-1"]
    assert fresh["spec"]["hostname"] == "j-worker-1"
    assert fresh["metadata"]["labels"][POD_GROUP_LABEL] == "j"
    assert fresh["metadata"]["annotations"][POD_GROUP_COUNT_ANNOTATION] == "2"
    assert fresh["spec"]["schedulingGates"] == [{"name": ADMISSION_GATE}]
    assert step(cluster)["phase"] != "Queued"  # one gated replacement is a restart, not a queued job
    cluster.kueue_sync()
    assert "j-worker-1" not in cluster.pods() and not cluster.pods()["j-worker-1-1"]["spec"]["schedulingGates"]


def test_resizing_a_kueue_pod_group_replaces_every_worker_with_the_new_count():
    cluster = FakeCluster(kueue=True)
    elastic = {"minNodes": 1, "maxNodes": 4}
    cluster.apply_job(manifest(nodes=2, elastic=elastic, scheduling={"queueName": "q"}))
    step(cluster)
    cluster.admit()
    cluster.run_all()
    step(cluster)
    cluster.apply_job(manifest(nodes=3, elastic=elastic, scheduling={"queueName": "q"}))
    status = step(cluster)
    # Kueue fixes a group's size at admission: the old members go (not as failures) with the old group's Workload,
    # whose deletion makes Kueue let them go, and come back as a group of 3.
    assert status["restarts"] == 0 and cluster.workload("j")["metadata"]["deletionTimestamp"]
    cluster.kubelet_confirms()
    cluster.kueue_sync()
    assert cluster.pods() == {} and cluster.workload("j") is None
    step(cluster)
    counts = {name: pod["metadata"]["annotations"][POD_GROUP_COUNT_ANNOTATION] for name, pod in cluster.pods().items()}
    assert counts == {"j-worker-0": "3", "j-worker-1": "3", "j-worker-2": "3"}


ACTIONS = st.lists(
    st.sampled_from(["reconcile", "admit", "run", "fail", "evict", "scale", "suspend", "resume", "workload", "edit"]),
    min_size=1,
    max_size=12,
)


def kueue_suspend(cluster):
    return next((o["spec"]["runPolicy"]["suspend"] for r, o in cluster.objects.items() if r.kind == "PyTorchJob"), None)


class Recording(FakeCluster):
    """Keeps every object the operator asked to create, before Kueue's webhook mutates it, and every patch."""

    def __init__(self):
        super().__init__(kueue=True)
        self.asked: list[dict] = []
        self.patched: list[tuple] = []

    def create(self, obj):
        self.asked.append(obj)
        return super().create(obj)

    def patch(self, ref, body):
        self.patched.append((ref, body))
        return super().patch(ref, body)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions=ACTIONS, backend=st.sampled_from(["elastic", "pytorchjob"]))
def test_no_plan_of_ours_ever_adds_or_removes_a_scheduling_gate_or_touches_kueues_suspend(actions, backend):
    cluster = Recording()
    elastic, nodes, suspend, steps = {"minNodes": 1, "maxNodes": 3}, 2, False, 10

    def job():
        return manifest(nodes=nodes, backend=backend, elastic=elastic, training={"steps": steps},
                        scheduling={"queueName": "q"}, runPolicy={"suspend": suspend})

    cluster.apply_job(job())
    step(cluster)
    for action in actions:
        pods = sorted(cluster.pods())
        if action == "admit":
            cluster.admit()
        elif action == "run":
            for name in pods:
                if not cluster.pods()[name]["spec"].get("schedulingGates"):
                    cluster.set_pod(name, "Running", ready=True)
        elif action == "fail" and pods:
            cluster.exit_pod(pods[0], 1)
        elif action == "evict" and pods:
            cluster.evict_pod(pods[0])
        elif action in ("scale", "suspend", "resume", "edit"):
            nodes = 3 if action == "scale" else nodes
            suspend = {"suspend": True, "resume": False}.get(action, suspend)
            steps += 10 if action == "edit" else 0
            cluster.apply_job(job())
        elif action == "workload":
            cluster.put(workload("j"))
        before = kueue_suspend(cluster)
        step(cluster)
        # Kueue's suspend flag never moves under our hand: the job's own suspend goes to the Workload.
        assert kueue_suspend(cluster) == before, f"runPolicy.suspend changed by us after {action!r}"
    # The only pod patch of ours ends a failed job's group (retriable-in-group), never a gate.
    unretriable = {"metadata": {"annotations": {"kueue.x-k8s.io/retriable-in-group": "false"}}}
    assert all(body == unretriable for ref, body in cluster.patched if ref.kind == "Pod")
    assert all(not obj.get("spec", {}).get("schedulingGates") for obj in cluster.asked)
    for obj in cluster.asked:
        for replica in obj.get("spec", {}).get("pytorchReplicaSpecs", {}).values():
            assert not replica["template"]["spec"].get("schedulingGates")


# ---- Kueue, PyTorchJob backend: Kueue owns runPolicy.suspend ----


def kubeflow_pytorchjob(cluster):
    ref = next(r for r in cluster.objects if r.kind == "PyTorchJob")
    return ref, cluster.objects[ref]


def test_a_pytorchjob_kueue_suspends_stays_suspended_with_no_patch_from_us_until_kueue_admits_it():
    cluster = FakeCluster(kueue=True)
    cluster.apply_job(manifest(backend="pytorchjob", scheduling={"queueName": "team-a"}))
    step(cluster)
    ref, pytorchjob = kubeflow_pytorchjob(cluster)
    assert pytorchjob["spec"]["runPolicy"]["suspend"] is True  # Kueue's webhook
    assert "schedulingPolicy" not in pytorchjob["spec"]["runPolicy"]  # a Kueue queue is not a Volcano queue
    cluster.put(workload("pytorchjob-j-1a2b3", uid=pytorchjob["metadata"]["uid"]))
    cluster.put(workload("other", uid="someone-else", reason="Other"))
    mark = len(cluster.writes)
    for minute in range(3):
        status = step(cluster, T0 + timedelta(minutes=minute))
    assert writes_since(cluster, mark, "PyTorchJob") == []
    assert cluster.objects[ref]["spec"]["runPolicy"]["suspend"] is True
    queued = condition(status, "Queued")
    assert status["phase"] == "Queued" and queued["reason"] == "Pending" and "insufficient quota" in queued["message"]
    # Kueue admits it by unsuspending; Kubeflow runs it; we still write nothing to it.
    cluster.admit()
    cluster.objects[ref]["status"] = {
        "conditions": [{"type": "Running", "status": "True", "reason": "PyTorchJobRunning", "lastTransitionTime": "2026-11-22T12:05:00Z"}],
        "replicaStatuses": {"Master": {"active": 1}, "Worker": {"active": 1}},
    }
    mark = len(cluster.writes)
    assert step(cluster)["phase"] == "Running" and writes_since(cluster, mark, "PyTorchJob") == []
    # Kueue preempts it (suspends it again): queued once more, still not our write to undo.
    cluster.objects[ref]["spec"]["runPolicy"]["suspend"] = True
    cluster.objects[ref]["status"]["conditions"].append(
        {"type": "Suspended", "status": "True", "reason": "PyTorchJobSuspended", "lastTransitionTime": "2026-11-22T12:09:00Z"}
    )
    mark = len(cluster.writes)
    assert step(cluster)["phase"] == "Queued" and writes_since(cluster, mark, "PyTorchJob") == []


def test_suspending_a_queued_pytorchjob_deactivates_its_workload_and_resuming_reactivates_it():
    cluster = FakeCluster(kueue=True)
    queue = {"queueName": "q"}
    cluster.apply_job(manifest(backend="pytorchjob", scheduling=queue))
    step(cluster)
    cluster.admit()
    ref, pytorchjob = kubeflow_pytorchjob(cluster)
    assert pytorchjob["spec"]["runPolicy"]["suspend"] is False
    wl_ref = next(r for r in cluster.objects if r.kind == "Workload")
    # A suspend patched into the PyTorchJob is undone by Kueue at once ("Job admitted, unsuspending"): the fake
    # does what Kueue does, so that way cannot pass.
    cluster.objects[ref]["spec"]["runPolicy"]["suspend"] = True
    cluster.kueue_sync()
    assert cluster.objects[ref]["spec"]["runPolicy"]["suspend"] is False
    # Ours: the Workload deactivated; Kueue evicts it, suspends the PyTorchJob and frees its quota.
    cluster.apply_job(manifest(backend="pytorchjob", scheduling=queue, runPolicy={"suspend": True}))
    mark = len(cluster.writes)
    step(cluster)
    assert writes_since(cluster, mark, "Workload") == [("patch", wl_ref)]
    assert writes_since(cluster, mark, "PyTorchJob") == [("patch", ref)]
    assert cluster.objects[wl_ref]["spec"]["active"] is False
    assert cluster.objects[ref]["metadata"]["annotations"]["brain.ai/suspend"] == "true"
    cluster.kueue_sync()
    assert cluster.objects[ref]["spec"]["runPolicy"]["suspend"] is True
    assert condition(cluster.objects[wl_ref]["status"], "QuotaReserved")["status"] == "False"
    cluster.objects[ref]["status"] = {"conditions": [  # Kubeflow stops its pods
        {"type": "Suspended", "status": "True", "reason": "PyTorchJobSuspended", "lastTransitionTime": "2026-11-22T12:09:00Z"}]}
    mark = len(cluster.writes)
    assert step(cluster)["phase"] == "Suspended" and writes_since(cluster, mark, "Workload") == []
    cluster.kueue_sync()
    assert cluster.objects[ref]["spec"]["runPolicy"]["suspend"] is True  # it stays suspended
    # Resumed: the Workload active again, queued by Kueue, which admits and unsuspends it.
    cluster.apply_job(manifest(backend="pytorchjob", scheduling=queue, runPolicy={"suspend": False}))
    mark = len(cluster.writes)
    step(cluster)
    assert writes_since(cluster, mark, "Workload") == [("patch", wl_ref)]
    assert writes_since(cluster, mark, "PyTorchJob") == [("patch", ref)]
    assert cluster.objects[wl_ref]["spec"]["active"] is True
    cluster.admit()
    assert cluster.objects[ref]["spec"]["runPolicy"]["suspend"] is False
    mark = len(cluster.writes)
    step(cluster)
    assert writes_since(cluster, mark, "Workload") == [] and writes_since(cluster, mark, "PyTorchJob") == []


def test_a_queued_pytorchjob_created_suspended_has_its_workload_deactivated_once_kueue_made_it():
    cluster = FakeCluster(kueue=True)
    cluster.apply_job(manifest(backend="pytorchjob", scheduling={"queueName": "q"}, runPolicy={"suspend": True}))
    step(cluster)
    ref, _ = kubeflow_pytorchjob(cluster)
    mark = len(cluster.writes)
    step(cluster)  # no Workload yet: nothing to deactivate
    assert writes_since(cluster, mark, "PyTorchJob") == []
    cluster.kueue_sync()
    wl_ref = next(r for r in cluster.objects if r.kind == "Workload")
    step(cluster)
    assert cluster.objects[wl_ref]["spec"]["active"] is False
    cluster.admit()  # Kueue admits only active Workloads
    assert cluster.objects[ref]["spec"]["runPolicy"]["suspend"] is True


# ---- gang scheduling: a PodGroup owned by the job, every pod linked to it ----


@pytest.mark.parametrize(
    ("gang", "api_version", "link"),
    [
        ("native", "scheduling.k8s.io/v1alpha2", lambda pod: pod["spec"]["schedulingGroup"] == {"podGroupName": "j"}),
        ("coscheduling", "scheduling.x-k8s.io/v1alpha1", lambda pod: pod["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == "j"),
        ("volcano", "scheduling.volcano.sh/v1beta1", lambda pod: pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == "j"),
    ],
)
def test_a_gang_scheduled_job_gets_one_pod_group_and_its_pods_join_it(gang, api_version, link):
    cluster = FakeCluster()
    cluster.apply_job(manifest(nodes=3, elastic={"minNodes": 2, "maxNodes": 4}, scheduling={"gang": gang}))
    step(cluster)
    (group,) = [o for r, o in cluster.objects.items() if r.kind == "PodGroup"]
    assert group["apiVersion"] == api_version and group["metadata"]["name"] == "j"
    assert group["metadata"]["ownerReferences"][0]["uid"] == cluster.get_job(NS, "j")["metadata"]["uid"]
    assert all(link(pod) for pod in cluster.pods().values())
    # A deleted PodGroup comes back; a second pass writes nothing.
    del cluster.objects[next(r for r in cluster.objects if r.kind == "PodGroup")]
    step(cluster)
    mark = len(cluster.writes)
    step(cluster)
    assert writes_since(cluster, mark) == [] and "PodGroup" in cluster.kinds()
