"""What the loop drives, built on every rank: the model wrapped as the run's layout says, the optimizer and schedule,
the gradient accumulator, checkpoints (restored), the preemption vote, the data and the held-out evaluation."""

from __future__ import annotations

import contextlib
import logging
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator, Optional

import torch
from torch import nn
from torch.amp import GradScaler
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import Dataset

from ..checkpoint import CheckpointManager, SampleLog, TrainState
from ..checkpoint.cadence import Cadence
from ..config import TrainerConfig
from ..config.model_flops import six_n_flops_per_token
from ..data.loader import RankAwareDataLoader
from ..model.flop_count import counted_flops_per_token
from ..model.init_from import WeightSource, manifest_fields
from ..observe.flops import peak_flops
from ..observe.memory_report import gather_init_memory
from ..observe.reporter import Reporter
from ..parallel.ddp import ProcessGroupUser
from ..parallel.pipeline import PipelineWrapper
from ..parallel.run_layout import RunLayout
from ..plan import checkpoint_bytes
from ..resilience.preemption import Preemption
from ..resilience.watchdog import Watchdog
from ..version import __version__
from .accumulation import GradientAccumulator
from .evaluation import Evaluator, held_out
from .loss import loss_fn
from .optimizer import adamw, whole_model
from .schedule import WarmupCosine, follow_config, peak_learning_rate
from .wrap import build_and_wrap

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Run:
    """What `train` hands every rank: the resolved config and what was opened before any rendezvous."""

    config: TrainerConfig
    dataset: Dataset
    held_out: Optional[Dataset]  # the validation split (data.source tokens), else None
    checkpoint_request: Optional[Path]  # contract.CHECKPOINT_REQUEST_FILE
    started: float  # time.time() when this trainer process began (the goodput ledger's initialisation)
    restarted_after: Optional[str] = None  # why torchrun restarted the workers in this pod (failures.begin_attempt)
    profile_request: Optional[Path] = None  # contract.PROFILE_REQUEST_FILE


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
    device: torch.device
    global_batch: int  # sequences per optimizer step, over all ranks


def assemble(run: Run, layout: RunLayout, reporter: Reporter, watchdog: Watchdog,
             cleanup: contextlib.ExitStack) -> Trainer:
    """Model, optimizer, schedule, checkpoints (restored), preemption, data: everything the loop drives."""
    cfg, training, device = run.config, run.config.training, layout.device
    # the batch arithmetic follows the resolved layout (auto's tensor parallelism and its accumulation)
    global_batch = replace(cfg, distributed=layout.distributed).effective_batch_size(layout.world_size)
    wrapper, model, source = build_and_wrap(cfg, layout)
    reporter.init_memory([r.as_dict() for r in gather_init_memory(model, device, layout.rank)])

    peak_lr = peak_learning_rate(training, global_batch)
    optimizer = adamw(model, training, peak_lr, device, layout.layout)
    schedule = WarmupCosine.from_config(training)
    scheduler = LambdaLR(optimizer, schedule)
    fp16 = layout.distributed.mixed_precision_policy == "fp16" and device.type == "cuda"
    scaler = GradScaler("cuda") if fp16 else None
    accumulator = GradientAccumulator(layout.micro_batches(cfg), scaler, model=model, max_grad_norm=training.grad_clip,
                                      pipeline_group=wrapper.pipeline_group)
    pipeline = wrapper if isinstance(wrapper, PipelineWrapper) else None
    whole = whole_model(pipeline) if pipeline else None
    state = TrainState(model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler, whole=whole)
    # the whole model's: a pipeline rank holds only its stages'
    parameters = (sum(math.prod(whole.shapes[name]) for name in pipeline.whole_parameters) if pipeline
                  else sum(p.numel() for p in model.parameters()))
    ckpt, preemption = _checkpoints(run, layout, parameters, source, watchdog, cleanup)
    if ckpt.restore(state) is not None:
        follow_config(scheduler, schedule, peak_lr)
    cadence = Cadence.for_run(cfg.checkpoint, reporter.goodput.ledger if reporter.active else None, last_save=state.step)
    batches, evaluator, sample_log = _data(run, layout, wrapper, state.sample_index)
    _started(cfg, layout, wrapper, reporter, state.step, global_batch, parameters)
    return Trainer(wrapper=wrapper, model=model, optimizer=optimizer, scheduler=scheduler, accumulator=accumulator,
                   state=state, ckpt=ckpt, preemption=preemption, cadence=cadence, batches=batches, evaluator=evaluator,
                   sample_log=sample_log, device=device, global_batch=global_batch)


def _checkpoints(run: Run, layout: RunLayout, parameters: int, source: Optional[WeightSource], watchdog: Watchdog,
                 cleanup: contextlib.ExitStack) -> tuple[CheckpointManager, Preemption]:
    """The checkpoint manager and the preemption vote, each undone by `cleanup`."""
    cfg = run.config
    ckpt = CheckpointManager(cfg.checkpoint, rank=layout.rank, world_size=layout.world_size,
                             config_hash=cfg.config_hash(), manifest_fields=manifest_fields(cfg, source),
                             save_guard=watchdog.checkpointing, checkpoint_bytes=checkpoint_bytes(parameters))
    # After finish() or a preemption it is closed already; after an error this does not wait for a save in flight,
    # and releases the checkpoint lease as finish() does (a run that ended holds no volume).
    cleanup.callback(ckpt.close, wait=False)
    # Before the restore: a SIGTERM from here on is answered at the first vote, with a checkpoint.
    preemption = Preemption(cfg.checkpoint, rank=layout.rank, group=ckpt.group, request_file=run.checkpoint_request,
                            profile_file=run.profile_request)
    cleanup.callback(preemption.close)  # SIGTERM gets its meaning back after an error
    return ckpt, preemption


def _data(run: Run, layout: RunLayout, wrapper: ProcessGroupUser,
          sample_index: int) -> tuple[Iterator[tuple[torch.Tensor, torch.Tensor]], Optional[Evaluator], SampleLog]:
    """This rank's batches from `sample_index` on, the held-out evaluation (None without a validation split) and the
    sample log."""
    training, rank, parallel = run.config.training, layout.rank, layout.layout
    # Batches are dealt by data-parallel rank: the tp ranks of a group and the stages of a pipeline read the same
    # ones, logged once (by the first stage's first tp rank) and counted once in evaluation (by the last stage's).
    reads_first = parallel.tp_rank(rank) == 0 and parallel.pp_rank(rank) == 0
    sample_log = SampleLog.from_env(rank) if reads_first else SampleLog(None, rank)
    loader = RankAwareDataLoader(sample_log.wrap(run.dataset), layout.distributed,
                                 micro_batch_size=training.micro_batch_size, rank=layout.dp_rank, world_size=parallel.dp,
                                 seed=training.seed, start_index=sample_index, num_workers=run.config.data.num_workers)
    evaluator = None if run.held_out is None else held_out(run.held_out, training.micro_batch_size,
                                                           training.eval_steps, layout, wrapper)
    return iter(loader), evaluator, sample_log


def model_flops_per_token(cfg: TrainerConfig, parameters: int) -> int:
    """Training FLOPs per token for MFU: counted on the model (model/flop_count.py), else 6 x parameters."""
    counted = counted_flops_per_token(cfg.model, cfg.training.seq_len, loss_fn)
    return six_n_flops_per_token(parameters) if counted is None else counted


def _started(cfg: TrainerConfig, layout: RunLayout, wrapper: ProcessGroupUser, reporter: Reporter, step: int,
             global_batch: int, parameters: int) -> None:
    """The reporter told the run's shape; rank 0 logs it, every pipeline rank its stages."""
    training, dist_cfg, parallel, rank, device = cfg.training, layout.distributed, layout.layout, layout.rank, layout.device
    preset = cfg.model.entrypoint or cfg.model.preset
    # Only rank 0 reports MFU; counting takes a pass over the model on the meta device.
    flops_per_token = model_flops_per_token(cfg, parameters) if reporter.active else 0
    reporter.started(step, tokens_per_step=global_batch * training.seq_len, flops_per_token=flops_per_token,
                     peak_flops=peak_flops(torch.cuda.get_device_name(device) if device.type == "cuda" else None,
                                           cfg.metrics.peak_flops),
                     world_size=layout.world_size, info={"version": __version__, "preset": preset,
                                                         "strategy": dist_cfg.strategy,
                                                         "world_size": str(layout.world_size)},
                     compiling=wrapper.compile_backend is not None)
    if rank == 0:
        log.info(
            "training %s with %s on %d rank(s) (tensor parallel %d, pipeline parallel %d), %s: micro-batch %d x %d "
            "accumulation x %d data-parallel ranks = %d sequences/step, from step %d",
            preset, dist_cfg.strategy, layout.world_size, parallel.tp, parallel.pp, device.type,
            training.micro_batch_size, layout.micro_batches(cfg), parallel.dp, global_batch, step,
        )
        log.info("model FLOPs per token: %.3g at sequence length %d (6 x parameters: %.3g)", flops_per_token,
                 training.seq_len, six_n_flops_per_token(parameters))
    if isinstance(wrapper, PipelineWrapper):
        log.info("rank %d: pipeline parallel %d x data parallel %d x tensor parallel %d, schedule %s, %d stage(s) per "
                 "rank; this rank runs %s", rank, parallel.pp, parallel.dp, parallel.tp, dist_cfg.pipeline_schedule,
                 parallel.stages_per_rank, "; ".join(f"stage {stage.index}: {', '.join(stage.names)}"
                                                     for stage in wrapper.stages))
