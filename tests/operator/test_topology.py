"""spec.scheduling.topology (issue 33 point 6): Kueue's Topology Aware Scheduling annotations on the elastic
backend's pod group, in torchrun's rank order, and refused where it cannot be honoured."""

import pytest
from fake_cluster import POD_INDEX_LABEL, FakeCluster
from test_reconcile import NS, manifest, step

from brain_operator.backends import render
from brain_operator.backends.elastic.topology import INDEX_LABEL_ANNOTATION, PREFERRED_ANNOTATION, RANK_ORDER_LABEL, \
    REQUIRED_ANNOTATION, rank_order
from brain_operator.spec import OperatorDefaults, parse_job
from brain_trainer.schema import ConfigError

RACK = "cloud.provider.com/topology-rack"


def job(**spec):
    return parse_job({**manifest(**spec), "metadata": {"name": "j", "namespace": NS, "uid": "u"}},
                     defaults=OperatorDefaults(image="img:1"))


def test_kueue_places_consecutive_indices_together_and_those_are_torchruns_consecutive_ranks():
    nodes = 12
    # torchrun's c10d rendezvous ranks nodes by their FQDN as text (dynamic_rendezvous.py: sorted participants).
    fqdns = sorted(f"j-worker-{i}.j-workers.{NS}.svc.cluster.local" for i in range(nodes))
    torch_rank = {fqdn.split(".")[0]: rank for rank, fqdn in enumerate(fqdns)}
    assert all(rank_order("j", nodes, i) == torch_rank[f"j-worker-{i}"] for i in range(nodes))
    assert rank_order("j", nodes, 10) == 2 and rank_order("j", nodes, 2) == 4  # text order, not number order


@pytest.mark.parametrize("level, annotation", [({"required": RACK}, REQUIRED_ANNOTATION),
                                               ({"preferred": RACK}, PREFERRED_ANNOTATION)])
def test_each_worker_pod_carries_the_topology_request_and_its_rank_order_for_kueue(level, annotation):
    pods = [o for o in render(job(nodes=3, scheduling={"queueName": "q", "topology": level})) if o["kind"] == "Pod"]
    for i, pod in enumerate(pods):
        meta = pod["metadata"]
        assert meta["annotations"][annotation] == RACK and meta["annotations"][INDEX_LABEL_ANNOTATION] == RANK_ORDER_LABEL
        assert meta["labels"][RANK_ORDER_LABEL] == str(rank_order("j", 3, i))
        assert {REQUIRED_ANNOTATION, PREFERRED_ANNOTATION} - {annotation} & set(meta["annotations"]) == set()


def test_kueues_webhook_takes_the_index_it_places_by_from_the_rank_order_label():
    cluster = FakeCluster(kueue=True)
    cluster.apply_job(manifest(nodes=12, scheduling={"queueName": "q", "topology": {"required": RACK}}))
    step(cluster)
    assert {n: p["metadata"]["labels"][POD_INDEX_LABEL] for n, p in cluster.pods().items()}["j-worker-10"] == "2"


@pytest.mark.parametrize("spec, message", [
    ({"scheduling": {"topology": {"required": RACK}}}, "spec.scheduling.topology: Kueue's Topology Aware Scheduling "
                                                       "places queued workers only: set scheduling.queueName"),
    ({"backend": "pytorchjob", "scheduling": {"queueName": "q", "topology": {"required": RACK}}},
     "spec.scheduling.topology: applies to the elastic backend, got pytorchjob"),
    ({"scheduling": {"queueName": "q", "topology": {}}},
     "spec.scheduling.topology.required: set either required or preferred"),
    ({"scheduling": {"queueName": "q", "topology": {"required": RACK, "preferred": RACK}}},
     "spec.scheduling.topology.required: set either"),
    ({"scheduling": {"queueName": "q", "topology": {"required": "not a label!"}}},
     "spec.scheduling.topology.required"),
])
def test_a_topology_that_cannot_be_honoured_is_refused_naming_the_field(spec, message):
    with pytest.raises(ConfigError) as err:
        job(**spec)
    assert any(message in str(e) for e in err.value.errors), [str(e) for e in err.value.errors]
