"""What each rank holds once its model is initialised: one log line per rank, and gauges on rank 0's /metrics."""

from __future__ import annotations

import logging
import resource
from dataclasses import asdict, dataclass
from typing import Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

log = logging.getLogger(__name__)

MB = 1e6


@dataclass(frozen=True)
class InitMemory:
    """One rank's memory right after initialisation."""

    rank: int
    parameter_bytes: int  # the parameters (its shards of them) this rank holds
    peak_host_bytes: int  # peak resident set of the process so far
    device_bytes: Optional[int]  # accelerator memory allocated (CUDA); None on CPU

    def line(self) -> str:
        text = (f"rank {self.rank} after init: parameters {self.parameter_bytes / MB:.1f} MB, "
                f"peak host memory {self.peak_host_bytes / MB:.1f} MB")
        if self.device_bytes is not None:
            text += f", device memory {self.device_bytes / MB:.1f} MB"
        return text

    def as_dict(self) -> dict:
        return asdict(self)


def peak_host_bytes() -> int:
    """Peak resident set of this process (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def held_parameter_bytes(model: nn.Module) -> int:
    """Bytes of the parameters this rank holds: its local shards under FSDP, everything otherwise."""
    total = 0
    for p in model.parameters():
        local = p.to_local() if isinstance(p, DTensor) else p
        total += local.numel() * local.element_size()
    return total


def measure(model: nn.Module, device: torch.device, rank: int) -> InitMemory:
    device_bytes = torch.cuda.memory_allocated(device) if device.type == "cuda" else None
    return InitMemory(rank, held_parameter_bytes(model), peak_host_bytes(), device_bytes)


def gather_init_memory(model: nn.Module, device: torch.device, rank: int) -> list[InitMemory]:
    """Log this rank's figures; every rank gets every rank's (rank 0 publishes them)."""
    mine = measure(model, device, rank)
    log.info("%s", mine.line())
    if not dist.is_initialized():
        return [mine]
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return everyone
