"""spec.podTemplate (issue 13): every overlay field reaches the pods of both backends, merged with the operator's;
what the operator owns is refused naming the path (parser, CLI, operator status); the CRD types the overlay with
Kubernetes' own schemas, so a typo is refused by the API server too."""

from __future__ import annotations

import copy
from datetime import datetime, timezone

import kubernetes_validate
import pytest
import structural
import yaml
from fake_cluster import FakeCluster
from test_examples import _checked_objects

from brain_operator import crd
from brain_operator.cli import main
from brain_operator.reconcile import reconcile
from brain_operator.backends import render
from brain_operator.spec import ConfigError, OperatorDefaults, OverlayPolicy, parse_job

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)
OVERLAY = {
    "metadata": {"labels": {"team": "vision"}, "annotations": {"example.com/owner": "alice"}},
    "spec": {
        "imagePullSecrets": [{"name": "regcred"}],
        "serviceAccountName": "trainer",
        "volumes": [
            {"name": "data", "persistentVolumeClaim": {"claimName": "datasets", "readOnly": True}},
            {"name": "creds", "secret": {"secretName": "s3"}},
        ],
        "initContainers": [{"name": "fetch", "image": "busybox:1.36", "args": ["true"], "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
        "containers": [
            {
                "name": "trainer",
                "env": [
                    {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "api-key"}}},
                    {"name": "HF_HOME", "value": "/data/hf"},
                ],
                "envFrom": [{"secretRef": {"name": "s3-creds"}}, {"configMapRef": {"name": "tracker"}}],
                "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": True}],
            },
            {
                "name": "uploader",
                "image": "rclone/rclone:1.68",
                "args": ["sync", "/checkpoints", "s3:bucket/run"],
                "volumeMounts": [{"name": "checkpoints", "mountPath": "/checkpoints", "readOnly": True}, {"name": "creds", "mountPath": "/creds"}],
            },
        ],
        "priorityClassName": "research",
        "dnsPolicy": "ClusterFirst",
        "runtimeClassName": "nvidia",
    },
}


# The overlay policy these overlays need: a ServiceAccount of their own, and ASKED's token, capability and
# host network (test_overlay_policy.py: each refused without its setting).
POLICY = OverlayPolicy(service_accounts=["trainer"], service_account_token=True, capabilities=["IPC_LOCK"], host_network=True)
ALLOWING = OperatorDefaults(overlay_policy=POLICY)


def manifest(overlay=None, **spec):
    return {
        "apiVersion": "brain.ai/v1alpha1",
        "kind": "BrainTrainingJob",
        "metadata": {"name": "ov", "namespace": "ml", "uid": "u-1"},
        "spec": {
            "image": "trainer:1",
            "nodes": 2,
            "checkpoint": {"volumeClaimTemplate": {"accessModes": ["ReadWriteMany"]}},
            "podTemplate": copy.deepcopy(OVERLAY if overlay is None else overlay),
            **spec,
        },
    }


def pod_templates(objects):
    """(metadata, pod spec, trainer container name) of every worker pod or PyTorchJob replica template."""
    for obj in objects:
        if obj["kind"] == "Pod":
            yield obj["metadata"], obj["spec"], "trainer"
        elif obj["kind"] == "PyTorchJob":
            for replica in obj["spec"]["pytorchReplicaSpecs"].values():
                yield replica["template"]["metadata"], replica["template"]["spec"], "pytorch"


@pytest.mark.parametrize("backend", ["elastic", "pytorchjob"])
def test_every_overlay_field_reaches_every_pod_merged_with_the_operators(backend):
    templates = list(pod_templates(render(parse_job(manifest(backend=backend), defaults=ALLOWING))))
    assert templates
    for meta, spec, trainer_name in templates:
        assert meta["labels"]["team"] == "vision" and meta["labels"]["brain.ai/job-name"] == "ov"
        assert meta["annotations"]["example.com/owner"] == "alice" and "brain.ai/config-hash" in meta["annotations"]
        assert spec["imagePullSecrets"] == [{"name": "regcred"}]
        assert spec["serviceAccountName"] == "trainer"
        assert spec["automountServiceAccountToken"] is False  # a service account does not mount its token by itself
        assert [v["name"] for v in spec["volumes"]] == ["config", "dshm", "checkpoints", "data", "creds"]
        assert (spec["priorityClassName"], spec["dnsPolicy"], spec["runtimeClassName"]) == ("research", "ClusterFirst", "nvidia")
        (init,) = spec["initContainers"]
        assert init["name"] == "fetch" and init["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
        trainer, uploader = spec["containers"]
        assert (trainer["name"], uploader["name"]) == (trainer_name, "uploader")
        env = [e["name"] for e in trainer["env"]]
        assert env[-2:] == ["WANDB_API_KEY", "HF_HOME"] and "PYTHONUNBUFFERED" in env  # after the operator's own
        assert trainer["envFrom"] == OVERLAY["spec"]["containers"][0]["envFrom"]
        assert [m["mountPath"] for m in trainer["volumeMounts"]] == ["/etc/brain", "/dev/shm", "/checkpoints", "/data"]
        assert trainer["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert uploader["securityContext"]["allowPrivilegeEscalation"] is False
        assert {"name": "checkpoints", "mountPath": "/checkpoints", "readOnly": True} in uploader["volumeMounts"]


ASKED = {"spec": {
    "automountServiceAccountToken": True,
    "hostNetwork": True,
    "containers": [{"name": "trainer", "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}}}],
}}


@pytest.mark.parametrize("version", ["1.29", "1.37"])
@pytest.mark.parametrize("backend", ["elastic", "pytorchjob"])
def test_pods_with_every_overlay_field_pass_strict_kubernetes_schemas(backend, version):
    for overlay in (OVERLAY, ASKED):
        for obj in render(parse_job(manifest(overlay, backend=backend), defaults=ALLOWING)):
            for checked in _checked_objects(obj):
                assert kubernetes_validate.validate(checked, version, strict=True) == version


def test_token_capabilities_and_host_network_only_when_asked():
    pod = next(o for o in render(parse_job(manifest(ASKED), defaults=ALLOWING)) if o["kind"] == "Pod")
    assert pod["spec"]["automountServiceAccountToken"] is True
    assert pod["spec"]["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
    # On the host's network the workers still resolve each other (the rendezvous host).
    assert pod["spec"]["hostNetwork"] is True and pod["spec"]["dnsPolicy"] == "ClusterFirstWithHostNet"
    plain = next(o for o in render(parse_job(manifest({}))) if o["kind"] == "Pod")
    assert "hostNetwork" not in plain["spec"] and "add" not in plain["spec"]["containers"][0]["securityContext"]["capabilities"]


def test_the_charts_pull_secrets_reach_every_job_merged_by_name():
    defaults = OperatorDefaults(image_pull_secrets=("org-registry", "regcred"), overlay_policy=POLICY)
    job = parse_job(manifest(), defaults=defaults)
    pod = next(o for o in render(job) if o["kind"] == "Pod")
    # regcred, in both lists, appears once.
    assert pod["spec"]["imagePullSecrets"] == [{"name": "org-registry"}, {"name": "regcred"}]
    bare = parse_job(manifest({}), defaults=defaults)
    assert next(o for o in render(bare) if o["kind"] == "Pod")["spec"]["imagePullSecrets"] == [{"name": "org-registry"}, {"name": "regcred"}]
    env = {"BRAIN_TRAINER_IMAGE_PULL_SECRETS": '[{"name": "org-registry"}]'}
    assert OperatorDefaults.from_env(env).image_pull_secrets == ("org-registry",)


def _trainer(**fields):
    return {"spec": {"containers": [{"name": "trainer", **fields}]}}


REFUSED = [
    (_trainer(command=["bash"]), "spec.podTemplate.spec.containers[0].command: reserved: the operator runs torchrun"),
    (_trainer(args=["-m", "x"]), "spec.podTemplate.spec.containers[0].args: reserved"),
    (_trainer(image="other:1"), "spec.podTemplate.spec.containers[0].image: reserved: set spec.image"),
    (_trainer(ports=[{"containerPort": 1234}]), "spec.podTemplate.spec.containers[0].ports: reserved"),
    (_trainer(env=[{"name": "PET_NNODES", "value": "9"}]), "spec.podTemplate.spec.containers[0].env[0].name: 'PET_NNODES' is reserved"),
    (_trainer(env=[{"name": "MASTER_ADDR", "value": "x"}]), "spec.podTemplate.spec.containers[0].env[0].name: 'MASTER_ADDR' is reserved"),
    (_trainer(env=[{"name": "NCCL_P2P_LEVEL", "value": "NVL"}]), "NCCL variables go in spec.nccl.env"),
    (_trainer(volumeMounts=[{"name": "checkpoints", "mountPath": "/elsewhere"}]), "containers[0].volumeMounts[0].name: 'checkpoints' is already mounted"),
    (
        {"spec": {"volumes": [{"name": "d", "emptyDir": {}}], "containers": [{"name": "trainer", "volumeMounts": [{"name": "d", "mountPath": "/dev/shm"}]}]}},
        "spec.podTemplate.spec.containers[0].volumeMounts[0].mountPath: '/dev/shm' is the trainer's own mount",
    ),
    (
        {"spec": {"volumes": [{"name": "d", "emptyDir": {}}], "containers": [{"name": "trainer", "volumeMounts": [{"name": "d", "mountPath": "/checkpoints/x"}]}]}},
        "containers[0].volumeMounts[0].mountPath: '/checkpoints/x' is the trainer's own mount",
    ),
    (_trainer(securityContext={"privileged": True}), "containers[0].securityContext.privileged: reserved"),
    (_trainer(securityContext={"capabilities": {"drop": []}}), "containers[0].securityContext.capabilities.drop: reserved"),
    ({"spec": {"volumes": [{"name": "config", "emptyDir": {}}]}}, "spec.podTemplate.spec.volumes[0].name: 'config' clashes with the operator's volume"),
    ({"spec": {"volumes": [{"name": "dshm", "emptyDir": {}}]}}, "spec.podTemplate.spec.volumes[0].name: 'dshm' clashes"),
    ({"spec": {"containers": [{"name": "pytorch", "image": "x"}]}}, "spec.podTemplate.spec.containers[0].name: 'pytorch' is the trainer container's name"),
    ({"spec": {"initContainers": [{"name": "trainer", "image": "x"}]}}, "spec.podTemplate.spec.initContainers[0].name: 'trainer' is the trainer container's name"),
    (
        {"spec": {"containers": [{"name": "side", "image": "x", "ports": [{"containerPort": 9400}]}]}},
        "spec.podTemplate.spec.containers[0].ports[0]: reserved: the trainer serves rdzv on 29400, metrics on 9400",
    ),
    ({"metadata": {"labels": {"brain.ai/job-name": "x"}}}, "spec.podTemplate.metadata.labels.brain.ai/job-name: reserved"),
    ({"metadata": {"labels": {"kueue.x-k8s.io/queue-name": "q"}}}, "spec.podTemplate.metadata.labels.kueue.x-k8s.io/queue-name: reserved"),
    ({"metadata": {"annotations": {"prometheus.io/port": "1"}}}, "spec.podTemplate.metadata.annotations.prometheus.io/port: reserved"),
    (
        _trainer(env=[{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"key": "token"}}}]),
        "spec.podTemplate.spec.containers[0].env[0].valueFrom.secretKeyRef.name: required",
    ),
    (_trainer(envFrom=[{"configMapRef": {}}]), "spec.podTemplate.spec.containers[0].envFrom[0].configMapRef.name: required"),
    ({"spec": {"imagePullSecrets": [{}]}}, "spec.podTemplate.spec.imagePullSecrets[0].name: required"),
    ({"spec": {"dnsPolicy": "None"}}, "spec.podTemplate.spec.dnsPolicy: must be one of ClusterFirst, ClusterFirstWithHostNet, Default"),
    (
        {"spec": {"containers": [{"name": "side", "image": "x", "volumeMounts": [{"name": "nope", "mountPath": "/x"}]}]}},
        "spec.podTemplate.spec.containers[0].volumeMounts[0].name: 'nope' names no volume",
    ),
    (
        {"spec": {"containers": [{"name": "side", "image": "x"}, {"name": "side", "image": "y"}]}},
        "spec.podTemplate.spec.containers[1].name: 'side' appears twice",
    ),
    # Kubernetes' own schema, by path: a typo and a wrong type.
    ({"spec": {"volumes": [{"name": "d", "secret": {"secretNme": "s"}}]}}, "spec.podTemplate.spec.volumes[0].secret.secretNme: unknown field"),
    ({"spec": {"containers": [{"name": "s", "image": "x", "ports": [{"containerPort": "80"}]}]}}, "containers[0].ports[0].containerPort: must be an integer"),
    ({"spec": {"hostNetwrok": True}}, "spec.podTemplate.spec.hostNetwrok: unknown field"),
    ({"spec": {"tolerations": []}}, "spec.podTemplate.spec.tolerations: unknown field"),
]


@pytest.mark.parametrize(("overlay", "complaint"), REFUSED, ids=lambda v: v if isinstance(v, str) else None)
def test_what_the_operator_owns_is_refused_naming_the_path(overlay, complaint):
    with pytest.raises(ConfigError) as err:
        parse_job(manifest(overlay))
    assert complaint in str(err.value), str(err.value)


def test_both_priority_classes_are_refused():
    with pytest.raises(ConfigError, match=r"spec.podTemplate.spec.priorityClassName: set either spec.scheduling.priorityClassName"):
        parse_job(manifest(scheduling={"priorityClassName": "high"}))


SCHEDULING = {"nodeSelector": {"pool": "a100"}, "tolerations": [{"key": "gpu", "operator": "Exists"}],
              "affinity": {"nodeAffinity": {}}, "schedulerName": "volcano"}


@pytest.mark.parametrize("key", sorted(SCHEDULING))
def test_a_scheduling_field_in_the_overlay_points_to_spec_scheduling_where_it_works(key):
    with pytest.raises(ConfigError) as err:
        parse_job(manifest({"spec": {key: SCHEDULING[key]}}))
    (line,) = map(str, err.value.errors)
    assert line.startswith(f"spec.podTemplate.spec.{key}: unknown field; did you mean spec.scheduling.{key}? (known fields: ")
    moved = parse_job(manifest({}, scheduling={key: SCHEDULING[key]}))
    templates = list(pod_templates(render(moved)))
    assert templates and all(spec[key] == SCHEDULING[key] for _, spec, _ in templates), "there it reaches every pod"


def test_an_unknown_overlay_field_without_a_home_elsewhere_gets_no_hint():
    with pytest.raises(ConfigError) as err:
        parse_job(manifest({"spec": {"hostNetwrok": True}}))
    assert "did you mean" not in str(err.value)


BAD_INPUT = {
    "reserved": (_trainer(env=[{"name": "NCCL_DEBUG", "value": "INFO"}]), "spec.podTemplate.spec.containers[0].env[0].name"),
    "volume clash": ({"spec": {"volumes": [{"name": "checkpoints", "emptyDir": {}}]}}, "spec.podTemplate.spec.volumes[0].name"),
    "secretKeyRef without name": (
        _trainer(env=[{"name": "T", "valueFrom": {"secretKeyRef": {"key": "k"}}}]),
        "spec.podTemplate.spec.containers[0].env[0].valueFrom.secretKeyRef.name",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUT))
def test_bad_overlays_get_one_line_naming_the_path_from_validate_and_from_the_operator(case, tmp_path, capsys):
    overlay, path = BAD_INPUT[case]
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(manifest(overlay)))
    assert main(["validate", str(job)]) == 1
    out, err = capsys.readouterr()
    (line,) = err.splitlines()
    assert line.startswith(f"{job}: {path}: ") and out == ""
    cluster = FakeCluster()
    cluster.apply_job(manifest(overlay))
    status = reconcile(cluster.get_job("ml", "ov"), cluster, NOW)
    valid = next(c for c in status["conditions"] if c["type"] == "Valid")
    assert (status["phase"], valid["status"], valid["reason"]) == ("Failed", "False", "InvalidSpec")
    assert valid["message"].startswith(f"{path}: ") and cluster.kinds() == []


SPEC_SCHEMA = crd.spec_schema()


def test_the_crd_types_the_overlay_with_kubernetes_schemas():
    overlay = SPEC_SCHEMA["properties"]["podTemplate"]["properties"]["spec"]["properties"]
    container = overlay["containers"]["items"]
    assert {"env", "envFrom", "volumeMounts", "securityContext", "image", "command"} <= set(container["properties"])
    assert container["required"] == ["name"] and container["properties"]["env"]["items"]["required"] == ["name"]
    assert "secret" in overlay["volumes"]["items"]["properties"] and "persistentVolumeClaim" in overlay["volumes"]["items"]["properties"]
    text = yaml.safe_dump(SPEC_SCHEMA["properties"]["podTemplate"])
    assert "x-kubernetes-preserve-unknown-fields" not in text


def test_the_generated_crd_schema_accepts_the_overlay_and_refuses_a_typo_inside_it():
    spec = manifest()["spec"]
    assert structural.errors(SPEC_SCHEMA, spec) == []
    typo = copy.deepcopy(spec)
    typo["podTemplate"]["spec"]["containers"][0]["env"][0]["valueFrom"]["secretKeyRef"]["nmae"] = "wandb"
    assert structural.errors(SPEC_SCHEMA, typo) == [
        "podTemplate.spec.containers.0.env.0.valueFrom.secretKeyRef: Additional properties are not allowed ('nmae' was unexpected)"
    ]
    wrong = copy.deepcopy(spec)
    wrong["podTemplate"]["spec"]["volumes"][0]["persistentVolumeClaim"]["readOnly"] = "yes"
    assert structural.errors(SPEC_SCHEMA, wrong) == ["podTemplate.spec.volumes.0.persistentVolumeClaim.readOnly: 'yes' is not of type 'boolean'"]
