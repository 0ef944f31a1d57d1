"""Tensor and sequence parallelism for BrainAI's blocks (`torch.distributed.tensor.parallel`, DTensor), Megatron-style.

A block names its split linears (`Block.COLWISE`, `Block.ROWWISE`). In every
reasoning block the query, key and value projections are split by output
rows (ColwiseParallel: each tp rank computes whole heads of its own, and
attention runs on them with no communication) and the attention's output
projection by input columns (RowwiseParallel). Every gated MLP, in reasoning
and decision blocks, splits the same way: gate and up colwise, down rowwise.

Sequence parallelism (always on with tp > 1, one code path): between and
inside the split blocks the residual stream is a DTensor sharded along the
sequence (`SEQUENCE`, (B, T/tp, D) per rank), and the blocks' norms run on
that shard (SequenceParallel, their weights replicated DTensors). A norm's
output is all-gathered once for the colwise linears that read it, and each
rowwise linear reduce-scatters its output back to the sequence shard: per
split region one all-gather and one reduce-scatter in forward (and the same
pair in backward), the volume of the one all-reduce they replace.

A run of split blocks that follow each other (no module holding parameters
of its own between them, in registration order, which is forward order)
takes the replicated stream in at its first block by slicing it (no
communication) and hands it out of its last block all-gathered as a plain
tensor; the model's forward stays unaware of all this (hooks only).

Everything else (encoders, snn_core, htm, workspace, meta, heads) is
replicated across the tp group: every tp rank holds it and computes it on the
same batch (docs/parallelism.md says what that costs). Its parameters stay
plain tensors here; FSDP2 then shards them over the data-parallel dimension
only.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

SEQUENCE = Shard(1)  # the residual stream inside a run of split blocks: (B, T, D) split along T
NORMS = (nn.RMSNorm, nn.LayerNorm)  # per-token modules a split block runs on its sequence shard


def is_split(block: nn.Module) -> bool:
    """Whether `block` names split linears (and so gets a plan)."""
    return bool(getattr(block, "COLWISE", ()) or getattr(block, "ROWWISE", ()))


def _norms(block: nn.Module) -> list[str]:
    return [name for name, module in block.named_modules() if name and isinstance(module, NORMS)]


def block_plan(block: nn.Module) -> dict[str, ParallelStyle]:
    """One block's plan by submodule name ({} for a block that names no split linears): the norms on the sequence
    shard, the colwise linears on their gathered input, the rowwise ones reduce-scattering to the sequence shard."""
    if not is_split(block):
        return {}
    plan: dict[str, ParallelStyle] = {name: SequenceParallel() for name in _norms(block)}
    plan.update({name: ColwiseParallel() for name in block.COLWISE})
    plan.update({name: RowwiseParallel(output_layouts=SEQUENCE, use_local_output=False) for name in block.ROWWISE})
    return plan


def gather_plan(block: nn.Module) -> dict[str, ParallelStyle]:
    """A split block's norm outputs all-gathered to Replicate, applied after `block_plan`: the colwise linears
    reading one norm (q, k, v; gate, up) share its one gather, and in backward its one reduce-scatter."""
    gather = PrepareModuleOutput(output_layouts=SEQUENCE, desired_output_layouts=Replicate(), use_local_output=False)
    return {name: gather for name in _norms(block)}


def split_runs(model: nn.Module) -> list[list[str]]:
    """The split blocks of `model` by qualified name, grouped in runs of blocks that follow each other.

    Forward order is registration order (BrainAI's, and FSDP's prefetch assumes it too); modules without
    parameters of their own (stacks, lists) do not break a run, any other module does."""
    runs: list[list[str]] = []
    open_run = False
    inside: str | None = None  # the prefix of the split block being skipped over
    for name, module in model.named_modules():
        if inside is not None and name.startswith(inside):
            continue
        if is_split(module):
            if not open_run:
                runs.append([])
            runs[-1].append(name)
            open_run, inside = True, f"{name}." if name else ""
        elif next(module.parameters(recurse=False), None) is not None:
            open_run = False
    return runs


def apply_tensor_parallel(model: nn.Module, tp_mesh: DeviceMesh) -> list[str]:
    """Split the blocks of `model` that name split linears over `tp_mesh`, in place; returns their names.

    Run before fully_shard: FSDP2 then shards the split parameters over the
    data-parallel dimension too (a 2-D DTensor, dp x tp)."""
    modules = dict(model.named_modules())
    enter = PrepareModuleInput(input_layouts=Replicate(), desired_input_layouts=SEQUENCE, use_local_output=False)
    leave = PrepareModuleOutput(output_layouts=SEQUENCE, desired_output_layouts=Replicate(), use_local_output=True)
    runs = split_runs(model)
    for run in runs:
        for name in run:
            parallelize_module(modules[name], tp_mesh, block_plan(modules[name]))
            parallelize_module(modules[name], tp_mesh, gather_plan(modules[name]))
        # slicing a replicated tensor needs no communication; its backward all-gathers the gradient
        parallelize_module(modules[run[0]], tp_mesh, enter)
        parallelize_module(modules[run[-1]], tp_mesh, leave)
    return [name for run in runs for name in run]
