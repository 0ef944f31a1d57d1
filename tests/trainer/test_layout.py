"""parallel/layout.py and the tensorParallel setting: the layouts a job may ask for, refused with the field named,
the same from the operator's validation as from the trainer."""

from __future__ import annotations

import pytest

from brain_operator.spec import effective_batch_size, parse_job
from brain_trainer.config import DistributedConfig, TrainerConfig
from brain_trainer.parallel import Layout, build_layout, resolve_distributed
from brain_trainer.schema import ConfigError


def manifest(spec):
    return {"apiVersion": "brain.ai/v1alpha1", "kind": "BrainTrainingJob",
            "metadata": {"name": "demo", "namespace": "ml", "uid": "u", "generation": 1},
            "spec": {"image": "brain-train/trainer:dev", **spec}}


def refusal(spec) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_job(manifest(spec))
    return str(caught.value)


def test_tp_groups_are_consecutive_ranks_and_dp_is_what_is_left():
    layout = build_layout(DistributedConfig(strategy="fsdp", tensor_parallel=2), world_size=8, local_world_size=4)
    assert layout == Layout(world_size=8, tp=2)
    assert layout.dp == 4
    assert [layout.dp_rank(r) for r in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [layout.tp_rank(r) for r in range(8)] == [0, 1] * 4


def test_trainer_refuses_a_tp_group_that_would_cross_a_node():
    with pytest.raises(ConfigError, match=r"^distributed.tensor_parallel: 3 does not divide LOCAL_WORLD_SIZE 4"):
        build_layout(DistributedConfig(strategy="fsdp", tensor_parallel=3), world_size=8, local_world_size=4)


def test_manifest_refuses_tp_that_does_not_divide_nproc_per_node():
    message = refusal({"model": {"preset": "1b"}, "nprocPerNode": 8, "distributed": {"tensorParallel": 3}})
    assert "spec.distributed.tensorParallel: 3 does not divide nprocPerNode 8" in message


def test_manifest_refuses_tp_with_ddp_and_tp_that_splits_a_head():
    assert "spec.distributed.tensorParallel: 2 needs strategy fsdp or auto" in refusal(
        {"nprocPerNode": 2, "distributed": {"tensorParallel": 2, "strategy": "ddp"}})
    assert "spec.distributed.tensorParallel: 4 does not divide the minimal preset's 2 attention heads" in refusal(
        {"nprocPerNode": 4, "distributed": {"tensorParallel": 4}})


def test_global_batch_is_split_over_data_parallel_ranks_only():
    spec = {"nodes": 2, "nprocPerNode": 4, "distributed": {"tensorParallel": 2},
            "training": {"microBatchSize": 2, "globalBatchSize": 12}}
    # 8 ranks / tp 2 = 4 dp ranks x micro-batch 2 = 8 sequences per micro-step: 12 is not a multiple
    assert "(8 at 2 nodes), got 12" in refusal(spec)
    spec["training"]["globalBatchSize"] = 16
    assert effective_batch_size(parse_job(manifest(spec))) == 16
    config = TrainerConfig.from_dict({"distributed": {"strategy": "fsdp", "tensor_parallel": 2},
                                      "training": {"micro_batch_size": 2, "global_batch_size": 16}})
    assert (config.accumulation_steps(8), config.effective_batch_size(8)) == (2, 16)


def test_elastic_range_is_checked_at_every_size():
    message = refusal({"nodes": 2, "nprocPerNode": 2, "elastic": {"minNodes": 1, "maxNodes": 3},
                       "distributed": {"tensorParallel": 2}, "training": {"microBatchSize": 1, "globalBatchSize": 2}})
    assert "(2 at 2 nodes), got 2" not in message and "(3 at 3 nodes), got 2" in message


def test_auto_strategy_with_tp_resolves_to_fsdp():
    config = TrainerConfig.from_dict({"distributed": {"tensor_parallel": 2}})
    assert resolve_distributed(config, 4, None).strategy == "fsdp"


def test_seq_len_must_divide_over_the_tp_ranks():
    """Sequence parallelism gives each tp rank an equal share of every sequence."""
    assert "spec.training.seqLen: must be a multiple of distributed.tensorParallel (2), got 129" in refusal(
        {"nprocPerNode": 2, "distributed": {"tensorParallel": 2}, "training": {"seqLen": 129}})
    with pytest.raises(ConfigError, match=r"^training.seq_len: must be a multiple of distributed.tensor_parallel \(2\), got 129"):
        TrainerConfig.from_dict({"distributed": {"tensor_parallel": 2}, "training": {"seq_len": 129}})
    assert TrainerConfig.from_dict({"distributed": {"tensor_parallel": 2}, "training": {"seq_len": 130}}).training.seq_len == 130
