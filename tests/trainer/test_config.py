"""The typed configuration mechanism and the trainer's config tree (torch-free)."""

import sys
from dataclasses import dataclass, replace
from typing import Any, Optional

import pytest
from processes import run

from brain_trainer.config import DistributedConfig, TrainerConfig, load_config
from brain_trainer.schema import ConfigError, from_dict, openapi_schema, setting, to_dict


def errors_of(data) -> list[str]:
    with pytest.raises(ConfigError) as info:
        TrainerConfig.from_dict(data)
    return [str(e) for e in info.value.errors]


def test_defaults_round_trip_through_yaml(tmp_path):
    cfg = TrainerConfig()
    path = tmp_path / "trainer.yaml"
    path.write_text(cfg.to_yaml())
    assert load_config(path) == cfg
    assert "async: true" in cfg.to_yaml()  # the Python keyword is spelled `async` in YAML


def test_every_bad_field_is_reported_with_its_path_and_value():
    errs = errors_of(
        {
            "distributed": {"fsdp_sharding": "fullshard", "master_port": 70000},
            "training": {"steps": 0, "stepz": 1, "learning_rate": "fast"},
        }
    )
    assert errs == [
        "training.stepz: unknown field (known fields: steps, micro_batch_size, global_batch_size, seq_len, "
        "learning_rate, min_lr_ratio, warmup_steps, lr_scaling, reference_batch_size, weight_decay, grad_clip, "
        "seed, log_interval, compile, eval_interval, eval_steps)",
        "training.steps: must be >= 1, got 0",
        "training.learning_rate: must be a number, got 'fast'",
        "distributed.fsdp_sharding: must be one of full_shard, shard_grad_op, no_shard, hybrid_shard; got 'fullshard'",
        "distributed.master_port: must be <= 65535, got 70000",
    ]


@pytest.mark.parametrize(
    "data, expected",
    [
        ({"training": {"micro_batch_size": True}}, "training.micro_batch_size: must be an integer, got True"),
        ({"training": {"learning_rate": 0}}, "training.learning_rate: must be > 0, got 0.0"),
        ({"data": {"source": "files"}}, "data.path: required when source is 'files'"),
        ({"model": {"entrypoint": "no colon"}}, "model.entrypoint: must match"),
        ({"model": []}, "model: must be a mapping, got []"),
        ({"distributed": {"num_nodes": 2, "node_rank": 2}}, "distributed.node_rank: must be < num_nodes (2), got 2"),
        (
            {"training": {"global_batch_size": 10, "micro_batch_size": 4}},
            "training.global_batch_size: must be a multiple of micro_batch_size (4), got 10",
        ),
        (
            {"training": {"global_batch_size": 16}, "distributed": {"gradient_accumulation_steps": 2}},
            "distributed.gradient_accumulation_steps: set either training.global_batch_size",
        ),
    ],
)
def test_single_bad_field(data, expected):
    errs = errors_of(data)
    assert len(errs) == 1 and errs[0].startswith(expected), errs


def test_accumulation_derived_from_global_batch():
    cfg = TrainerConfig.from_dict({"training": {"micro_batch_size": 4, "global_batch_size": 32}})
    assert cfg.accumulation_steps(world_size=2) == 4
    assert cfg.effective_batch_size(world_size=2) == 32
    with pytest.raises(ConfigError, match="multiple of micro_batch_size x data-parallel ranks \\(12\\)"):
        cfg.accumulation_steps(world_size=3)


def test_config_hash_tracks_settings():
    a, b = TrainerConfig(), TrainerConfig.from_dict({"training": {"steps": 7}})
    assert a.config_hash() == TrainerConfig().config_hash()
    assert a.config_hash() != b.config_hash()


def test_distributed_presets_and_backend():
    assert DistributedConfig.preset("7b").strategy == "fsdp"
    assert DistributedConfig.preset("7b").fsdp_sharding == "full_shard"
    assert DistributedConfig.preset("3b").fsdp_sharding == "shard_grad_op"
    with pytest.raises(ConfigError, match="model.preset"):
        DistributedConfig.preset("400b")
    assert DistributedConfig().resolved_backend(cuda_available=True) == "nccl"
    assert DistributedConfig().resolved_backend(cuda_available=False) == "gloo"
    assert DistributedConfig(backend="gloo").resolved_backend(cuda_available=True) == "gloo"


def test_unreadable_or_invalid_yaml_is_one_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="missing.yaml: cannot read: "):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("training: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


@dataclass
class _Inner:
    size: int = setting(1, minimum=1)


@dataclass
class _Outer:
    """A camelCase model for the CRD."""

    image_name: str = setting(help="required")
    inner_thing: _Inner = setting(default_factory=_Inner)
    extra: Optional[dict[str, Any]] = setting(None)


def test_camel_case_paths_schema_and_round_trip():
    with pytest.raises(ConfigError) as info:
        from_dict(_Outer, {"innerThing": {"size": 0}}, path="spec", camel_case=True)
    assert [str(e) for e in info.value.errors] == [
        "spec.imageName: required field is missing",
        "spec.innerThing.size: must be >= 1, got 0",
    ]
    obj = from_dict(_Outer, {"imageName": "x", "extra": {"a": [1]}}, camel_case=True)
    assert to_dict(obj, camel_case=True) == {"imageName": "x", "innerThing": {"size": 1}, "extra": {"a": [1]}}
    schema = openapi_schema(_Outer)
    assert schema["required"] == ["imageName"]
    assert schema["properties"]["innerThing"]["properties"]["size"] == {"type": "integer", "minimum": 1}
    assert schema["properties"]["extra"]["x-kubernetes-preserve-unknown-fields"] is True


def test_trainer_yaml_takes_the_manifests_camel_case_keys_for_the_same_fields():
    config = TrainerConfig.from_dict({
        "training": {"steps": 50, "micro_batch_size": 4, "global_batch_size": 8, "seq_len": 64,
                     "learning_rate": 1e-3, "warmup_steps": 10},
        "distributed": {"strategy": "fsdp", "fsdp_sharding": "shard_grad_op", "activation_checkpointing": "full"},
        "checkpoint": {"interval_steps": 5, "keep_last": 1, "async": True},
        "data": {"source": "files", "path": "corpus/*.txt", "num_workers": 0},
        "metrics": {"bind_address": "127.0.0.1"},
    })
    manifest_view = to_dict(config, camel_case=True)  # what a manifest's sections hold: camelCase
    assert manifest_view["training"]["microBatchSize"] == 4 and "keepLast" in manifest_view["checkpoint"]
    pasted = TrainerConfig.from_dict(manifest_view)
    assert pasted.metrics.bind_address == TrainerConfig().metrics.bind_address  # derived: not in the manifest view
    assert pasted == replace(config, metrics=TrainerConfig().metrics)
    # both spellings in one file, a derived field (trainer view only) in camelCase too
    mixed = TrainerConfig.from_dict({"training": {"microBatchSize": 2, "seq_len": 32}, "metrics": {"bindAddress": "0.0.0.0"}})
    assert (mixed.training.micro_batch_size, mixed.training.seq_len, mixed.metrics.bind_address) == (2, 32, "0.0.0.0")


def test_a_field_given_in_both_spellings_or_misspelt_is_named():
    with pytest.raises(ConfigError) as info:
        TrainerConfig.from_dict({"training": {"micro_batch_size": 4, "microBatchSize": 8, "seqLen": 0},
                                 "checkpoint": {"keep_last": 1, "keepLast": 1}, "data": {"numworkers": 1}})
    errors = [str(e) for e in info.value.errors]
    assert errors[:2] == ["training.micro_batch_size: given twice, as micro_batch_size and as microBatchSize",
                          "checkpoint.keep_last: given twice, as keep_last and as keepLast"]
    assert len(errors) == 2  # nothing else is judged until the spelling is settled
    with pytest.raises(ConfigError) as info:
        TrainerConfig.from_dict({"training": {"seqLen": 0}, "data": {"numworkers": 1}})
    assert [str(e) for e in info.value.errors][0] == "training.seq_len: must be >= 2, got 0"
    assert str(info.value.errors[1]).startswith("data.numworkers: unknown field (known fields: source, path, num_workers")


def test_config_modules_do_not_import_torch():
    torch_free = ("config", "contract", "config.kubeyaml", "config.presets", "plan", "parallel.launcher",
                  "observe.metrics", "observe.progress", "loop.schedule", "checkpoint", "checkpoint.store",
                  "checkpoint.resume_from")
    imports = ", ".join(f"brain_trainer.{name}" for name in torch_free)
    code = f"import sys, brain_trainer, {imports}; assert 'torch' not in sys.modules, sorted(sys.modules)"
    done = run([sys.executable, "-c", code], timeout=120)
    assert done.returncode == 0, done.stderr


def test_sequence_longer_than_the_preset_accepts_is_a_config_error():
    errs = errors_of({"training": {"seq_len": 100000}})
    assert errs == ["training.seq_len: must be <= 512 (the minimal preset's max_seq_len), got 100000"]
    # A user model decides for itself.
    TrainerConfig.from_dict({"training": {"seq_len": 100000}, "model": {"entrypoint": "pkg.mod:build"}})


def test_package_root_exports_the_contract_lazily():
    code = (
        "import sys, brain_trainer as b; assert 'torch' not in sys.modules; "
        "from brain_trainer import train, DDPWrapper, RankAwareDataLoader; "
        "assert callable(b.train) and not isinstance(b.train, type(sys)), b.train"
    )
    done = run([sys.executable, "-c", code], timeout=120)
    assert done.returncode == 0, done.stderr
