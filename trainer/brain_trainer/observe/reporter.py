"""Rank 0's outputs, and the books they are made from: the loop tells what happened, in plain numbers.

Every rank keeps the clocks (its TrainResult says its own throughput); rank 0
alone keeps the goodput ledger (goodput_log.py, beside the checkpoints) and
publishes: the log line, the progress document, the metrics endpoint (MFU
from flops.py), TensorBoard and the experiment trackers (trackers.py).

    reporter = Reporter(cfg, rank, started)       # the ledger counts this start at once
    reporter.started(step, ...)                   # set up: initialisation time ends here (compiled: after a step)
    per step:          reporter.stepped(step, checkpoint_total_s)
    per evaluation:    reporter.evaluated(step, loss, perplexity, tokens, seconds)
    per logging step:  reporter.logged(step, loss, ...)
    at the end:        reporter.loop_ended(step); the final save; reporter.finished(...)
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from ..config import TrainerConfig
from ..contract import PROGRESS_FILE_ENV, RUN_ID_ENV, Progress, eta_seconds, format_time, job_name, restart_count
from .flops import mfu
from .goodput import CHECKPOINT, EVALUATION, INITIALIZATION, Ledger
from .goodput_log import GoodputLog
from .metrics import start_metrics_server
from .progress import write_progress

if TYPE_CHECKING:
    from .board import Scalars
    from .profiling import StepProfiler
    from .trackers import Trackers

log = logging.getLogger(__name__)

Answered = Optional[tuple[str, int]]  # the newest checkpoint request whose checkpoint is committed, and its step


@dataclass
class Books:
    """What this rank's loop did, for its TrainResult."""

    first_step: int = 0
    steps: int = 0  # optimizer steps this process ran
    loop_seconds: float = 0.0  # first step to the final save
    eval_seconds: float = 0.0
    history: list[tuple[int, float]] = field(default_factory=list)  # (step, loss) at each logging step
    eval_history: list[tuple[int, float]] = field(default_factory=list)  # (step, held-out loss) at each evaluation
    # (logging step, steps since the previous one, their training seconds): the loop's throughput windows; each
    # edge is a logging step, where the loss is read back from the device, so an accelerator has caught up there
    windows: list[tuple[int, int, float]] = field(default_factory=list)


class Reporter:
    """Created once per rank before anything can fail; `close` in any case."""

    def __init__(self, cfg: TrainerConfig, rank: int, started: float, restarted_after: Optional[str] = None):
        self.active = rank == 0
        self.training = cfg.training
        self.progress_path = os.environ.get(PROGRESS_FILE_ENV) if self.active else None
        self.metrics = start_metrics_server(cfg.metrics.port, cfg.metrics.bind_address) if self.active else None
        self.tensorboard_dir = cfg.metrics.tensorboard_dir if self.active else None
        self._cfg, self._rank = cfg, rank
        self.profiler: Optional[StepProfiler] = None  # only for a run that asks for a profile
        self.sinks: list[Scalars | Trackers] = []  # TensorBoard and the trackers: each writes the same scalars
        self.last: Optional[Progress] = None
        self.eval_loss: Optional[float] = None
        # The run's ledger lives beside the checkpoints, which outlive this trainer; written at once, so this start
        # counts as a restart of the run even if it dies before its first step.
        # (On a bucket it is kept in memory only: checkpoint.local_folder is None.)
        folder = self._folder = cfg.checkpoint.local_folder() if self.active and cfg.checkpoint.enabled else None
        # torchrun restarts its workers in place: which torchrun, and its restart count, tell the in-pod restarts.
        self.goodput = GoodputLog(folder, os.environ.get(RUN_ID_ENV, ""), started,
                                  agent=torchrun_agent() if self.active else "", agent_restarts=restart_count(),
                                  restarted_after=restarted_after)
        self.goodput.save()
        if self.active and restarted_after is not None:
            log.warning("torchrun restarted the workers in this pod (%d in-pod restart(s) of the run) after %s",
                        self.goodput.ledger.in_pod_restarts, restarted_after)
        self._started = started
        self.books = Books()
        self._tokens_per_step = 0
        self._flops_per_token = 0.0
        self._peak_flops: Optional[float] = None
        self._world_size = 1
        self._loop_start = self._loop_end = self._last_step_time = self._last_log_time = 0.0
        self._last_log_step = 0
        self._step_times: list[float] = []  # of the steps since the last logging step
        self._checkpoint_s = 0.0  # the loop's total wait for saves when the latest step ended
        self._compiling = False  # the next step compiles the blocks: the ledger counts it as initialization

    def started(self, step: int, *, tokens_per_step: int, flops_per_token: float, peak_flops: Optional[float],
                world_size: int, info: dict[str, str], compiling: bool = False) -> None:
        """Set up, about to compute `step` + 1: initialisation ends, brain_trainer_info, TensorBoard and the
        trackers from here.

        `compiling`: the blocks compile at their first call, so initialisation ends after the next step.
        """
        self.goodput.record(INITIALIZATION, time.time() - self._started)
        self._compiling = compiling
        self._tokens_per_step, self._flops_per_token = tokens_per_step, flops_per_token
        self._peak_flops, self._world_size = peak_flops, world_size
        self.books.first_step = self._last_log_step = step
        self._loop_start = self._last_step_time = self._last_log_time = time.perf_counter()
        if self.metrics is not None:
            self.metrics.describe(**info)  # brain_trainer_info
        if self.tensorboard_dir:
            from .board import Scalars  # imports tensorboard: only for runs that write it

            self.sinks.append(Scalars(self.tensorboard_dir, first_step=step + 1))
        if self.active and self._cfg.metrics.trackers:
            self.sinks.append(self._trackers())
        if self._cfg.profiling.start_step is not None:
            from .profiling import StepProfiler  # imports torch.profiler: only for runs that profile

            self.profiler = StepProfiler(self._cfg.profiling, self._profiles_root(), self._rank, step)

    def stepped(self, step: int, checkpoint_total_s: float) -> None:
        """An optimizer step ended; `checkpoint_total_s`: all the loop has waited for saves so far."""
        now = time.perf_counter()
        seconds = now - self._last_step_time
        self._step_times.append(seconds)
        self._last_step_time = now
        if self.active:  # only rank 0's ledger is kept
            waited = checkpoint_total_s - self._checkpoint_s
            self.goodput.step(step, seconds - waited, INITIALIZATION if self._compiling else None)
            self.goodput.record(CHECKPOINT, waited)
            self.goodput.save(force=self.training.logs_at(step))
        self._checkpoint_s = checkpoint_total_s
        self._compiling = False
        if self.profiler is not None:
            self.profiler.stepped(step)

    def _profiles_root(self) -> Path:
        """Where profiles go: beside the checkpoints on a volume, the working folder when they are on a bucket."""
        return self._cfg.checkpoint.local_folder() or Path.cwd()

    def profile_now(self, step: int, steps: int) -> None:
        """The ranks agreed on a profile request at `step`: trace the `steps` steps after it, with spec.profiling's
        options, unless a profile is under way (or still to come) already."""
        if self.profiler is not None and self.profiler.busy:
            if self.active:
                log.warning("profile request at step %d ignored: the profile in %s is not written yet", step,
                            self.profiler.folder)
            return
        from .profiling import StepProfiler  # imports torch.profiler: only once a profile is asked for

        self.profiler = StepProfiler(replace(self._cfg.profiling, start_step=step + 1, steps=steps),
                                     self._profiles_root(), self._rank, step)
        if self.active:
            log.info("profiling steps %d-%d on every rank (requested): traces in %s/rank-*.json.gz", step + 1,
                     step + steps, self.profiler.folder)

    def evaluated(self, step: int, loss: float, perplexity: float, tokens: int, seconds: float) -> None:
        """An evaluation pass of `seconds` ran after `step`: logged, and in the progress document from now on."""
        self.books.eval_history.append((step, loss))
        self.books.eval_seconds += seconds
        self._last_log_time += seconds  # throughput counts training only
        self._last_step_time = time.perf_counter()  # the next step's time starts after the evaluation
        if not self.active:
            return
        self.goodput.record(EVALUATION, seconds)
        log.info("eval step %d/%d loss %.4f perplexity %.2f (%d tokens)", step, self.training.steps, loss, perplexity,
                 tokens)
        self.eval_loss = loss
        if self.last is not None:
            self._publish(replace(self.last, eval_loss=loss, updated_at=format_time()))
        for sink in self.sinks:
            sink.write(step, eval_loss=loss, eval_perplexity=perplexity)

    def logged(self, step: int, loss: float, *, lr: float, grad_norm: float, peak_memory: int,
               last_checkpoint_step: Optional[int], answered: Answered, checkpoint_interval: int) -> None:
        """A logging step: `loss` averaged over ranks since the previous one."""
        now = time.perf_counter()
        steps = step - self._last_log_step
        tokens_per_second = self._tokens_per_step * steps / (now - self._last_log_time)
        self.books.history.append((step, loss))
        self.books.windows.append((step, steps, now - self._last_log_time))
        step_times, self._step_times = self._step_times, []
        self._last_log_step, self._last_log_time = step, now
        if not self.active:
            return
        step_time = sum(step_times) / len(step_times)
        used = mfu(tokens_per_second, self._flops_per_token, self._peak_flops, self._world_size)
        log.info("step %d/%d loss %.4f tokens/s %.0f step_time %.3fs lr %.3e%s", step, self.training.steps, loss,
                 tokens_per_second, step_time, lr, "" if used is None else f" mfu {used:.1%}")
        goodput = self.goodput.summary()
        self._publish(
            Progress(step=step, total_steps=self.training.steps, loss=loss, tokens_per_second=tokens_per_second,
                     mfu=used,
                     eta_seconds=eta_seconds(step, self.training.steps, step_time),
                     last_checkpoint_step=last_checkpoint_step, eval_loss=self.eval_loss, **_answered(answered),
                     goodput=goodput, **_restarts(self.goodput.ledger),
                     checkpoint_interval_steps=checkpoint_interval, profile=self._profile(),
                     updated_at=format_time()),
            step_times=step_times, tokens=self._tokens_per_step * steps, learning_rate=lr,
            peak_memory_bytes=peak_memory, grad_norm=grad_norm, mfu=used,
        )
        for sink in self.sinks:
            sink.write(step, loss=loss, learning_rate=lr, tokens_per_second=tokens_per_second, grad_norm=grad_norm,
                       mfu=used, goodput=goodput.ratio)

    def init_memory(self, ranks: list[dict[str, Any]]) -> None:
        """Every rank's memory after initialisation, on the metrics endpoint."""
        if self.metrics is not None:
            self.metrics.publish_init_memory(ranks)

    def loop_ended(self, step: int) -> None:
        """The last step is done; the final save comes next."""
        self.books.steps = step - self.books.first_step
        self._loop_end = time.perf_counter()
        self.books.loop_seconds = self._loop_end - self._loop_start

    def finished(self, *, last_checkpoint_step: Optional[int], answered: Answered) -> Books:
        """The final checkpoint is committed: the last books, and the last progress with the final goodput."""
        if self.active:
            self.goodput.record(CHECKPOINT, time.perf_counter() - self._loop_end)
            self.goodput.save()
            if self.last is not None:
                self._publish(replace(self.last, last_checkpoint_step=last_checkpoint_step, **_answered(answered),
                                      goodput=self.goodput.summary(), updated_at=format_time()))
        return self.books

    def _publish(self, progress: Progress, **extras: Any) -> None:
        self.last = progress
        if self.progress_path:
            try:
                write_progress(self.progress_path, progress)
            except OSError as exc:  # like the metrics endpoint, progress reporting never stops training
                log.warning("cannot write the progress document %s: %s", self.progress_path, exc.strerror or exc)
        if self.metrics is not None:
            self.metrics.publish(progress, **extras)

    def _profile(self) -> Optional[str]:
        """The folder of the run's profile once written."""
        return str(self.profiler.folder) if self.profiler is not None and self.profiler.written else None

    def close(self) -> None:
        if self.profiler is not None:
            self.profiler.close()
        if self.metrics is not None:
            self.metrics.close()
        for sink in self.sinks:
            sink.close()

    def _trackers(self) -> Trackers:
        """The trackers' runs, continued or begun; tagged with the job and the run's restarts."""
        from .trackers import Identity, Trackers, flat_params  # imports a tracker's client only when configured

        uid = os.environ.get(RUN_ID_ENV, "")
        identity = Identity(job_name() or uid or "brain-train", uid, self.goodput.ledger.restarts)
        return Trackers(self._cfg.metrics.trackers, self._folder, flat_params(self._cfg.to_dict()), identity)


def _answered(answered: Answered) -> dict[str, Any]:
    """The progress fields of the newest checkpoint request answered."""
    return {} if answered is None else {"checkpoint_request": answered[0], "checkpoint_request_step": answered[1]}


def _restarts(ledger: Ledger) -> dict[str, Any]:
    """The progress fields of the run's restarts, from the ledger (the in-pod ones with the latest reason)."""
    return {"restarts": ledger.restarts, "in_pod_restarts": ledger.in_pod_restarts,
            "last_in_pod_restart": ledger.last_in_pod_restart or None}


def torchrun_agent() -> str:
    """Which torchrun agent started this process: host, pid and, where /proc tells them, the boot and the agent's
    start time (a replaced pod's torchrun has the pod's name for host and often the same pid: 1)."""
    ppid = os.getppid()
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        started = Path(f"/proc/{ppid}/stat").read_text().rsplit(")", 1)[1].split()[19]  # field 22, starttime
    except (OSError, IndexError):
        boot = started = ""
    return f"{socket.gethostname()}:{ppid}:{boot}:{started}"
