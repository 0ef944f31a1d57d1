"""What the planner is asked about one run, built once from a config: `PlanQuestion`, and the one rule for what
`strategy: auto` runs where the planner does not choose (`unplanned_strategy`)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from ..config import ModelConfig, TrainerConfig
from ..config.presets import BrainAIConfig, preset_config
from .bytes import RUNTIME_OVERHEAD_BYTES
from .choice import StrategyChoice


def planned_model(model: ModelConfig) -> BrainAIConfig | str:
    """What the planner sizes for a model section: the preset, resized when model.vocab_size says so."""
    if model.vocab_size is None:
        return model.preset
    return preset_config(model.preset, vocab_size=model.vocab_size)


def model_config(model: BrainAIConfig | str) -> BrainAIConfig:
    return preset_config(model) if isinstance(model, str) else model


def model_name(model: BrainAIConfig | str) -> str:
    return f"preset {model!r}" if isinstance(model, str) else "the model"


def unplanned_strategy(world_size: int, tensor_parallel: int, pipeline_parallel: int) -> str:
    """What `strategy: auto` runs where the planner does not choose (one rank, no accelerator, a user model): fsdp
    under tensor or pipeline parallelism (the one strategy they compose with, layout.py), single on one rank, else
    ddp."""
    if tensor_parallel > 1 or pipeline_parallel > 1:
        return "fsdp"
    return "single" if world_size == 1 else "ddp"


@dataclass(frozen=True)
class PlanQuestion:
    """One run as the planner sees it: the model, the world, the batch and what the job sets.

    tensor_parallel or pipeline_parallel None: the job leaves the degree to `strategy: auto`, which picks one within
    nodes of `ranks_per_node` ranks (unknown: 1 only; `plan_ladder`). `micro_batches` are per optimizer step at the
    job's own degrees. The last three fields size the host memory (`plan_host_memory`).
    """

    model: BrainAIConfig | str
    world_size: int = 1
    device_memory_bytes: Optional[int] = None  # per device; None: unknown (no accelerator)
    ranks_per_node: Optional[int] = None  # hybrid_shard's shard group, and the node a picked tp group stays in
    strategy: str = "auto"
    precision: str = "fp32"
    micro_batch_size: int = 1
    seq_len: Optional[int] = None  # None: the model's max_seq_len
    micro_batches: int = 1
    fsdp_sharding: str = "full_shard"
    activation_checkpointing: str = "none"
    activation_checkpointing_every: int = 2
    cpu_offload: bool = False
    tensor_parallel: Optional[int] = 1
    pipeline_parallel: Optional[int] = 1
    pipeline_schedule: str = "1f1b"
    stages_per_rank: int = 1
    overhead_bytes: int = RUNTIME_OVERHEAD_BYTES
    async_checkpoint: bool = True
    checkpointing: bool = True
    data_workers: int = 0

    @classmethod
    def from_config(cls, cfg: TrainerConfig, world_size: int, *, device_memory_bytes: Optional[int] = None,
                    ranks_per_node: Optional[int] = None) -> "PlanQuestion":
        """The question `cfg` asks over `world_size` ranks, with the preset's recommendations where it says nothing
        (`TrainerConfig.resolved`). ConfigError when its global batch does not divide (`accumulation_steps`)."""
        cfg = cfg.resolved()
        dist, training = cfg.distributed, cfg.training
        return cls(
            model=planned_model(cfg.model), world_size=world_size, device_memory_bytes=device_memory_bytes,
            ranks_per_node=ranks_per_node, strategy=dist.strategy, precision=dist.mixed_precision_policy,
            micro_batch_size=training.micro_batch_size, seq_len=training.seq_len,
            micro_batches=cfg.accumulation_steps(world_size), fsdp_sharding=dist.fsdp_sharding,
            activation_checkpointing=dist.activation_checkpointing,
            activation_checkpointing_every=dist.activation_checkpointing_every, cpu_offload=dist.cpu_offload,
            tensor_parallel=dist.tensor_parallel, pipeline_parallel=dist.pipeline_parallel,
            pipeline_schedule=dist.pipeline_schedule, stages_per_rank=dist.stages_per_rank,
            async_checkpoint=cfg.checkpoint.async_save, checkpointing=cfg.checkpoint.enabled,
            data_workers=cfg.data.num_workers,
        )

    def choice(self, strategy: Optional[str] = None) -> StrategyChoice:
        """The job's own settings as one option, with `strategy` in place of the job's when given."""
        return StrategyChoice(strategy or self.strategy, self.fsdp_sharding, self.activation_checkpointing,
                              self.cpu_offload, self.tensor_parallel or 1, self.pipeline_parallel or 1,
                              self.pipeline_schedule, self.stages_per_rank)

    def unplanned_choice(self) -> StrategyChoice:
        """What `strategy: auto` runs where the planner does not choose (`unplanned_strategy`); CPU offload is
        fsdp's only."""
        job = self.choice()
        strategy = unplanned_strategy(self.world_size, job.tensor_parallel, job.pipeline_parallel)
        return replace(job, strategy=strategy, cpu_offload=self.cpu_offload and strategy == "fsdp")
