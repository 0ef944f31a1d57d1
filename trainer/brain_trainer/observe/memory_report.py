"""What each rank holds once its model is initialised (one log line per rank, gauges on rank 0's /metrics), its peak
memory while training, and what an out-of-memory failure says (the planner's estimate beside what was available)."""

from __future__ import annotations

import logging
import os
import resource
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

log = logging.getLogger(__name__)

MB = 1e6
GIB = 1024**3
# cgroup v2: the memory limit of the container this process runs in ("max" when none).
CGROUP_MEMORY_MAX = Path("/sys/fs/cgroup/memory.max")


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


def peak_memory_bytes(device: torch.device) -> int:
    """Peak accelerator memory of this rank; on CPU, the process's peak resident set."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return peak_host_bytes()


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


def available_memory(device: torch.device) -> tuple[int, str]:
    """(bytes, what limits them) this rank could use: the accelerator's memory, or on the CPU the tightest of the
    physical memory, the cgroup's limit and the address-space limit."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory, "device memory"
    limits = [(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "physical memory")]
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        limits.append((soft, "address-space limit"))
    try:
        cgroup = CGROUP_MEMORY_MAX.read_text().strip()
    except OSError:
        cgroup = ""
    if cgroup.isdigit():
        limits.append((int(cgroup), "cgroup memory limit"))
    return min(limits)


def out_of_memory_line(exc: BaseException, estimate: Optional[int], device: torch.device, rank: int) -> str:
    """One line for the termination message: what failed, the planner's estimate per rank, what was available."""
    what = "device" if device.type == "cuda" else "host"
    planned = (f"the memory planner estimates {estimate / GIB:.2f} GiB of {what} memory per rank"
               if estimate is not None else "the memory planner cannot size a user model")
    available, limit = available_memory(device)
    return f"{type(exc).__name__} on rank {rank}: {planned}; {available / GIB:.2f} GiB available ({limit})"
