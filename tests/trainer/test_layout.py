"""plan/layout.py and the tensorParallel setting: the layouts a job may ask for, refused with the field named,
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


def test_pipeline_stages_are_outermost_and_dp_is_what_tp_and_pp_leave():
    distributed = DistributedConfig(strategy="fsdp", tensor_parallel=2, pipeline_parallel=2)
    layout = build_layout(distributed, world_size=8, local_world_size=4)
    assert (layout.pp, layout.dp, layout.tp, layout.stages) == (2, 2, 2, 2)
    assert [layout.pp_rank(r) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [layout.dp_rank(r) for r in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]
    assert [layout.tp_rank(r) for r in range(8)] == [0, 1] * 4
    assert TrainerConfig(distributed=distributed).data_parallel(8) == 2


def test_trainer_refuses_a_pipeline_that_does_not_divide_the_world():
    with pytest.raises(ConfigError, match=r"^distributed.pipeline_parallel: distributed.pipeline_parallel x "
                                          r"distributed.tensor_parallel \(3 x 2\) does not divide the world size 8"):
        build_layout(DistributedConfig(strategy="fsdp", tensor_parallel=2, pipeline_parallel=3), 8, 4)


def test_interleaved_runs_two_stages_per_rank_unless_told_and_others_run_one():
    assert DistributedConfig(pipeline_schedule="interleaved-1f1b").stages_per_rank == 2
    assert DistributedConfig(pipeline_schedule="interleaved-1f1b", virtual_stages=3).stages_per_rank == 3
    assert DistributedConfig().stages_per_rank == 1
    assert "spec.distributed.virtualStages: 2 stages per rank need pipelineSchedule interleaved-1f1b, got 1f1b" in refusal(
        {"nprocPerNode": 2, "distributed": {"pipelineParallel": 2, "virtualStages": 2},
         "training": {"microBatchSize": 1, "globalBatchSize": 4}})
    assert "spec.distributed.virtualStages: interleaved-1f1b runs several stages per rank: needs >= 2, got 1" in refusal(
        {"nprocPerNode": 2, "distributed": {"pipelineSchedule": "interleaved-1f1b", "virtualStages": 1}})


def test_manifest_refuses_pipelines_the_trainer_could_not_run():
    assert "spec.distributed.pipelineParallel: 2 needs strategy fsdp or auto" in refusal(
        {"nprocPerNode": 2, "distributed": {"pipelineParallel": 2, "strategy": "ddp"}})
    # minimal: encoders, 1 + 1 + 1 stacked blocks, 2 reasoning, 1 decision, meta, heads = 9 units
    assert "spec.distributed.pipelineParallel: 5 ranks x 2 stages each = 10 stages, more than the minimal preset's 9 " \
           "blocks" in refusal({"nodes": 5, "nprocPerNode": 1, "distributed": {
               "pipelineParallel": 5, "pipelineSchedule": "interleaved-1f1b"}})
    assert "spec.distributed.pipelineParallel: cuts a model.preset's BrainAI at its block boundaries" in refusal(
        {"nprocPerNode": 2, "model": {"entrypoint": "mypkg.models:build"}, "distributed": {"pipelineParallel": 2}})


def test_manifest_refuses_fewer_micro_batches_than_stages_naming_where_they_come_from():
    spec = {"nodes": 2, "nprocPerNode": 2, "distributed": {"pipelineParallel": 2}}
    assert "spec.distributed.gradientAccumulationSteps: gives 1 micro-batches per step, fewer than the 2 pipeline " \
           "stages of distributed.pipelineParallel" in refusal(spec)
    spec["training"] = {"microBatchSize": 2, "globalBatchSize": 4}  # 2 dp ranks x 2 = 4: one micro-batch
    assert "spec.training.globalBatchSize: gives 1 micro-batches per step" in refusal(spec)
    spec["training"]["globalBatchSize"] = 8
    assert effective_batch_size(parse_job(manifest(spec))) == 8
    spec["distributed"].update(pipelineSchedule="interleaved-1f1b")
    spec["training"]["globalBatchSize"] = 12  # 3 micro-batches: not whole rounds of 2
    assert "spec.training.globalBatchSize: gives 3 micro-batches per step; interleaved-1f1b runs them in rounds of " \
           "distributed.pipelineParallel (2): use a multiple at 2 nodes" in refusal(spec)


def test_elastic_range_keeps_the_pipeline_at_every_size():
    message = refusal({"nodes": 2, "nprocPerNode": 1, "elastic": {"minNodes": 2, "maxNodes": 3},
                       "distributed": {"pipelineParallel": 2, "gradientAccumulationSteps": 4}})
    assert "spec.distributed.pipelineParallel: distributed.pipelineParallel x distributed.tensorParallel (2 x 1) does not divide the world " \
           "size 3 (3 nodes x 1)" in message
    hybrid = refusal({"nodes": 2, "nprocPerNode": 2, "distributed": {"pipelineParallel": 4, "fsdpSharding":
                      "hybrid_shard", "gradientAccumulationSteps": 4}})
    assert "4 stages of 1 ranks each split nodes of 2; hybrid_shard replicates across whole nodes" in hybrid


def test_bubble_shrinks_with_micro_batches_and_virtual_stages():
    from brain_trainer.plan.layout import bubble_fraction
    one = DistributedConfig(pipeline_parallel=4)
    assert bubble_fraction(one, 4) == pytest.approx(3 / 7)
    assert bubble_fraction(one, 16) == pytest.approx(3 / 19)
    assert bubble_fraction(DistributedConfig(pipeline_parallel=4, pipeline_schedule="interleaved-1f1b"), 16) \
        == pytest.approx(3 / 35)


def test_seq_len_must_divide_over_the_tp_ranks():
    """Sequence parallelism gives each tp rank an equal share of every sequence."""
    assert "spec.training.seqLen: must be a multiple of distributed.tensorParallel (2), got 129" in refusal(
        {"nprocPerNode": 2, "distributed": {"tensorParallel": 2}, "training": {"seqLen": 129}})
    with pytest.raises(ConfigError, match=r"^training.seq_len: must be a multiple of distributed.tensor_parallel \(2\), got 129"):
        TrainerConfig.from_dict({"distributed": {"tensor_parallel": 2}, "training": {"seq_len": 129}})
    assert TrainerConfig.from_dict({"distributed": {"tensor_parallel": 2}, "training": {"seq_len": 130}}).training.seq_len == 130
