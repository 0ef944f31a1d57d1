"""`braintrain estimate`: the memory planner's view of a job (pure, torch-free).

For the job's model, precision, micro-batch, sequence length and world size:
the per-rank breakdown of the strategy the job asks for, the strategy
`strategy: auto` would pick, and every option the planner tries.
"""

from __future__ import annotations

import math

from brain_trainer.memory import GIB, first_fit, plan_ladder, plan_memory
from brain_trainer.schema import ConfigError, FieldError

from .spec import Job, trainer_config, world_size

__all__ = ["DEFAULT_DEVICE_MEMORY_GIB", "estimate_lines"]

# An 80 GB accelerator (A100/H100 80GB) when the user does not say.
DEFAULT_DEVICE_MEMORY_GIB = 80.0


def estimate_lines(job: Job, *, device_memory_gib: float | None = None) -> list[str]:
    cfg = trainer_config(job)
    if cfg.model.entrypoint:
        raise ConfigError(
            [FieldError("spec.model.entrypoint", "the planner sizes presets only; a user model's size is unknown without torch")]
        )
    gib = DEFAULT_DEVICE_MEMORY_GIB if device_memory_gib is None else device_memory_gib
    if not 0 < gib < math.inf:  # also refuses nan, which argparse's float accepts
        raise ConfigError([FieldError("--device-memory", f"must be a finite number > 0 GiB, got {gib}")])
    memory = int(gib * GIB)
    dist, training = cfg.distributed, cfg.training
    ranks = world_size(job.spec)
    shape = dict(
        precision=dist.mixed_precision_policy,
        micro_batch_size=training.micro_batch_size,
        seq_len=training.seq_len,
        world_size=ranks,
    )
    lines = [
        f"{job.name}: preset {cfg.model.preset}, {ranks} rank(s) ({job.spec.nodes} node(s) x {job.spec.nproc_per_node}), "
        f"{dist.mixed_precision_policy}, micro-batch {training.micro_batch_size} x {training.seq_len} tokens, "
        f"{gib:g} GiB per device",
        "",
    ]
    if dist.strategy != "auto":
        strategy = "single" if ranks == 1 and dist.strategy == "ddp" else dist.strategy
        asked = plan_memory(
            cfg.model.preset,
            strategy,
            fsdp_sharding=dist.fsdp_sharding,
            activation_checkpointing=dist.activation_checkpointing,
            cpu_offload=dist.cpu_offload,
            node_size=job.spec.nproc_per_node,
            **shape,
        )
        verdict = "fits" if asked.fits(memory) else f"does NOT fit ({(asked.total - memory) / GIB:.1f} GiB per rank missing)"
        lines += [f"configured (spec.distributed): {verdict}", asked.summary(), ""]
    ladder = plan_ladder(
        cfg.model.preset,
        activation_checkpointing=dist.activation_checkpointing,
        cpu_offload=dist.cpu_offload,
        **shape,
    )
    choice, plan = first_fit(ladder, memory, cfg.model.preset)
    lines += [f"strategy: auto picks {choice}", plan.summary(), "", "options tried, cheapest first (device GiB per rank):"]
    for option, tried in ladder:
        mark = "fits" if tried.fits(memory) else "too big"
        lines.append(f"  {str(option):<58}{tried.total / GIB:9.2f}  {mark}")
    return lines
