"""The training loop: `train(cfg)` under torchrun, SLURM, a manual launch, or alone.

DistributedLauncher -> process group -> the run's layout (strategy, mesh) ->
model -> DDPWrapper / FSDPWrapper -> optimizer and schedule -> checkpoint
restore -> RankAwareDataLoader -> loop (GradientAccumulator) -> final save.
The seed's public classes are this path (docs/architecture.md, "The
trainer"); assemble.py builds the pieces, this module is the algorithm.

The loop keeps the running loss on the device and synchronises with the host
only at logging steps (every `training.log_interval` steps). What happens
around a step belongs to others: the wrapper runs its forward and backward
passes (`train_step`, whatever the layout), the reporter keeps the books and
publishes (observe/), the watchdog times steps, the preemption vote, the
checkpoint cadence and the checkpoint manager decide on saves (boundary.py).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist

from ..checkpoint import CheckpointManager
from ..config import TrainerConfig
from ..contract import OUT_OF_MEMORY
from ..data.loader import build_dataset
from ..data.tokens.source import token_source
from ..observe.memory_report import out_of_memory_line, peak_memory_bytes
from ..observe.reporter import Books, Reporter
from ..parallel.ddp import ensure_process_group, use_local_device
from ..parallel.launcher import DistributedLauncher
from ..parallel.run_layout import Ranks, RunLayout
from ..resilience.failures import Fatal, say
from ..resilience.preflight import run_preflight
from ..resilience.watchdog import Watchdog
from . import boundary
from .assemble import Run, Trainer, assemble
from .evaluation import due


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


def committed_step(ckpt: CheckpointManager) -> Optional[int]:
    return ckpt.last_committed[0] if ckpt.last_committed else None


def train(cfg: TrainerConfig, *, checkpoint_request: Optional[Path] = None, started: Optional[float] = None,
          restarted_after: Optional[str] = None, profile_request: Optional[Path] = None) -> TrainResult:
    """Train as configured; returns on every rank once the last step is saved.

    DistributedLauncher exports the torch variables for whichever launcher
    started this process, then runs the loop here. A new content of the
    `checkpoint_request` file asks for a checkpoint at the next vote
    (contract.CHECKPOINT_REQUEST_FILE), of the `profile_request` file a profile of
    the steps after it (contract.PROFILE_REQUEST_FILE). `started` (time.time()) is when this
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
              restarted_after=restarted_after, profile_request=profile_request)
    return DistributedLauncher(cfg.distributed).launch(_launched, run)


def _launched(run: Run) -> TrainResult:
    cfg = run.config
    ranks = Ranks.from_environment()  # once: the run's layout carries them from here on
    device = use_local_device()
    with contextlib.ExitStack() as cleanup:  # undone in reverse order, whatever happens
        if ensure_process_group(cfg.distributed, ranks.rank, ranks.world_size):
            cleanup.callback(dist.destroy_process_group)
        # A rank that never joins, or a network the collectives cannot cross, is network-error now, not stalled later.
        run_preflight(cfg.distributed.preflight_seconds, ranks.rank, ranks.world_size, device,
                      ranks_per_node=ranks.local_world_size)
        # From here on a rank that hangs (on a peer, a collective, storage) ends itself (watchdog.py).
        watchdog = Watchdog(cfg.watchdog)
        cleanup.callback(watchdog.close)
        reporter = Reporter(cfg, ranks.rank, run.started, restarted_after=run.restarted_after)
        cleanup.callback(reporter.close)
        try:
            layout = RunLayout.resolved(cfg, ranks, device)  # the strategy, pp x dp x tp and the mesh: built once
            return _trained(run, layout, reporter, watchdog, cleanup)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:
            say(exc, str(ranks.rank))  # before the cleanup unwinds (failures.say)
            raise


def _trained(run: Run, layout: RunLayout, reporter: Reporter, watchdog: Watchdog,
             cleanup: contextlib.ExitStack) -> TrainResult:
    """The pieces built, then the loop; running out of memory says what the planner expected at this layout."""
    try:
        trainer = assemble(run, layout, reporter, watchdog, cleanup)
        return _loop(trainer, run.config, reporter, watchdog)
    except (MemoryError, torch.OutOfMemoryError) as exc:
        line = out_of_memory_line(exc, layout.memory_estimate(run.config), layout.device, layout.rank)
        raise Fatal(OUT_OF_MEMORY, line) from exc


def _loop(t: Trainer, cfg: TrainerConfig, reporter: Reporter, watchdog: Watchdog) -> TrainResult:
    """Optimizer steps until `training.steps` (the wrapper's forward and backward passes over each step's
    micro-batches, then the optimizer), then the final save."""
    training, state, ckpt = cfg.training, t.state, t.ckpt
    t.model.train()
    running_loss = torch.zeros((), device=t.device)  # summed on device: no host sync between logging steps
    micro_losses = 0
    while state.step < training.steps:
        micro_losses += t.wrapper.train_step(t.batches, t.accumulator, running_loss)
        t.accumulator.apply(t.optimizer)
        t.scheduler.step()
        state.step += 1
        state.sample_index += t.global_batch
        t.sample_log.record(state.step)
        watchdog.stepped(state.step)
        profile_steps = boundary.after_step(state, ckpt, t.preemption, t.cadence)
        reporter.stepped(state.step, ckpt.stall_total_s)
        if profile_steps:
            reporter.profile_now(state.step, profile_steps)
        if t.evaluator is not None and due(state.step, training):
            began = time.perf_counter()
            with watchdog.evaluating():
                result = t.evaluator(t.model, forward=t.wrapper.logits)
            reporter.evaluated(state.step, result.loss, result.perplexity, result.tokens, time.perf_counter() - began)
        if not training.logs_at(state.step):
            continue
        reporter.logged(state.step, t.wrapper.all_reduce_loss(running_loss.item(), micro_losses),
                        lr=t.scheduler.get_last_lr()[0], grad_norm=t.accumulator.last_grad_norm,
                        peak_memory=peak_memory_bytes(t.device), last_checkpoint_step=committed_step(ckpt),
                        answered=ckpt.answered, checkpoint_interval=t.cadence.interval)
        running_loss.zero_()
        micro_losses = 0
    reporter.loop_ended(state.step)
    boundary.finish(state, ckpt, t.preemption)
    return _result(t, training.seq_len, reporter.finished(last_checkpoint_step=committed_step(ckpt),
                                                          answered=ckpt.answered))


def _result(t: Trainer, seq_len: int, books: Books) -> TrainResult:
    """What `train` returns, from the reporter's books."""
    training_seconds = books.loop_seconds - books.eval_seconds
    return TrainResult(
        step=t.state.step,
        loss=books.history[-1][1] if books.history else float("nan"),
        tokens_per_second=books.steps * t.global_batch * seq_len / training_seconds if books.steps else 0.0,
        wall_seconds=books.loop_seconds,
        history=books.history,
        eval_history=books.eval_history,
        windows=books.windows,
    )
