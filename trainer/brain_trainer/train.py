"""The training loop: `train(cfg)` under torchrun, SLURM, a manual launch, or alone.

DistributedLauncher -> process group -> strategy -> model -> DDPWrapper /
FSDPWrapper -> optimizer and schedule -> checkpoint restore ->
RankAwareDataLoader -> loop (GradientAccumulator) -> final save. The seed's
public classes are this path (docs/architecture.md, "The trainer").

The loop keeps the running loss on the device and synchronises with the host
only at logging steps (every `training.log_interval` steps), where rank 0
logs, writes the progress document and publishes metrics.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from argparse import Namespace
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.amp import GradScaler
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import Dataset

from .accumulation import GradientAccumulator
from .checkpoint import CheckpointManager, SampleLog, TrainState
from .config import DistributedConfig, TrainerConfig
from .contract import OUT_OF_MEMORY, PROGRESS_FILE_ENV, RUN_ID_ENV, Goodput, Progress, eta_seconds, format_time
from .data import RankAwareDataLoader, build_dataset
from .ddp import DDPWrapper, ProcessGroupUser, SingleDeviceWrapper, ensure_process_group, use_local_device
from .failures import Fatal
from .evaluation import EvalResult, Evaluator, due
from .flops import mfu, peak_flops, training_flops_per_token
from .fsdp import FSDPWrapper
from .goodput import CHECKPOINT, EVALUATION, INITIALIZATION
from .goodput_log import GoodputLog
from .launcher import DistributedLauncher
from .memory import checkpoint_bytes, rank_estimate, resolve_distributed
from .metrics import start_metrics_server
from .init_from import WeightSource, manifest_fields, open_source
from .materialize import Initializer, build, is_meta
from .memory_report import InitMemory, gather_init_memory, out_of_memory_line, peak_host_bytes
from .progress import write_progress
from .schedule import WarmupCosine, follow_config, peak_learning_rate
from .schema import ConfigError, FieldError
from .tokens.source import token_source
from .version import __version__
from .watchdog import Watchdog
from .young_daly import choose_mtbf

if TYPE_CHECKING:
    from .board import Scalars

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


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy, computed in fp32 whatever the autocast dtype."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Weight decay on matrices and embeddings (>= 2-D) only, never on biases and norm gains."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]


def device_memory_bytes(device: torch.device) -> Optional[int]:
    """Accelerator memory for the planner; None on CPU, where host memory is shared and unknown."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return None


def resolve_strategy(cfg: TrainerConfig, world_size: int, device: torch.device) -> DistributedConfig:
    """The distributed settings with `strategy: auto` replaced by the planner's choice."""
    resolved = resolve_distributed(cfg, world_size, device_memory_bytes(device))
    if resolved.strategy == "single" and world_size > 1:
        raise ConfigError(
            [FieldError("distributed.strategy", f"single trains one process, but the world size is {world_size}; use ddp or fsdp")]
        )
    return resolved


WRAPPERS = {"single": SingleDeviceWrapper, "ddp": DDPWrapper, "fsdp": FSDPWrapper}


def make_wrapper(model: nn.Module, dist_cfg: DistributedConfig, *, compile_backend: Optional[str] = None) -> ProcessGroupUser:
    """The seed's wrapper for a resolved strategy: SingleDeviceWrapper, DDPWrapper or FSDPWrapper."""
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
    compile_backend = "inductor" if cfg.training.compile and device.type == "cuda" else None
    wrapper = make_wrapper(model, dist_cfg, compile_backend=compile_backend)
    model = wrapper.setup(rank, world_size, materialize=Initializer(cfg.training.seed) if is_meta(model) else None)
    if source is not None:
        source.load_into(model)
    return wrapper, model, source


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


class Reporter:
    """Rank 0's outputs at logging steps: the log line, the progress document, the metrics endpoint, TensorBoard."""

    def __init__(self, cfg: TrainerConfig, rank: int):
        self.active = rank == 0
        self.total_steps = cfg.training.steps
        self.progress_path = os.environ.get(PROGRESS_FILE_ENV) if self.active else None
        self.metrics = start_metrics_server(cfg.metrics.port) if self.active else None
        self.tensorboard_dir = cfg.metrics.tensorboard_dir if self.active else None
        self.scalars: Optional[Scalars] = None
        self.last: Optional[Progress] = None
        self.eval_loss: Optional[float] = None

    def started(self, step: int, **info: str) -> None:
        """Once the run is set up at `step`: brain_trainer_info, and TensorBoard from the next step on."""
        if self.metrics is not None:
            self.metrics.describe(**info)
        if self.tensorboard_dir:
            from .board import Scalars  # imports tensorboard: only for runs that write it

            self.scalars = Scalars(self.tensorboard_dir, first_step=step + 1)

    def report(self, step: int, loss: float, *, tokens_per_second: float, step_times: list[float], tokens: int,
               lr: float, last_checkpoint_step: Optional[int], peak_memory: int, grad_norm: float,
               mfu: Optional[float], answered: Optional[tuple[str, int]], goodput: Goodput, restarts: int,
               checkpoint_interval: int) -> None:
        if not self.active:
            return
        step_time = sum(step_times) / len(step_times)
        log.info(
            "step %d/%d loss %.4f tokens/s %.0f step_time %.3fs lr %.3e",
            step, self.total_steps, loss, tokens_per_second, step_time, lr,
        )
        self._publish(
            Progress(
                step=step,
                total_steps=self.total_steps,
                loss=loss,
                tokens_per_second=tokens_per_second,
                eta_seconds=eta_seconds(step, self.total_steps, step_time),
                last_checkpoint_step=last_checkpoint_step,
                eval_loss=self.eval_loss,
                **_answered(answered),
                goodput=goodput,
                restarts=restarts,
                checkpoint_interval_steps=checkpoint_interval,
                updated_at=format_time(),
            ),
            step_times=step_times,
            tokens=tokens,
            learning_rate=lr,
            peak_memory_bytes=peak_memory,
            grad_norm=grad_norm,
            mfu=mfu,
        )
        if self.scalars is not None:
            self.scalars.write(step, loss=loss, learning_rate=lr, tokens_per_second=tokens_per_second,
                               grad_norm=grad_norm, mfu=mfu, goodput=goodput.ratio)

    def evaluated(self, step: int, result: EvalResult) -> None:
        """An evaluation's result: logged, and in the progress document from now on."""
        if not self.active:
            return
        log.info("eval step %d/%d loss %.4f perplexity %.2f (%d tokens)", step, self.total_steps, result.loss,
                 result.perplexity, result.tokens)
        self.eval_loss = result.loss
        if self.last is not None:
            self._publish(replace(self.last, eval_loss=result.loss, updated_at=format_time()))
        if self.scalars is not None:
            self.scalars.write(step, eval_loss=result.loss)

    def init_memory(self, ranks: list[InitMemory]) -> None:
        """Every rank's memory after initialisation, on the metrics endpoint."""
        if self.metrics is not None:
            self.metrics.publish_init_memory([r.as_dict() for r in ranks])

    def checkpointed(self, step: Optional[int], answered: Optional[tuple[str, int]], goodput: Goodput) -> None:
        """Re-publish the last progress once the final checkpoint is committed, with the final goodput."""
        if self.active and self.last is not None:
            self._publish(replace(self.last, last_checkpoint_step=step, **_answered(answered), goodput=goodput,
                                  updated_at=format_time()))

    def _publish(self, progress: Progress, **extras: Any) -> None:
        self.last = progress
        if self.progress_path:
            try:
                write_progress(self.progress_path, progress)
            except OSError as exc:  # like the metrics endpoint, progress reporting never stops training
                log.warning("cannot write the progress document %s: %s", self.progress_path, exc.strerror or exc)
        if self.metrics is not None:
            self.metrics.publish(progress, **extras)

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
        if self.scalars is not None:
            self.scalars.close()


def _answered(answered: Optional[tuple[str, int]]) -> dict[str, Any]:
    """The progress fields of the newest checkpoint request answered."""
    return {} if answered is None else {"checkpoint_request": answered[0], "checkpoint_request_step": answered[1]}


def train(cfg: TrainerConfig, *, checkpoint_request: Optional[Path] = None, started: Optional[float] = None) -> TrainResult:
    """Train as configured; returns on every rank once the last step is saved.

    DistributedLauncher exports the torch variables for whichever launcher
    started this process, then runs the loop here. A new content of the
    `checkpoint_request` file asks for a checkpoint at the next vote
    (contract.CHECKPOINT_REQUEST_FILE). `started` (time.time()) is when this
    trainer process began, for the goodput ledger; default: now.
    """
    started = time.time() if started is None else started
    cfg = cfg.resolved()
    # Build the datasets first: a bad data.path (or a vocabulary that does not match it) fails before any rendezvous.
    dataset = build_dataset(cfg.data, cfg.training.seq_len, cfg.training.seed)
    held_out = None
    if cfg.data.source == "tokens":
        cfg, held_out = token_source(cfg, dataset)
    args = Namespace(config=cfg, dataset=dataset, held_out=held_out, checkpoint_request=checkpoint_request,
                     started=started)
    return DistributedLauncher(cfg.distributed).launch(_launched, args)


def _launched(args: Namespace) -> TrainResult:
    cfg: TrainerConfig = args.config
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = use_local_device()
    with contextlib.ExitStack() as cleanup:  # undone in reverse order, whatever happens
        if ensure_process_group(cfg.distributed, rank, world_size):
            cleanup.callback(dist.destroy_process_group)
        # From here on a rank that hangs (on a peer, a collective, storage) ends itself (watchdog.py).
        watchdog = Watchdog(cfg.watchdog)
        cleanup.callback(watchdog.close)
        reporter = Reporter(cfg, rank)
        cleanup.callback(reporter.close)
        try:
            return _run(args, rank, world_size, device, reporter, watchdog, cleanup)
        except (MemoryError, torch.OutOfMemoryError) as exc:
            estimate = rank_estimate(cfg, resolve_strategy(cfg, world_size, device), world_size,
                                     node_size=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
                                     accelerator=device.type == "cuda")
            raise Fatal(OUT_OF_MEMORY, out_of_memory_line(exc, estimate, device, rank)) from exc


def _run(args: Namespace, rank: int, world_size: int, device: torch.device, reporter: Reporter, watchdog: Watchdog,
         cleanup: contextlib.ExitStack) -> TrainResult:
    cfg: TrainerConfig = args.config
    held_out: Optional[Dataset] = args.held_out
    training = cfg.training
    dist_cfg = resolve_strategy(cfg, world_size, device)
    accumulation = cfg.accumulation_steps(world_size)
    global_batch = cfg.effective_batch_size(world_size)
    tokens_per_step = global_batch * training.seq_len
    # Rank 0 keeps the run's ledger beside the checkpoints, which outlive this trainer (goodput.py); written at
    # once, so this start counts as a restart of the run even if it dies before its first step.
    ledger_folder = Path(cfg.checkpoint.dir) if rank == 0 and cfg.checkpoint.enabled else None
    goodput = GoodputLog(ledger_folder, os.environ.get(RUN_ID_ENV, ""), args.started)
    goodput.save()

    wrapper, model, source = build_and_wrap(cfg, dist_cfg, rank, world_size, device)
    reporter.init_memory(gather_init_memory(model, device, rank))

    peak_lr = peak_learning_rate(training, global_batch)
    optimizer = torch.optim.AdamW(
        param_groups(model, training.weight_decay),
        lr=peak_lr,
        betas=ADAMW_BETAS,
        fused=True if device.type == "cuda" else None,  # one kernel for all parameters on GPU
    )
    schedule = WarmupCosine.from_config(training)
    scheduler = LambdaLR(optimizer, schedule)
    fp16_cuda = dist_cfg.mixed_precision_policy == "fp16" and device.type == "cuda"
    scaler = GradScaler("cuda") if fp16_cuda else None
    acc = GradientAccumulator(accumulation, scaler, model=model, max_grad_norm=training.grad_clip)

    state = TrainState(model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler)
    ckpt = CheckpointManager(cfg.checkpoint, rank=rank, world_size=world_size, config_hash=cfg.config_hash(),
                             manifest_fields=manifest_fields(cfg.model, source), save_guard=watchdog.checkpointing,
                             request_file=args.checkpoint_request,
                             checkpoint_bytes=checkpoint_bytes(sum(p.numel() for p in model.parameters())))
    # After finish() or a preemption it is closed already; after an error this
    # gives SIGTERM back its default meaning without waiting for a save in flight.
    cleanup.callback(ckpt.close, wait=False)
    if ckpt.restore(state) is not None:
        follow_config(scheduler, schedule, peak_lr)
    if rank == 0:  # the vote shares rank 0's figure: only its ledger knows the run's failures
        ledger = goodput.ledger
        ckpt.mtbf_s, ckpt.mtbf_source = choose_mtbf(cfg.checkpoint.mtbf_minutes, ledger.wall_seconds, ledger.restarts)
    reporter.started(state.step, version=__version__, preset=cfg.model.entrypoint or cfg.model.preset,
                     strategy=dist_cfg.strategy, world_size=str(world_size))
    flops_per_token = training_flops_per_token(sum(p.numel() for p in model.parameters()))
    peak = peak_flops(torch.cuda.get_device_name(device) if device.type == "cuda" else None, cfg.metrics.peak_flops)
    sample_log = SampleLog.from_env(rank)
    dataset = sample_log.wrap(args.dataset)

    loader = RankAwareDataLoader(
        dataset,
        dist_cfg,
        micro_batch_size=training.micro_batch_size,
        rank=rank,
        world_size=world_size,
        seed=training.seed,
        start_index=state.sample_index,
        num_workers=cfg.data.num_workers,
    )
    batches = iter(loader)
    evaluator = None if held_out is None else Evaluator(
        held_out, training.micro_batch_size, training.eval_steps, rank, world_size, device,
        lambda: autocast_context(dist_cfg.mixed_precision_policy, device),
    )
    if rank == 0:
        log.info(
            "training %s with %s on %d rank(s), %s: micro-batch %d x %d accumulation x %d ranks = %d sequences/step, from step %d",
            cfg.model.entrypoint or cfg.model.preset, dist_cfg.strategy, world_size, device.type,
            training.micro_batch_size, accumulation, world_size, global_batch, state.step,
        )

    goodput.record(INITIALIZATION, time.time() - args.started)
    stalled = ckpt.stall_total_s

    model.train()
    running_loss = torch.zeros((), device=device)  # summed on device: no host sync between logging steps
    micro_losses = 0
    history: list[tuple[int, float]] = []
    eval_history: list[tuple[int, float]] = []
    eval_seconds = 0.0
    first_step = last_log_step = state.step
    start = last_log_time = last_step_time = time.perf_counter()
    step_times: list[float] = []  # of the steps since the last logging step
    micro_idx = 0
    while state.step < training.steps:
        x, y = next(batches)
        x = x.to(device, non_blocking=True)
        y = y.to(device, non_blocking=True)
        with acc.sync_context(micro_idx):
            with autocast_context(dist_cfg.mixed_precision_policy, device):
                loss = loss_fn(model(x), y)
            stepped = acc.step(loss, optimizer, micro_idx)
        running_loss += loss.detach()
        micro_losses += 1
        micro_idx += 1
        if not stepped:
            continue
        micro_idx = 0
        scheduler.step()
        state.step += 1
        state.sample_index += global_batch
        sample_log.record(state.step)
        watchdog.stepped(state.step)
        ckpt.after_step(state)
        now = time.perf_counter()
        step_times.append(now - last_step_time)
        goodput.step(state.step, step_times[-1] - (ckpt.stall_total_s - stalled))
        goodput.record(CHECKPOINT, ckpt.stall_total_s - stalled)
        if evaluator is not None and due(state.step, training):
            began = time.perf_counter()
            with watchdog.evaluating():
                result = evaluator(model)
            reporter.evaluated(state.step, result)
            eval_history.append((state.step, result.loss))
            spent = time.perf_counter() - began
            eval_seconds += spent
            last_log_time += spent  # throughput counts training only
            goodput.record(EVALUATION, spent)
            now = time.perf_counter()  # the next step's time starts after the evaluation
        logging_step = not state.step % training.log_interval or state.step == training.steps
        goodput.save(force=logging_step)
        last_step_time, stalled = now, ckpt.stall_total_s
        if not logging_step:
            continue
        mean_loss = wrapper.all_reduce_metrics({"loss": running_loss.item() / micro_losses})["loss"]
        now = time.perf_counter()
        steps = state.step - last_log_step
        tokens_per_second = tokens_per_step * steps / (now - last_log_time)
        reporter.report(
            state.step, mean_loss, tokens_per_second=tokens_per_second, step_times=step_times,
            tokens=tokens_per_step * steps, lr=scheduler.get_last_lr()[0], last_checkpoint_step=committed_step(ckpt),
            peak_memory=peak_memory_bytes(device), grad_norm=acc.last_grad_norm,
            mfu=mfu(tokens_per_second, flops_per_token, peak, world_size), answered=ckpt.answered,
            goodput=goodput.summary(), restarts=goodput.ledger.restarts, checkpoint_interval=ckpt.interval,
        )
        history.append((state.step, mean_loss))
        running_loss.zero_()
        micro_losses = 0
        step_times = []
        last_log_step, last_log_time = state.step, now
    loop_seconds = time.perf_counter() - start
    ckpt.finish(state)
    goodput.record(CHECKPOINT, time.perf_counter() - start - loop_seconds)
    goodput.save()
    reporter.checkpointed(committed_step(ckpt), ckpt.answered, goodput.summary())
    steps_run = state.step - first_step
    return TrainResult(
        step=state.step,
        loss=history[-1][1] if history else float("nan"),
        tokens_per_second=steps_run * tokens_per_step / (loop_seconds - eval_seconds) if steps_run else 0.0,
        wall_seconds=loop_seconds,
        history=history,
        eval_history=eval_history,
    )
