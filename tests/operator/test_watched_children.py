"""Issue 14, point 3: reconcile reads the watched children from memory, so a steady pass lists nothing.

Also what the indexes keep of a child (children.observed_child): enough that
the plan made from it equals the plan made from the full objects.
"""

import pytest
from counting_cluster import CountingCluster, watched
from fake_cluster import FakeCluster
from test_reconcile import NS, T0
from test_reconcile import manifest as reconcile_manifest

from brain_operator.cluster.children import WATCHED_KINDS, observed_child
from brain_operator.cluster.api import controller_uid
from brain_operator.reconcile import plan, reconcile, watched_kinds
from brain_operator.backends import render
from brain_operator.spec import parse_job


def manifest(name="j", nodes=4, **spec):
    """test_reconcile's job, with a checkpoint claim of its own so that every child kind is there to watch."""
    return reconcile_manifest(name, nodes, checkpoint={"volumeClaimTemplate": {"storage": "1Gi"}}, **spec)


def step(cluster, counting, name="j"):
    # As handlers.reconcile_job does: read the job, then reconcile it.
    reconcile(counting.get_job(NS, name), counting, T0, observed=watched(cluster))
    return counting.take()


@pytest.mark.parametrize("gang", ["none", "volcano"])
def test_a_steady_reconcile_makes_no_list_call_and_patches_status_only_on_a_change(gang):
    cluster = FakeCluster()
    counting = CountingCluster(cluster)
    cluster.apply_job(manifest(scheduling={"gang": gang}))
    first = step(cluster, counting)
    # pods, Service, ConfigMap, claim, NetworkPolicy, PodGroup
    assert first["LIST"] == 0 and first["CREATE"] == 4 + 4 + (gang != "none")
    cluster.run_all()
    assert step(cluster, counting) == {"GET": 1, "PATCH status": 1, "CREATE event": 1}  # Pending -> Running
    # Nothing changed: one read of the job, nothing listed, nothing written.
    assert step(cluster, counting) == {"GET": 1}
    cluster.set_pod("j-worker-0", "Running", ready=False)
    assert step(cluster, counting) == {"GET": 1, "PATCH status": 1}


def test_without_watches_every_child_kind_is_listed():
    # What the in-memory tests and `braintrain run` do: no indexes, so reconcile lists.
    cluster = FakeCluster()
    counting = CountingCluster(cluster)
    cluster.apply_job(manifest())
    reconcile(cluster.get_job(NS, "j"), counting, T0)
    assert counting.take()["LIST"] == 5  # Pod, Service, ConfigMap, PersistentVolumeClaim, NetworkPolicy


def test_a_pytorchjob_is_listed_as_it_is_not_watched():
    cluster = FakeCluster()
    counting = CountingCluster(cluster)
    cluster.apply_job(manifest(backend="pytorchjob"))
    step(cluster, counting)
    assert step(cluster, counting) == {"GET": 1, "LIST": 1}


def full_pod(cluster, name, phase, **status):
    cluster.set_pod(name, phase, **status)
    pod = cluster.pods()[name]
    # What the API server sends besides: times, container ids, node, QoS, managed fields.
    pod["metadata"].update(creationTimestamp="2026-11-22T12:00:00Z", resourceVersion="42",
                           managedFields=[{"manager": "kubelet", "operation": "Update"}])
    pod["spec"]["nodeName"] = "node-1"
    pod["status"].update(hostIP="10.0.0.1", podIP="10.1.0.7", qosClass="Guaranteed", startTime="2026-11-22T12:00:01Z")
    return pod


def test_the_plan_from_observed_children_equals_the_plan_from_full_objects():
    cluster = FakeCluster(kueue=True)
    job = manifest(nodes=4, scheduling={"queueName": "q"}, runPolicy={"backoffLimit": 1})
    cluster.apply_job(job)
    reconcile(cluster.get_job(NS, "j"), cluster, T0)
    cluster.admit()
    full_pod(cluster, "j-worker-0", "Running", conditions=[{"type": "Ready", "status": "True"}])
    full_pod(cluster, "j-worker-1", "Pending")
    cluster.exit_pod("j-worker-2", 1, message="CUDA error")
    cluster.evict_pod("j-worker-3")
    manifest_now = cluster.get_job(NS, "j")
    parsed = parse_job(manifest_now)
    desired = render(parsed)
    children = [c for kind in watched_kinds(parsed, desired) for c in cluster.list_children(*kind, NS, "j")]
    assert {(c["apiVersion"], c["kind"]) for c in children} <= WATCHED_KINDS
    full = plan(parsed, desired, children, manifest_now.get("status") or {}, T0)
    kept = plan(parsed, desired, [observed_child(c) for c in children], manifest_now.get("status") or {}, T0)
    assert kept == full and full.deletes and full.events


def test_an_observed_pod_keeps_what_the_plan_reads_and_drops_the_rest():
    cluster = FakeCluster()
    cluster.apply_job(manifest(nodes=1))
    reconcile(cluster.get_job(NS, "j"), cluster, T0)
    scheduled = {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-11-22T12:00:01Z"}
    pod = full_pod(cluster, "j-worker-0", "Running", ready=True, conditions=[scheduled])
    kept = observed_child(pod)
    assert kept["status"] == {"phase": "Running", "podIP": "10.1.0.7", "containerStatuses": [],
                              "conditions": [scheduled, {"type": "Ready", "status": "True"}]}
    assert kept["spec"] == {"nodeName": "node-1"} and "managedFields" not in kept["metadata"]
    assert kept["metadata"]["uid"] == pod["metadata"]["uid"]
    # Whose child it is: the controller's uid (issue 21: children count only when it is their job's).
    assert controller_uid(kept) == controller_uid(pod) == cluster.get_job(NS, "j")["metadata"]["uid"]
    assert len(repr(kept)) * 3 < len(repr(pod))
