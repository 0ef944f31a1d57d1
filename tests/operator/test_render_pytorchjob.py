"""The pytorchjob backend: what Kubeflow's own SDK model reads back from our rendering."""

from __future__ import annotations

import json

import pytest
from kubeflow.training import ApiClient, KubeflowOrgV1PyTorchJob

from brain_operator.backends import render, render_pytorchjob
from brain_operator.spec import parse_job


def manifest(**spec):
    return {
        "apiVersion": "brain.ai/v1alpha1",
        "kind": "BrainTrainingJob",
        "metadata": {"name": "kf", "namespace": "ml", "uid": "u-1"},
        "spec": {
            "image": "trainer:1",
            "backend": "pytorchjob",
            "nodes": 3,
            "nprocPerNode": 2,
            "checkpoint": {"volumeClaimTemplate": {"accessModes": ["ReadWriteMany"]}},
            "nccl": {"debug": "WARN"},
            "scheduling": {"queueName": "q1", "volcanoQueue": "vq", "priorityClassName": "high"},
            "runPolicy": {"backoffLimit": 4, "activeDeadlineSeconds": 3600, "ttlSecondsAfterFinished": 60, "suspend": True},
            **spec,
        },
    }


class _Response:
    def __init__(self, obj):
        self.data = json.dumps(obj)


def deserialize(obj) -> KubeflowOrgV1PyTorchJob:
    return ApiClient().deserialize(_Response(obj), "KubeflowOrgV1PyTorchJob")


def pytorchjob(objects):
    (found,) = [o for o in objects if o["kind"] == "PyTorchJob"]
    return found


def test_fixed_size_job_is_master_plus_workers():
    objects = render_pytorchjob(parse_job(manifest()))
    assert [o["kind"] for o in objects] == ["ConfigMap", "PersistentVolumeClaim", "NetworkPolicy", "PyTorchJob"]
    model = deserialize(pytorchjob(objects))
    assert model.api_version == "kubeflow.org/v1" and model.kind == "PyTorchJob"
    assert model.metadata.name == "kf" and model.metadata.namespace == "ml"
    assert model.metadata.owner_references[0].uid == "u-1" and model.metadata.owner_references[0].controller
    assert model.metadata.labels["kueue.x-k8s.io/queue-name"] == "q1"
    specs = model.spec.pytorch_replica_specs
    assert set(specs) == {"Master", "Worker"}
    assert specs["Master"].replicas == 1 and specs["Worker"].replicas == 2
    assert model.spec.nproc_per_node == "2"
    assert model.spec.elastic_policy is None
    run = model.spec.run_policy
    assert (run.backoff_limit, run.active_deadline_seconds, run.ttl_seconds_after_finished, run.suspend) == (4, 3600, 60, True)
    # The Kueue queue is only the label; Kubeflow's schedulingPolicy.queue is Volcano's, a field of its own.
    assert (run.scheduling_policy.queue, run.scheduling_policy.priority_class) == ("vq", "high")
    # Under a Kueue queue the job's suspend reaches Kueue's Workload once Kueue made it: none applied yet.
    assert model.metadata.annotations["brain.ai/suspend"] == "false"
    for role in ("Master", "Worker"):
        pod = specs[role].template.spec
        (c,) = pod.containers
        assert c.name == "pytorch"  # where the training operator injects its variables
        assert c.command == ["tini", "--", "python", "-m", "brain_trainer.agent"] and c.args == ["-m", "brain_trainer", "--config", "/etc/brain/trainer.yaml"]
        env = {e.name: e.value for e in c.env}
        assert env["NCCL_DEBUG"] == "WARN" and env["PYTHONUNBUFFERED"] == "1"
        # The training operator sets torchrun's other variables; it has none for the shutdown timeout.
        assert [name for name in env if name.startswith("PET_")] == ["PET_SHUTDOWN_TIMEOUT"]
        assert pod.automount_service_account_token is False
        assert c.security_context.allow_privilege_escalation is False
        assert {v.name for v in pod.volumes} == {"config", "dshm", "checkpoints"}
        assert specs[role].restart_policy == "OnFailure"


def test_elastic_job_carries_an_elastic_policy():
    objects = render(parse_job(manifest(nodes=2, elastic={"minNodes": 1, "maxNodes": 4, "maxRestarts": 9})))
    model = deserialize(pytorchjob(objects))
    policy = model.spec.elastic_policy
    assert (policy.min_replicas, policy.max_replicas, policy.rdzv_backend, policy.max_restarts) == (1, 4, "c10d", 9)
    # A late worker 0 keeps the others waiting as long as a start may take (watchdog.startupSeconds).
    assert {(c.key, c.value) for c in policy.rdzv_conf} == {("join_timeout", "1800"), ("read_timeout", "1800")}
    # Kubeflow's elastic jobs are Workers only: the rendezvous is worker 0 and the range counts Workers.
    assert set(model.spec.pytorch_replica_specs) == {"Worker"}
    assert model.spec.pytorch_replica_specs["Worker"].replicas == 2
    assert model.spec.nproc_per_node == "2"
    assert model.spec.run_policy.backoff_limit == 4


def test_single_node_job_has_only_a_master():
    model = deserialize(pytorchjob(render(parse_job(manifest(nodes=1)))))
    assert set(model.spec.pytorch_replica_specs) == {"Master"}


@pytest.mark.parametrize("claim", [{"claimName": "existing"}, {}])
def test_no_claim_object_without_a_template(claim):
    objects = render_pytorchjob(parse_job(manifest(nodes=1, checkpoint=claim)))
    assert [o["kind"] for o in objects] == ["ConfigMap", "NetworkPolicy", "PyTorchJob"]
