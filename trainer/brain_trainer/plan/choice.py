"""One option the planner weighs: a strategy with its sharding, checkpointing, offload and parallel degrees."""

from __future__ import annotations

from dataclasses import dataclass

from ..config.sections import INTERLEAVED


@dataclass(frozen=True)
class StrategyChoice:
    """The distributed settings a plan assumes."""

    strategy: str
    fsdp_sharding: str = "full_shard"
    activation_checkpointing: str = "none"  # none, full or selective
    cpu_offload: bool = False
    tensor_parallel: int = 1  # ranks splitting each reasoning/decision block (fsdp only)
    pipeline_parallel: int = 1  # pipeline ranks the model's stages are spread over (fsdp only)
    pipeline_schedule: str = "1f1b"
    stages_per_rank: int = 1

    def __str__(self) -> str:
        words = [self.strategy] + ([self.fsdp_sharding] if self.strategy == "fsdp" else [])
        text = " ".join(words)
        if self.tensor_parallel > 1:
            text += f" + tp {self.tensor_parallel}"
        if self.pipeline_parallel > 1:
            per_rank = f", {self.stages_per_rank} stages per rank" if self.pipeline_schedule == INTERLEAVED else ""
            text += f" + pp {self.pipeline_parallel} ({self.pipeline_schedule}{per_rank})"
        if self.activation_checkpointing != "none":
            text += f" + {self.activation_checkpointing} activation checkpointing"
        if self.cpu_offload:
            text += " + CPU offload"
        return text
