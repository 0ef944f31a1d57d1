"""spec.objectStore: how the trainer of both backends reaches the store of checkpoint.uri and data.uri; and
status's lastCheckpoint in the store.

The URIs themselves are tested beside the volumes they replace (test_render_elastic.py, test_data_volume.py),
their validation in test_spec.py's table, the local run in test_local_plan.py, the NetworkPolicy in
test_network_policy.py.
"""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from fake_cluster import FakeCluster
from test_data_volume import pod_specs

from brain_operator.backends import render
from brain_operator.reconcile import reconcile
from brain_operator.local.dataset import job_vocabulary
from brain_operator.sizing.storage import storage_lines
from brain_operator.spec import API_VERSION, KIND, parse_job
from brain_trainer.schema import ConfigError

ENDPOINT = "https://minio.storage.svc:9000"
SIDECAR = {"name": "proxy", "image": "registry.example/proxy:1"}


def manifest(backend="elastic", store=None, **spec):
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": "llm", "namespace": "team-a", "uid": "u-1"},
        "spec": {"image": "registry.example/trainer:1", "backend": backend, "nodes": 2,
                 "checkpoint": {"uri": "s3://team-a-ckpt/llm"}, **({"objectStore": store} if store else {}), **spec},
    }


def trainers(backend, **kwargs):
    """Each worker's trainer container (named trainer, or pytorch in a PyTorchJob), and each pod's other containers."""
    name = {"elastic": "trainer", "pytorchjob": "pytorch"}[backend]
    specs = list(pod_specs(render(parse_job(manifest(backend, **kwargs)))))
    assert specs
    return ([c for s in specs for c in s["containers"] if c["name"] == name],
            [c for s in specs for c in s["containers"] if c["name"] != name])


@pytest.mark.parametrize("backend", ["elastic", "pytorchjob"])
def test_the_endpoint_and_the_secret_reach_the_trainer_alone(backend):
    mine, others = trainers(backend, store={"endpoint": ENDPOINT, "credentialsSecret": "minio-keys"},
                            podTemplate={"spec": {"containers": [SIDECAR]}})
    for trainer in mine:
        assert [e["value"] for e in trainer["env"] if e["name"] == "AWS_ENDPOINT_URL"] == [ENDPOINT]
        assert trainer["envFrom"] == [{"secretRef": {"name": "minio-keys"}}]
    assert others and all("envFrom" not in c and "env" not in c for c in others)


@pytest.mark.parametrize("backend", ["elastic", "pytorchjob"])
def test_without_settings_the_pods_own_identity_and_amazon_s3_are_used(backend):
    # No endpoint: the SDK's default (Amazon S3); no Secret: the service account (IRSA, Workload Identity) or node.
    for trainer in trainers(backend)[0]:
        assert not [e for e in trainer["env"] if e["name"].startswith("AWS_")]
        assert "envFrom" not in trainer


def test_the_overlays_secrets_come_after_the_stores():
    overlay = {"spec": {"containers": [{"name": "trainer", "envFrom": [{"secretRef": {"name": "wandb"}}]}]}}
    for trainer in trainers("elastic", store={"credentialsSecret": "minio-keys"}, podTemplate=overlay)[0]:
        assert trainer["envFrom"] == [{"secretRef": {"name": "minio-keys"}}, {"secretRef": {"name": "wandb"}}]


def test_without_an_endpoint_the_overlay_may_set_the_variable():
    # Nothing to clash with: e.g. the endpoint read from a ConfigMap the platform team keeps.
    from_map = {"name": "AWS_ENDPOINT_URL", "valueFrom": {"configMapKeyRef": {"name": "s3", "key": "endpoint"}}}
    overlay = {"spec": {"containers": [{"name": "trainer", "env": [from_map]}]}}
    for trainer in trainers("elastic", podTemplate=overlay)[0]:
        assert [e for e in trainer["env"] if e["name"] == "AWS_ENDPOINT_URL"] == [from_map]


def test_the_store_is_no_volume_to_size_and_its_dataset_is_not_read_here():
    job = parse_job(manifest(data={"source": "tokens", "uri": "s3://datasets/ds"}, model={"preset": "minimal"}))
    assert storage_lines(job)[1] == "object store s3://team-a-ckpt/llm: its room is the store's"
    assert "the dataset is in an object store (s3://datasets/ds), not read from here" in job_vocabulary(job).source


def test_status_names_the_last_checkpoint_in_the_store():
    cluster = FakeCluster()
    cluster.apply_job(manifest())
    now = datetime(2026, 11, 29, 12, 0, 0, tzinfo=timezone.utc)
    reconcile(cluster.get_job("team-a", "llm"), cluster, now)
    cluster.run_all("team-a")
    reconcile(cluster.get_job("team-a", "llm"), cluster, now)
    assert cluster.get_job("team-a", "llm")["status"]["phase"] == "Running"
    doc = {"step": 40, "total_steps": 200, "last_checkpoint_step": 25}
    reconcile(cluster.get_job("team-a", "llm"), cluster, now, progress=doc)
    assert cluster.get_job("team-a", "llm")["status"]["lastCheckpoint"] == {
        "step": 25, "path": "s3://team-a-ckpt/llm/step-00000025"}


def test_an_s3_init_from_is_served_by_the_object_store_and_another_scheme_is_refused():
    # Checkpoints on a claim, the first weights from a bucket: the store's endpoint reaches the trainer all the same.
    job = manifest(store={"endpoint": ENDPOINT}, checkpoint={"claimName": "ckpt"},
                   model={"initFrom": "s3://team-a-ckpt/base/step-00000040"})
    pods = [s for s in pod_specs(render(parse_job(job))) if s]
    assert pods and all({"name": "AWS_ENDPOINT_URL", "value": ENDPOINT} in s["containers"][0]["env"] for s in pods)
    with pytest.raises(ConfigError, match=r"spec\.model\.initFrom: scheme 'gs' is not supported"):
        parse_job(manifest(model={"initFrom": "gs://team-a-ckpt/base"}))
