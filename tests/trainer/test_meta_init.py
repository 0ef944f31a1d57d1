"""Meta-device initialisation: the same initial weights at any world size and strategy, a 1b preset
initialised on 4 ranks in a fraction of the host memory the whole model needs, user models."""

from __future__ import annotations

import hashlib
import logging
import math
import os

import pytest
import torch
import torch.distributed as dist
from harness import run_ranks
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from brain_trainer.config import ModelConfig, TrainerConfig
from brain_trainer.config.presets import param_count
from brain_trainer.loop.train import train
from brain_trainer.loop.wrap import build_and_wrap
from brain_trainer.model.brain_ai import INIT_STD, residual_out_std
from brain_trainer.model.materialize import Initializer, build, is_meta
from brain_trainer.model.seeded_init import flat_runs
from brain_trainer.observe.memory_report import measure
from brain_trainer.parallel.run_layout import RunLayout
from brain_trainer.schema import ConfigError

SEED = 7
PRESET = {"preset": "minimal"}
USER = {"entrypoint": "user_models:small_lm"}
FULL_SHARD = {"strategy": "fsdp", "fsdp_sharding": "full_shard"}


def _config(model: dict, distributed: dict, **sections) -> TrainerConfig:
    return TrainerConfig.from_dict(
        {"model": model, "distributed": distributed, "training": {"seed": SEED}, **sections}
    ).resolved()


def _digests(state: dict) -> dict[str, str]:
    return {name: hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest() for name, t in state.items()}


def initial_states(rank: int, world_size: int, cases: dict) -> dict | None:
    """For each case (model, distributed, ranks per node): digests of the full state right after init."""
    out = {}
    for name, (model, distributed, per_node) in cases.items():
        if per_node:
            os.environ["LOCAL_WORLD_SIZE"] = str(per_node)  # hybrid_shard's node size (a spawned rank's own)
        cfg = _config(model, distributed)
        _, wrapped, _ = build_and_wrap(cfg, RunLayout.from_environment(cfg.distributed, rank, world_size, torch.device("cpu")))
        full = get_model_state_dict(wrapped, options=StateDictOptions(full_state_dict=True))
        out[name] = _digests(full)
        if name == "fsdp":
            q, norm = full["reasoning.blocks.0.q.weight"], full["reasoning.blocks.0.attn_norm.weight"]
            out["stats"] = (float(q.std()), bool((norm == 1).all()))
    return out if rank == 0 else None


def test_initial_weights_are_bitwise_equal_at_1_2_and_4_ranks_with_full_shard_ddp_and_tp(tmp_path):
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:  # one rank in this process: a spawned one would cost another torch start
        one = initial_states(0, 1, {
            "fsdp": (PRESET, FULL_SHARD, None), "single": (PRESET, {"strategy": "single"}, None),
            "user": (USER, {"strategy": "single"}, None),
        })
    finally:
        dist.destroy_process_group()
    two = run_ranks(initial_states, 2, {
        "fsdp": (PRESET, FULL_SHARD, None), "ddp": (PRESET, {"strategy": "ddp"}, None), "user": (USER, FULL_SHARD, None),
    })[0]
    four = run_ranks(initial_states, 4, {
        "fsdp": (PRESET, FULL_SHARD, None), "hybrid": (PRESET, {"strategy": "fsdp", "fsdp_sharding": "hybrid_shard"}, 2),
        # tensor parallel: column shards (rowwise-split weights) and row shards split again by FSDP2
        "tp2": (PRESET, {**FULL_SHARD, "tensor_parallel": 2}, 2), "tp2 hybrid": (PRESET, {"strategy": "fsdp", "fsdp_sharding": "hybrid_shard", "tensor_parallel": 2}, 2),
    })[0]
    reference = one["fsdp"]
    assert len(reference) == len(dict(build(ModelConfig(), SEED).named_parameters()))
    for name, digests in (("1 rank single", one["single"]), ("2 ranks full_shard", two["fsdp"]),
                          ("2 ranks ddp", two["ddp"]), ("4 ranks full_shard", four["fsdp"]),
                          ("4 ranks hybrid_shard 2x2", four["hybrid"]), ("4 ranks tp2 x dp2", four["tp2"]),
                          ("4 ranks tp2, nodes of 2", four["tp2 hybrid"])):
        assert digests == reference, name
    assert one["user"] == two["user"], "a user model with reset_parameters() alike"
    std, norms_are_ones = one["stats"]
    assert abs(std - INIT_STD) < 0.1 * INIT_STD and norms_are_ones  # the model's own init, not a stand-in
    assert reference["reasoning.blocks.0.q.weight"] != reference["reasoning.blocks.1.q.weight"]  # own streams


def init_1b(rank: int, world_size: int) -> dict:
    """The trainer's model building for the 1b preset, full_shard; stops right after init."""
    cfg = _config({"preset": "1b"}, FULL_SHARD)
    _, model, _ = build_and_wrap(cfg, RunLayout.from_environment(cfg.distributed, rank, world_size, torch.device("cpu")))
    return measure(model, torch.device("cpu"), rank).as_dict()


def test_1b_full_shard_on_4_ranks_initialises_in_a_fraction_of_the_whole_model():
    full_fp32 = 4 * param_count("1b")
    ranks = run_ranks(init_1b, 4, timeout=600)
    for figures in ranks:
        assert figures["parameter_bytes"] <= full_fp32 / 4 * 1.01, figures  # its shard, nothing more
        assert figures["peak_host_bytes"] <= 0.5 * full_fp32 + 600e6, figures
    assert sum(f["parameter_bytes"] for f in ranks) == full_fp32


def test_a_user_model_without_reset_parameters_is_built_whole_with_a_message(caplog):
    with caplog.at_level(logging.WARNING):
        model = build(ModelConfig(entrypoint="user_models:without_reset"), SEED)
    assert not is_meta(model)
    (message,) = [r.getMessage() for r in caplog.records]
    assert "Gain (at 1) holds parameters or buffers but defines no reset_parameters(); add one" in message
    assert "building the whole model on every rank instead" in message
    user = build(ModelConfig(entrypoint="user_models:small_lm"), SEED)
    assert is_meta(user)


def test_an_initialisation_that_leaves_a_tensor_unset_is_refused():
    model = build(ModelConfig(entrypoint="user_models:forgets_a_buffer"), SEED)
    with pytest.raises(ConfigError, match=r"model: 1.freq is not set by the model's initialisation"):
        Initializer(SEED)(model, torch.device("cpu"))


BLOCKS = ModelConfig(entrypoint="user_models:brainai_blocks")


def materialised(seed: int) -> torch.nn.Module:
    model = build(BLOCKS, seed)
    assert is_meta(model), "built on the meta device, not whole on every rank"
    Initializer(seed)(model, torch.device("cpu"))
    return model


def test_an_entrypoint_made_of_brainai_blocks_builds_on_meta_and_initialises_as_brainai_does():
    model = materialised(SEED)
    encoders, spiking, transformer, heads = model
    assert all(torch.isfinite(t).all() for t in model.state_dict().values())
    # The blocks' own initialisation, not torch's defaults (kaiming: std ~0.1 for these Linear layers).
    for block in spiking.blocks:
        assert (block.threshold == 1.0).all() and (block.leak_logit == 2.0).all()
    out_std = INIT_STD / math.sqrt(2 * (2 + 2))  # into the stream: two spiking blocks, attention and MLP
    assert residual_out_std(model) == out_std
    assert transformer.attn_out.weight.std().item() == pytest.approx(out_std, rel=0.1)
    assert heads.lm_head.weight.std().item() == pytest.approx(INIT_STD, rel=0.1)
    assert encoders.embed.weight.std().item() == pytest.approx(1.0, rel=0.1) and not encoders.conv.bias.any()
    # Seeded: the same seed gives the same weights, another seed others.
    again, other = materialised(SEED).state_dict(), materialised(SEED + 1).state_dict()
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, again[name]), name
    assert not torch.equal(heads.lm_head.weight, other["3.lm_head.weight"])


def test_an_entrypoint_made_of_brainai_blocks_trains(tmp_path):
    cfg = TrainerConfig.from_dict({
        "model": {"entrypoint": BLOCKS.entrypoint},
        "training": {"steps": 2, "micro_batch_size": 2, "seq_len": 16, "warmup_steps": 0, "log_interval": 1},
        "distributed": {"strategy": "single"},
        "data": {"source": "synthetic", "num_samples": 64},
        "checkpoint": {"dir": str(tmp_path), "interval_steps": 0},
        "metrics": {"port": 0},
    })
    assert train(cfg).step == 2


@pytest.mark.parametrize("shape, offsets, sizes", [
    ((6, 4), (2, 0), (3, 4)),  # FSDP2's rows: one run
    ((6, 4), (0, 2), (6, 2)),  # a rowwise weight's column shard: one run per row
    ((6, 4), (3, 1), (2, 2)),  # both
    ((2, 3, 4), (1, 1, 0), (1, 2, 4)),  # whole trailing dimension: runs span it
    ((), (), ()),
])
def test_flat_runs_cover_exactly_the_box(shape, offsets, sizes):
    full = torch.arange(math.prod(shape)).reshape(shape)
    box = full[tuple(slice(o, o + s) for o, s in zip(offsets, sizes))].reshape(-1)
    covered = torch.full_like(box, -1)
    for at, start, length in flat_runs(shape, offsets, sizes):
        covered[at : at + length] = torch.arange(start, start + length)
    assert covered.tolist() == box.tolist()
