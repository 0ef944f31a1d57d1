"""Host (CPU) memory per rank, and the memory request of a pod (torch-free).

What a pod's memory request must cover, per rank: the process itself (torch,
and on GPUs the CUDA libraries and context), initialisation (meta-device init
keeps at most one init block or one tensor being read on the host), the
training states themselves when the device is the CPU, CPU-offloaded states,
the asynchronous checkpoint's staging copy (each rank's parameters and AdamW
moments, fp32: 12 bytes per parameter it holds) and the DataLoader's worker
processes.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config.presets import largest_tensor_params
from .bytes import GIB, MIB, gib_rows, quantity
from .checkpoint_size import STAGED_BYTES_PER_PARAM
from .memory import MemoryPlan
from .question import PlanQuestion, model_config

# Estimates: the process sizes were measured on CPU with torch 2.13 (about 330 MB resident after importing torch and
# joining a gloo group); CUDA's figure is the usual resident size of a torch process once CUDA, cuBLAS, cuDNN and
# NCCL are loaded.
CPU_PROCESS_BYTES = 512 * MIB
CUDA_PROCESS_BYTES = 3 * GIB
DATA_WORKER_BYTES = 256 * MIB  # one DataLoader worker process (forked: torch's pages stay shared)
INIT_BYTES_PER_PARAM = 4  # fp32: the largest tensor drawn or read at once during initialisation
POD_HEADROOM = 1.1  # allocator fragmentation and the page cache of checkpoint writes
REQUEST_GRANULE = 64 * MIB


@dataclass(frozen=True)
class HostPlan:
    """Host (CPU) memory per rank for one plan, and the memory request of a pod running `ranks_per_pod` ranks."""

    plan: MemoryPlan
    accelerator: bool
    ranks_per_pod: int
    process: int  # the Python process: torch, and on GPUs the CUDA libraries and context
    init: int  # the most initialisation holds on the host at once (meta init: one tensor)
    training_states: int  # the device plan's states and activations, when the device is the CPU
    offloaded: int  # CPU-offloaded sharded states
    checkpoint_staging: int  # the async checkpoint's copy of this rank's parameters and optimizer state
    data_workers: int  # DataLoader worker processes

    @property
    def total(self) -> int:
        return (self.process + self.init + self.training_states + self.offloaded + self.checkpoint_staging
                + self.data_workers)

    @property
    def pod_request(self) -> int:
        """Bytes a pod should request: every rank's total with POD_HEADROOM, rounded up (to 64Mi; to 1Gi above 4Gi)."""
        wanted = self.total * self.ranks_per_pod * POD_HEADROOM
        granule = GIB if wanted > 4 * GIB else REQUEST_GRANULE
        return -int(-wanted // granule) * granule

    def summary(self) -> str:
        device = "GPU" if self.accelerator else "CPU"
        rows = [
            ("process", self.process),
            ("initialisation", self.init),
            ("training states", self.training_states),
            ("CPU offload", self.offloaded),
            ("ckpt staging", self.checkpoint_staging),
            ("data workers", self.data_workers),
            ("total", self.total),
        ]
        lines = [f"host memory per rank ({self.plan.choice} on {device}):", *gib_rows(rows)]
        lines.append(f"recommended pod memory request: {quantity(self.pod_request)} "
                     f"({self.ranks_per_pod} rank(s) per pod, +{POD_HEADROOM - 1:.0%})")
        return "\n".join(lines)


def plan_host_memory(question: PlanQuestion, plan: MemoryPlan, *, accelerator: bool,
                     ranks_per_pod: int = 1) -> HostPlan:
    """Host memory per rank for `plan` of `question` (see the module docstring); `accelerator`: the device is a GPU,
    else the CPU."""
    held = -(-plan.held_params // plan.shard_size)
    staged = question.checkpointing and question.async_checkpoint
    return HostPlan(
        plan=plan,
        accelerator=accelerator,
        ranks_per_pod=ranks_per_pod,
        process=CUDA_PROCESS_BYTES if accelerator else CPU_PROCESS_BYTES,
        init=largest_tensor_params(model_config(question.model)) * INIT_BYTES_PER_PARAM,
        training_states=0 if accelerator else plan.total - plan.overhead,
        offloaded=plan.host,
        checkpoint_staging=held * STAGED_BYTES_PER_PARAM if staged else 0,
        data_workers=question.data_workers * DATA_WORKER_BYTES,
    )
