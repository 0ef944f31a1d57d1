"""Each job's NetworkPolicy (render/network.py, docs/security.md): who may connect to its worker pods."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timezone

import kubernetes_validate
import pytest
import yaml
from fake_cluster import FakeCluster

from brain_operator.reconcile import reconcile
from brain_operator.backends import render
from brain_operator.spec import API_VERSION, KIND, OperatorDefaults, parse_job
from brain_operator.spec.model import NetworkAccess
from brain_trainer.config import TrainerConfig
from brain_trainer.contract import METRICS_PORT
from brain_trainer.schema import ConfigError

NAMESPACE = "team-a"
UID = "5d1c0b4e-0000-4000-8000-000000000001"
ACCESS = NetworkAccess(operator_namespace="brain-system", scrape_namespaces=("monitoring",))
T0 = datetime(2026, 11, 22, 12, 0, 0, tzinfo=timezone.utc)


def manifest(name="llm", backend="elastic", nodes=2):
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": UID},
        "spec": {"image": "registry.example/trainer:1", "backend": backend, "nodes": nodes},
    }


def job(name="llm", backend="elastic", network=ACCESS):
    return dataclasses.replace(parse_job(manifest(name, backend)), network=network)


def of_kind(objects, kind):
    return [obj for obj in objects if obj["kind"] == kind]


def policy(objects):
    [found] = of_kind(objects, "NetworkPolicy")
    return found


def pod_labels(objects):
    """The labels of the pods the job runs: its own (elastic) or those Kubeflow makes from each replica template."""
    labels = [pod["metadata"]["labels"] for pod in of_kind(objects, "Pod")]
    for pytorchjob in of_kind(objects, "PyTorchJob"):
        labels += [r["template"]["metadata"]["labels"] for r in pytorchjob["spec"]["pytorchReplicaSpecs"].values()]
    return labels


def selects(selector, labels):
    """Kubernetes' label selector semantics, for matchLabels and matchExpressions (In)."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    return all(labels.get(e["key"]) in e["values"] for e in selector.get("matchExpressions", []) if e["operator"] == "In")


@pytest.mark.parametrize("backend", ["elastic", "pytorchjob"])
@pytest.mark.parametrize("version", ["1.29", "1.37"])
def test_the_policy_is_a_valid_networking_v1_object_owned_by_the_job(backend, version):
    rendered = policy(render(job(backend=backend)))
    assert kubernetes_validate.validate(rendered, version, strict=True) == version
    assert rendered["metadata"]["name"] == "llm-network" and rendered["metadata"]["namespace"] == NAMESPACE
    [owner] = rendered["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == (KIND, UID, True)
    # Ingress only: the workers still reach the API server, the registry, their storage.
    assert rendered["spec"]["policyTypes"] == ["Ingress"]


@pytest.mark.parametrize("backend", ["elastic", "pytorchjob"])
def test_it_selects_every_pod_of_the_job_and_no_pod_of_another(backend):
    ours, theirs = render(job("llm", backend)), render(job("other", backend))
    spec = policy(ours)["spec"]
    assert pod_labels(ours) and all(selects(spec["podSelector"], labels) for labels in pod_labels(ours))
    assert not any(selects(spec["podSelector"], labels) for labels in pod_labels(theirs))


@pytest.mark.parametrize("backend", ["elastic", "pytorchjob"])
def test_every_port_is_open_to_the_jobs_own_pods_only(backend):
    # The rendezvous and process-group stores unpickle what they are sent, and NCCL's ports are ephemeral.
    ours, theirs = render(job("llm", backend)), render(job("other", backend))
    [peers] = [rule for rule in policy(ours)["spec"]["ingress"] if "ports" not in rule]
    [source] = peers["from"]
    assert set(source) == {"podSelector"}  # no namespaceSelector: the policy's own namespace
    assert all(selects(source["podSelector"], labels) for labels in pod_labels(ours))
    assert not any(selects(source["podSelector"], labels) for labels in pod_labels(theirs))


@pytest.mark.parametrize("backend", ["elastic", "pytorchjob"])
def test_a_job_in_an_object_store_keeps_its_egress_open_to_reach_the_store(backend):
    # A policy that lists Egress isolates the pods' egress: they would lose DNS, their peers (NCCL connects out)
    # and the store. So the store needs no rule here; a namespace that denies egress must allow it (docs/deploy.md).
    stored = manifest(backend=backend)
    stored["spec"].update(checkpoint={"uri": "s3://team-a-ckpt/llm"}, data={"source": "tokens", "uri": "s3://datasets/ds"},
                          objectStore={"endpoint": "https://minio.storage:9000"})
    rendered = policy(render(dataclasses.replace(parse_job(stored), network=ACCESS)))
    assert rendered["spec"]["policyTypes"] == ["Ingress"] and "egress" not in rendered["spec"]
    assert rendered["spec"] == policy(render(job(backend=backend)))["spec"]


def test_the_metrics_port_alone_is_open_to_the_operators_and_the_scraping_namespaces():
    [metrics] = [rule for rule in policy(render(job()))["spec"]["ingress"] if "ports" in rule]
    assert metrics["ports"] == [{"protocol": "TCP", "port": METRICS_PORT}]
    [source] = metrics["from"]
    namespaces = source["namespaceSelector"]
    assert set(source) == {"namespaceSelector"}  # any pod there: Prometheus and the operator are not our pods
    assert selects(namespaces, {"kubernetes.io/metadata.name": "brain-system"})
    assert selects(namespaces, {"kubernetes.io/metadata.name": "monitoring"})
    assert not selects(namespaces, {"kubernetes.io/metadata.name": NAMESPACE})
    # The port the policy opens is the one rank 0 serves in a pod, on every interface (the operator polls the pod IP).
    trainer = TrainerConfig.from_dict(yaml.safe_load(of_kind(render(job()), "ConfigMap")[0]["data"]["trainer.yaml"]))
    assert (trainer.metrics.port, trainer.metrics.bind_address) == (METRICS_PORT, "0.0.0.0")


def test_without_an_operator_namespace_or_scrapers_only_the_jobs_pods_get_in():
    rendered = policy(render(job(network=NetworkAccess())))
    assert [list(rule) for rule in rendered["spec"]["ingress"]] == [["from"]]


@pytest.mark.parametrize("backend", ["elastic", "pytorchjob"])
def test_the_chart_switch_renders_none(backend):
    off = OperatorDefaults.from_env({OperatorDefaults.ENV_NETWORK_POLICY: "false"})
    assert off.network is None
    assert of_kind(render(parse_job(manifest(backend=backend), defaults=off)), "NetworkPolicy") == []


def test_by_default_every_job_gets_one():
    assert parse_job(manifest()).network == NetworkAccess()
    assert len(of_kind(render(parse_job(manifest())), "NetworkPolicy")) == 1


def test_the_operators_environment_is_read_and_checked():
    env = {
        OperatorDefaults.ENV_NAMESPACE: "brain-system",
        OperatorDefaults.ENV_SCRAPE_NAMESPACES: '["monitoring", "monitoring", "obs"]',
        OperatorDefaults.ENV_NETWORK_POLICY: "true",
    }
    read = OperatorDefaults.from_env(env).network
    assert read == NetworkAccess(operator_namespace="brain-system", scrape_namespaces=("monitoring", "obs"))
    bad = {
        OperatorDefaults.ENV_NAMESPACE: "Brain_System",
        OperatorDefaults.ENV_SCRAPE_NAMESPACES: '"monitoring"',
        OperatorDefaults.ENV_NETWORK_POLICY: "maybe",
    }
    with pytest.raises(ConfigError) as err:
        OperatorDefaults.from_env(bad)
    assert {e.path for e in err.value.errors} == {
        OperatorDefaults.ENV_NAMESPACE, OperatorDefaults.ENV_SCRAPE_NAMESPACES, OperatorDefaults.ENV_NETWORK_POLICY,
    }


def test_reconcile_creates_the_policy_and_brings_it_back_when_deleted():
    cluster = FakeCluster()
    cluster.apply_job(manifest())
    defaults = OperatorDefaults(network=ACCESS)
    reconcile(cluster.get_job(NAMESPACE, "llm"), cluster, T0, defaults)
    [ref] = [ref for ref in cluster.objects if ref.kind == "NetworkPolicy"]
    assert cluster.objects[ref]["spec"] == policy(render(parse_job(cluster.get_job(NAMESPACE, "llm"), defaults=defaults)))["spec"]
    del cluster.objects[ref]
    reconcile(cluster.get_job(NAMESPACE, "llm"), cluster, T0, defaults)
    assert ref in cluster.objects
