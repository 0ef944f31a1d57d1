"""Pipeline parallelism (parallel/pipeline.py) composed with FSDP2 and tensor parallelism, on 4 gloo ranks:
pp2 x dp2 under every schedule, pp4 x dp1, tp2 x pp2 (1f1b and interleaved), train like one process on the same global batches (same losses,
same gradients by name, the same total gradient norm); each rank holds only its stages' units, under their own
names, initialised bitwise as one process initialises the whole model."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os

import pytest
import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.utils.data import Dataset

from brain_trainer.config import DistributedConfig, ModelConfig, TrainerConfig
from brain_trainer.loop.accumulation import GradientAccumulator
from brain_trainer.loop.evaluation import Evaluator
from brain_trainer.loop.loss import loss_fn
from brain_trainer.loop.wrap import build_and_wrap
from brain_trainer.model.materialize import Initializer, build
from brain_trainer.parallel.ddp import all_reduce_weighted_mean
from brain_trainer.plan.layout import build_layout
from brain_trainer.parallel.pipeline import PipelineWrapper, prune
from brain_trainer.parallel.run_layout import RunLayout, check_micro_batches
from brain_trainer.parallel.step import StepSettings
from brain_trainer.schema import ConfigError
from harness import run_ranks
from parity import SEQ_LEN, global_batches, minimal_model, optimizer_for, rank_slice, reference_gradients, reference_losses

WORLD, MICRO_BATCH, MICRO_BATCHES, STEPS, SEED = 4, 2, 2, 3, 7
# (schedule, tensor parallel, whether the rank returns its first step's gradients, other distributed settings;
# pipeline_parallel 2 unless they say otherwise)
LAYOUTS = {
    "1f1b": ("1f1b", 1, True, {}), "gpipe": ("gpipe", 1, False, {}), "interleaved": ("interleaved-1f1b", 1, False, {}),
    "tp2 x pp2": ("1f1b", 2, True, {}),
    # every block recomputed in backward; hybrid_shard over nodes of 2 ranks: each stage's 2 ranks are one node
    "checkpointed, hybrid": ("1f1b", 1, False, {"activation_checkpointing": "full", "fsdp_sharding": "hybrid_shard"}),
    "pp4": ("1f1b", 1, True, {"pipeline_parallel": 4}),  # one rank per stage: no data parallelism left
    "interleaved, 3 stages per rank": ("interleaved-1f1b", 1, False, {"virtual_stages": 3}),
    "tp2 x pp2, interleaved": ("interleaved-1f1b", 2, False, {}),
    "selective": ("1f1b", 1, False, {"activation_checkpointing": "selective"}),
}
NODE = 2  # ranks per node (LOCAL_WORLD_SIZE) for hybrid_shard


def _digests(state: dict) -> dict[str, str]:
    return {name: hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest() for name, t in state.items()}


def _config(schedule: str, tp: int, settings: dict) -> DistributedConfig:
    return DistributedConfig(**{"strategy": "fsdp", "pipeline_parallel": 2, "pipeline_schedule": schedule,
                                "tensor_parallel": tp, **settings})


def _micro_batches(config: DistributedConfig) -> int:
    """Per optimizer step: MICRO_BATCHES, or one per pipeline rank where there are more (each needs one in flight)."""
    return max(MICRO_BATCHES, config.pp)


def _trained(rank: int, world_size: int, schedule: str, tp: int, with_gradients: bool, settings: dict) -> dict:
    """STEPS optimizer steps of the layout's micro-batches each on this rank's data-parallel slice."""
    config = _config(schedule, tp, settings)
    layout = build_layout(config, world_size, NODE)
    micro_batches = _micro_batches(config)
    wrapper = PipelineWrapper(minimal_model(), config,
                              steps=StepSettings(seq_len=SEQ_LEN, micro_batches=micro_batches, loss_fn=loss_fn))
    model = wrapper.setup(rank, world_size)
    optimizer = optimizer_for(model)
    clip = GradientAccumulator(1, model=model, max_grad_norm=1e9, pipeline_group=wrapper.pipeline_group)  # measures
    losses, gradients, norm, evaluated = [], {}, None, None
    for step, tokens in enumerate(global_batches(STEPS, MICRO_BATCH * micro_batches * layout.dp)):
        mine = rank_slice(tokens, layout.dp_rank(rank), layout.dp)
        loss = wrapper.step(mine[:, :-1], mine[:, 1:])
        if step == 0 and with_gradients:
            gradients = {name: p.grad.full_tensor().tolist() for name, p in model.named_parameters()}
        clip.apply(optimizer)
        norm = clip.last_grad_norm if step == 0 else norm
        losses.append(all_reduce_weighted_mean(0.0 if loss is None else loss.item(), float(loss is not None)))
        if step == 0:  # a forward-only pass between two training steps (the loop's evaluation) changes nothing
            logits = wrapper.logits(mine[:, :-1], mine[:, 1:])
            evaluated = None if logits is None else tuple(logits.shape)
    return dict(losses=losses, gradients=gradients, norm=norm, evaluated=evaluated,
                held=sorted({name.rsplit(".", 1)[0] for name in dict(model.named_parameters())}),
                stages=[stage.index for stage in wrapper.stages], mesh=wrapper.mesh.mesh_dim_names)


def _initialised(rank: int, world_size: int, distributed: dict) -> dict[str, str]:
    """Digests of the full tensors this rank's part holds, built and initialised as the trainer does."""
    cfg = TrainerConfig.from_dict({"model": {"preset": "minimal"}, "distributed": distributed,
                                   "training": {"seed": SEED, "seq_len": SEQ_LEN, "micro_batch_size": MICRO_BATCH,
                                                "global_batch_size": 2 * MICRO_BATCH * WORLD // 2}}).resolved()
    _, part, _ = build_and_wrap(cfg, RunLayout.from_environment(cfg.distributed, rank, world_size, torch.device("cpu")))
    return _digests(get_model_state_dict(part, options=StateDictOptions(full_state_dict=True)))


def _ranks(rank: int, world_size: int) -> dict:
    os.environ["LOCAL_WORLD_SIZE"] = str(NODE)  # a spawned rank's own environment: the trainer reads it
    results = {name: _trained(rank, world_size, *layout) for name, layout in LAYOUTS.items()}
    results["init"] = {name: _initialised(rank, world_size, {"strategy": "fsdp", "pipeline_parallel": 2, **extra})
                       for name, extra in (("pp2", {}), ("tp2 x pp2", {"tensor_parallel": 2}),
                                           ("pp2 hybrid", {"fsdp_sharding": "hybrid_shard"}))}
    return results


@pytest.fixture(scope="module")
def ranks():
    return run_ranks(_ranks, WORLD)


@pytest.mark.parametrize("name", LAYOUTS)
def test_every_layout_and_schedule_trains_like_one_process(ranks, name):
    schedule, tp, _, settings = LAYOUTS[name]
    config = _config(schedule, tp, settings)
    micro_batches = _micro_batches(config)
    batches = global_batches(STEPS, MICRO_BATCH * micro_batches * build_layout(config, WORLD, NODE).dp)
    reference = reference_losses(batches)
    expected = reference_gradients(batches[0])
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in expected.values()])).item()
    for r in (rank[name] for rank in ranks):
        assert all(abs(a - b) <= 1e-4 * abs(b) for a, b in zip(r["losses"], reference)), (r["losses"], reference)
        assert abs(r["norm"] - norm) <= 1e-4 * norm, (r["norm"], norm)
        # logits of a forward-only pass on the last stage only: the last pipeline rank (interleaved: its last stage)
        last = r["stages"][-1] == max(r["stages"][-1] for r in (rank[name] for rank in ranks))
        assert r["evaluated"] == ((MICRO_BATCH * micro_batches, SEQ_LEN, 256) if last else None)
    if LAYOUTS[name][2]:
        gradients = {}
        for rank in ranks:
            gradients.update(rank[name]["gradients"])
        assert set(gradients) == set(expected), "the pipeline ranks together hold every parameter"
        for fqn, grad in gradients.items():
            torch.testing.assert_close(torch.tensor(grad), expected[fqn], rtol=1e-4, atol=1e-6, msg=fqn)


def test_each_pipeline_rank_holds_only_its_stages_under_their_own_names(ranks):
    first, last = ranks[0]["1f1b"], ranks[-1]["1f1b"]  # pipeline ranks 0 and 1 (pp is the outermost dimension)
    assert first["stages"] == [0] and last["stages"] == [1]
    assert first["held"][0] == "encoders.conv" and "heads.lm_head" not in first["held"]
    assert "heads.lm_head" in last["held"] and not any(name.startswith("encoders") for name in last["held"])
    assert ranks[0]["interleaved"]["stages"] == [0, 2] and ranks[-1]["interleaved"]["stages"] == [1, 3]
    assert [rank["pp4"]["stages"] for rank in ranks] == [[0], [1], [2], [3]]
    assert [ranks[r]["interleaved, 3 stages per rank"]["stages"] for r in (0, -1)] == [[0, 2, 4], [1, 3, 5]]
    assert first["mesh"] == ("pp", "shard") and ranks[0]["tp2 x pp2"]["mesh"] == ("pp", "shard", "tp")
    assert ranks[0]["checkpointed, hybrid"]["mesh"] == ("pp", "replicate", "shard")


def test_pipeline_ranks_initialise_bitwise_as_one_process():
    """The depth scaling of the residual projections is the whole model's, whatever a rank keeps."""
    model = build(ModelConfig(), SEED)
    Initializer(SEED)(model, torch.device("cpu"))
    whole = _digests(model.state_dict())
    part = build(ModelConfig(), SEED)
    prune(part, ["encoders", "snn_core.blocks.0", "reasoning.blocks.1", "heads"])
    Initializer(SEED)(part, torch.device("cpu"))
    held = _digests(part.state_dict())
    assert held and all(not name.startswith(("encoders", "heads", "reasoning.blocks.1.")) for name in held)
    assert held == {name: whole[name] for name in held}


def test_pipeline_ranks_of_the_trainer_initialise_bitwise_as_one_process(ranks):
    model = build(ModelConfig(), SEED)
    Initializer(SEED)(model, torch.device("cpu"))
    whole = _digests(model.state_dict())
    for layout in ("pp2", "tp2 x pp2", "pp2 hybrid"):
        merged = {}
        for rank in ranks:
            for name, digest in rank["init"][layout].items():
                assert merged.setdefault(name, digest) == digest, (layout, name)
        assert merged == whole, layout


class Windows(Dataset):
    """`count` (tokens, targets) windows of SEQ_LEN, counting from the window's index."""

    def __init__(self, count: int):
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = (torch.arange(SEQ_LEN + 1) * (i + 1)) % 256
        return tokens[:-1], tokens[1:]


def test_evaluation_in_pipeline_passes_pads_and_counts_each_window_once():
    """7 windows in micro-batches of 3 (the last of 1), two micro-batches a pass: two passes of 6 rows each
    (padded), the same loss as one micro-batch at a time."""
    model = minimal_model()
    shapes = []

    def forward(x, y):
        shapes.append(tuple(x.shape))
        return model(x)

    one = Evaluator(Windows(7), 3, 5, 0, 1, torch.device("cpu"), contextlib.nullcontext)(model)
    passes = Evaluator(Windows(7), 3, 5, 0, 1, torch.device("cpu"), contextlib.nullcontext,
                       micro_batches=2)(model, forward=forward)
    assert shapes == [(6, SEQ_LEN), (6, SEQ_LEN)]
    assert passes.tokens == one.tokens == 7 * SEQ_LEN and passes.loss == pytest.approx(one.loss, rel=1e-6)


def _micro(pp: int, schedule: str, global_batch: int) -> TrainerConfig:
    return TrainerConfig.from_dict({
        "training": {"micro_batch_size": 1, "global_batch_size": global_batch},
        "distributed": {"strategy": "fsdp", "pipeline_parallel": pp, "pipeline_schedule": schedule},
    }).resolved()


def test_too_few_micro_batches_are_refused_and_few_warned_about(caplog):
    cfg = _micro(4, "1f1b", 3)
    with pytest.raises(ConfigError, match=r"training.global_batch_size: gives 3 micro-batches per step, fewer than the 4"):
        check_micro_batches(cfg, cfg.distributed, 3)
    cfg = _micro(2, "interleaved-1f1b", 3)
    with pytest.raises(ConfigError, match=r"training.global_batch_size: gives 3 micro-batches .* use a multiple"):
        check_micro_batches(cfg, cfg.distributed, 3)
    cfg = _micro(2, "1f1b", 4)
    with caplog.at_level(logging.WARNING):
        check_micro_batches(cfg, cfg.distributed, 4)
        check_micro_batches(cfg, cfg.distributed, 8)
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "4 micro-batches per step for 2 pipeline stages: each rank idles 20% of a step" in warning


def test_fp16_is_refused_under_a_pipeline():
    with pytest.raises(ConfigError, match=r"distributed.mixed_precision_policy: fp16 needs a gradient scaler"):
        TrainerConfig.from_dict({"distributed": {"strategy": "fsdp", "pipeline_parallel": 2,
                                                 "mixed_precision_policy": "fp16"}})
