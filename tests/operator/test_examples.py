"""Every example in deploy/examples/ is a valid BrainTrainingJob, renders valid Kubernetes objects, and asks for the memory the planner recommends.

Objects go through kubernetes-validate's strict schemas for Kubernetes 1.29
and 1.37 (both ship with the installed kubernetes-validate); a PyTorchJob has
no upstream schema there, so each of its pod templates is checked as a core
PodTemplate. The examples themselves are checked against the generated CRD
schema with jsonschema.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from brain_operator.crd import build_crd
from brain_operator.sizing.estimate import host_plan, quantity_bytes
from brain_operator.backends import render
from brain_operator.spec import OperatorDefaults, parse_job

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "deploy" / "examples").glob("*.yaml"))
K8S_VERSIONS = ("1.29", "1.37")
# local-minimal.yaml names no image: the operator's default (the Helm chart's) fills it.
DEFAULTS = OperatorDefaults(image="brain-train/trainer:dev")


def load(path):
    return yaml.safe_load(path.read_text())


def test_examples_exist():
    names = {p.name for p in EXAMPLES}
    assert {"cpu-gloo.yaml", "gpu-7b-fsdp.yaml", "pytorchjob-elastic.yaml"} <= names


@pytest.fixture(scope="module")
def crd_schema():
    return build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_matches_the_crd_schema(path, crd_schema):
    # OpenAPI v3.0 schemas use draft-4 semantics (boolean exclusiveMinimum).
    jsonschema.Draft4Validator(crd_schema).validate(load(path))


def _checked_objects(obj):
    """The object itself, or for a PyTorchJob each replica's pod template as a PodTemplate."""
    if obj["kind"] != "PyTorchJob":
        return [obj]
    return [
        {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": f"{obj['metadata']['name']}-{role.lower()}", "namespace": obj["metadata"]["namespace"]},
            "template": replica["template"],
        }
        for role, replica in obj["spec"]["pytorchReplicaSpecs"].items()
    ]


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("backend", ["elastic", "pytorchjob"])
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_renders_valid_objects(path, backend, version):
    job = parse_job(load(path), defaults=DEFAULTS)
    job = dataclasses.replace(job, uid="7f8c1d2e-0000-4000-8000-000000000001", spec=dataclasses.replace(job.spec, backend=backend))
    objects = render(job)
    assert objects
    for obj in objects:
        for checked in _checked_objects(obj):
            # validate() returns the schema version it used: the one asked for, not an older fallback.
            assert kubernetes_validate.validate(checked, version, strict=True) == version


def test_strict_validation_catches_a_bad_object():
    """The check above can fail: a misspelt pod field is refused."""
    job = parse_job(load(EXAMPLES[0]), defaults=DEFAULTS)
    pod = next(o for o in render(dataclasses.replace(job, uid="u")) if o["kind"] == "Pod")
    pod["spec"]["restartPolicyy"] = "Never"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, "1.37", strict=True)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_memory_request_follows_the_host_memory_planner(path):
    """At least what `braintrain estimate` recommends for a pod, and at most twice it."""
    job = parse_job(load(path), defaults=DEFAULTS)
    recommended = host_plan(job).pod_request
    requested = quantity_bytes(job.spec.resources.requests["memory"])
    assert recommended <= requested <= 2 * recommended, (path.name, recommended / 2**30, requested / 2**30)


def test_memory_quantities():
    assert quantity_bytes("128Gi") == 128 * 2**30 and quantity_bytes("1.5G") == 1.5e9 and quantity_bytes(2048) == 2048
    assert quantity_bytes("500M") == 500e6 and quantity_bytes("1Ki") == 1024
    with pytest.raises(ValueError, match=r"spec.resources.requests.memory: not a memory quantity such as 8Gi: '12 GB'"):
        quantity_bytes("12 GB")
