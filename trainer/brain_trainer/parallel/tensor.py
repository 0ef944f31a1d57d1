"""Tensor parallelism for BrainAI's blocks (`torch.distributed.tensor.parallel`, DTensor), Megatron-style.

A block names its split linears (`Block.COLWISE`, `Block.ROWWISE`). In every
reasoning block the query, key and value projections are split by output
rows (ColwiseParallel: each tp rank computes whole heads of its own, and
attention runs on them with no communication) and the attention's output
projection by input columns (RowwiseParallel: one all-reduce brings the
block's output back whole). Every gated MLP, in reasoning and decision
blocks, splits the same way: gate and up colwise, down rowwise. A split block
costs two all-reduces of its activations in forward and two in backward,
inside the tp group.

Everything else (encoders, snn_core, htm, workspace, meta, heads, and the
norms of the split blocks) is replicated across the tp group: every tp rank
holds it and computes it on the same batch (docs/parallelism.md says what
that costs). Its parameters stay plain tensors here; FSDP2 then shards them
over the data-parallel dimension only.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel, parallelize_module


def block_plan(block: nn.Module) -> dict[str, ParallelStyle]:
    """One block's plan by submodule name: {} for a block that names no split linears."""
    plan: dict[str, ParallelStyle] = {name: ColwiseParallel() for name in getattr(block, "COLWISE", ())}
    plan.update({name: RowwiseParallel() for name in getattr(block, "ROWWISE", ())})
    return plan


def apply_tensor_parallel(model: nn.Module, tp_mesh: DeviceMesh) -> list[str]:
    """Split the blocks of `model` that name split linears over `tp_mesh`, in place; returns their names.

    Run before fully_shard: FSDP2 then shards the split parameters over the
    data-parallel dimension too (a 2-D DTensor, dp x tp)."""
    split = []
    for name, module in model.named_modules():
        plan = block_plan(module)
        if plan:
            parallelize_module(module, tp_mesh, plan)
            split.append(name)
    return split
