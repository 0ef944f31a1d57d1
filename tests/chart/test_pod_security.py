"""Restricted Pod Security Standard: the operator's own pod and every rendered trainer pod."""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from brain_operator.backends import render
from brain_operator.spec import OperatorDefaults, OverlayPolicy, parse_job
from chart_render import REPO, only, render_objects
from pod_security import restricted_violations

EXAMPLES = sorted((REPO / "deploy" / "examples").glob("*.yaml"))
DEFAULTS = OperatorDefaults(image="ghcr.io/brain-ai/brain-train-trainer:0.1.0")

COMPLIANT = {
    "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "seccompProfile": {"type": "RuntimeDefault"}},
    "containers": [
        {
            "name": "main",
            "image": "example",
            "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        }
    ],
    "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory"}}],
}


def _set(spec, path, value):
    *parents, leaf = path
    node = spec
    for key in parents:
        node = node.setdefault(key, {}) if isinstance(node, dict) else node[key]
    node[leaf] = value


@pytest.mark.parametrize(
    ("path", "value", "complaint"),
    [
        (("hostNetwork",), True, "spec.hostNetwork"),
        (("hostPID",), True, "spec.hostPID"),
        (("securityContext", "runAsNonRoot"), False, "runAsNonRoot: must be true"),
        (("securityContext", "runAsUser"), 0, "spec.securityContext.runAsUser: must not be 0"),
        (("securityContext", "seccompProfile"), {"type": "Unconfined"}, "seccompProfile.type"),
        (("securityContext", "sysctls"), [{"name": "kernel.msgmax", "value": "1"}], "kernel.msgmax"),
        (("volumes",), [{"name": "host", "hostPath": {"path": "/"}}], "['hostPath'] not allowed"),
        (("containers", 0, "securityContext", "privileged"), True, "privileged"),
        (("containers", 0, "securityContext", "allowPrivilegeEscalation"), True, "allowPrivilegeEscalation"),
        (("containers", 0, "securityContext", "capabilities"), {"drop": ["NET_RAW"]}, "drop: must include ALL"),
        (("containers", 0, "securityContext", "capabilities", "add"), ["SYS_ADMIN"], "['SYS_ADMIN'] not allowed"),
        (("containers", 0, "securityContext", "runAsNonRoot"), False, "containers[main].securityContext.runAsNonRoot"),
        (("containers", 0, "securityContext", "procMount"), "Unmasked", "procMount"),
        (("containers", 0, "securityContext", "seLinuxOptions"), {"type": "spc_t"}, "spc_t"),
        (("containers", 0, "ports"), [{"containerPort": 80, "hostPort": 80}], "hostPort"),
        (("initContainers",), [{"name": "init", "image": "x"}], "initContainers[init].securityContext.allowPrivilegeEscalation"),
    ],
)
def test_the_checker_names_each_violated_control(path, value, complaint):
    assert restricted_violations(COMPLIANT) == []
    spec = copy.deepcopy(COMPLIANT)
    _set(spec, path, value)
    problems = restricted_violations(spec)
    assert any(complaint in problem for problem in problems), problems


def test_the_checker_requires_seccomp_somewhere_and_accepts_it_per_container():
    spec = copy.deepcopy(COMPLIANT)
    del spec["securityContext"]["seccompProfile"]
    assert restricted_violations(spec) == ["containers[main].securityContext.seccompProfile: must be set here or on the pod"]
    spec["containers"][0]["securityContext"]["seccompProfile"] = {"type": "Localhost", "localhostProfile": "p.json"}
    assert restricted_violations(spec) == []


def test_the_checker_reads_apparmor_annotations():
    bad = {"container.apparmor.security.beta.kubernetes.io/main": "unconfined"}
    assert len(restricted_violations(COMPLIANT, bad)) == 1
    good = {"container.apparmor.security.beta.kubernetes.io/main": "runtime/default"}
    assert restricted_violations(COMPLIANT, good) == []


@pytest.mark.parametrize("values", ["defaults", "namespaced"])
def test_operator_deployment_is_restricted(value_sets, values):
    template = only(render_objects(value_sets[values]), "Deployment")["spec"]["template"]
    assert restricted_violations(template["spec"], template["metadata"].get("annotations")) == []


def test_the_helm_test_pod_is_restricted():
    pod = only(render_objects(), "Pod")
    assert restricted_violations(pod["spec"], pod["metadata"].get("annotations")) == []
    assert pod["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True


def _pod_specs(objects):
    """(name, pod spec, annotations) of every pod a rendering creates, directly or through a PyTorchJob."""
    for obj in objects:
        if obj["kind"] == "Pod":
            yield obj["metadata"]["name"], obj["spec"], obj["metadata"].get("annotations")
        elif obj["kind"] == "PyTorchJob":
            for role, replica in obj["spec"]["pytorchReplicaSpecs"].items():
                template = replica["template"]
                yield f"{obj['metadata']['name']}/{role}", template["spec"], (template.get("metadata") or {}).get("annotations")


@pytest.mark.parametrize("backend", ["elastic", "pytorchjob"])
@pytest.mark.parametrize("example", EXAMPLES, ids=[path.name for path in EXAMPLES])
def test_rendered_trainer_pods_are_restricted(example: Path, backend):
    manifest = yaml.safe_load(example.read_text())
    manifest["spec"]["backend"] = backend
    manifest["metadata"].setdefault("uid", "6f1c2a4e-0000-4000-8000-000000000001")
    pods = list(_pod_specs(render(parse_job(manifest, defaults=DEFAULTS))))
    assert pods, f"{example.name} rendered no pods"
    for name, spec, annotations in pods:
        assert restricted_violations(spec, annotations) == [], name


@pytest.mark.parametrize("backend", ["elastic", "pytorchjob"])
def test_a_pod_overlay_leaves_the_restricted_profile_only_where_it_asks_to(backend):
    # shared-cluster.yaml's overlay (secrets, volumes, a native sidecar), plus a plain sidecar and the remaining
    # pod fields, stays restricted; IPC_LOCK for RDMA and the host's network leave it, each named once per pod.
    manifest = yaml.safe_load((REPO / "deploy" / "examples" / "shared-cluster.yaml").read_text())
    manifest["spec"]["backend"] = backend
    overlay = manifest["spec"]["podTemplate"]["spec"]
    overlay["containers"].append({"name": "metrics-relay", "image": "example/relay:1", "args": ["--port", "8081"]})
    overlay.update(automountServiceAccountToken=True, dnsPolicy="Default", runtimeClassName="nvidia")
    trainer = "trainer" if backend == "elastic" else "pytorch"
    # The token, IPC_LOCK and the host's network each need the operator's overlay policy to allow them.
    defaults = replace(DEFAULTS, overlay_policy=OverlayPolicy(service_account_token=True, capabilities=["IPC_LOCK"], host_network=True))
    for name, spec, annotations in _pod_specs(render(parse_job(manifest, defaults=defaults))):
        assert restricted_violations(spec, annotations) == [], name
    overlay["containers"][0]["securityContext"] = {"capabilities": {"add": ["IPC_LOCK"]}}
    overlay["hostNetwork"] = True
    for name, spec, annotations in _pod_specs(render(parse_job(manifest, defaults=defaults))):
        assert restricted_violations(spec, annotations) == [
            "spec.hostNetwork: must be unset or false",
            f"containers[{trainer}].securityContext.capabilities.add: ['IPC_LOCK'] not allowed",
        ], name
