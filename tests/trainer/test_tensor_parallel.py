"""Tensor parallelism (parallel/tensor.py) composed with FSDP2 (parallel/fsdp.py): 4 gloo ranks as tp2 x dp2 train
like one process on the same global batches: same losses, same gradients, and the split parameters really split."""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor

from brain_trainer.config import DistributedConfig
from brain_trainer.loop.accumulation import GradientAccumulator
from brain_trainer.parallel import build_layout
from brain_trainer.parallel.fsdp import FSDPWrapper
from harness import run_ranks
from parity import STEPS, global_batches, lm_loss, minimal_model, optimizer_for, rank_slice, reference_gradients, reference_losses

MICRO_BATCH = 2
WORLD, TP = 4, 2
SPLIT = ("reasoning.blocks.0.q.weight", "reasoning.blocks.1.attn_out.weight", "decision.blocks.0.mlp.down.weight")


def _tp_rank(rank, world_size):
    config = DistributedConfig(strategy="fsdp", tensor_parallel=TP)
    layout = build_layout(config, world_size, world_size)
    wrapper = FSDPWrapper(minimal_model(), config)
    model = wrapper.setup(rank, world_size)
    optimizer = optimizer_for(model)
    clip = GradientAccumulator(1, None, model=model, max_grad_norm=1e9)  # measures the norm across meshes, clips nothing
    losses, gradients, norms = [], {}, []
    for step, tokens in enumerate(global_batches(STEPS, MICRO_BATCH * layout.dp)):
        loss = lm_loss(model, rank_slice(tokens, layout.dp_rank(rank), layout.dp))
        loss.backward()
        if step == 0:
            gradients = {name: p.grad.full_tensor().tolist() for name, p in model.named_parameters()}
            norms.append(float(clip._clip(clip._parameters(optimizer))))
        optimizer.step()
        optimizer.zero_grad()
        reduced = torch.tensor([loss.item()])
        torch.distributed.all_reduce(reduced)
        losses.append(reduced.item() / world_size)
    params = dict(model.named_parameters())
    split = {name: (tuple(params[name].to_local().shape), tuple(params[name].shape), params[name].device_mesh.mesh_dim_names)
             for name in SPLIT}
    wrapper.cleanup()
    return dict(losses=losses, gradients=gradients, norm=norms[0], split=split,
                mesh=wrapper.mesh.mesh_dim_names, all_dtensor=all(isinstance(p, DTensor) for p in params.values()))


def test_tp2_dp2_trains_like_one_process():
    results = run_ranks(_tp_rank, WORLD)
    batches = global_batches(STEPS, MICRO_BATCH * WORLD // TP)
    reference = reference_losses(batches)
    expected = reference_gradients(batches[0])
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in expected.values()])).item()
    for r in results:
        assert r["mesh"] == ("shard", "tp") and r["all_dtensor"]
        assert all(abs(a - b) <= 1e-4 * abs(b) for a, b in zip(r["losses"], reference)), (r["losses"], reference)
        assert set(r["gradients"]) == set(expected)
        for name, grad in r["gradients"].items():
            torch.testing.assert_close(torch.tensor(grad), expected[name], rtol=1e-4, atol=1e-6, msg=name)
        assert abs(r["norm"] - norm) <= 1e-4 * norm
        # q: colwise (rows split by tp, then by dp); attn_out and down: rowwise (columns split by tp)
        (q_local, q_full, q_mesh), (out_local, out_full, _), (down_local, down_full, _) = (r["split"][n] for n in SPLIT)
        assert q_mesh == ("shard", "tp") and q_local == (q_full[0] // 4, q_full[1])
        assert out_local == (out_full[0] // 2, out_full[1] // 2) and down_local == (down_full[0] // 2, down_full[1] // 2)
