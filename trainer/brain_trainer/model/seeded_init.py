"""Random initial weights that do not depend on how the model is split over ranks.

While `seeded_fills(model, seed)` is active, every random in-place fill of one
of the model's parameters or buffers (`normal_`, `uniform_`, ...: what
`nn.init` and `reset_parameters()` call) is replaced by one that draws the
tensor's flattened values in fixed blocks of BLOCK elements, each block from
its own generator seeded by (seed, tensor name, how many fills of that tensor
came before, block index). A rank holding a box of a parameter (its FSDP2
shard on dim 0, a tensor-parallel shard on dim 0 or 1 under it, or the whole
tensor under DDP) draws only the blocks that overlap the box's runs of
consecutive elements, and always a block's full length, so the values of the
full tensor are bitwise the same at every world size, layout and strategy.
They depend on the seed, the names and shapes, and on the device type (CPU
and CUDA generators differ).

Fills of tensors that are not the model's (scratch tensors an initialiser
makes) and constant fills are left alone.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import math
from typing import Any, Iterator

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

BLOCK = 1 << 20  # elements per independently seeded block: small against a shard, large against launch costs

_aten = torch.ops.aten
RANDOM_FILLS = frozenset(
    (_aten.normal_, _aten.uniform_, _aten.bernoulli_, _aten.exponential_, _aten.log_normal_, _aten.cauchy_,
     _aten.geometric_, _aten.random_)
)


def local_box(tensor: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...]]:
    """(the part this rank holds, its offset in the full tensor along each dimension).

    A DTensor's part is one box of the full tensor (FSDP2's Shard(0), a
    tensor-parallel Shard(0) or Shard(1), or both); a plain tensor is all of itself.
    """
    if not isinstance(tensor, DTensor):
        return tensor, (0,) * tensor.dim()
    (chunk,) = tensor.__create_chunk_list__()
    return tensor.to_local(), tuple(chunk.offsets)


def flat_runs(shape: tuple[int, ...], offsets: tuple[int, ...], sizes: tuple[int, ...]) -> Iterator[tuple[int, int, int]]:
    """The box's runs of consecutive elements in the full (contiguous) tensor of `shape`, in the box's order:
    (flat index in the box, flat index in the full tensor, length). Pure."""
    if not shape:
        yield 0, 0, 1
        return
    # the dimensions after the last split one are whole: every run spans them
    split = [d for d in range(len(shape)) if offsets[d] != 0 or sizes[d] != shape[d]]
    last = split[-1] if split else 0
    strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
    length = sizes[last] * strides[last]
    if length == 0:
        return
    for i, index in enumerate(itertools.product(*(range(size) for size in sizes[:last]))):
        start = sum((o + j) * stride for o, j, stride in zip(offsets, index, strides)) + offsets[last] * strides[last]
        yield i * length, start, length


def block_seed(seed: int, name: str, call: int, block: int) -> int:
    digest = hashlib.blake2b(f"{seed}/{name}/{call}/{block}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1  # a non-negative int64: every generator accepts it


def _key(tensor: torch.Tensor) -> tuple | None:
    """What identifies a tensor's storage region (a `.data` alias of a parameter included)."""
    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    if local.numel() == 0 or local.is_meta:
        return None
    return local.data_ptr(), tuple(local.shape), local.stride(), local.dtype


class _SeededFills(TorchDispatchMode):
    def __init__(self, names: dict[tuple, str], seed: int):
        super().__init__()
        self.names = names
        self.seed = seed
        self.calls: dict[str, int] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func.overloadpacket in RANDOM_FILLS:
            name = self.names.get(_key(args[0]))
            if name is not None:
                if any(isinstance(a, torch.Tensor) for a in (*args[1:], *kwargs.values())):
                    raise ValueError(f"{name}: {func} with tensor arguments cannot be drawn per shard")
                call = self.calls.get(name, 0)
                self.calls[name] = call + 1
                self._fill(func, args, kwargs, name, call)
                return args[0]
        return func(*args, **kwargs)

    def _fill(self, func: Any, args: tuple, kwargs: dict, name: str, call: int) -> None:
        local, offsets = local_box(args[0])
        total = args[0].numel()
        flat = local.view(-1) if local.is_contiguous() else torch.empty(local.numel(), dtype=local.dtype, device=local.device)
        drawn: tuple[int, torch.Tensor] | None = None  # the last block drawn: the runs of a column shard share blocks
        for at, start, length in flat_runs(tuple(args[0].shape), offsets, tuple(local.shape)):
            pos, end = start, start + length
            while pos < end:
                block = pos // BLOCK
                first = block * BLOCK
                if drawn is None or drawn[0] != block:
                    values = torch.empty(min(BLOCK, total - first), dtype=local.dtype, device=local.device)
                    generator = torch.Generator(device=local.device)
                    generator.manual_seed(block_seed(self.seed, name, call, block))
                    func(values, *args[1:], **{**kwargs, "generator": generator})
                    drawn = (block, values)
                values = drawn[1]
                stop = min(end, first + values.numel())
                flat[at + pos - start : at + stop - start] = values[pos - first : stop - first]
                pos = stop
        if flat.data_ptr() != local.data_ptr():
            local.copy_(flat.view(local.shape))


def named_tensors(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    yield from model.named_parameters()
    yield from model.named_buffers()


@contextlib.contextmanager
def seeded_fills(model: nn.Module, seed: int) -> Iterator[None]:
    """Within: random fills of `model`'s tensors are drawn per shard, the same at any world size (see module docstring)."""
    names = {key: name for name, tensor in named_tensors(model) if (key := _key(tensor)) is not None}
    with _SeededFills(names, seed), torch.no_grad():
        yield


def poison(model: nn.Module) -> None:
    """Fill every floating-point tensor with NaN, so that `unset` finds what an initialiser forgot."""
    with torch.no_grad():
        for _, tensor in named_tensors(model):
            if tensor.is_floating_point():
                local_box(tensor)[0].fill_(math.nan)


def unset(model: nn.Module) -> list[str]:
    """Names of the floating-point tensors (this rank's parts of them) still holding NaN."""
    return [
        name
        for name, tensor in named_tensors(model)
        if tensor.is_floating_point() and bool(torch.isnan(local_box(tensor)[0]).any())
    ]
