"""`braintrain estimate`: the memory planner's view of a job (pure, torch-free).

For the job's model, precision, micro-batch, sequence length and world size:
the per-rank device breakdown of the strategy the job asks for, the strategy
`strategy: auto` would pick, every option the planner tries, and the host
memory per rank of the strategy the job will run, with the pod memory request
that covers it (compared with `spec.resources.requests.memory`), the room
its checkpoints need (storage.py), and the model FLOPs per token the trainer's
MFU counts (config/model_flops.py: the formula its FlopCounterMode count equals).
The preset is sized with the vocabulary the trainer will give it (vocabulary.py):
a token dataset's tokenizer's where the dataset is reachable from here (the
caller reads it), and the first lines say which one. Errors name fields as the manifest spells them.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import replace
from typing import Iterator

from brain_trainer.config import TrainerConfig
from brain_trainer.config.model_flops import six_n_flops_per_token, training_flops_per_token
from brain_trainer.config.presets import param_count, preset_config
from brain_trainer.plan import (
    GIB,
    HostPlan,
    MemoryPlan,
    PlanQuestion,
    first_fit,
    plan_for,
    plan_host_memory,
    plan_ladder,
    planned_model,
)
from brain_trainer.schema import ConfigError, FieldError, spelling

from ..spec import Job, JobSpec, trainer_config, world_size
from ..spec.kube import quantity_value
from .storage import check_storage, storage_lines
from .vocabulary import Vocabulary, with_vocabulary

__all__ = ["DEFAULT_DEVICE_MEMORY_GIB", "estimate_lines", "host_plan", "quantity_bytes"]

# An 80 GB accelerator (A100/H100 80GB) when the user does not say.
DEFAULT_DEVICE_MEMORY_GIB = 80.0
MEMORY_REQUEST = "spec.resources.requests.memory"
# The planner names the trainer's keys (training.micro_batch_size); estimate's reader wrote a manifest
# (spec.training.microBatchSize).
MANIFEST_NAMES = spelling(JobSpec, camel_case=True, prefix="spec.")


@contextmanager
def _manifest_spelling() -> Iterator[None]:
    """The planner's input errors with their fields spelled as the manifest spells them."""
    try:
        yield
    except ConfigError as exc:
        raise ConfigError([FieldError(MANIFEST_NAMES(e.path), e.message) for e in exc.errors]) from None


def quantity_bytes(value: int | str) -> float:
    """A Kubernetes memory quantity (`900Gi`, `1.5G`, `2048`) in bytes."""
    size = quantity_value(value)
    if size is None:
        raise ConfigError([FieldError(MEMORY_REQUEST, f"not a memory quantity such as 8Gi: {value!r}")])
    return size


def _device_memory(device_memory_gib: float | None) -> int:
    gib = DEFAULT_DEVICE_MEMORY_GIB if device_memory_gib is None else device_memory_gib
    if not 0 < gib < math.inf:  # also refuses nan, which argparse's float accepts
        raise ConfigError([FieldError("--device-memory", f"must be a finite number > 0 GiB, got {gib}")])
    return int(gib * GIB)


def _question(job: Job, memory: int) -> PlanQuestion:
    """The planner's question for the job; `memory` per device, known to the planner on GPUs only (as the trainer
    sees it)."""
    cfg = trainer_config(job)
    if cfg.model.entrypoint:
        raise ConfigError(
            [FieldError("spec.model.entrypoint", "the planner sizes presets only; a user model's size is unknown without torch")]
        )
    with _manifest_spelling():
        return PlanQuestion.from_config(cfg, world_size(job.spec), ranks_per_node=job.spec.nproc_per_node,
                                        device_memory_bytes=memory if job.spec.resources.gpus() else None)


def _plans(job: Job, memory: int) -> tuple[MemoryPlan | None, list, MemoryPlan]:
    """(the configured plan or None under auto, the auto ladder, the plan the job will run)."""
    question = _question(job, memory)
    gpus = question.device_memory_bytes is not None
    with _manifest_spelling():
        asked = None
        if question.strategy != "auto":
            one_rank = question.world_size == 1 and question.strategy == "ddp"
            asked = plan_for(question, question.choice("single" if one_rank else None))
        # auto picks tensor, then pipeline parallelism where the job leaves them unset, on GPUs (the trainer, seeing
        # their memory); on CPUs it runs what it runs without planning (PlanQuestion.unplanned_choice)
        ladder = plan_ladder(question if gpus else replace(question, ranks_per_node=None))
        unplanned = None if asked is not None or gpus else plan_for(question, question.unplanned_choice())
    if asked is not None:
        return asked, ladder, asked
    if unplanned is not None:
        return None, ladder, unplanned
    return None, ladder, first_fit(ladder, memory, question.model, MANIFEST_NAMES)[1]


def host_plan(job: Job, *, device_memory_gib: float | None = None) -> HostPlan:
    """Host memory per rank of the strategy the job will run, and the pod memory request it needs."""
    memory = _device_memory(device_memory_gib)
    _, _, runs = _plans(job, memory)
    return plan_host_memory(_question(job, memory), runs, accelerator=job.spec.resources.gpus() > 0,
                            ranks_per_pod=job.spec.nproc_per_node)


def _request_verdict(job: Job, plan: HostPlan) -> str:
    requested = job.spec.resources.requests.get("memory")
    if requested is None:
        return f"{MEMORY_REQUEST}: not set"
    size = quantity_bytes(requested)
    if size < plan.pod_request:
        return f"{MEMORY_REQUEST}: {requested}, below the recommended request"
    if size > 2 * plan.pod_request:
        return f"{MEMORY_REQUEST}: {requested}, more than twice the recommended request"
    return f"{MEMORY_REQUEST}: {requested}, covers it"


def _vocabulary(vocab_size: int | None) -> str:
    return "" if vocab_size is None else f" (vocabulary {vocab_size:,})"


def flops_line(cfg: TrainerConfig) -> str:
    """The model FLOPs per token the trainer's MFU uses, beside the usual 6 x parameters."""
    vocabulary = {} if cfg.model.vocab_size is None else {"vocab_size": cfg.model.vocab_size}
    model = preset_config(cfg.model.preset, **vocabulary)
    return (f"model FLOPs per token: {training_flops_per_token(model, cfg.training.seq_len):.3g} at sequence length "
            f"{cfg.training.seq_len}, forward and backward (6 x parameters: {six_n_flops_per_token(param_count(model)):.3g})")


# Micro-batches per pipeline stage below which its fill and drain idle a large share of the step (issue 25's rule
# of thumb: at least 4 x the pipeline degree).
PIPELINE_MICRO_BATCHES_PER_STAGE = 4


def _data_parallel(plan: MemoryPlan) -> int:
    return plan.world_size // (plan.tensor_parallel * plan.pipeline_parallel)


def _bubble_warning(plan: MemoryPlan) -> list[str]:
    if plan.pipeline_parallel == 1 or plan.micro_batches >= PIPELINE_MICRO_BATCHES_PER_STAGE * plan.pipeline_parallel:
        return []
    return [f"  warning: fewer than {PIPELINE_MICRO_BATCHES_PER_STAGE} x pp micro-batches per step: the pipeline "
            f"idles {plan.bubble:.1%} of it"]


def _batch_lines(cfg: TrainerConfig, first: MemoryPlan, picked: MemoryPlan) -> list[str]:
    """What a picked layout does to the accumulation (the global batch stays), and a pipeline's bubble."""
    if picked.micro_batches == first.micro_batches:
        return _bubble_warning(picked)
    field = ("spec.training.globalBatchSize" if cfg.training.global_batch_size
             else "spec.distributed.gradientAccumulationSteps")
    return [f"  keeps the global batch: {picked.micro_batches} micro-batches per step on {_data_parallel(picked)} "
            f"data-parallel rank(s), where {field} gives {first.micro_batches} on {_data_parallel(first)}",
            *_bubble_warning(picked)]


def estimate_lines(job: Job, vocabulary: Vocabulary, *, device_memory_gib: float | None = None) -> list[str]:
    """The estimate's lines; `vocabulary` as the caller found it (local/dataset.py reads a token dataset where
    `braintrain run` would)."""
    check_storage(job, vocabulary)
    job = with_vocabulary(job, vocabulary)
    cfg = trainer_config(job).resolved()  # the preset's recommendations where the job says nothing
    memory = _device_memory(device_memory_gib)
    asked, ladder, _ = _plans(job, memory)
    dist, training = cfg.distributed, cfg.training
    lines = [
        f"{job.name}: preset {cfg.model.preset}{_vocabulary(cfg.model.vocab_size)}, {world_size(job.spec)} rank(s) "
        f"({job.spec.nodes} node(s) x {job.spec.nproc_per_node}), {dist.mixed_precision_policy}, micro-batch "
        f"{training.micro_batch_size} x {training.seq_len} tokens, {memory / GIB:g} GiB per device",
        *([f"vocabulary: {vocabulary.source}"] if vocabulary.source else []),
        flops_line(cfg),
        "",
    ]
    if asked is not None:
        verdict = "fits" if asked.fits(memory) else f"does NOT fit ({(asked.total - memory) / GIB:.1f} GiB per rank missing)"
        lines += [f"configured (spec.distributed): {verdict}", asked.summary(), *_bubble_warning(asked), ""]
    choice, plan = first_fit(ladder, memory, planned_model(cfg.model), MANIFEST_NAMES)
    lines += [f"strategy: auto picks {choice}", plan.summary(), *_batch_lines(cfg, ladder[0][1], plan), "",
              "options tried, cheapest first (device GiB per rank; GiB each rank sends per step; pipeline bubble):"]
    width = max(len(str(option)) for option, _ in ladder) + 1
    for option, tried in ladder:
        mark = "fits" if tried.fits(memory) else "too big"
        bubble = f"  bubble {tried.bubble:5.1%}" if tried.pipeline_parallel > 1 else ""
        lines.append(f"  {str(option):<{width}}{tried.total / GIB:9.2f}  {mark:<7}  sends "
                     f"{tried.communication.total / GIB:9.1f}{bubble}")
    host = host_plan(job, device_memory_gib=device_memory_gib)
    lines += ["", host.summary(), _request_verdict(job, host), "", *storage_lines(job)]
    return lines
