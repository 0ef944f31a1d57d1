"""The overlay policy (issue 28): what spec.podTemplate may ask beyond the safe settings is refused by default,
naming the field and the chart setting, and allowed by that setting alone; mount paths are normalised before
the reserved-path check."""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta

import pytest
import yaml
from fake_cluster import FakeCluster
from test_handlers import NS, T0
from test_handlers import manifest as job_manifest
from test_overlay import manifest

from brain_operator import handlers

from brain_operator.cli import main
from brain_operator.backends import render
from brain_operator.spec import ConfigError, OperatorDefaults, OverlayPolicy, parse_job
from brain_trainer.schema import camel


def _sidecar(**fields):
    return {"spec": {"containers": [{"name": "side", "image": "busybox:1.36", **fields}]}}


def _context(**context):
    return _sidecar(securityContext=context)


# (setting, what allows it, overlay, the refused field below spec.podTemplate); the Pod Security Standards'
# control each stands for is in OverlayPolicy's help.
CASES = [
    ("privileged", True, _context(privileged=True), "spec.containers[0].securityContext.privileged"),
    ("privileged", True, _context(windowsOptions={"hostProcess": True}), "spec.containers[0].securityContext.windowsOptions.hostProcess"),
    ("privileged", True, {"spec": {"initContainers": [{"name": "i", "image": "x", "securityContext": {"privileged": True}}]}},
     "spec.initContainers[0].securityContext.privileged"),
    ("privilege_escalation", True, _context(allowPrivilegeEscalation=True), "spec.containers[0].securityContext.allowPrivilegeEscalation"),
    ("root", True, _context(runAsUser=0), "spec.containers[0].securityContext.runAsUser"),
    ("root", True, _context(runAsGroup=0), "spec.containers[0].securityContext.runAsGroup"),
    ("root", True, _context(runAsNonRoot=False), "spec.containers[0].securityContext.runAsNonRoot"),
    ("capabilities", ["NET_ADMIN"], _context(capabilities={"add": ["NET_ADMIN"]}), "spec.containers[0].securityContext.capabilities.add[0]"),
    ("capabilities", ["IPC_LOCK"], {"spec": {"containers": [{"name": "trainer", "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}}}]}},
     "spec.containers[0].securityContext.capabilities.add[0]"),
    ("unconfined", True, _context(procMount="Unmasked"), "spec.containers[0].securityContext.procMount"),
    ("unconfined", True, _context(seccompProfile={"type": "Unconfined"}), "spec.containers[0].securityContext.seccompProfile.type"),
    ("unconfined", True, _context(seLinuxOptions={"type": "spc_t"}), "spec.containers[0].securityContext.seLinuxOptions.type"),
    ("unconfined", True, _context(seLinuxOptions={"user": "system_u"}), "spec.containers[0].securityContext.seLinuxOptions.user"),
    ("unconfined", True, {"metadata": {"annotations": {"container.apparmor.security.beta.kubernetes.io/trainer": "unconfined"}}},
     "metadata.annotations.container.apparmor.security.beta.kubernetes.io/trainer"),
    ("host_ports", True, _sidecar(ports=[{"containerPort": 80, "hostPort": 80}]), "spec.containers[0].ports[0].hostPort"),
    ("host_network", True, {"spec": {"hostNetwork": True}}, "spec.hostNetwork"),
    ("host_paths", ["/"], {"spec": {"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}}, "spec.volumes[0].hostPath.path"),
    ("service_accounts", ["builder"], {"spec": {"serviceAccountName": "builder"}}, "spec.serviceAccountName"),
    ("service_account_token", True, {"spec": {"automountServiceAccountToken": True}}, "spec.automountServiceAccountToken"),
    ("service_account_token", True,
     {"spec": {"volumes": [{"name": "t", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}]}},
     "spec.volumes[0].projected.sources[0].serviceAccountToken"),
]
IDS = [path for *_, path in CASES]


def _everything_but(name: str) -> OverlayPolicy:
    """A policy allowing every setting but `name`: whatever it guards, no other setting lets through."""
    lists = {"capabilities": ["SYS_ADMIN"], "host_paths": ["/srv"], "service_accounts": ["other"]}
    return OverlayPolicy(**{
        f.name: lists.get(f.name, True) for f in dataclasses.fields(OverlayPolicy) if f.name != name
    })


@pytest.mark.parametrize(("name", "allowing", "overlay", "path"), CASES, ids=IDS)
def test_each_field_is_refused_by_default_naming_the_field_and_the_setting(name, allowing, overlay, path):
    shown = "[]" if isinstance(allowing, list) else "false"
    for defaults in (None, OperatorDefaults(), OperatorDefaults(overlay_policy=_everything_but(name))):
        with pytest.raises(ConfigError) as err:
            parse_job(manifest(overlay), defaults=defaults)
        (line,) = str(err.value).splitlines()
        assert line.startswith(f"spec.podTemplate.{path}: "), line
        assert line.endswith(f"not allowed by the operator's overlay policy (podOverlayPolicy.{camel(name)}: {shown})"), line


@pytest.mark.parametrize(("name", "allowing", "overlay", "path"), CASES, ids=IDS)
def test_each_field_is_allowed_by_its_setting(name, allowing, overlay, path):
    job = parse_job(manifest(overlay), defaults=OperatorDefaults(overlay_policy=OverlayPolicy(**{name: allowing})))
    assert any(obj["kind"] == "Pod" for obj in render(job))


def test_capabilities_are_an_allow_list_in_either_spelling():
    policy = OperatorDefaults(overlay_policy=OverlayPolicy(capabilities=["IPC_LOCK", "CAP_SYS_NICE"]))
    parse_job(manifest(_context(capabilities={"add": ["CAP_IPC_LOCK", "SYS_NICE"]})), defaults=policy)
    with pytest.raises(ConfigError, match=r"capabilities.add\[1\]: 'cap_sys_admin' is not allowed .*IPC_LOCK, CAP_SYS_NICE\]"):
        parse_job(manifest(_context(capabilities={"add": ["ipc_lock", "cap_sys_admin"]})), defaults=policy)


@pytest.mark.parametrize(("path", "allowed"), [
    ("/mnt/datasets", True), ("/mnt/datasets/imagenet", True), ("/mnt//datasets/./x", True),
    ("/mnt/datasets-private", False), ("/mnt/datasets/../../etc", False), ("/", False),
])
def test_host_paths_are_allowed_below_a_prefix_once_normalised(path, allowed):
    overlay = {"spec": {"volumes": [{"name": "h", "hostPath": {"path": path}}]}}
    defaults = OperatorDefaults(overlay_policy=OverlayPolicy(host_paths=["/mnt/datasets/"]))
    if allowed:
        parse_job(manifest(overlay), defaults=defaults)
    else:
        with pytest.raises(ConfigError, match=rf"spec.podTemplate.spec.volumes\[0\].hostPath.path: {path!r} is not allowed"):
            parse_job(manifest(overlay), defaults=defaults)


def test_the_default_service_account_needs_no_setting():
    for account in ("default", ""):
        parse_job(manifest({"spec": {"serviceAccountName": account}}))


@pytest.mark.parametrize("field", ["hostPID", "hostIPC", "securityContext", "ephemeralContainers", "shareProcessNamespace"])
def test_pod_fields_no_setting_covers_are_not_part_of_the_overlay(field):
    # Host namespaces other than the network, sysctls and the pod's own seccomp and SELinux options live there.
    with pytest.raises(ConfigError, match=rf"spec.podTemplate.spec.{field}: unknown field"):
        parse_job(manifest({"spec": {field: True}}), defaults=OperatorDefaults(overlay_policy=_everything_but("")))


@pytest.mark.parametrize("mount", ["/checkpoints/../etc/brain", "//etc/brain", "/etc/./brain/x", "/data/../dev/shm"])
def test_mount_paths_are_normalised_before_the_reserved_path_check(mount):
    overlay = {"spec": {"volumes": [{"name": "d", "emptyDir": {}}],
                        "containers": [{"name": "trainer", "volumeMounts": [{"name": "d", "mountPath": mount}]}]}}
    with pytest.raises(ConfigError, match=rf"containers\[0\].volumeMounts\[0\].mountPath: {mount!r} is the trainer's own mount"):
        parse_job(manifest(overlay))


def test_the_policy_is_read_from_the_operators_environment():
    env = {OperatorDefaults.ENV_OVERLAY_POLICY: json.dumps({"privileged": True, "capabilities": ["IPC_LOCK"], "hostPaths": ["/mnt"]})}
    assert OperatorDefaults.from_env(env).overlay_policy == OverlayPolicy(privileged=True, capabilities=["IPC_LOCK"], host_paths=["/mnt"])
    assert OperatorDefaults.from_env({}).overlay_policy == OverlayPolicy()
    bad = {OperatorDefaults.ENV_OVERLAY_POLICY: json.dumps({"privileged": "yes", "hostPath": []})}
    with pytest.raises(ConfigError) as err:
        OperatorDefaults.from_env(bad)
    assert str(err.value).splitlines() == [
        "BRAIN_POD_OVERLAY_POLICY.hostPath: unknown field (known fields: privileged, privilegeEscalation, root, capabilities, "
        "unconfined, hostPorts, hostNetwork, hostPaths, serviceAccounts, serviceAccountToken)",
        "BRAIN_POD_OVERLAY_POLICY.privileged: must be a boolean, got 'yes'",
    ]
    with pytest.raises(ConfigError, match="BRAIN_POD_OVERLAY_POLICY: must be a JSON object"):
        OperatorDefaults.from_env({OperatorDefaults.ENV_OVERLAY_POLICY: "{privileged"})


def test_the_cli_refuses_a_privileged_sidecar_unless_the_policy_allows_it(tmp_path, capsys, monkeypatch):
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(manifest(_context(privileged=True))))
    monkeypatch.delenv(OperatorDefaults.ENV_OVERLAY_POLICY, raising=False)
    for command in ("validate", "render", "estimate", "run"):  # run refuses before it starts any worker
        assert main([command, str(job)]) == 1
        out, err = capsys.readouterr()
        assert err.splitlines() == [
            f"{job}: spec.podTemplate.spec.containers[0].securityContext.privileged: "
            "not allowed by the operator's overlay policy (podOverlayPolicy.privileged: false)"
        ] and out == ""
    monkeypatch.setenv(OperatorDefaults.ENV_OVERLAY_POLICY, '{"privileged": true}')
    assert main(["validate", str(job)]) == 0
    assert main(["render", str(job)]) == 0
    pods = [obj for obj in yaml.safe_load_all(capsys.readouterr().out) if obj["kind"] == "Pod"]
    assert pods and all(pod["spec"]["containers"][1]["securityContext"]["privileged"] is True for pod in pods)


def _operator(cluster, policy: OverlayPolicy, minutes: int = 0) -> handlers.Context:
    """An operator started with `policy` (the chart's podOverlayPolicy) over the same cluster, `minutes` after T0."""
    return handlers.Context(client=cluster, defaults=OperatorDefaults(image="registry.example/brain:1", overlay_policy=policy),
                            clock=lambda: T0 + timedelta(minutes=minutes))


def _condition(cluster, kind):
    return next(c for c in cluster.get_job(NS, "demo")["status"]["conditions"] if c["type"] == kind)


def _warnings(cluster):
    return [(event.reason, event.message) for _, event in cluster.events if event.type == "Warning"]


def test_a_tightened_policy_leaves_running_pods_alone_and_creates_no_new_one():
    cluster = FakeCluster(pod_security="restricted")  # the namespace admits the overlay: only the policy may not
    cluster.apply_job(job_manifest(podTemplate={"spec": {"serviceAccountName": "builder"}}))
    handlers.handle(_operator(cluster, OverlayPolicy(service_accounts=["builder"])), NS, "demo")
    cluster.run_all()
    writes = len(cluster.writes)

    # The operator restarts with the default policy, which no longer allows the ServiceAccount.
    handlers.handle(_operator(cluster, OverlayPolicy(), minutes=1), NS, "demo")

    message = ("spec.podTemplate.spec.serviceAccountName: 'builder' is not allowed by the operator's overlay policy "
               "(podOverlayPolicy.serviceAccounts: []) (running pods are left alone; none is created until the policy "
               "or the overlay changes)")
    valid = _condition(cluster, "Valid")
    assert (valid["status"], valid["reason"], valid["message"]) == ("False", "OverlayNotAllowed", message)
    assert cluster.get_job(NS, "demo")["status"]["phase"] == "Running"  # the pods say so, not the policy
    assert sorted(cluster.pods()) == ["demo-worker-0", "demo-worker-1"]
    assert [op for op, ref in cluster.writes[writes:] if ref.kind == "Pod"] == []
    assert _warnings(cluster) == [("OverlayNotAllowed", message)]

    # Another pass says nothing new; a lost pod is not replaced under the forbidden overlay.
    strict = _operator(cluster, OverlayPolicy(), minutes=2)
    handlers.handle(strict, NS, "demo")
    assert len(_warnings(cluster)) == 1
    lost = next(ref for ref in cluster.objects if ref.kind == "Pod" and ref.name == "demo-worker-1")
    del cluster.objects[lost]
    handlers.handle(strict, NS, "demo")
    assert sorted(cluster.pods()) == ["demo-worker-0"]
    assert [op for op, ref in cluster.writes[writes:] if ref.kind == "Pod"] == []
    assert _condition(cluster, "Valid")["lastTransitionTime"] == valid["lastTransitionTime"] == "2026-11-22T12:01:00Z"

    # The policy allows it again: the replacement is created and the spec is valid.
    handlers.handle(_operator(cluster, OverlayPolicy(service_accounts=["builder"])), NS, "demo")
    assert sorted(cluster.pods()) == ["demo-worker-0", "demo-worker-1"]
    assert _condition(cluster, "Valid")["status"] == "True"


def test_a_job_nothing_runs_yet_is_refused_as_an_invalid_spec():
    cluster = FakeCluster()
    cluster.apply_job(job_manifest(podTemplate={"spec": {"serviceAccountName": "builder"}}))
    handlers.handle(_operator(cluster, OverlayPolicy()), NS, "demo")

    valid = _condition(cluster, "Valid")
    assert (valid["status"], valid["reason"]) == ("False", "InvalidSpec")
    assert valid["message"] == ("spec.podTemplate.spec.serviceAccountName: 'builder' is not allowed by the operator's "
                                "overlay policy (podOverlayPolicy.serviceAccounts: [])")
    assert cluster.get_job(NS, "demo")["status"]["phase"] == "Failed" and cluster.pods() == {}
