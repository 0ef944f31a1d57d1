"""What the local runner shows: worker output, live progress, the final summary.

On a terminal a `rich` progress bar (step/total, loss, held-out loss, tokens/s, ETA) stays
under the workers' output; elsewhere (CI, a pipe) a plain line is printed at
most every `interval` seconds, and only when the step moved. Both read the
progress document rank 0 writes (brain_trainer.contract.Progress). The
formatting functions are pure.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Protocol, TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn
from rich.progress import Progress as ProgressBar
from rich.text import Text

from brain_trainer.contract import Goodput, Progress, perplexity

from ..spec.overrides import as_flags

__all__ = [
    "Display",
    "PlainDisplay",
    "RichDisplay",
    "RunSummary",
    "format_duration",
    "goodput_line",
    "make_display",
    "progress_line",
    "read_progress",
    "restarts_line",
    "summary_lines",
]


def read_progress(path: Path) -> Optional[Progress]:
    """The newest progress document, or None before rank 0 wrote one.

    The trainer replaces the file atomically, so a partial document means a
    foreign writer; it reads as "no news" rather than stopping the run.
    """
    try:
        text = path.read_bytes()
    except OSError:
        return None
    return Progress.from_json(text)


def format_duration(seconds: Optional[float]) -> str:
    if seconds is None:
        return "-"
    total = max(0, int(round(seconds)))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def _loss(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.4f}"


def _rate(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _eval(doc: Progress) -> str:
    """`  eval 2.3456` once the job has evaluated; nothing for a job that does not evaluate."""
    return "" if doc.eval_loss is None else f"  eval {_loss(doc.eval_loss)}"


def progress_line(doc: Progress) -> str:
    """`step 120/200 (60%)  loss 2.1342  eval 2.3456  12,345 tok/s  ETA 0m32s`"""
    step, total = doc.step, doc.total_steps or 0
    percent = f" ({100 * step // total}%)" if total else ""
    return (
        f"step {step}/{total or '?'}{percent}  loss {_loss(doc.loss)}{_eval(doc)}  "
        f"{_rate(doc.tokens_per_second)} tok/s  ETA {format_duration(doc.eta_seconds)}"
    )


@dataclass(frozen=True)
class RunSummary:
    status: str
    step: Optional[int]
    total_steps: int
    loss: Optional[float]
    first_loss: Optional[float]
    tokens_per_second: Optional[float]
    wall_seconds: float
    checkpoint: Optional[str]
    restarts: int
    message: str = ""
    reason: str = ""  # why the run failed, as the trainer named it: `storage-full: <line>`
    eval_loss: Optional[float] = None
    first_eval_loss: Optional[float] = None
    goodput: Optional[Goodput] = None
    set_aside: tuple[str, ...] = ()  # folders checkpoint.resumeFrom moved checkpoints into during the run
    overrides: tuple[str, ...] = ()  # the command line's `--set PATH=VALUE`s, as given
    in_pod_restarts: int = 0  # of the restarts, those torchrun made inside a pod (rank 0's progress document)
    last_in_pod_restart: str = ""  # why the latest of them happened


def goodput_line(g: Optional[Goodput]) -> str:
    """`71% of 1m40s: productive 71.5 s, recomputed 3.6 s, ...` (the parts that are not zero)."""
    if g is None:
        return "-"
    parts = [(key.removesuffix("_seconds"), value) for key, value in vars(g).items()
             if key.endswith("_seconds") and key != "wall_seconds" and value > 0]
    detail = ", ".join(f"{kind} {value:.1f} s" for kind, value in parts)
    return f"{100 * g.ratio:.0f}% of {format_duration(g.wall_seconds)}" + (f": {detail}" if detail else "")


def restarts_line(s: RunSummary) -> str:
    """`2 (1 in pod, last: error: RuntimeError: boom)`: the runner's restarts of every pod and torchrun's inside one."""
    if not s.in_pod_restarts:
        return str(s.restarts)
    last = f", last: {s.last_in_pod_restart}" if s.last_in_pod_restart else ""
    return f"{s.restarts + s.in_pod_restarts} ({s.in_pod_restarts} in pod{last})"


def summary_lines(s: RunSummary) -> list[str]:
    fell = f" (first logged: {_loss(s.first_loss)})" if s.first_loss is not None else ""
    evaluated = []
    if s.eval_loss is not None:
        first = f"; first: {_loss(s.first_eval_loss)}" if s.first_eval_loss is not None else ""
        evaluated = [f"eval loss:   {_loss(s.eval_loss)} (perplexity {perplexity(s.eval_loss):,.1f}{first})"]
    return [
        f"status:      {s.status}" + (f" ({s.message})" if s.message else ""),
        *([f"reason:      {s.reason}"] if s.reason else []),
        *([f"overrides:   {as_flags(s.overrides)}"] if s.overrides else []),
        f"steps:       {'-' if s.step is None else s.step}/{s.total_steps}",
        f"final loss:  {_loss(s.loss)}{fell}",
        *evaluated,
        f"tokens/s:    {_rate(s.tokens_per_second)}",
        f"wall time:   {format_duration(s.wall_seconds)}",
        f"restarts:    {restarts_line(s)}",
        f"goodput:     {goodput_line(s.goodput)}",
        f"checkpoint:  {s.checkpoint or '-'}",
        *(f"set aside:   {folder} (checkpoints moved out of the way by checkpoint.resumeFrom)" for folder in s.set_aside),
    ]


class Display(Protocol):
    def log(self, pod: str, line: str) -> None: ...

    def note(self, message: str) -> None: ...

    def update(self, doc: Optional[Progress]) -> None: ...

    def close(self) -> None: ...


class PlainDisplay:
    """Line-oriented output for logs and CI."""

    def __init__(self, stream: TextIO, *, interval: float = 5.0, clock: Callable[[], float] = time.monotonic):
        self.stream = stream
        self.interval = interval
        self.clock = clock
        self._last_time: Optional[float] = None
        self._last_step: Optional[int] = None

    def _print(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def log(self, pod: str, line: str) -> None:
        self._print(f"[{pod}] {line}")

    def note(self, message: str) -> None:
        self._print(f"braintrain: {message}")

    def update(self, doc: Optional[Progress]) -> None:
        if doc is None:
            return
        now, step = self.clock(), doc.step
        if step == self._last_step or (self._last_time is not None and now - self._last_time < self.interval):
            return
        self._last_time, self._last_step = now, step
        self._print(f"progress: {progress_line(doc)}")

    def close(self) -> None:
        """Nothing is held open."""


class RichDisplay:
    """A live progress bar under the scrolling worker output."""

    def __init__(self, stream: TextIO, *, job_name: str, total_steps: int):
        self.console = Console(file=stream)
        self.progress = ProgressBar(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}{task.fields[eval]}"),
            TextColumn("{task.fields[rate]} tok/s"),
            TextColumn("ETA {task.fields[eta]}"),
            console=self.console,
            refresh_per_second=4,
        )
        self.task = self.progress.add_task(job_name, total=total_steps, loss="-", eval="", rate="-", eta="-")
        self.progress.start()

    def log(self, pod: str, line: str) -> None:
        self.console.print(Text(f"[{pod}] ", style="dim") + Text(line), soft_wrap=True)

    def note(self, message: str) -> None:
        self.console.print(Text(f"braintrain: {message}", style="bold"))

    def update(self, doc: Optional[Progress]) -> None:
        if doc is None:
            return
        self.progress.update(
            self.task,
            completed=doc.step,
            total=doc.total_steps or None,
            loss=_loss(doc.loss),
            eval=_eval(doc),
            rate=_rate(doc.tokens_per_second),
            eta=format_duration(doc.eta_seconds),
        )

    def close(self) -> None:
        self.progress.stop()


def make_display(stream: TextIO, *, job_name: str, total_steps: int) -> Display:
    if stream.isatty():
        return RichDisplay(stream, job_name=job_name, total_steps=total_steps)
    return PlainDisplay(stream)
