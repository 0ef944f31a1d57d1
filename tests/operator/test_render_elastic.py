"""The elastic backend's contract (docs/architecture.md), field by field, on a rendered 3-node job."""

from __future__ import annotations

import pytest
import yaml

from brain_operator.backends import build_worker_pod, render, render_elastic
from brain_operator.backends.shared.workers import checkpoint_claim_name
from brain_operator.spec import parse_job, trainer_config
from brain_trainer.config import TrainerConfig

UID = "0b5e7c1e-2f4a-4c1e-9d51-7d3f0e6a9c11"


def job_manifest(**spec):
    return {
        "apiVersion": "brain.ai/v1alpha1",
        "kind": "BrainTrainingJob",
        "metadata": {"name": "llm", "namespace": "team-a", "uid": UID},
        "spec": {
            "image": "registry.example/trainer:1.0",
            "nodes": 3,
            "nprocPerNode": 4,
            "elastic": {"minNodes": 2, "maxNodes": 5, "maxRestarts": 7},
            "resources": {"requests": {"cpu": "8", "memory": "32Gi"}, "limits": {"nvidia.com/gpu": 4}},
            "checkpoint": {"volumeClaimTemplate": {"accessModes": ["ReadWriteMany"], "storage": "50Gi", "storageClassName": "nfs"}, "mountPath": "/ckpt"},
            "nccl": {"debug": "INFO", "socketIfname": "eth0", "ibDisable": True, "env": {"NCCL_ALGO": "Ring"}},
            "scheduling": {
                "nodeSelector": {"pool": "gpu"},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "affinity": {"nodeAffinity": {}},
                "priorityClassName": "training",
                "schedulerName": "volcano",
                "queueName": "team-a-queue",
            },
            **spec,
        },
    }


@pytest.fixture(scope="module")
def job():
    return parse_job(job_manifest())


@pytest.fixture(scope="module")
def objects(job):
    return render_elastic(job)


def by_kind(objects, kind):
    return [o for o in objects if o["kind"] == kind]


def env_of(pod):
    (container,) = pod["spec"]["containers"]
    names = [e["name"] for e in container["env"]]
    assert len(names) == len(set(names)), "an environment variable is set twice"
    return {e["name"]: e["value"] for e in container["env"]}


def test_object_set(objects, job):
    assert [(o["kind"], o["metadata"]["name"]) for o in objects] == [
        ("Service", "llm-workers"),
        ("ConfigMap", "llm-config"),
        ("PersistentVolumeClaim", "llm-checkpoints"),
        ("NetworkPolicy", "llm-network"),
        ("Pod", "llm-worker-0"),
        ("Pod", "llm-worker-1"),
        ("Pod", "llm-worker-2"),
    ]
    assert render(job) == objects
    for obj in objects:
        assert obj["metadata"]["namespace"] == "team-a"
        assert obj["metadata"]["labels"]["brain.ai/job-name"] == "llm"
        if obj["kind"] == "PersistentVolumeClaim":
            # reclaimPolicy Retain (the default): the checkpoints outlive the job.
            assert "ownerReferences" not in obj["metadata"]
            continue
        assert obj["metadata"]["ownerReferences"] == [
            {
                "apiVersion": "brain.ai/v1alpha1",
                "kind": "BrainTrainingJob",
                "name": "llm",
                "uid": UID,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]


def test_headless_service_resolves_before_readiness(objects):
    (svc,) = by_kind(objects, "Service")
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"] == {"brain.ai/job-name": "llm"}
    assert [p["port"] for p in svc["spec"]["ports"]] == [29400]


def test_config_map_holds_the_resolved_trainer_config(objects, job):
    (cm,) = by_kind(objects, "ConfigMap")
    loaded = TrainerConfig.from_dict(yaml.safe_load(cm["data"]["trainer.yaml"]))
    assert loaded == trainer_config(job)
    assert loaded.checkpoint.dir == "/ckpt"
    assert loaded.distributed.num_nodes == 3


def test_checkpoint_claim_from_the_template(objects):
    (pvc,) = by_kind(objects, "PersistentVolumeClaim")
    assert pvc["spec"] == {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": "50Gi"}},
        "storageClassName": "nfs",
    }


def test_existing_claim_is_mounted_not_created():
    job = parse_job(job_manifest(checkpoint={"claimName": "shared-ckpt"}))
    objects = render_elastic(job)
    assert not by_kind(objects, "PersistentVolumeClaim")
    volumes = {v["name"]: v for v in by_kind(objects, "Pod")[0]["spec"]["volumes"]}
    assert volumes["checkpoints"]["persistentVolumeClaim"] == {"claimName": "shared-ckpt"}


def test_checkpoints_in_an_object_store_mount_no_volume_and_are_the_trainers_folder():
    job = parse_job(job_manifest(checkpoint={"uri": "s3://team-a-ckpt/llm/run-1"}))
    objects = render_elastic(job)
    assert not by_kind(objects, "PersistentVolumeClaim")
    for pod in by_kind(objects, "Pod"):
        assert [v["name"] for v in pod["spec"]["volumes"]] == ["config", "dshm"]
        assert [m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]] == ["/etc/brain", "/dev/shm"]
        assert "BRAIN_CHECKPOINT_CLAIM" not in env_of(pod)  # no claim to name
    (cm,) = by_kind(objects, "ConfigMap")
    assert TrainerConfig.from_dict(yaml.safe_load(cm["data"]["trainer.yaml"])).checkpoint.dir == "s3://team-a-ckpt/llm/run-1"


def test_pods_identity(objects):
    for i, pod in enumerate(by_kind(objects, "Pod")):
        assert pod["metadata"]["name"] == f"llm-worker-{i}"
        assert pod["spec"]["hostname"] == f"llm-worker-{i}"
        assert pod["spec"]["subdomain"] == "llm-workers"
        assert pod["metadata"]["labels"]["brain.ai/replica-index"] == str(i)
        assert pod["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a-queue"


def test_exec_form_torchrun_agent_under_tini(objects):
    for pod in by_kind(objects, "Pod"):
        (c,) = pod["spec"]["containers"]
        assert c["command"] == ["tini", "--", "python", "-m", "brain_trainer.agent"]
        assert c["args"] == ["-m", "brain_trainer", "--config", "/etc/brain/trainer.yaml"]
        assert c["image"] == "registry.example/trainer:1.0"


def test_torchrun_environment(objects):
    pods = by_kind(objects, "Pod")
    for i, pod in enumerate(pods):
        env = env_of(pod)
        assert env["PET_NNODES"] == "2:5"
        assert env["PET_NPROC_PER_NODE"] == "4"
        assert env["PET_RDZV_BACKEND"] == "c10d"
        assert env["PET_RDZV_ENDPOINT"] == "llm-worker-0.llm-workers:29400"
        assert env["PET_RDZV_ID"] == UID
        assert env["PET_MAX_RESTARTS"] == "7"
        # Worker 0 hosts the store; everyone waits watchdog.startupSeconds (default 1800 s) for the others and
        # for it, not torch's 600 s join and 60 s store timeouts.
        assert env["PET_RDZV_CONF"] == f"is_host={1 if i == 0 else 0},join_timeout=1800,read_timeout=1800"
        # Workers get time to commit a checkpoint on SIGTERM before torchrun kills them,
        # within the pod's own grace period.
        assert int(env["PET_SHUTDOWN_TIMEOUT"]) + 30 <= pod["spec"]["terminationGracePeriodSeconds"]
        assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
        assert env["PYTHONUNBUFFERED"] == "1"
        assert not {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"} & env.keys()


def test_the_reasons_that_fail_the_job_reach_the_trainer(objects):
    # With them the trainer stops torchrun too, whose restarts inside the pod would fail the same way.
    assert {env_of(pod)["BRAIN_FAIL_FAST"] for pod in by_kind(objects, "Pod")} == {"storage-full,data-error,config-error,fenced"}
    policy = {"storageFull": "Restart", "error": "FailJob"}
    changed = render_elastic(parse_job(job_manifest(runPolicy={"failurePolicy": policy})))
    assert env_of(by_kind(changed, "Pod")[0])["BRAIN_FAIL_FAST"] == "data-error,config-error,fenced,error"


def test_the_checkpoint_volumes_holder_is_the_job_and_its_uid(objects):
    # A refused start names the holder and the claim (checkpoint/lease.py); a replaced pod is the same holder.
    for pod in by_kind(objects, "Pod"):
        assert env_of(pod)["BRAIN_LEASE_HOLDER"] == f"job llm (uid {UID})"
        assert env_of(pod)["BRAIN_CHECKPOINT_CLAIM"] == checkpoint_claim_name(parse_job(job_manifest()))


def test_nccl_block(objects):
    env = env_of(by_kind(objects, "Pod")[1])
    assert env["NCCL_DEBUG"] == "INFO"
    assert env["NCCL_SOCKET_IFNAME"] == "eth0"
    assert env["NCCL_IB_DISABLE"] == "1"
    assert env["NCCL_ALGO"] == "Ring"


def test_volumes_and_mounts(objects):
    pod = by_kind(objects, "Pod")[0]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    mounts = {m["mountPath"]: m for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert volumes[mounts["/etc/brain"]["name"]]["configMap"]["name"] == "llm-config"
    assert mounts["/etc/brain"]["readOnly"] is True
    assert volumes[mounts["/dev/shm"]["name"]]["emptyDir"] == {"medium": "Memory"}
    assert volumes[mounts["/ckpt"]["name"]]["persistentVolumeClaim"] == {"claimName": "llm-checkpoints"}


def test_restricted_security(objects):
    for pod in by_kind(objects, "Pod"):
        spec = pod["spec"]
        assert spec["automountServiceAccountToken"] is False
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert isinstance(spec["securityContext"]["runAsUser"], int) and spec["securityContext"]["runAsUser"] > 0
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        sc = spec["containers"][0]["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert "privileged" not in sc


def test_pod_lifecycle(objects):
    for pod in by_kind(objects, "Pod"):
        assert pod["spec"]["restartPolicy"] == "Never"  # the operator recreates pods and counts failures
        # Long enough for an async sharded checkpoint on SIGTERM.
        assert pod["spec"]["terminationGracePeriodSeconds"] >= 300


def test_resources_and_scheduling(objects):
    spec = by_kind(objects, "Pod")[2]["spec"]
    assert spec["containers"][0]["resources"] == {
        "requests": {"cpu": "8", "memory": "32Gi"},
        "limits": {"nvidia.com/gpu": 4},
    }
    assert spec["nodeSelector"] == {"pool": "gpu"}
    assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert spec["affinity"] == {"nodeAffinity": {}}
    assert spec["priorityClassName"] == "training"
    assert spec["schedulerName"] == "volcano"


def test_metrics_port_and_scrape_annotations(objects, job):
    port = trainer_config(job).metrics.port
    pod = by_kind(objects, "Pod")[0]
    ports = {p["name"]: p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]}
    assert ports == {"rdzv": 29400, "metrics": port}
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(port)


def test_single_pod_builder_matches_the_full_render(objects, job):
    assert build_worker_pod(job, 1) == by_kind(objects, "Pod")[1]
    # Scaling up renders the next index with the same contract.
    extra = build_worker_pod(job, 4)
    assert extra["metadata"]["name"] == "llm-worker-4" and env_of(extra)["PET_RDZV_CONF"].startswith("is_host=0,")


def test_render_is_pure(job):
    first = render_elastic(job)
    first[4]["spec"]["containers"][0]["env"].clear()
    first[4]["spec"]["tolerations"].clear()
    assert render_elastic(job)[4]["spec"]["tolerations"] and env_of(render_elastic(job)[4])


def test_without_queue_or_uid():
    manifest = job_manifest()
    del manifest["metadata"]["uid"]
    del manifest["spec"]["scheduling"]["queueName"]
    pods = by_kind(render_elastic(parse_job(manifest)), "Pod")
    assert "ownerReferences" not in pods[0]["metadata"]
    assert "kueue.x-k8s.io/queue-name" not in pods[0]["metadata"]["labels"]
    assert env_of(pods[0])["PET_RDZV_ID"] == "llm"
