"""Optional APIs discovered, not guessed (discovery.py): a job that needs what the cluster does not serve, or what
the operator may not create, fails admission with BackendUnavailable and creates nothing; `gang: native` renders for
the version of Kubernetes' PodGroup the cluster serves."""

import pytest
from fake_cluster import FakeCluster
from test_reconcile import NS, T0, condition, manifest

from brain_operator.cluster.discovery import OLD_WORKLOAD, OPTIONAL, PYTORCHJOB, ServedApis, verb
from brain_operator.reconcile import reconcile
from brain_operator.objects.schedulers import COSCHEDULING_POD_GROUP, VOLCANO_POD_GROUP, WORKLOAD

V1ALPHA3 = ("scheduling.k8s.io/v1alpha3", "PodGroup")


def step(cluster, name="j"):
    return reconcile(cluster.get_job(NS, name), cluster, T0, apis=cluster.discover([NS]))


def warnings(cluster):
    return [(e.reason, e.message) for _, e in cluster.events if e.type == "Warning"]


def test_discovery_picks_the_native_version_the_cluster_serves():
    assert ServedApis(frozenset({V1ALPHA3})).native_pod_group() == "scheduling.k8s.io/v1alpha3"
    newest = {("scheduling.k8s.io/v1alpha2", "PodGroup"), V1ALPHA3, ("scheduling.k8s.io/v1beta1", "PodGroup")}
    assert ServedApis(frozenset(newest)).native_pod_group() == "scheduling.k8s.io/v1beta1"
    assert ServedApis().native_pod_group() is None
    cluster = FakeCluster(served={V1ALPHA3})
    cluster.apply_job(manifest(scheduling={"gang": "native"}))
    assert step(cluster)["phase"] == "Pending"
    group = next(o for r, o in cluster.objects.items() if r.kind == "PodGroup")
    assert group["apiVersion"] == "scheduling.k8s.io/v1alpha3"
    assert cluster.pods()["j-worker-0"]["spec"]["schedulingGroup"] == {"podGroupName": "j"}


@pytest.mark.parametrize("gang, kind, remedy", [
    ("coscheduling", COSCHEDULING_POD_GROUP, "install scheduler-plugins' coscheduling"),
    ("volcano", VOLCANO_POD_GROUP, "install Volcano"),
    ("native", None, "GenericWorkload"),
])
def test_a_gang_kind_that_is_not_served_fails_with_its_reason_and_creates_nothing(gang, kind, remedy):
    cluster = FakeCluster(served=[k for k in OPTIONAL if k != kind and k[1] != "PodGroup"])
    cluster.apply_job(manifest(scheduling={"gang": gang}))
    status = step(cluster)
    valid = condition(status, "Valid")
    assert status["phase"] == "Failed" and valid["status"] == "False" and valid["reason"] == "BackendUnavailable"
    assert valid["message"].startswith("spec.scheduling.gang") and remedy in valid["message"]
    assert cluster.kinds() == [] and warnings(cluster)[0] == ("BackendUnavailable", valid["message"])
    # Refused again the same way: nothing new written or said.
    writes, events = len(cluster.writes), len(cluster.events)
    assert step(cluster) == status and (len(cluster.writes), len(cluster.events)) == (writes, events)
    # Once the cluster serves it (a CRD installed), the same job starts.
    cluster.served = set(OPTIONAL)
    status = step(cluster)
    assert status["phase"] == "Pending" and condition(status, "Valid")["status"] == "True"
    assert "PodGroup" in cluster.kinds() and len(cluster.pods()) == 2


def test_a_pytorchjob_the_operator_may_not_create_names_the_chart_value():
    cluster = FakeCluster(forbidden=[PYTORCHJOB])
    cluster.apply_job(manifest(backend="pytorchjob"))
    status = step(cluster)
    message = condition(status, "Valid")["message"]
    assert condition(status, "Valid")["reason"] == "BackendUnavailable" and "pytorchjob.enabled=true" in message
    assert "namespace default" in message and cluster.kinds() == []


def test_a_pytorchjob_on_a_cluster_without_kubeflow_says_what_to_install():
    cluster = FakeCluster(served=[k for k in OPTIONAL if k != PYTORCHJOB])
    cluster.apply_job(manifest(backend="pytorchjob"))
    message = condition(step(cluster), "Valid")["message"]
    assert message.startswith("spec.backend: pytorchjob needs kubeflow.org/v1 PyTorchJob") and "Kubeflow" in message


@pytest.mark.parametrize("backend", ["elastic", "pytorchjob"])
def test_a_queued_job_on_a_cluster_without_kueue_fails_with_what_to_do(backend):
    cluster = FakeCluster(served=[k for k in OPTIONAL if k[1] != WORKLOAD[1]])
    cluster.apply_job(manifest(backend=backend, scheduling={"queueName": "research"}))
    status = step(cluster)
    valid = condition(status, "Valid")
    assert status["phase"] == "Failed" and valid["reason"] == "BackendUnavailable"
    assert valid["message"].startswith("spec.scheduling.queueName: research needs kueue.x-k8s.io/v1beta2 Workload")
    assert "install Kueue" in valid["message"] and "remove spec.scheduling.queueName" in valid["message"]
    assert cluster.kinds() == [] and warnings(cluster)[0] == ("BackendUnavailable", valid["message"])
    # Without the queue the same job runs.
    cluster.apply_job(manifest(backend=backend))
    assert condition(step(cluster), "Valid")["status"] == "True" and cluster.kinds() != []


def test_kueue_serving_only_v1beta1_workloads_runs_a_queued_job_and_names_that_version():
    old = ServedApis(frozenset({OLD_WORKLOAD}))
    assert old.workload() == OLD_WORKLOAD and ServedApis(frozenset({WORKLOAD, OLD_WORKLOAD})).workload() == WORKLOAD
    cluster = FakeCluster(served=[k for k in OPTIONAL if k != WORKLOAD])
    cluster.apply_job(manifest(scheduling={"queueName": "research"}))
    assert condition(step(cluster), "Valid")["status"] == "True" and "Pod" in cluster.kinds()
    refused = FakeCluster(served=[k for k in OPTIONAL if k != WORKLOAD], forbidden=[OLD_WORKLOAD])
    refused.apply_job(manifest(scheduling={"queueName": "research"}))
    message = condition(step(refused), "Valid")["message"]
    assert message.startswith("spec.scheduling.queueName: research needs kueue.x-k8s.io/v1beta1 Workload, which the "
                              "operator may not list")


def test_kueue_workloads_the_operator_may_not_list_name_the_verb():
    cluster = FakeCluster(forbidden=[WORKLOAD])
    cluster.apply_job(manifest(scheduling={"queueName": "research"}))
    message = condition(step(cluster), "Valid")["message"]
    assert "which the operator may not list in namespace default" in message and verb(WORKLOAD) == "list"
