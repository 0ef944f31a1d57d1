"""One declaration per setting: the BrainTrainingJob embeds the trainer's own config tree (docs/architecture.md)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from brain_operator import crd
from brain_operator.backends import build_config_map
from brain_operator.spec import JobSpec, parse_job, spec_to_dict
from brain_trainer.config import CheckpointConfig, TrainerConfig
from brain_trainer.contract import CONFIG_FILE
from brain_trainer.schema import ConfigError, camel, from_dict, key_for, to_dict

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "deploy" / "examples").glob("*.yaml"))
SPEC_SCHEMA = crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
# The trainer's sections, by the name they have in both trees.
SECTIONS = [f.name for f in dataclasses.fields(TrainerConfig)]


def _schema_at(keys):
    node = SPEC_SCHEMA
    for key in keys:
        node = node.get("properties", {}).get(key)
        if node is None:
            return None
    return node


def test_every_trainer_setting_is_at_the_same_path_in_the_crd():
    found, derived = 0, []
    for section in SECTIONS:
        section_cls = TrainerConfig.__dataclass_fields__[section].default_factory
        for f in dataclasses.fields(section_cls):
            manifest_path = (section, key_for(f, True))
            if f.metadata.get("derived"):
                derived.append(".".join((section, f.name)))
                assert _schema_at(manifest_path) is None, f"{manifest_path}: derived by the operator, not in the CRD"
                continue
            assert _schema_at(manifest_path) is not None, f"spec.{'.'.join(manifest_path)} missing from the CRD"
            # trainer.yaml spells it the same way, snake_case.
            assert key_for(f, True) == (f.metadata.get("key") or camel(f.name))
            found += 1
    assert found > 30
    assert sorted(derived) == [
        "checkpoint.dir", "distributed.master_addr", "distributed.master_port", "distributed.node_rank",
        "distributed.num_nodes", "metrics.bind_address", "metrics.port",
    ]


def test_the_spec_sections_are_the_trainer_classes():
    spec_types = {f.name: f.default_factory for f in dataclasses.fields(JobSpec) if f.name in SECTIONS}
    trainer_types = {name: TrainerConfig.__dataclass_fields__[name].default_factory for name in spec_types}
    for name, spec_type in spec_types.items():
        assert issubclass(spec_type, trainer_types[name]), name
    assert set(spec_types) == {"model", "training", "distributed", "data", "watchdog", "metrics", "profiling",
                               "checkpoint"}


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_manifest_to_configmap_to_trainer_config_and_back_is_lossless(path):
    job = parse_job(yaml.safe_load(path.read_text()), require_image=False)
    text = build_config_map(job)["data"][CONFIG_FILE]
    cfg = TrainerConfig.from_dict(yaml.safe_load(text))
    back = spec_to_dict(job.spec)
    for section in ("model", "training", "distributed", "watchdog", "metrics"):
        back[section] = to_dict(getattr(cfg, section), camel_case=True)
    for section in ("data", "checkpoint"):  # the trainer's fields, plus where the data and checkpoints live
        back[section] = {**back[section], **to_dict(getattr(cfg, section), camel_case=True)}
    again = parse_job({"apiVersion": "brain.ai/v1alpha1", "kind": "BrainTrainingJob", "metadata": {"name": job.name},
                       "spec": back}, require_image=False)
    assert again.spec == job.spec
    # What the operator derived is there too.
    assert cfg.checkpoint.dir == job.spec.checkpoint.mount_path and cfg.distributed.num_nodes == job.spec.nodes


def test_a_section_pasted_between_trainer_yaml_and_a_manifest_means_the_same():
    training = {"steps": 30, "microBatchSize": 4, "globalBatchSize": 16, "learningRate": 0.001, "lrScaling": "linear"}
    job = parse_job({"apiVersion": "brain.ai/v1alpha1", "kind": "BrainTrainingJob", "metadata": {"name": "j"},
                     "spec": {"training": training}}, require_image=False)
    snake = to_dict(job.spec.training)
    assert TrainerConfig.from_dict({"training": snake}).training == job.spec.training
    assert to_dict(job.spec.training, camel_case=True) == {**to_dict(TrainerConfig().training, camel_case=True), **training}


def test_derived_fields_are_the_operators_in_a_manifest_and_settable_in_trainer_yaml():
    with pytest.raises(ConfigError) as err:
        parse_job({"apiVersion": "brain.ai/v1alpha1", "kind": "BrainTrainingJob", "metadata": {"name": "j"},
                   "spec": {"image": "i", "checkpoint": {"dir": "/x"}, "distributed": {"nodeRank": 1}}})
    assert sorted(e.path for e in err.value.errors) == ["spec.checkpoint.dir", "spec.distributed.nodeRank"]
    assert all("unknown field" in e.message for e in err.value.errors)
    cfg = TrainerConfig.from_dict({"checkpoint": {"dir": "/x"}, "distributed": {"num_nodes": 2, "node_rank": 1}})
    assert (cfg.checkpoint.dir, cfg.distributed.node_rank) == ("/x", 1)
    assert from_dict(CheckpointConfig, {"dir": "/y"}).dir == "/y"


@pytest.mark.parametrize(
    "spec, trainer, manifest_error, trainer_error",
    [
        (
            {"training": {"microBatchSize": 4, "globalBatchSize": 10}},
            {"training": {"micro_batch_size": 4, "global_batch_size": 10}},
            "spec.training.globalBatchSize: must be a multiple of microBatchSize (4), got 10",
            "training.global_batch_size: must be a multiple of micro_batch_size (4), got 10",
        ),
        (
            {"training": {"globalBatchSize": 16}, "distributed": {"gradientAccumulationSteps": 2}},
            {"training": {"global_batch_size": 16}, "distributed": {"gradient_accumulation_steps": 2}},
            "spec.distributed.gradientAccumulationSteps: set either training.globalBatchSize or "
            "distributed.gradientAccumulationSteps, not both",
            "distributed.gradient_accumulation_steps: set either training.global_batch_size or "
            "distributed.gradient_accumulation_steps, not both",
        ),
        (
            {"training": {"seqLen": 4096}},
            {"training": {"seq_len": 4096}},
            "spec.training.seqLen: must be <= 512 (the minimal preset's max_seq_len), got 4096",
            "training.seq_len: must be <= 512 (the minimal preset's max_seq_len), got 4096",
        ),
    ],
)
def test_each_rule_across_fields_speaks_the_readers_spelling(spec, trainer, manifest_error, trainer_error):
    with pytest.raises(ConfigError) as err:
        parse_job({"apiVersion": "brain.ai/v1alpha1", "kind": "BrainTrainingJob", "metadata": {"name": "j"},
                   "spec": {"image": "i", **spec}})
    assert [str(e) for e in err.value.errors] == [manifest_error]
    with pytest.raises(ConfigError) as err:
        TrainerConfig.from_dict(trainer)
    assert [str(e) for e in err.value.errors] == [trainer_error]


def test_unset_distributed_fields_take_the_presets_recommendation_once():
    cfg = TrainerConfig.from_dict({"model": {"preset": "7b"}, "distributed": {"strategy": "fsdp"}})
    assert cfg.distributed.activation_checkpointing is None  # trainer.yaml says what the user said
    resolved = cfg.resolved()
    assert resolved.distributed.activation_checkpointing == "full" and resolved.distributed.mixed_precision_policy == "bf16"
    assert resolved.resolved() is resolved
    assert cfg.config_hash() == TrainerConfig.from_dict(to_dict(cfg)).config_hash()
