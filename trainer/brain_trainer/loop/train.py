"""The training loop: `train(cfg)` under torchrun, SLURM, a manual launch, or alone.

DistributedLauncher -> process group -> strategy -> model -> DDPWrapper /
FSDPWrapper -> optimizer and schedule -> checkpoint restore ->
RankAwareDataLoader -> loop (GradientAccumulator) -> final save. The seed's
public classes are this path (docs/architecture.md, "The trainer").

The loop keeps the running loss on the device and synchronises with the host
only at logging steps (every `training.log_interval` steps). What happens
around a step belongs to others: the reporter keeps the books and publishes
(observe/), the watchdog times steps, the preemption vote, the checkpoint
cadence and the checkpoint manager decide on saves (boundary.py).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.amp import GradScaler
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import Dataset

from ..checkpoint import CheckpointManager, SampleLog, TrainState, WholeModel
from ..checkpoint.cadence import Cadence
from ..config import DistributedConfig, TrainerConfig
from ..contract import OUT_OF_MEMORY
from ..data.loader import RankAwareDataLoader, build_dataset
from ..data.tokens.source import token_source
from ..config.model_flops import six_n_flops_per_token
from ..model.flop_count import counted_flops_per_token
from ..model.init_from import WeightSource, manifest_fields, open_source
from ..model.materialize import Initializer, build, is_meta
from ..observe.flops import peak_flops
from ..observe.memory_report import gather_init_memory, out_of_memory_line, peak_host_bytes
from ..observe.reporter import Reporter
from ..parallel.ddp import (DDPWrapper, ProcessGroupUser, SingleDeviceWrapper, all_reduce_weighted_mean,
                            ensure_process_group, use_local_device)
from ..parallel.fsdp import FSDPWrapper
from ..parallel.launcher import DistributedLauncher, env_int
from ..plan.layout import Layout, bubble_fraction, build_layout, micro_batch_problems, micro_batches_field
from ..parallel.pipeline import PipelineSteps, PipelineWrapper
from ..parallel.blocks import COMPILE_BACKEND, Backend
from ..plan import checkpoint_bytes, rank_estimate, resolve_distributed
from ..resilience.failures import Fatal, say
from ..resilience.preemption import Preemption
from ..resilience.preflight import run_preflight
from ..resilience.watchdog import Watchdog
from ..schema import ConfigError, FieldError
from ..version import __version__
from . import boundary
from .accumulation import GradientAccumulator
from .evaluation import Evaluator, due
from .schedule import WarmupCosine, follow_config, peak_learning_rate

log = logging.getLogger(__name__)

ADAMW_BETAS = (0.9, 0.95)
AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class TrainResult:
    step: int  # optimizer steps completed, counting those before a resume
    loss: float  # loss of the last logged step, averaged over ranks (NaN if nothing ran)
    tokens_per_second: float  # over all ranks, for the steps this process ran
    wall_seconds: float  # the loop's wall time in this process
    history: list[tuple[int, float]] = field(default_factory=list)  # (step, loss) at each logging step
    eval_history: list[tuple[int, float]] = field(default_factory=list)  # (step, held-out loss) at each evaluation
    # (logging step, steps, training seconds) of each logging window, timed where the device is synchronised
    windows: list[tuple[int, int, float]] = field(default_factory=list)


@dataclass(frozen=True)
class Run:
    """What `train` hands every rank: the resolved config and what was opened before any rendezvous."""

    config: TrainerConfig
    dataset: Dataset
    held_out: Optional[Dataset]  # the validation split (data.source tokens), else None
    checkpoint_request: Optional[Path]  # contract.CHECKPOINT_REQUEST_FILE
    started: float  # time.time() when this trainer process began (the goodput ledger's initialisation)
    restarted_after: Optional[str] = None  # why torchrun restarted the workers in this pod (failures.begin_attempt)


@dataclass
class Trainer:
    """One rank's built pieces, ready for the loop."""

    wrapper: ProcessGroupUser
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: LambdaLR
    accumulator: GradientAccumulator
    state: TrainState
    ckpt: CheckpointManager
    preemption: Preemption
    cadence: Cadence
    batches: Iterator[tuple[torch.Tensor, torch.Tensor]]
    evaluator: Optional[Evaluator]
    sample_log: SampleLog
    autocast: Callable[[], contextlib.AbstractContextManager]
    device: torch.device
    global_batch: int  # sequences per optimizer step, over all ranks


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy, computed in fp32 whatever the autocast dtype."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def decays(ndim: int) -> bool:
    """Weight decay on matrices and embeddings (>= 2-D) only, never on biases and norm gains."""
    return ndim >= 2


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """The optimizer's two groups: decayed, then not (`decays`).

    Two groups at every layout: a checkpoint's optimizer and schedule state (one entry per group) loads under any other."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if decays(p.ndim)], "weight_decay": weight_decay},
        {"params": [p for p in params if not decays(p.ndim)], "weight_decay": 0.0},
    ]


def whole_model(wrapper: PipelineWrapper) -> WholeModel:
    """What a pipeline rank's checkpoint part belongs to: the whole model's tensors and optimizer groups."""
    shapes, parameters = wrapper.whole, wrapper.whole_parameters
    return WholeModel(shapes=shapes, optimizer_groups=(
        tuple(name for name in parameters if decays(len(shapes[name]))),
        tuple(name for name in parameters if not decays(len(shapes[name]))),
    ))


def device_memory_bytes(device: torch.device) -> Optional[int]:
    """Accelerator memory for the planner; None on CPU, where host memory is shared and unknown."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return None


def optimizer_kernels(device: torch.device, layout: Layout) -> dict[str, bool | None]:
    """AdamW's implementation: fused (one kernel for all parameters) on GPU, unless tensor parallelism puts the
    parameters on two device meshes ((dp..., tp) for the split ones, (dp...) for the rest), which one fused or
    foreach call over DTensors cannot mix: then the per-parameter loop (CPU uses it anyway)."""
    if layout.tp > 1:
        return {"fused": False, "foreach": False}
    return {"fused": True if device.type == "cuda" else None}


def resolve_strategy(cfg: TrainerConfig, world_size: int, device: torch.device) -> DistributedConfig:
    """The distributed settings with `strategy: auto` replaced by the planner's choice (tensor parallelism, when the
    job leaves it unset, within this node's ranks)."""
    resolved = resolve_distributed(cfg, world_size, device_memory_bytes(device),
                                   env_int(os.environ, "LOCAL_WORLD_SIZE", default=world_size))
    if resolved.strategy == "single" and world_size > 1:
        raise ConfigError(
            [FieldError("distributed.strategy", f"single trains one process, but the world size is {world_size}; use ddp or fsdp")]
        )
    return resolved


WRAPPERS = {"single": SingleDeviceWrapper, "ddp": DDPWrapper, "fsdp": FSDPWrapper}


def make_wrapper(model: nn.Module, dist_cfg: DistributedConfig, *, compile_backend: Optional[Backend] = None,
                 pipeline: Optional[PipelineSteps] = None) -> ProcessGroupUser:
    """The seed's wrapper for a resolved strategy: SingleDeviceWrapper, DDPWrapper or FSDPWrapper; PipelineWrapper
    (FSDP2 per stage) under pipeline parallelism, which runs the training's micro-batches as `pipeline` says."""
    if dist_cfg.pp > 1:
        if pipeline is None:
            raise ValueError("pipeline parallelism needs the pipeline's steps (PipelineSteps)")
        return PipelineWrapper(model, dist_cfg, steps=pipeline, compile_backend=compile_backend)
    return WRAPPERS[dist_cfg.strategy](model, dist_cfg, compile_backend=compile_backend)


def build_and_wrap(cfg: TrainerConfig, dist_cfg: DistributedConfig, rank: int, world_size: int,
                   device: torch.device) -> tuple[ProcessGroupUser, nn.Module, Optional[WeightSource]]:
    """This rank's model, ready to train, without the whole model on any rank that shards it.

    Built on the meta device, checked against model.init_from's tensors,
    wrapped (blocks checkpointed and compiled, then sharded), materialised and
    initialised in place (each rank fills only its own shards), then loaded
    with init_from's weights. Returns (wrapper, model, the init_from source).
    """
    model = build(cfg.model, cfg.training.seed)
    source = open_source(cfg.model.init_from, model) if cfg.model.init_from else None
    compile_backend = COMPILE_BACKEND if cfg.training.compiles(device.type) else None
    wrapper = make_wrapper(model, dist_cfg, compile_backend=compile_backend,
                           pipeline=pipeline_steps(cfg, dist_cfg, world_size, device) if dist_cfg.pp > 1 else None)
    model = wrapper.setup(rank, world_size, materialize=Initializer(cfg.training.seed) if is_meta(model) else None)
    if source is not None:
        source.load_into(model)
    return wrapper, model, source


def pipeline_steps(cfg: TrainerConfig, dist_cfg: DistributedConfig, world_size: int,
                   device: torch.device) -> PipelineSteps:
    """The pipeline's part of the training settings: the accumulation steps are its micro-batches."""
    return PipelineSteps(seq_len=cfg.training.seq_len,
                         micro_batches=replace(cfg, distributed=dist_cfg).accumulation_steps(world_size),
                         loss_fn=loss_fn, autocast=functools.partial(autocast_context, dist_cfg.mixed_precision_policy, device))


def check_micro_batches(cfg: TrainerConfig, dist_cfg: DistributedConfig, micro_batches: int) -> None:
    """Refuse fewer micro-batches per step than the pipeline needs (ConfigError naming the field that sets them);
    warn when the pipeline idles much of a step for want of them."""
    field = micro_batches_field(cfg.training.global_batch_size)
    problems = list(micro_batch_problems(dist_cfg, micro_batches, field, str))
    if problems:
        raise ConfigError([FieldError(path, message) for path, message in problems])
    if 1 < dist_cfg.pp and micro_batches < 4 * dist_cfg.pp:
        log.warning("%s gives %d micro-batches per step for %d pipeline stages: each rank idles %.0f%% of a step "
                    "(fill and drain); at least %d keep it small", field, micro_batches, dist_cfg.pp,
                    100 * bubble_fraction(dist_cfg, micro_batches), 4 * dist_cfg.pp)


def model_flops_per_token(cfg: TrainerConfig, parameters: int) -> int:
    """Training FLOPs per token for MFU: counted on the model (model/flop_count.py), else 6 x parameters."""
    counted = counted_flops_per_token(cfg.model, cfg.training.seq_len, loss_fn)
    return six_n_flops_per_token(parameters) if counted is None else counted


def committed_step(ckpt: CheckpointManager) -> Optional[int]:
    return ckpt.last_committed[0] if ckpt.last_committed else None


def autocast_context(policy: str, device: torch.device) -> contextlib.AbstractContextManager:
    dtype = AUTOCAST_DTYPES.get(policy)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def peak_memory_bytes(device: torch.device) -> int:
    """Peak accelerator memory of this rank; on CPU, the process's peak resident set."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return peak_host_bytes()


def train(cfg: TrainerConfig, *, checkpoint_request: Optional[Path] = None, started: Optional[float] = None,
          restarted_after: Optional[str] = None) -> TrainResult:
    """Train as configured; returns on every rank once the last step is saved.

    DistributedLauncher exports the torch variables for whichever launcher
    started this process, then runs the loop here. A new content of the
    `checkpoint_request` file asks for a checkpoint at the next vote
    (contract.CHECKPOINT_REQUEST_FILE). `started` (time.time()) is when this
    trainer process began, for the goodput ledger; default: now. `restarted_after`:
    why torchrun restarted the workers in this pod (`reason: line`), None on a
    pod's first attempt; the ledger counts it as an in-pod restart.
    """
    started = time.time() if started is None else started
    cfg = cfg.resolved()
    # Build the datasets first: a bad data.path (or a vocabulary that does not match it) fails before any rendezvous.
    dataset = build_dataset(cfg.data, cfg.training.seq_len, cfg.training.seed)
    held_out = None
    if cfg.data.source == "tokens":
        cfg, held_out = token_source(cfg, dataset)
    run = Run(config=cfg, dataset=dataset, held_out=held_out, checkpoint_request=checkpoint_request, started=started,
              restarted_after=restarted_after)
    return DistributedLauncher(cfg.distributed).launch(_launched, run)


def _launched(run: Run) -> TrainResult:
    cfg = run.config
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = use_local_device()
    with contextlib.ExitStack() as cleanup:  # undone in reverse order, whatever happens
        if ensure_process_group(cfg.distributed, rank, world_size):
            cleanup.callback(dist.destroy_process_group)
        # A rank that never joins, or a network the collectives cannot cross, is network-error now, not stalled later.
        run_preflight(cfg.distributed.preflight_seconds, rank, world_size, device)
        # From here on a rank that hangs (on a peer, a collective, storage) ends itself (watchdog.py).
        watchdog = Watchdog(cfg.watchdog)
        cleanup.callback(watchdog.close)
        reporter = Reporter(cfg, rank, run.started, restarted_after=run.restarted_after)
        cleanup.callback(reporter.close)
        try:
            try:
                trainer = _build(run, rank, world_size, device, reporter, watchdog, cleanup)
                return _loop(trainer, cfg, reporter, watchdog)
            except (MemoryError, torch.OutOfMemoryError) as exc:
                estimate = rank_estimate(cfg, resolve_strategy(cfg, world_size, device), world_size,
                                         node_size=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
                                         accelerator=device.type == "cuda")
                raise Fatal(OUT_OF_MEMORY, out_of_memory_line(exc, estimate, device, rank)) from exc
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:
            say(exc, str(rank))  # before the cleanup unwinds (failures.say)
            raise


def _build(run: Run, rank: int, world_size: int, device: torch.device, reporter: Reporter, watchdog: Watchdog,
           cleanup: contextlib.ExitStack) -> Trainer:
    """Model, optimizer, schedule, checkpoints (restored), preemption, data: everything the loop drives."""
    cfg, training = run.config, run.config.training
    dist_cfg = resolve_strategy(cfg, world_size, device)
    # the batch arithmetic follows the resolved layout (auto's tensor parallelism and its accumulation)
    batch = replace(cfg, distributed=dist_cfg)
    layout = build_layout(dist_cfg, world_size, env_int(os.environ, "LOCAL_WORLD_SIZE", default=world_size))
    global_batch = batch.effective_batch_size(world_size)
    check_micro_batches(cfg, dist_cfg, batch.accumulation_steps(world_size))
    wrapper, model, source = build_and_wrap(cfg, dist_cfg, rank, world_size, device)
    pipeline = wrapper if isinstance(wrapper, PipelineWrapper) else None
    reporter.init_memory([r.as_dict() for r in gather_init_memory(model, device, rank)])

    peak_lr = peak_learning_rate(training, global_batch)
    optimizer = torch.optim.AdamW(
        param_groups(model, training.weight_decay),
        lr=peak_lr,
        betas=ADAMW_BETAS,
        **optimizer_kernels(device, layout),
    )
    schedule = WarmupCosine.from_config(training)
    scheduler = LambdaLR(optimizer, schedule)
    scaler = GradScaler("cuda") if dist_cfg.mixed_precision_policy == "fp16" and device.type == "cuda" else None
    accumulator = GradientAccumulator(batch.accumulation_steps(world_size), scaler, model=model,
                                      max_grad_norm=training.grad_clip,
                                      pipeline_group=pipeline.pipeline_group if pipeline else None)
    whole = whole_model(pipeline) if pipeline else None
    state = TrainState(model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler, whole=whole)
    # the whole model's: a pipeline rank holds only its stages'
    parameters = (sum(math.prod(whole.shapes[name]) for name in pipeline.whole_parameters) if pipeline
                  else sum(p.numel() for p in model.parameters()))
    ckpt = CheckpointManager(cfg.checkpoint, rank=rank, world_size=world_size, config_hash=cfg.config_hash(),
                             manifest_fields=manifest_fields(cfg, source), save_guard=watchdog.checkpointing,
                             checkpoint_bytes=checkpoint_bytes(parameters))
    # After finish() or a preemption it is closed already; after an error this does not wait for a save in flight.
    cleanup.callback(ckpt.close, wait=False)
    # Before the restore: a SIGTERM from here on is answered at the first vote, with a checkpoint.
    preemption = Preemption(cfg.checkpoint, rank=rank, group=ckpt.group, request_file=run.checkpoint_request)
    cleanup.callback(preemption.close)  # SIGTERM gets its meaning back after an error
    if ckpt.restore(state) is not None:
        follow_config(scheduler, schedule, peak_lr)
    cadence = Cadence.for_run(cfg.checkpoint, reporter.goodput.ledger if reporter.active else None, last_save=state.step)

    # Batches are dealt by data-parallel rank: the tp ranks of a group and the stages of a pipeline read the same
    # ones, logged once (by the first stage's first tp rank) and counted once in evaluation (by the last stage's).
    dp_rank, first_tp = layout.dp_rank(rank), layout.tp_rank(rank) == 0
    reads_first = first_tp and layout.pp_rank(rank) == 0
    sample_log = SampleLog.from_env(rank) if reads_first else SampleLog(None, rank)
    loader = RankAwareDataLoader(sample_log.wrap(run.dataset), dist_cfg, micro_batch_size=training.micro_batch_size,
                                 rank=dp_rank, world_size=layout.dp, seed=training.seed, start_index=state.sample_index,
                                 num_workers=cfg.data.num_workers)
    autocast = functools.partial(autocast_context, dist_cfg.mixed_precision_policy, device)
    evaluator = None if run.held_out is None else Evaluator(
        run.held_out, training.micro_batch_size, training.eval_steps, dp_rank, layout.dp, device, autocast,
        counts=first_tp and (pipeline is None or pipeline.holds_last),
        micro_batches=pipeline.steps.micro_batches if pipeline else 1)
    preset = cfg.model.entrypoint or cfg.model.preset
    # Only rank 0 reports MFU; counting takes a pass over the model on the meta device.
    flops_per_token = model_flops_per_token(cfg, parameters) if reporter.active else 0
    reporter.started(state.step, tokens_per_step=global_batch * training.seq_len, flops_per_token=flops_per_token,
                     peak_flops=peak_flops(torch.cuda.get_device_name(device) if device.type == "cuda" else None,
                                           cfg.metrics.peak_flops),
                     world_size=world_size, info={"version": __version__, "preset": preset,
                                                  "strategy": dist_cfg.strategy, "world_size": str(world_size)},
                     compiling=wrapper.compile_backend is not None)
    if rank == 0:
        log.info(
            "training %s with %s on %d rank(s) (tensor parallel %d, pipeline parallel %d), %s: micro-batch %d x %d "
            "accumulation x %d data-parallel ranks = %d sequences/step, from step %d",
            preset, dist_cfg.strategy, world_size, layout.tp, layout.pp, device.type,
            training.micro_batch_size, batch.accumulation_steps(world_size), layout.dp, global_batch, state.step,
        )
        log.info("model FLOPs per token: %.3g at sequence length %d (6 x parameters: %.3g)", flops_per_token,
                 training.seq_len, six_n_flops_per_token(parameters))
    if pipeline is not None:
        log.info("rank %d: pipeline parallel %d x data parallel %d x tensor parallel %d, schedule %s, %d stage(s) per "
                 "rank; this rank runs %s", rank, layout.pp, layout.dp, layout.tp, dist_cfg.pipeline_schedule,
                 layout.stages_per_rank, "; ".join(f"stage {stage.index}: {', '.join(stage.names)}"
                                                   for stage in pipeline.stages))
    return Trainer(wrapper=wrapper, model=model, optimizer=optimizer, scheduler=scheduler, accumulator=accumulator,
                   state=state, ckpt=ckpt, preemption=preemption, batches=iter(loader), evaluator=evaluator,
                   cadence=cadence, sample_log=sample_log, autocast=autocast, device=device, global_batch=global_batch)


def _loop(t: Trainer, cfg: TrainerConfig, reporter: Reporter, watchdog: Watchdog) -> TrainResult:
    """Micro-batches through the accumulator until `training.steps` optimizer steps, then the final save."""
    training, state, ckpt = cfg.training, t.state, t.ckpt
    pipeline = t.wrapper if isinstance(t.wrapper, PipelineWrapper) else None
    t.model.train()
    running_loss = torch.zeros((), device=t.device)  # summed on device: no host sync between logging steps
    micro_losses = micro_idx = 0
    while state.step < training.steps:
        if pipeline is None:
            x, y = next(t.batches)
            x = x.to(t.device, non_blocking=True)
            y = y.to(t.device, non_blocking=True)
            with t.accumulator.sync_context(micro_idx):
                with t.autocast():
                    loss = loss_fn(t.model(x), y)
                stepped = t.accumulator.step(loss, t.optimizer, micro_idx)
            running_loss += loss.detach()
            micro_losses += 1
            micro_idx += 1
            if not stepped:
                continue
            micro_idx = 0
        else:
            micro_batches = t.accumulator.accumulation_steps
            # the step's micro-batches in one batch: the schedule splits it again
            x, y = (torch.cat(parts).to(t.device) for parts in zip(*(next(t.batches) for _ in range(micro_batches))))
            loss = pipeline.step(x, y)
            t.accumulator.apply(t.optimizer)
            if loss is not None:  # the last stage's: the mean over the micro-batches
                running_loss += loss * micro_batches
                micro_losses += micro_batches
        t.scheduler.step()
        state.step += 1
        state.sample_index += t.global_batch
        t.sample_log.record(state.step)
        watchdog.stepped(state.step)
        boundary.after_step(state, ckpt, t.preemption, t.cadence)
        reporter.stepped(state.step, ckpt.stall_total_s)
        if t.evaluator is not None and due(state.step, training):
            began = time.perf_counter()
            with watchdog.evaluating():
                result = t.evaluator(t.model, forward=pipeline.logits if pipeline else None)
            reporter.evaluated(state.step, result.loss, result.perplexity, result.tokens, time.perf_counter() - began)
        if not training.logs_at(state.step):
            continue
        if pipeline is None:
            mean_loss = t.wrapper.all_reduce_metrics({"loss": running_loss.item() / micro_losses})["loss"]
        else:  # only the last stage's ranks hold losses: the mean of theirs, on every rank (rank 0 logs it)
            mean_loss = all_reduce_weighted_mean(running_loss.item(), micro_losses)
        reporter.logged(state.step, mean_loss, lr=t.scheduler.get_last_lr()[0], grad_norm=t.accumulator.last_grad_norm,
                        peak_memory=peak_memory_bytes(t.device), last_checkpoint_step=committed_step(ckpt),
                        answered=ckpt.answered, checkpoint_interval=t.cadence.interval)
        running_loss.zero_()
        micro_losses = 0
    reporter.loop_ended(state.step)
    boundary.finish(state, ckpt, t.preemption)
    books = reporter.finished(last_checkpoint_step=committed_step(ckpt), answered=ckpt.answered)
    training_seconds = books.loop_seconds - books.eval_seconds
    return TrainResult(
        step=state.step,
        loss=books.history[-1][1] if books.history else float("nan"),
        tokens_per_second=books.steps * t.global_batch * training.seq_len / training_seconds if books.steps else 0.0,
        wall_seconds=books.loop_seconds,
        history=books.history,
        eval_history=books.eval_history,
        windows=books.windows,
    )
