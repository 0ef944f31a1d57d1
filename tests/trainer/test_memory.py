"""The memory planner: hand-checkable byte counts, strategy choice, auto resolution, torch-freedom."""

from __future__ import annotations

import json
import sys
from dataclasses import replace

import pytest
from processes import run

from brain_trainer import ConfigError, TrainerConfig
from brain_trainer.plan.comms import REDUCE_BYTES, ring
from brain_trainer.plan.layout import bubble_fraction, micro_batch_problems, world_problems
from brain_trainer.plan import (
    GIB,
    InsufficientMemoryError,
    PlanQuestion,
    StrategyChoice,
    choose_strategy,
    plan_host_memory,
    plan_ladder,
    plan_memory,
    planned_model,
    resolve_distributed,
)
from brain_trainer.plan.activations import activation_bytes, activation_units
from brain_trainer.plan.ladder import pipeline_parallel_options, strategy_ladder, tensor_parallel_options
from brain_trainer.plan.pipeline import in_flight, rank_units
from brain_trainer.config.presets import MODEL_PRESETS, param_count, split_block_params, wrap_unit_params

GB = 10**9
MINIMAL = MODEL_PRESETS["minimal"]
P = param_count(MINIMAL)
U = max(wrap_unit_params(MINIMAL))


def test_planner_presets_and_config_do_not_import_torch():
    code = (
        "import sys\n"
        "import brain_trainer, brain_trainer.config, brain_trainer.config.presets, brain_trainer.plan as plan\n"
        "plan.choose_strategy(plan.PlanQuestion('7b', world_size=8, device_memory_bytes=80 * 10**9))\n"
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))\n"
    )
    done = run([sys.executable, "-c", code], timeout=120)
    assert done.returncode == 0, done.stderr


def test_model_states_per_strategy_by_hand():
    def states(strategy, **kw):
        plan = plan_memory("minimal", strategy, micro_batch_size=2, seq_len=3, **kw)
        assert plan.total == plan.parameters + plan.gradients + plan.optimizer_state + plan.activations + plan.overhead
        return plan.parameters, plan.gradients, plan.optimizer_state, plan.host

    assert states("single") == (4 * P, 4 * P, 8 * P, 0)
    assert states("ddp", world_size=4) == (4 * P, 4 * P, 8 * P, 0)
    assert states("fsdp", fsdp_sharding="no_shard", world_size=4) == (4 * P, 4 * P, 8 * P, 0)
    # 16-bit parameters: the optimizer adds fp32 master weights to its two moments
    assert states("ddp", world_size=4, precision="bf16") == (2 * P, 2 * P, 12 * P, 0)
    zero2 = (2 * P, 2 * P // 4, 12 * P // 4, 0)
    assert states("fsdp", fsdp_sharding="shard_grad_op", world_size=4, precision="bf16") == zero2
    full = (2 * P // 4 + 2 * 2 * U, 2 * P // 4 + 2 * U, 12 * P // 4, 0)
    assert states("fsdp", world_size=4, precision="bf16") == full
    assert states("fsdp", fsdp_sharding="hybrid_shard", node_size=4, world_size=16, precision="bf16") == full
    offloaded = (2 * 2 * U, 2 * U, 0, 2 * P // 4 + 2 * P // 4 + 12 * P // 4)
    assert states("fsdp", world_size=4, precision="bf16", cpu_offload=True) == offloaded


def test_seven_billion_parameters_need_about_112_gb_per_rank_in_ddp():
    plan = plan_memory("7b", "ddp", world_size=8, precision="bf16")
    assert 110 * GB < plan.parameters + plan.gradients + plan.optimizer_state < 114 * GB


def test_activations_by_hand_and_with_checkpointing():
    d, mlp = MINIMAL.d_model, 4 * MINIMAL.ffn_hidden / MINIMAL.d_model
    blocks = dict(snn=4 + 3 * MINIMAL.snn_steps, htm=20, workspace=5, reasoning=10 + mlp, decision=3 + mlp)
    full = 8 + blocks["snn"] + blocks["htm"] + blocks["workspace"] + 2 * blocks["reasoning"] + blocks["decision"]
    assert activation_units(MINIMAL, checkpointing="none") == pytest.approx(full)
    # checkpointed: each of the 9 blocks keeps its input, the largest is recomputed
    assert activation_units(MINIMAL, checkpointing="full") == pytest.approx(9 + blocks["reasoning"])
    # selective, every 2nd block in forward order (encoders, snn, htm, workspace, reasoning x2, decision, meta, heads)
    chosen = [blocks["snn"], blocks["workspace"], blocks["reasoning"], 4]
    assert activation_units(MINIMAL, checkpointing="selective", every=2) == pytest.approx(
        full - sum(chosen) + len(chosen) + max(chosen)
    )
    expected = 2 * 3 * (full * d * 2 + 2 * 256 * 4)
    assert activation_bytes(MINIMAL, "bf16", 2, 3, checkpointing="none") == int(expected)
    plan = plan_memory("minimal", "ddp", world_size=2, precision="bf16", micro_batch_size=2, seq_len=3)
    assert plan.activations == int(expected)


def test_sequence_parallelism_divides_the_split_blocks_activations_but_their_gathered_norm_outputs():
    mlp = 4 * MINIMAL.ffn_hidden / MINIMAL.d_model
    blocks = dict(snn=4 + 3 * MINIMAL.snn_steps, htm=20, workspace=5, reasoning=10 + mlp, decision=3 + mlp)
    # at tp2 a reasoning block keeps its two norm outputs whole, a decision block its one; the rest is halved
    split = dict(reasoning=2 + (blocks["reasoning"] - 2) / 2, decision=1 + (blocks["decision"] - 1) / 2)
    replicated = 8 + blocks["snn"] + blocks["htm"] + blocks["workspace"]
    assert activation_units(MINIMAL, "none", tensor_parallel=2) == pytest.approx(
        replicated + 2 * split["reasoning"] + split["decision"])
    # checkpointed: 6 whole inputs, the 3 split blocks' half inputs, the largest block (htm) recomputed
    assert activation_units(MINIMAL, "full", tensor_parallel=2) == pytest.approx(6 + 3 / 2 + blocks["htm"])
    plan = plan_memory("minimal", "fsdp", world_size=2, micro_batch_size=2, seq_len=4, tensor_parallel=2)
    assert plan.activations == activation_bytes(MINIMAL, "fp32", 2, 4, "none", tensor_parallel=2)


def test_activation_estimate_matches_tensors_saved_by_the_real_model():
    import torch
    import torch.nn.functional as F

    from brain_trainer.model.brain_ai import BrainAI

    torch.manual_seed(0)
    model = BrainAI.from_preset("minimal")
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    tokens = torch.randint(0, 256, (4, 96))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits = model(tokens)
        F.cross_entropy(logits.reshape(-1, 256), tokens.reshape(-1))
    measured = sum(saved.values()) + logits.nbytes
    estimate = activation_bytes(MINIMAL, "fp32", 4, 96, checkpointing="none")
    assert abs(estimate - measured) <= 0.1 * measured, (estimate, measured)


def test_seven_b_on_8_ranks_of_40_gb_fits_full_shard_not_ddp():
    settings = dict(world_size=8, precision="bf16", micro_batch_size=1, seq_len=2048)
    assert not plan_memory("7b", "ddp", **settings).fits(40 * GB)
    assert plan_memory("7b", "fsdp", fsdp_sharding="full_shard", **settings).fits(40 * GB)
    choice, plan = choose_strategy(PlanQuestion("7b", device_memory_bytes=40 * GB, **settings))
    assert choice == StrategyChoice("fsdp", "full_shard") and plan.fits(40 * GB)


def test_seven_b_on_8_ranks_of_80_gb_picks_full_shard():
    settings = dict(world_size=8, precision="fp32", micro_batch_size=1, seq_len=4096)
    assert not plan_memory("7b", "ddp", **settings).fits(80 * GB)
    assert not plan_memory("7b", "fsdp", fsdp_sharding="shard_grad_op", **settings).fits(80 * GB)
    choice, _ = choose_strategy(PlanQuestion("7b", device_memory_bytes=80 * GB, **settings))
    assert choice == StrategyChoice("fsdp", "full_shard")
    # long sequences in bf16: only checkpointing brings the activations down
    long_bf16 = dict(world_size=8, precision="bf16", micro_batch_size=4, seq_len=4096)
    choice, _ = choose_strategy(PlanQuestion("7b", device_memory_bytes=80 * GB, **long_bf16))
    assert choice == StrategyChoice("fsdp", "full_shard", activation_checkpointing="full")


def test_choice_walks_down_the_ladder_as_memory_shrinks():
    settings = dict(world_size=8, precision="bf16", micro_batch_size=2, seq_len=4096)
    ladder = strategy_ladder(8)
    totals = [
        plan_memory(
            "7b",
            c.strategy,
            fsdp_sharding=c.fsdp_sharding,
            activation_checkpointing=c.activation_checkpointing,
            cpu_offload=c.cpu_offload,
            **settings,
        ).total
        for c in ladder
    ]
    assert totals == sorted(totals, reverse=True)  # every step down the ladder saves memory here
    for option, total in zip(ladder, totals):
        choice, plan = choose_strategy(PlanQuestion("7b", device_memory_bytes=total, **settings))
        assert choice == option and plan.total == total
    assert choose_strategy(PlanQuestion("minimal", device_memory_bytes=GIB * 2, world_size=1))[0] == StrategyChoice("single")


def test_nothing_fits_says_how_much_is_missing():
    with pytest.raises(InsufficientMemoryError) as err:
        choose_strategy(PlanQuestion(
            "7b", device_memory_bytes=16 * GIB, world_size=2, precision="bf16", micro_batch_size=8, seq_len=4096,
        ))
    smallest = err.value.plan
    assert smallest.choice == StrategyChoice("fsdp", "full_shard", activation_checkpointing="full", cpu_offload=True)
    assert err.value.missing_bytes == smallest.total - 16 * GIB > 0
    assert isinstance(err.value, ConfigError) and err.value.errors[0].path == "distributed.strategy"
    assert f"{err.value.missing_bytes / GIB:.1f} GiB per rank missing" in str(err.value)


def test_requested_checkpointing_and_offload_stay_on():
    ladder = strategy_ladder(4, activation_checkpointing="full", cpu_offload=True)
    assert ladder == [StrategyChoice("fsdp", "full_shard", activation_checkpointing="full", cpu_offload=True)]
    selective = strategy_ladder(4, activation_checkpointing="selective")
    assert [c.activation_checkpointing for c in selective] == ["selective"] * 3 + ["full"] * 2


def test_bad_planner_inputs_name_the_field():
    cases = [
        (dict(strategy="auto"), "distributed.strategy"),
        (dict(strategy="single", world_size=2), "distributed.strategy"),
        (dict(strategy="ddp", cpu_offload=True, world_size=2), "distributed.cpu_offload"),
        (dict(strategy="fsdp", fsdp_sharding="hybrid_shard", world_size=6, node_size=4), "node_size"),
        (dict(strategy="fsdp", precision="fp8"), "distributed.mixed_precision_policy"),
        (dict(strategy="ddp", micro_batch_size=0), "training.micro_batch_size"),
    ]
    for kwargs, path in cases:
        with pytest.raises(ConfigError) as err:
            plan_memory("minimal", **kwargs)
        assert [e.path for e in err.value.errors] == [path], kwargs


def _config(**distributed) -> TrainerConfig:
    cfg = TrainerConfig.from_dict({"model": {"preset": "7b"}, "training": {"micro_batch_size": 1, "seq_len": 2048}})
    return replace(cfg, distributed=replace(cfg.distributed, mixed_precision_policy="bf16", **distributed))


def test_resolve_distributed_makes_auto_concrete():
    fixed = _config(strategy="fsdp", fsdp_sharding="hybrid_shard")
    assert resolve_distributed(fixed, 8, 40 * GB) is fixed.distributed
    auto = _config()
    assert auto.distributed.strategy == "auto"
    assert resolve_distributed(auto, 1, 80 * GB).strategy == "single"
    assert resolve_distributed(auto, 8, None).strategy == "ddp"
    custom = replace(auto, model=replace(auto.model, entrypoint="pkg.mod:make"))
    assert resolve_distributed(custom, 8, 40 * GB).strategy == "ddp"
    resolved = resolve_distributed(auto, 8, 40 * GB)
    assert resolved.strategy == "fsdp" and resolved.fsdp_sharding == "full_shard"
    assert resolved.activation_checkpointing == "none" and not resolved.cpu_offload
    assert resolved.mixed_precision_policy == "bf16" and resolved.master_port == auto.distributed.master_port
    small = resolve_distributed(replace(auto, model=replace(auto.model, preset="minimal")), 2, 40 * GB)
    assert small.strategy == "ddp"
    with pytest.raises(InsufficientMemoryError):
        resolve_distributed(auto, 2, 2 * GIB)


def test_the_planner_sizes_a_resized_vocabulary():
    """The embedding, the head and the logits grow with model.vocab_size (set by hand or from a token dataset)."""
    auto = _config()
    small = replace(auto, model=replace(auto.model, preset="minimal"), training=replace(auto.training, seq_len=512))
    assert planned_model(small.model) == "minimal"
    huge = replace(small, model=replace(small.model, vocab_size=1_000_000))
    assert planned_model(huge.model).vocab_size == 1_000_000
    assert plan_memory(planned_model(huge.model), "ddp").total > plan_memory("minimal", "ddp").total + 4 * GB
    assert resolve_distributed(small, 2, 2 * GIB).strategy == "ddp"
    with pytest.raises(InsufficientMemoryError):
        resolve_distributed(huge, 2, 2 * GIB)


def test_host_memory_counts_the_staging_copy_of_what_each_rank_holds():
    params = param_count("7b")
    sharded = plan_memory("7b", "fsdp", world_size=8, precision="bf16")
    host = plan_host_memory(PlanQuestion("7b"), sharded, accelerator=True, ranks_per_pod=8)
    assert host.checkpoint_staging == -(-params // 8) * 12  # fp32 parameters and two AdamW moments
    assert host.training_states == 0 and host.init < 1 * GB  # meta init: one tensor at a time on the host
    replicated = plan_host_memory(PlanQuestion("7b"), plan_memory("7b", "ddp", world_size=8, precision="bf16"), accelerator=True)
    assert replicated.checkpoint_staging == params * 12
    synchronous = plan_host_memory(PlanQuestion("7b", async_checkpoint=False, data_workers=2), sharded, accelerator=True)
    assert synchronous.checkpoint_staging == 0 and synchronous.data_workers > 0
    on_cpu = plan_host_memory(PlanQuestion("minimal"), plan_memory("minimal", "ddp", world_size=2), accelerator=False)
    assert on_cpu.training_states > 0 and on_cpu.process < host.process
    assert host.pod_request >= host.total * 8 and host.pod_request % GIB == 0


def test_tensor_parallel_divides_the_split_blocks_states_by_tp():
    """70b, bf16, full checkpointing on 8 nodes x 8 GPUs: tp8 x dp8 holds an eighth of the split blocks, then
    FSDP2 shards that over the 8 data-parallel ranks; the replicated rest is sharded over dp only."""
    cfg = MODEL_PRESETS["70b"]
    shape = dict(precision="bf16", micro_batch_size=1, seq_len=4096, world_size=64, activation_checkpointing="full")
    held = wrap_unit_params(cfg, 8)
    split = split_block_params(cfg)
    replicated = param_count(cfg) - cfg.reasoning_blocks * split["reasoning"] - cfg.decision_blocks * split["decision"]
    assert sum(held) == replicated + (cfg.reasoning_blocks * split["reasoning"] + cfg.decision_blocks * split["decision"]) // 8
    tp = plan_memory("70b", "fsdp", tensor_parallel=8, **shape)
    assert tp.shard_size == 8 and tp.tensor_parallel == 8
    assert (tp.parameters, tp.gradients, tp.optimizer_state) == (
        2 * sum(held) // 8 + 2 * 2 * max(held), 2 * sum(held) // 8 + 2 * max(held), 12 * sum(held) // 8)
    dp = plan_memory("70b", "fsdp", **shape)
    # sequence parallelism: the checkpointed split blocks keep their sequence shard, 1/8 of their input
    assert tp.activations == activation_bytes(cfg, "bf16", 1, 4096, "full", tensor_parallel=8) < dp.activations / 2
    assert tp.fits(80 * GB)
    hybrid = plan_memory("70b", "fsdp", fsdp_sharding="hybrid_shard", node_size=8, tensor_parallel=8, **shape)
    assert hybrid.shard_size == 1 and hybrid.optimizer_state == 12 * sum(held)  # a node is one tp group: no dp shard
    assert tp.summary().startswith("fsdp full_shard + tp 8 + full activation checkpointing on 64 rank(s), per rank:")
    assert all(option.strategy == "fsdp" for option in strategy_ladder(64, tensor_parallel=8))


def test_split_parameters_are_the_blocks_colwise_and_rowwise_linears():
    import torch
    from brain_trainer.model.brain_ai import BrainAI, Block
    cfg = replace(MINIMAL, d_model=96, n_heads=4, reasoning_blocks=3, decision_blocks=2)
    with torch.device("meta"):
        model = BrainAI(cfg)
    found: dict[str, set[int]] = {}
    for name, block in model.named_modules():
        if isinstance(block, Block) and (block.COLWISE or block.ROWWISE):
            modules = dict(block.named_modules())
            count = sum(p.numel() for n in (*block.COLWISE, *block.ROWWISE) for p in modules[n].parameters())
            found.setdefault(name.split(".")[0], set()).add(count)
    assert found == {stack: {count} for stack, count in split_block_params(cfg).items()}


def test_bad_tensor_parallel_plans_name_the_field():
    with pytest.raises(ConfigError) as exc:
        plan_memory("7b", "fsdp", world_size=12, tensor_parallel=8)
    assert [str(e) for e in exc.value.errors] == ["distributed.tensor_parallel: 8 does not divide the world size 12"]
    with pytest.raises(ConfigError) as exc:
        plan_memory("7b", "ddp", world_size=8, tensor_parallel=2)
    assert [str(e) for e in exc.value.errors] == ["distributed.tensor_parallel: 2 needs strategy fsdp, got ddp"]


def test_auto_under_tensor_parallelism_walks_the_fsdp_ladder():
    job = {"model": {"preset": "70b"}, "training": {"micro_batch_size": 1, "seq_len": 4096},
           "distributed": {"strategy": "auto", "tensor_parallel": 8, "mixed_precision_policy": "bf16"}}
    cfg = TrainerConfig.from_dict(job)
    gpu = resolve_distributed(cfg, 64, 80 * GB)
    # sequence parallelism divides the split blocks' activations by 8: the cheapest option, shard_grad_op without
    # checkpointing (60.1 GiB per rank), fits
    assert (gpu.strategy, gpu.fsdp_sharding, gpu.activation_checkpointing) == ("fsdp", "shard_grad_op", "none")
    tight = resolve_distributed(cfg, 64, 40 * GB)
    assert (tight.strategy, tight.fsdp_sharding, tight.activation_checkpointing) == ("fsdp", "full_shard", "full")
    assert resolve_distributed(cfg, 64, None).strategy == "fsdp"  # CPU: the one strategy tp composes with


def test_auto_picks_the_smallest_tensor_parallel_that_fits_when_the_job_leaves_it_unset():
    """13b on 8 nodes x 8 GPUs of 36 GiB at 1024 tokens: no tp1 option fits on the device (accumulating 4
    micro-batches, FSDP2 holds every gradient unsharded in fp32: 52 GB), tp2 full_shard + checkpointing does (half of
    that). The trainer runs what the planner picked, with the global batch the job names at tp1 (accumulation x tp);
    a job that sets tensorParallel keeps it."""
    job = {"model": {"preset": "13b"}, "training": {"micro_batch_size": 1, "seq_len": 1024},
           "distributed": {"strategy": "auto", "mixed_precision_policy": "bf16", "gradient_accumulation_steps": 4}}
    cfg = TrainerConfig.from_dict(job)
    assert cfg.distributed.tensor_parallel is None and cfg.distributed.tp == 1
    memory = 36 * GIB
    tp1 = plan_ladder(PlanQuestion("13b", world_size=64, precision="bf16", seq_len=1024, micro_batches=4))
    assert not any(plan.fits(memory) for option, plan in tp1 if not option.cpu_offload)
    picked = resolve_distributed(cfg, 64, memory, ranks_per_node=8)
    assert (picked.strategy, picked.fsdp_sharding, picked.activation_checkpointing, picked.cpu_offload) == (
        "fsdp", "full_shard", "full", False)
    assert (picked.tensor_parallel, picked.pipeline_parallel, picked.gradient_accumulation_steps) == (2, 1, 8)
    assert replace(cfg, distributed=picked).effective_batch_size(64) == cfg.effective_batch_size(64) == 1 * 4 * 64

    global_batch = TrainerConfig.from_dict({**job, "training": {**job["training"], "global_batch_size": 256},
                                            "distributed": {**job["distributed"], "gradient_accumulation_steps": 1}})
    picked = resolve_distributed(global_batch, 64, memory, ranks_per_node=8)
    assert (picked.tensor_parallel, picked.gradient_accumulation_steps) == (2, 1)
    assert replace(global_batch, distributed=picked).accumulation_steps(64) == 256 // 32

    # tp stays 1 where the job sets it (then a pipeline splits the model; set too, nothing fits: even offloaded, the
    # accumulated gradients stay on the device), where the node is unknown, and on CPUs (no device memory to plan
    # against)
    set_to_one = TrainerConfig.from_dict({**job, "distributed": {**job["distributed"], "tensor_parallel": 1}})
    kept = resolve_distributed(set_to_one, 64, memory, ranks_per_node=8)
    assert (kept.tensor_parallel, kept.pipeline_parallel, kept.cpu_offload) == (1, 4, False)
    both = TrainerConfig.from_dict({**job, "distributed": {**job["distributed"], "tensor_parallel": 1,
                                                           "pipeline_parallel": 1}})
    with pytest.raises(InsufficientMemoryError, match="smallest option, fsdp full_shard .* offload, needs 53.4 GiB"):
        resolve_distributed(both, 64, memory, ranks_per_node=8)
    with pytest.raises(InsufficientMemoryError):  # the node unknown: tp1's options only
        resolve_distributed(cfg, 64, memory)
    assert resolve_distributed(cfg, 64, None, ranks_per_node=8).tensor_parallel == 1


def test_tensor_parallel_options_stay_in_a_node_and_split_whole_heads():
    assert tensor_parallel_options("70b", 8) == [1, 2, 4, 8]
    assert tensor_parallel_options("minimal", 8) == [1, 2]  # 2 heads: a third of a head is no head
    assert tensor_parallel_options("7b", 6) == [1, 2]  # 32 heads: 3 and 6 divide the node, not the heads


# -- pipeline parallelism --

def _auto_70b(**distributed) -> TrainerConfig:
    return TrainerConfig.from_dict({"model": {"preset": "70b"}, "training": {"micro_batch_size": 1, "seq_len": 4096},
                                    "distributed": {"strategy": "auto", "mixed_precision_policy": "bf16",
                                                    **distributed}})


def test_70b_on_8_nodes_of_80_gib_keeps_tensor_parallel_8_without_a_pipeline():
    """Global batch 512 on 8 nodes x 8 GPUs of 80 GiB: every micro-batch but a step's last accumulates its gradients
    unsharded in fp32 (4 bytes for each parameter a rank holds), so tp1 to tp4 hold 280 to 70 GB of them; tp8
    holds 35 GB and fits with full checkpointing. No pipeline: it comes after every tensor-parallel degree."""
    cfg = replace(_auto_70b(), training=replace(_auto_70b().training, global_batch_size=512))
    picked = resolve_distributed(cfg, 64, 80 * GIB, ranks_per_node=8)
    assert (picked.strategy, picked.fsdp_sharding, picked.activation_checkpointing, picked.cpu_offload) == (
        "fsdp", "full_shard", "full", False)
    assert (picked.tensor_parallel, picked.pipeline_parallel) == (8, 1)
    assert replace(cfg, distributed=picked).accumulation_steps(64) == 512 // 8  # the 8 data-parallel ranks' share
    plan = plan_memory("70b", "fsdp", precision="bf16", seq_len=4096, world_size=64, activation_checkpointing="full",
                       tensor_parallel=8, micro_batches=64)
    held = wrap_unit_params(MODEL_PRESETS["70b"], 8)
    assert plan.gradients == 2 * sum(held) // 8 + REDUCE_BYTES * sum(held) + 2 * max(held)
    assert 56 * GIB < plan.total < 58 * GIB
    ladder = plan_ladder(PlanQuestion("70b", world_size=64, precision="bf16", seq_len=4096, tensor_parallel=None,
                                      pipeline_parallel=None, ranks_per_node=8, micro_batches=8))
    too_big = [option.tensor_parallel for option, tried in ladder if not tried.fits(80 * GIB)]
    assert too_big[:10] == [1, 1, 1, 1, 2, 2, 2, 4, 4, 4]


def test_auto_adds_a_pipeline_when_a_node_of_tensor_parallel_is_not_enough():
    """70b on 8 nodes x 8 GPUs of 48 GiB, 2 micro-batches per step: tp8 needs 56.9 GiB (its fp32 gradient
    accumulators alone 32.6), tp8 x pp2 49.2; tp8 x pp4 fits at 40.2: its fullest rank holds a quarter of the
    blocks (gathered for the step, as torch's stages keep them) and a quarter of the accumulators. The global batch
    stays: accumulation 2 x 8 x 4, which gives the pipeline its micro-batches."""
    cfg = _auto_70b(gradient_accumulation_steps=2)
    picked = resolve_distributed(cfg, 64, 48 * GIB, ranks_per_node=8)
    assert (picked.strategy, picked.fsdp_sharding, picked.activation_checkpointing, picked.cpu_offload) == (
        "fsdp", "full_shard", "full", False)
    assert (picked.tensor_parallel, picked.pipeline_parallel, picked.pipeline_schedule) == (8, 4, "1f1b")
    assert picked.gradient_accumulation_steps == 2 * 8 * 4
    assert replace(cfg, distributed=picked).effective_batch_size(64) == cfg.effective_batch_size(64) == 2 * 64
    assert not list(micro_batch_problems(picked, picked.gradient_accumulation_steps, "m", str))
    assert not list(world_problems(picked, 64, 8, str))
    ladder = plan_ladder(PlanQuestion("70b", world_size=64, precision="bf16", seq_len=4096,
                                      activation_checkpointing="none", tensor_parallel=None, pipeline_parallel=None,
                                      ranks_per_node=8, micro_batches=2))
    sizes = {(o.tensor_parallel, o.pipeline_parallel): round(p.total / GIB, 1) for o, p in ladder
             if o.activation_checkpointing == "full" and not o.cpu_offload}
    assert sizes[(8, 1)] == 56.9 and sizes[(8, 2)] == 49.2 and sizes[(8, 4)] == 40.2
    layouts = [(o.tensor_parallel, o.pipeline_parallel) for o, _ in ladder if not o.cpu_offload]
    assert layouts == sorted(layouts, key=lambda layout: (layout[1], layout[0])), "tp inside a node first, then pp"
    assert [o.cpu_offload for o, _ in ladder] == sorted(o.cpu_offload for o, _ in ladder), "offload last"
    assert pipeline_parallel_options("70b", 64 // 8) == [2, 4, 8]

    # the same with the global batch named: the trainer's accumulation grows alike; a set pipeline is kept
    named = replace(cfg, training=replace(cfg.training, global_batch_size=128),
                    distributed=replace(cfg.distributed, gradient_accumulation_steps=1))
    picked = resolve_distributed(named, 64, 48 * GIB, ranks_per_node=8)
    assert (picked.tensor_parallel, picked.pipeline_parallel) == (8, 4)
    assert replace(named, distributed=picked).accumulation_steps(64) == 64
    kept = resolve_distributed(_auto_70b(gradient_accumulation_steps=2, pipeline_parallel=2), 64, 48 * GIB,
                               ranks_per_node=8)
    assert (kept.tensor_parallel, kept.pipeline_parallel, kept.cpu_offload) == (8, 2, True)
    # interleaved-1f1b keeps more in flight, and receives for twice the stages: at 48 GiB only offload fits, at 52
    # its pp4 does, with whole rounds of micro-batches
    job = _auto_70b(gradient_accumulation_steps=2, pipeline_schedule="interleaved-1f1b")
    assert resolve_distributed(job, 64, 48 * GIB, ranks_per_node=8).cpu_offload
    interleaved = resolve_distributed(job, 64, 52 * GIB, ranks_per_node=8)
    assert (interleaved.tp, interleaved.pp, interleaved.stages_per_rank, interleaved.cpu_offload) == (8, 4, 2, False)
    assert interleaved.gradient_accumulation_steps == 2 * 8 * 4
    assert not list(micro_batch_problems(interleaved, interleaved.gradient_accumulation_steps, "m", str))


def test_a_pipeline_rank_holds_its_stages_and_the_fullest_is_planned():
    cfg = MODEL_PRESETS["70b"]
    shape = dict(precision="bf16", seq_len=4096, world_size=64, tensor_parallel=8, activation_checkpointing="full",
                 micro_batches=16)
    plan = plan_memory("70b", "fsdp", pipeline_parallel=4, **shape)
    ranks = rank_units(cfg, 4096, 4, 1, 8)
    runs = [stage.units for stage in sorted((s for stages in ranks for s in stages), key=lambda s: s.index)]
    assert [run.start for run in runs] == [0] + [run.stop for run in runs[:-1]]  # the chain, cut in order
    assert runs[-1].stop == len(wrap_unit_params(cfg, 8))
    held = wrap_unit_params(cfg, 8)
    per_rank = [sum(held[i] for stage in stages for i in stage.units) for stages in ranks]
    assert sum(per_rank) == sum(held)
    assert plan.held_params == per_rank[plan.pipeline_rank] and plan.shard_size == 64 // (8 * 4)
    # full_shard under a pipeline: the stage's parameters gathered for the step, its gradients accumulated in fp32
    n = plan.held_params
    assert plan.parameters == 2 * n // 2 + 2 * n and plan.optimizer_state == 12 * n // 2
    assert plan.gradients == 2 * n // 2 + REDUCE_BYTES * n + 2 * max(held[i] for s in ranks[plan.pipeline_rank]
                                                                      for i in s.units)
    # the receive buffers: one activation and one gradient per micro-batch, torch's PipelineStage allocates them
    boundary = 4096 * cfg.d_model * 2
    first = ranks[plan.pipeline_rank][0]
    assert plan.pipeline_buffers == 16 * boundary * ((not first.first) + (not first.last))
    assert plan.bubble == bubble_fraction(replace(_auto_70b().distributed, pipeline_parallel=4), 16) == 3 / 19
    assert str(plan.choice) == "fsdp full_shard + tp 8 + pp 4 (1f1b) + full activation checkpointing"
    summary = plan.summary()
    assert summary.splitlines()[1].startswith(f"  pipeline rank {plan.pipeline_rank} of 4 (the fullest), "
                                              "16 micro-batches per step, bubble 15.8%:")
    assert "pipeline buffers" in summary
    interleaved = plan_memory("70b", "fsdp", pipeline_parallel=4, pipeline_schedule="interleaved-1f1b",
                              stages_per_rank=2, **shape)
    assert str(interleaved.choice).startswith("fsdp full_shard + tp 8 + pp 4 (interleaved-1f1b, 2 stages per rank)")
    assert len(interleaved.stages) == 2


def test_1f1b_keeps_pp_micro_batches_in_flight_where_gpipe_keeps_all():
    """No checkpointing, 16 micro-batches over 4 pipeline ranks: 1f1b's first rank keeps 4 micro-batches of its
    stage, gpipe's fullest keeps all 16 of its own."""
    cfg = MODEL_PRESETS["70b"]
    shape = dict(precision="bf16", seq_len=4096, world_size=64, tensor_parallel=8, pipeline_parallel=4,
                 micro_batches=16)
    ranks = rank_units(cfg, 4096, 4, 1, 8)

    def one_micro_batch(rank):
        return activation_bytes(cfg, "bf16", 1, 4096, "none", tensor_parallel=8, held=[(ranks[rank][0].units, 1)])

    gpipe = plan_memory("70b", "fsdp", pipeline_schedule="gpipe", **shape)
    one_f_one_b = plan_memory("70b", "fsdp", pipeline_schedule="1f1b", **shape)
    assert gpipe.activations == 16 * one_micro_batch(gpipe.pipeline_rank)
    assert one_f_one_b.activations == (4 - one_f_one_b.pipeline_rank) * one_micro_batch(one_f_one_b.pipeline_rank)
    assert gpipe.activations > 3.5 * one_f_one_b.activations
    assert gpipe.total - one_f_one_b.total > 90 * GIB
    # the whole model's saved tensors, one micro-batch, are what the chain's stages keep between them
    assert sum(one_micro_batch(rank) for rank in range(4)) == activation_bytes(cfg, "bf16", 1, 4096, "none",
                                                                               tensor_parallel=8)


# The peak count of forwards not yet backwarded in torch's own schedules, per pipeline rank: the schedule objects
# compute every rank's action order (`pipeline_order`) at construction, which the fake backend lets one process do.
TORCH_IN_FLIGHT = """
import json, sys
import torch, torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B
from torch.distributed.pipelining.schedules import _ComputationType

cases, pp_max = json.loads(sys.argv[1]), max(case[1] for case in json.loads(sys.argv[1]))
out = []
for schedule, pp, v, m in cases:
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=pp)
    stages = [PipelineStage(torch.nn.Linear(2, 2), pp * local, pp * v, torch.device("cpu")) for local in range(v)]
    if schedule == "interleaved-1f1b":
        order = ScheduleInterleaved1F1B(stages, m).pipeline_order
    else:
        order = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule](stages[0], m).pipeline_order
    peaks = []
    for rank in range(pp):
        open_ = {pp * local + rank: 0 for local in range(v)}
        best = dict(open_)
        for action in order[rank]:
            if action is None or action.computation_type not in (_ComputationType.FORWARD,
                                                                 _ComputationType.FULL_BACKWARD):
                continue
            open_[action.stage_index] += 1 if action.computation_type == _ComputationType.FORWARD else -1
            if sum(open_.values()) > sum(best.values()):
                best = dict(open_)
        peaks.append([best[pp * local + rank] for local in range(v)])
    out.append(peaks)
    dist.destroy_process_group()
print(json.dumps(out))
"""


def test_in_flight_counts_are_torch_schedules_own():
    cases = [("gpipe", 4, 1, 8), ("1f1b", 4, 1, 8), ("1f1b", 2, 1, 2), ("1f1b", 8, 1, 32),
             ("interleaved-1f1b", 4, 2, 8), ("interleaved-1f1b", 2, 2, 4), ("interleaved-1f1b", 4, 3, 12),
             ("interleaved-1f1b", 2, 2, 6), ("interleaved-1f1b", 4, 2, 16)]
    done = run([sys.executable, "-c", TORCH_IN_FLIGHT, json.dumps(cases)], timeout=300)
    assert done.returncode == 0, done.stderr
    torch_peaks = json.loads(done.stdout)
    ours = [[list(in_flight(schedule, pp, v, m, rank)) for rank in range(pp)] for schedule, pp, v, m in cases]
    assert ours == torch_peaks
    assert ours[1] == [[4], [3], [2], [1]]  # 1f1b: pp - r
    assert ours[4][0] == [7, 4]  # interleaved, rank 0: 10 warm-up forwards, then one more, 4 per stage a round


def test_communication_per_step_by_hand():
    cfg = MODEL_PRESETS["70b"]
    tokens = 4096
    activation = tokens * cfg.d_model * 2
    plan = plan_memory("70b", "fsdp", precision="bf16", seq_len=tokens, world_size=64, tensor_parallel=8,
                       pipeline_parallel=2, micro_batches=16)
    stages = rank_units(cfg, tokens, 2, 1, 8)[plan.pipeline_rank]
    names = [name for stage in stages for name in stage.names]
    reasoning, decision = (sum(n.startswith(f"{stack}.") for n in names) for stack in ("reasoning", "decision"))
    sent = plan.communication
    n = plan.held_params
    assert sent.fsdp == 16 * 2 * ring(n * 2, 4) + ring(n * REDUCE_BYTES, 4)  # gathers twice a micro-batch, one scatter
    assert sent.tp == 16 * (4 * reasoning + 2 * decision) * 2 * ring(activation, 8)
    assert sent.pp == 16 * activation  # one boundary: the activation one way, or its gradient the other
    assert sent.ddp == 0 and sent.total == sent.fsdp + sent.tp + sent.pp
    ddp = plan_memory("7b", "ddp", precision="bf16", world_size=8).communication
    assert (ddp.ddp, ddp.fsdp, ddp.tp, ddp.pp) == (2 * ring(param_count("7b") * 2, 8), 0, 0, 0)
    assert plan_memory("7b", "single").communication.total == 0


def test_bad_pipeline_plans_name_the_field():
    def errors(**kw):
        with pytest.raises(ConfigError) as exc:
            plan_memory("70b", kw.pop("strategy", "fsdp"), **kw)
        return [str(e) for e in exc.value.errors]

    assert errors(strategy="ddp", world_size=8, pipeline_parallel=2, micro_batches=2) == [
        "distributed.pipeline_parallel: 2 needs strategy fsdp, got ddp"]
    assert errors(world_size=12, tensor_parallel=2, pipeline_parallel=4, micro_batches=4) == [
        "distributed.pipeline_parallel: 4 x tensor_parallel 2 does not divide the world size 12"]
    assert errors(world_size=8, pipeline_parallel=4, micro_batches=2) == [
        "distributed.gradient_accumulation_steps: gives 2 micro-batches per step, fewer than the 4 pipeline stages "
        "of distributed.pipeline_parallel: every stage needs one in flight"]
    assert errors(world_size=8, pipeline_parallel=4, pipeline_schedule="interleaved-1f1b", stages_per_rank=2,
                  micro_batches=6) == [
        "distributed.gradient_accumulation_steps: gives 6 micro-batches per step; interleaved-1f1b runs them in "
        "rounds of distributed.pipeline_parallel (4): use a multiple"]
    assert errors(world_size=64, pipeline_parallel=64, stages_per_rank=2, pipeline_schedule="interleaved-1f1b",
                  micro_batches=64) == ["distributed.pipeline_parallel: 128 stages, more than the model's 91 blocks"]
    assert errors(world_size=8, pipeline_parallel=0) == [
        "distributed.pipeline_parallel: needs >= 1 rank and stage per rank, got 0 x 1"]
    assert errors(world_size=8, micro_batches=0) == ["distributed.gradient_accumulation_steps: must be >= 1, got 0"]
    assert errors(world_size=8, pipeline_schedule="zigzag") == [
        "distributed.pipeline_schedule: must be one of 1f1b, gpipe, interleaved-1f1b; got 'zigzag'"]
