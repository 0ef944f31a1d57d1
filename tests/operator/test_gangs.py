"""scheduling.gang (issue 14): the PodGroup each gang scheduler reads, checked against its upstream schema, and
the pods linked to it; Kubernetes' own PodGroup against kubernetes-validate's schemas where they know the kind,
scheduler-plugins' and Volcano's against the CRDs copied from their repositories into tests/operator/upstream/."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import structural
import yaml

from brain_operator.backends import build_pod_group, render
from brain_operator.spec import ConfigError, parse_job

UPSTREAM = Path(__file__).with_name("upstream")
UID = "0b5e7c1e-2f4a-4c1e-9d51-7d3f0e6a9c11"


def job(gang, **scheduling):
    return parse_job(
        {
            "apiVersion": "brain.ai/v1alpha1",
            "kind": "BrainTrainingJob",
            "metadata": {"name": "gang", "namespace": "ml", "uid": UID},
            "spec": {
                "image": "trainer:1",
                "nodes": 4,
                "elastic": {"minNodes": 3, "maxNodes": 6},
                "checkpoint": {"volumeClaimTemplate": {"accessModes": ["ReadWriteMany"]}},
                "scheduling": {"gang": gang, **scheduling},
            },
        }
    )


def upstream_schema(file_name):
    crd = next(doc for doc in yaml.safe_load_all((UPSTREAM / file_name).read_text()) if doc)
    (version,) = crd["spec"]["versions"]
    return f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"], version["schema"]["openAPIV3Schema"]


def pods(objects):
    return [o for o in objects if o["kind"] == "Pod"]


def owned_by_the_job(obj):
    (owner,) = obj["metadata"]["ownerReferences"]
    return owner["uid"] == UID and owner["controller"] and owner["kind"] == "BrainTrainingJob"


def test_native_pod_group_is_kubernetes_own_and_pods_name_it_in_scheduling_group():
    objects = render(job("native"))
    group = build_pod_group(job("native"))
    assert group in objects and owned_by_the_job(group)
    assert (group["apiVersion"], group["kind"]) == ("scheduling.k8s.io/v1alpha2", "PodGroup")
    assert group["spec"] == {"schedulingPolicy": {"gang": {"minCount": 3}}}  # the elastic minimum
    # scheduling.k8s.io/v1alpha2 PodGroup and spec.schedulingGroup are Kubernetes 1.36's (GenericWorkload).
    kubernetes_validate.validate(group, "1.36", strict=True)
    for pod in pods(objects):
        assert pod["spec"]["schedulingGroup"] == {"podGroupName": "gang"} and "schedulerName" not in pod["spec"]
        for version in ("1.36", "1.37"):
            kubernetes_validate.validate(pod, version, strict=True)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pods(objects)[0], "1.29", strict=True)  # older servers do not know the field


@pytest.mark.parametrize(
    ("gang", "file_name", "scheduler", "linked"),
    [
        ("coscheduling", "scheduling.x-k8s.io_podgroups.yaml", "scheduler-plugins-scheduler",
         lambda pod: pod["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == "gang"),
        ("volcano", "scheduling.volcano.sh_podgroups.yaml", "volcano",
         lambda pod: pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == "gang"),
    ],
)
def test_crd_based_pod_groups_fit_their_upstream_schema(gang, file_name, scheduler, linked):
    api_version, kind, schema = upstream_schema(file_name)
    objects = render(job(gang))
    (group,) = [o for o in objects if o["kind"] == "PodGroup"]
    assert (group["apiVersion"], group["kind"]) == (api_version, kind) and owned_by_the_job(group)
    assert group["spec"]["minMember"] == 3
    assert structural.errors(schema, group) == []
    for pod in pods(objects):
        assert linked(pod) and pod["spec"]["schedulerName"] == scheduler
        for version in ("1.29", "1.37"):
            kubernetes_validate.validate(pod, version, strict=True)
    # The checker is strict: an unknown field would be refused.
    assert structural.errors(schema, {**group, "spec": {**group["spec"], "minMembers": 3}})


def test_volcano_pod_group_takes_the_volcano_queue_and_priority_and_a_named_scheduler_wins():
    _, _, schema = upstream_schema("scheduling.volcano.sh_podgroups.yaml")
    objects = render(job("volcano", volcanoQueue="research", priorityClassName="high", schedulerName="volcano-gpu"))
    (group,) = [o for o in objects if o["kind"] == "PodGroup"]
    assert group["spec"] == {"minMember": 3, "queue": "research", "priorityClassName": "high"}
    assert structural.errors(schema, group) == []
    assert {pod["spec"]["schedulerName"] for pod in pods(objects)} == {"volcano-gpu"}


def test_no_gang_renders_no_pod_group_and_no_link():
    objects = render(job("none"))
    assert "PodGroup" not in {o["kind"] for o in objects}
    for pod in pods(objects):
        assert "schedulingGroup" not in pod["spec"] and "schedulerName" not in pod["spec"]


def test_a_gang_needs_the_elastic_backend():
    with pytest.raises(ConfigError, match="spec.scheduling.gang: applies to the elastic backend"):
        parse_job(
            {
                "apiVersion": "brain.ai/v1alpha1",
                "kind": "BrainTrainingJob",
                "metadata": {"name": "g"},
                "spec": {"image": "i", "backend": "pytorchjob", "scheduling": {"gang": "volcano"}},
            }
        )


@pytest.mark.parametrize(("api_version", "release"), [
    ("scheduling.k8s.io/v1alpha2", "1.36"), ("scheduling.k8s.io/v1alpha3", "1.37"), ("scheduling.k8s.io/v1beta1", "1.37"),
])
def test_the_native_pod_group_fits_each_version_discovery_may_pick(api_version, release):
    # kubernetes-validate's schemas of each release, generated from upstream's OpenAPI: one shape in all three.
    from dataclasses import replace

    group = build_pod_group(replace(job("native"), native_pod_group=api_version))
    assert group["apiVersion"] == api_version and group["spec"] == {"schedulingPolicy": {"gang": {"minCount": 3}}}
    kubernetes_validate.validate(group, release, strict=True)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate({**group, "spec": {"schedulingPolicy": {"gang": {"minMember": 3}}}}, release,
                                     strict=True)
