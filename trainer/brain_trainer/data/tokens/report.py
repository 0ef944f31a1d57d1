"""Progress of a pass over the corpus, in input bytes: a rich bar on a terminal, plain lines elsewhere."""

from __future__ import annotations

from types import TracebackType
from typing import Optional, TextIO

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

PLAIN_STEPS = 10  # a plain line at every tenth of the input


class PassProgress:
    """`advance(n)` after n more input bytes; used as a context manager around one pass."""

    def __init__(self, label: str, total_bytes: int, stream: TextIO):
        self.label = label
        self.total = max(total_bytes, 1)
        self.stream = stream
        self.done = 0
        self._printed = 0
        self._bar: Optional[Progress] = None
        if stream.isatty():
            self._bar = Progress(
                TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                TimeRemainingColumn(), console=Console(file=stream), transient=False,
            )
            self._task = self._bar.add_task(label, total=self.total)

    def __enter__(self) -> "PassProgress":
        if self._bar is not None:
            self._bar.start()
        return self

    def advance(self, n: int) -> None:
        self.done += n
        if self._bar is not None:
            self._bar.update(self._task, completed=min(self.done, self.total))
            return
        step = min(self.done * PLAIN_STEPS // self.total, PLAIN_STEPS)
        if step > self._printed:
            self._line(step)

    def _line(self, step: int) -> None:
        self._printed = step
        done = min(self.done, self.total) if step < PLAIN_STEPS else self.total
        print(f"{self.label}: {done / 1e6:.1f} of {self.total / 1e6:.1f} MB ({step * 100 // PLAIN_STEPS}%)",
              file=self.stream, flush=True)

    def __exit__(self, kind: Optional[type], exc: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        if self._bar is not None:
            if exc is None:
                self._bar.update(self._task, completed=self.total)
            self._bar.stop()
        elif exc is None and self._printed < PLAIN_STEPS:
            self._line(PLAIN_STEPS)  # skipped documents and blank lines never advanced the count
