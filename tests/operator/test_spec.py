"""spec.py: parsing a BrainTrainingJob, one clear error per bad field, and the translation to TrainerConfig."""

from __future__ import annotations

import copy
import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from brain_operator.backends import render
from brain_operator.spec import (
    JobSpec,
    OperatorDefaults,
    effective_batch_size,
    is_elastic,
    node_range,
    parse_job,
    resolved_backend,
    resolved_strategy,
    spec_to_dict,
    trainer_config,
)
from brain_trainer.config import DISTRIBUTED_PRESETS, TrainerConfig
from brain_trainer.schema import ConfigError, openapi_schema


def manifest(spec=None, **metadata):
    return {
        "apiVersion": "brain.ai/v1alpha1",
        "kind": "BrainTrainingJob",
        "metadata": {"name": "demo", "namespace": "ml", "uid": "uid-1", "generation": 2, **metadata},
        "spec": {"image": "brain-train/trainer:dev", **(spec or {})},
    }


def test_minimal_manifest_gets_every_default():
    job = parse_job(manifest())
    assert (job.name, job.namespace, job.uid, job.generation) == ("demo", "ml", "uid-1", 2)
    assert job.spec.backend == "elastic" and job.spec.nodes == 1 and job.spec.nproc_per_node == 1
    assert node_range(job.spec) == (1, 1) and not is_elastic(job.spec)
    assert job.spec.checkpoint.mount_path == "/checkpoints"
    assert job.spec.run_policy.backoff_limit == 3 and job.spec.run_policy.suspend is False


def test_api_server_metadata_is_accepted_and_ignored():
    job = parse_job(manifest(resourceVersion="7", labels={"a": "b"}, managedFields=[], creationTimestamp="2026-01-01T00:00:00Z"))
    assert job.name == "demo"


def test_round_trip_through_dict():
    spec = {
        "nodes": 3,
        "elastic": {"minNodes": 2, "maxNodes": 4, "maxRestarts": 1},
        "checkpoint": {"volumeClaimTemplate": {"storage": "5Gi"}, "async": False},
        "resources": {"requests": {"cpu": 2, "memory": "4Gi"}},
    }
    job = parse_job(manifest(spec))
    again = parse_job(manifest(spec_to_dict(job.spec)))
    assert again.spec == job.spec
    assert spec_to_dict(job.spec)["checkpoint"]["async"] is False


def test_trainer_config_translation():
    job = parse_job(
        manifest(
            {
                "nodes": 2,
                "nprocPerNode": 2,
                "model": {"preset": "7b"},
                "training": {"steps": 9, "microBatchSize": 2, "seqLen": 64},
                "distributed": {"strategy": "fsdp", "cpuOffload": True, "gradientAccumulationSteps": 4,
                                "mixedPrecisionPolicy": "fp16", "timeoutSeconds": 600},
                "data": {"source": "files", "path": "/data/*.txt", "numWorkers": 2},
                "checkpoint": {"mountPath": "/ckpt", "intervalSteps": 7, "keepLast": 2, "async": False},
            }
        )
    )
    cfg = trainer_config(job).resolved()
    assert isinstance(cfg, TrainerConfig)
    assert cfg.training.steps == 9 and cfg.training.micro_batch_size == 2 and cfg.training.seq_len == 64
    assert cfg.distributed.gradient_accumulation_steps == 4
    assert cfg.distributed.mixed_precision_policy == "fp16"
    assert cfg.distributed.num_nodes == 2 and cfg.distributed.timeout_seconds == 600
    assert cfg.distributed.strategy == "fsdp" and cfg.distributed.cpu_offload is True
    # Unset fields take the 7b preset's recommendation.
    assert cfg.distributed.activation_checkpointing == DISTRIBUTED_PRESETS["7b"].activation_checkpointing == "full"
    assert cfg.distributed.fsdp_sharding == DISTRIBUTED_PRESETS["7b"].fsdp_sharding
    assert (cfg.data.source, cfg.data.path, cfg.data.num_workers) == ("files", "/data/*.txt", 2)
    assert (cfg.checkpoint.dir, cfg.checkpoint.interval_steps, cfg.checkpoint.keep_last) == ("/ckpt", 7, 2)
    assert cfg.checkpoint.async_save is False
    # The trainer accepts what we render.
    assert TrainerConfig.from_dict(cfg.to_dict()) == cfg
    assert effective_batch_size(job) == 2 * 4 * 4


def test_precision_defaults_to_the_preset():
    assert trainer_config(parse_job(manifest({"model": {"preset": "1b"}}))).resolved().distributed.mixed_precision_policy == "bf16"
    assert trainer_config(parse_job(manifest())).resolved().distributed.mixed_precision_policy == "fp32"


def test_planner_decides_checkpointing_under_strategy_auto():
    def dist(distributed):
        return trainer_config(parse_job(manifest({"model": {"preset": "7b"}, "distributed": distributed}))).resolved().distributed

    assert dist({"strategy": "auto"}).activation_checkpointing == "none"  # a rung of the planner's ladder
    assert dist({"strategy": "fsdp"}).activation_checkpointing == "full"  # the 7b preset's recommendation
    assert dist({"strategy": "auto", "activationCheckpointing": "selective"}).activation_checkpointing == "selective"


def test_resolved_values():
    gpu = parse_job(manifest({"nodes": 2, "resources": {"limits": {"nvidia.com/gpu": 8}}, "model": {"preset": "3b"}}))
    assert resolved_backend(gpu.spec) == "nccl"
    # The trainer plans `auto` against the device's memory at start-up.
    assert resolved_strategy(gpu.spec) == "auto"
    assert resolved_strategy(parse_job(manifest({"nodes": 2, "distributed": {"strategy": "fsdp"}})).spec) == "fsdp"
    cpu = parse_job(manifest({"nodes": 2, "model": {"preset": "3b"}}))
    assert resolved_backend(cpu.spec) == "gloo" and resolved_strategy(cpu.spec) == "ddp"
    assert resolved_strategy(parse_job(manifest()).spec) == "single"
    batch = parse_job(manifest({"nodes": 3, "nprocPerNode": 2, "training": {"microBatchSize": 4, "globalBatchSize": 48}}))
    assert effective_batch_size(batch) == 48


def test_elastic_range_defaults_to_nodes_on_the_open_side():
    assert node_range(parse_job(manifest({"nodes": 3, "elastic": {"minNodes": 2}})).spec) == (2, 3)
    assert node_range(parse_job(manifest({"nodes": 3, "elastic": {"maxNodes": 5}})).spec) == (3, 5)


def test_operator_defaults_fill_what_the_job_omits():
    defaults = OperatorDefaults.from_env(
        {
            "BRAIN_TRAINER_IMAGE": "registry/trainer:1",
            "BRAIN_TRAINER_IMAGE_PULL_POLICY": "Always",
            "BRAIN_NCCL_ENV": '{"NCCL_P2P_DISABLE": "1", "NCCL_ALGO": "Ring"}',
        }
    )
    bare = manifest({"nccl": {"env": {"NCCL_ALGO": "Tree"}}})
    del bare["spec"]["image"]
    job = parse_job(bare, defaults=defaults)
    assert job.spec.image == "registry/trainer:1" and job.spec.image_pull_policy == "Always"
    assert job.spec.nccl.env == {"NCCL_P2P_DISABLE": "1", "NCCL_ALGO": "Tree"}  # the job's key wins
    own = parse_job(manifest({"imagePullPolicy": "Never"}), defaults=defaults)
    assert own.spec.image == "brain-train/trainer:dev" and own.spec.image_pull_policy == "Never"
    assert OperatorDefaults.from_env({}) == OperatorDefaults()


@pytest.mark.parametrize(
    "env, field",
    [
        ({"BRAIN_NCCL_ENV": "not json"}, "BRAIN_NCCL_ENV"),
        ({"BRAIN_NCCL_ENV": '{"RANK": "0"}'}, "BRAIN_NCCL_ENV"),
        ({"BRAIN_NCCL_ENV": '["x"]'}, "BRAIN_NCCL_ENV"),
        ({"BRAIN_TRAINER_IMAGE_PULL_POLICY": "Sometimes"}, "BRAIN_TRAINER_IMAGE_PULL_POLICY"),
    ],
)
def test_bad_operator_defaults_name_the_variable(env, field):
    with pytest.raises(ConfigError) as err:
        OperatorDefaults.from_env(env)
    assert [e.path for e in err.value.errors] == [field]


def test_local_runs_need_no_image():
    bare = manifest()
    del bare["spec"]["image"]
    assert parse_job(bare, require_image=False).spec.image is None


def test_longest_valid_name_fits_a_pod_hostname():
    name = "a" * 54  # "a"*54 + "-worker-1" is exactly 63 characters
    assert parse_job(manifest({"nodes": 2}, name=name)).name == name


def _set(spec, dotted, value):
    node = spec
    *parents, last = dotted.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return spec


# (case, change to the valid manifest, the one field the error must name, text the message must hold)
BAD = [
    ("nodes wrong type", lambda m: _set(m["spec"], "nodes", "two"), "spec.nodes", "'two'"),
    ("zero nodes", lambda m: _set(m["spec"], "nodes", 0), "spec.nodes", "got 0"),
    ("negative nodes", lambda m: _set(m["spec"], "nodes", -3), "spec.nodes", "got -3"),
    ("zero processes", lambda m: _set(m["spec"], "nprocPerNode", 0), "spec.nprocPerNode", "got 0"),
    ("bool for int", lambda m: _set(m["spec"], "nodes", True), "spec.nodes", "True"),
    ("unknown spec field", lambda m: _set(m["spec"], "gpus", 8), "spec.gpus", "unknown field"),
    ("unknown nested field", lambda m: _set(m["spec"], "training.epochs", 3), "spec.training.epochs", "unknown field"),
    ("unknown top-level field", lambda m: m.update(extra=1), "extra", "unknown field"),
    ("bad backend", lambda m: _set(m["spec"], "backend", "slurm"), "spec.backend", "'slurm'"),
    ("bad pull policy", lambda m: _set(m["spec"], "imagePullPolicy", "Sometimes"), "spec.imagePullPolicy", "'Sometimes'"),
    ("bad preset", lambda m: _set(m["spec"], "model.preset", "400b"), "spec.model.preset", "'400b'"),
    ("bad entrypoint", lambda m: _set(m["spec"], "model.entrypoint", "not a path"), "spec.model.entrypoint", "'not a path'"),
    ("bad precision", lambda m: _set(m["spec"], "distributed.mixedPrecisionPolicy", "fp8"), "spec.distributed.mixedPrecisionPolicy", "'fp8'"),
    ("bad strategy", lambda m: _set(m["spec"], "distributed.strategy", "zero3"), "spec.distributed.strategy", "'zero3'"),
    ("bad nccl debug", lambda m: _set(m["spec"], "nccl.debug", "LOUD"), "spec.nccl.debug", "'LOUD'"),
    ("missing image", lambda m: m["spec"].pop("image"), "spec.image", "required"),
    ("steps as a string", lambda m: _set(m["spec"], "training.steps", "100"), "spec.training.steps", "'100'"),
    ("zero learning rate", lambda m: _set(m["spec"], "training.learningRate", 0), "spec.training.learningRate", "got 0"),
    ("negative backoff", lambda m: _set(m["spec"], "runPolicy.backoffLimit", -1), "spec.runPolicy.backoffLimit", "got -1"),
    ("negative torchrun restarts", lambda m: _set(m["spec"], "elastic.maxRestarts", -1), "spec.elastic.maxRestarts", "got -1"),
    ("zero keepLast", lambda m: _set(m["spec"], "checkpoint.keepLast", 0), "spec.checkpoint.keepLast", "got 0"),
    ("bad resumeFrom", lambda m: _set(m["spec"], "checkpoint.resumeFrom", "earliest"), "spec.checkpoint.resumeFrom",
     "must be latest, none or a step >= 0, got 'earliest'"),
    ("min above max", lambda m: m["spec"].update(nodes=4, elastic={"minNodes": 6, "maxNodes": 4}), "spec.elastic.minNodes", "must be <= maxNodes (4), got 6"),
    ("nodes above the range", lambda m: m["spec"].update(nodes=5, elastic={"minNodes": 2, "maxNodes": 4}), "spec.nodes", "got 5"),
    ("nodes below the range", lambda m: m["spec"].update(nodes=1, elastic={"minNodes": 2, "maxNodes": 4}), "spec.nodes", "got 1"),
    ("reserved PET_ key", lambda m: _set(m["spec"], "nccl.env", {"PET_NNODES": "9"}), "spec.nccl.env.PET_NNODES", "reserved"),
    ("reserved RANK", lambda m: _set(m["spec"], "nccl.env", {"RANK": "0"}), "spec.nccl.env.RANK", "reserved"),
    ("reserved MASTER_ADDR", lambda m: _set(m["spec"], "nccl.env", {"MASTER_ADDR": "x"}), "spec.nccl.env.MASTER_ADDR", "reserved"),
    ("rendered NCCL key", lambda m: _set(m["spec"], "nccl.env", {"NCCL_DEBUG": "INFO"}), "spec.nccl.env.NCCL_DEBUG", "reserved"),
    ("bad env name", lambda m: _set(m["spec"], "nccl.env", {"1BAD": "x"}), "spec.nccl.env.1BAD", "'1BAD'"),
    ("env value not a string", lambda m: _set(m["spec"], "nccl.env", {"NCCL_ALGO": 1}), "spec.nccl.env.NCCL_ALGO", "got 1"),
    (
        "name too long for a hostname",
        lambda m: (m["metadata"].update(name="a" * 55), m["spec"].update(nodes=2, elastic={"maxNodes": 100})),
        "metadata.name",
        "'" + "a" * 55 + "-worker-99'",
    ),
    ("name with capitals", lambda m: m["metadata"].update(name="Bad_Name"), "metadata.name", "'Bad_Name'"),
    ("name starting with a digit", lambda m: m["metadata"].update(name="1job"), "metadata.name", "'1job'"),
    ("missing metadata", lambda m: m.pop("metadata"), "metadata", "None"),
    (
        "multi-node with a ReadWriteOnce template",
        lambda m: m["spec"].update(nodes=2, checkpoint={"volumeClaimTemplate": {"accessModes": ["ReadWriteOnce"]}}),
        "spec.checkpoint.volumeClaimTemplate.accessModes",
        "ReadWriteMany",
    ),
    (
        "elastic range reaching 2 nodes with a ReadWriteOnce template",
        lambda m: m["spec"].update(elastic={"maxNodes": 2}, checkpoint={"volumeClaimTemplate": {"accessModes": ["ReadWriteOnce"]}}),
        "spec.checkpoint.volumeClaimTemplate.accessModes",
        "ReadWriteOnce",
    ),
    (
        "claim and template both",
        lambda m: _set(m["spec"], "checkpoint", {"claimName": "pvc", "volumeClaimTemplate": {}}),
        "spec.checkpoint.volumeClaimTemplate",
        "not both",
    ),
    ("checkpoint uri of another scheme", lambda m: _set(m["spec"], "checkpoint.uri", "gs://bucket/run"),
     "spec.checkpoint.uri", "scheme 'gs' is not supported: only s3://"),
    ("checkpoint uri without a scheme", lambda m: _set(m["spec"], "checkpoint.uri", "bucket/run"), "spec.checkpoint.uri",
     "must be an s3://bucket/prefix URI, got 'bucket/run'"),
    ("checkpoint uri with a bad bucket", lambda m: _set(m["spec"], "checkpoint.uri", "s3://My_Bucket/run"),
     "spec.checkpoint.uri", "'My_Bucket' is not a bucket name"),
    ("checkpoint uri with a '..' part", lambda m: _set(m["spec"], "checkpoint.uri", "s3://bucket/a/../b"),
     "spec.checkpoint.uri", "'..' parts"),
    ("checkpoint uri and claim both", lambda m: _set(m["spec"], "checkpoint", {"uri": "s3://bucket/run", "claimName": "pvc"}),
     "spec.checkpoint.uri", "set either uri or claimName, not both"),
    ("checkpoint uri and template both",
     lambda m: _set(m["spec"], "checkpoint", {"uri": "s3://bucket/run", "volumeClaimTemplate": {}}),
     "spec.checkpoint.uri", "set either uri or volumeClaimTemplate, not both"),
    ("an object store without a uri", lambda m: _set(m["spec"], "objectStore", {"credentialsSecret": "s3"}),
     "spec.objectStore", "applies to checkpoint.uri and data.uri"),
    ("an endpoint that is no URL", lambda m: m["spec"].update(checkpoint={"uri": "s3://bucket/run"},
                                                               objectStore={"endpoint": "minio:9000"}),
     "spec.objectStore.endpoint", "must be an http:// or https:// URL"),
    ("an endpoint carrying credentials", lambda m: m["spec"].update(checkpoint={"uri": "s3://bucket/run"},
                                                                   objectStore={"endpoint": "https://key:secret@minio"}),
     "spec.objectStore.endpoint", "must not carry credentials: name a Secret holding them in credentialsSecret"),
    ("a bad credentials Secret name", lambda m: m["spec"].update(checkpoint={"uri": "s3://bucket/run"},
                                                                objectStore={"credentialsSecret": "S3 keys"}),
     "spec.objectStore.credentialsSecret", "'S3 keys'"),
    ("the endpoint in nccl.env too", lambda m: m["spec"].update(
        checkpoint={"uri": "s3://bucket/run"}, objectStore={"endpoint": "http://minio:9000"},
        nccl={"env": {"AWS_ENDPOINT_URL": "http://other:9000"}}),
     "spec.nccl.env.AWS_ENDPOINT_URL", "'AWS_ENDPOINT_URL' is set from objectStore.endpoint"),
    ("the endpoint in the trainer's overlay env too", lambda m: m["spec"].update(
        checkpoint={"uri": "s3://bucket/run"}, objectStore={"endpoint": "http://minio:9000"},
        podTemplate={"spec": {"containers": [{"name": "trainer", "env": [{"name": "AWS_ENDPOINT_URL", "value": "x"}]}]}}),
     "spec.podTemplate.spec.containers[0].env[0].name", "'AWS_ENDPOINT_URL' is set from objectStore.endpoint"),
    ("bad access mode", lambda m: _set(m["spec"], "checkpoint.volumeClaimTemplate", {"accessModes": ["ReadWriteAlways"]}), "spec.checkpoint.volumeClaimTemplate.accessModes", "'ReadWriteAlways'"),
    ("relative mount path", lambda m: _set(m["spec"], "checkpoint.mountPath", "ckpt"), "spec.checkpoint.mountPath", "'ckpt'"),
    ("mount over the config", lambda m: _set(m["spec"], "checkpoint.mountPath", "/etc/brain"), "spec.checkpoint.mountPath", "'/etc/brain'"),
    ("batch not a multiple of micro-batch", lambda m: _set(m["spec"], "training", {"microBatchSize": 4, "globalBatchSize": 10}), "spec.training.globalBatchSize", "got 10"),
    (
        "batch not divisible at every elastic size",
        lambda m: m["spec"].update(nodes=2, elastic={"minNodes": 2, "maxNodes": 4}, training={"microBatchSize": 4, "globalBatchSize": 24}),
        "spec.training.globalBatchSize",
        "(16 at 4 nodes), got 24",
    ),
    ("batch and accumulation both", lambda m: m["spec"].update(training={"globalBatchSize": 16}, distributed={"gradientAccumulationSteps": 2}), "spec.distributed.gradientAccumulationSteps", "not both"),
    ("files without a path", lambda m: _set(m["spec"], "data", {"source": "files"}), "spec.data.path", "required"),
    ("bad quantity", lambda m: _set(m["spec"], "resources.limits", {"memory": "lots"}), "spec.resources.limits.memory", "'lots'"),
    ("negative quantity", lambda m: _set(m["spec"], "resources.requests", {"cpu": -1}), "spec.resources.requests.cpu", "got -1"),
    ("bool quantity", lambda m: _set(m["spec"], "resources.requests", {"cpu": True}), "spec.resources.requests.cpu", "True"),
    ("tolerations not a list", lambda m: _set(m["spec"], "scheduling.tolerations", "all"), "spec.scheduling.tolerations", "'all'"),
    ("bad queue name", lambda m: _set(m["spec"], "scheduling.queueName", "bad queue!"), "spec.scheduling.queueName", "'bad queue!'"),
    ("spec not a mapping", lambda m: m.update(spec=["nodes"]), "spec", "['nodes']"),
    ("wrong apiVersion", lambda m: m.update(apiVersion="brain.ai/v1"), "apiVersion", "'brain.ai/v1'"),
    ("wrong kind", lambda m: m.update(kind="PyTorchJob"), "kind", "'PyTorchJob'"),
]


def test_the_table_is_large_enough():
    assert len(BAD) >= 30


@pytest.mark.parametrize("case, change, path, text", BAD, ids=[b[0] for b in BAD])
def test_malformed_manifest_gets_one_error_naming_the_field(case, change, path, text):
    bad = manifest()
    change(bad)
    with pytest.raises(ConfigError) as err:
        parse_job(bad)
    errors = err.value.errors
    assert len(errors) == 1, f"{case}: {err.value}"
    assert errors[0].path == path, f"{case}: {err.value}"
    assert text in errors[0].message, f"{case}: {err.value}"
    assert str(err.value).startswith(f"{path}: ")


def test_all_errors_are_reported_at_once():
    bad = manifest({"nodes": 0, "backend": "slurm", "training": {"steps": -1}})
    with pytest.raises(ConfigError) as err:
        parse_job(bad)
    assert {e.path for e in err.value.errors} == {"spec.nodes", "spec.backend", "spec.training.steps"}


# ---- property-based: no input makes the parser raise anything but ConfigError ----


def _keys(schema):
    for key, prop in schema.get("properties", {}).items():
        yield key
        yield from _keys(prop)


KNOWN_KEYS = sorted(set(_keys(openapi_schema(JobSpec))) | {"PET_X", "NCCL_ALGO", "cpu", "nvidia.com/gpu"})
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**40), max_value=2**40)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.sampled_from(["elastic", "pytorchjob", "files", "ReadWriteOnce", "ReadWriteMany", "7b", "fp16", "1Gi", "x:y"])
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(KNOWN_KEYS) | st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)
FULL = manifest(
    {
        "nodes": 2,
        "elastic": {"minNodes": 1, "maxNodes": 3},
        "training": {"microBatchSize": 2, "globalBatchSize": 12},
        "checkpoint": {"volumeClaimTemplate": {"accessModes": ["ReadWriteMany"]}},
        "nccl": {"env": {"NCCL_ALGO": "Ring"}},
        "scheduling": {"queueName": "q", "tolerations": [{"key": "k", "operator": "Exists"}]},
        "resources": {"limits": {"cpu": 1}},
    }
)


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, (*prefix, key))


PATHS = [p for p in _paths(FULL) if p]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(path=st.sampled_from(PATHS), key=st.sampled_from(KNOWN_KEYS) | st.text(max_size=8), value=VALUES, replace=st.booleans())
def test_fuzzed_manifests_raise_only_config_errors(path, key, value, replace):
    bad = copy.deepcopy(FULL)
    parent = bad
    for part in path[:-1]:
        parent = parent[part]
    if replace:
        parent[path[-1]] = value
    elif isinstance(parent[path[-1]], dict):
        parent[path[-1]][key] = value
    else:
        del parent[path[-1]]
    try:
        job = parse_job(bad)
    except ConfigError as exc:
        assert exc.errors and all(e.message for e in exc.errors)
        return
    # Whatever parses also renders, on both backends.
    for backend in ("elastic", "pytorchjob"):
        assert render(dataclasses.replace(job, spec=dataclasses.replace(job.spec, backend=backend)))


@settings(max_examples=100, deadline=None)
@given(VALUES)
def test_arbitrary_documents_raise_only_config_errors(document):
    try:
        parse_job(document)
    except ConfigError:
        pass
