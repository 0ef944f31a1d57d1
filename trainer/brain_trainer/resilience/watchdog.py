"""The hang watchdog: a thread on every rank that ends a process whose steps stopped.

A rank stuck in a collective (a peer frozen, a dead link) cannot raise: the
main thread is inside the backend. The watchdog thread sees that no step
finished within its limit (stall.py decides the limit), dumps every thread's
Python stack to stderr (faulthandler), writes `brain.ai/stalled: ...` as the
termination message and exits with the contract's code for it; torchrun then restarts the group,
which resumes from the newest committed checkpoint.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import sys
import threading
import time
from typing import ContextManager, Iterator

from ..config import WatchdogConfig
from ..contract import EXIT_CODES, STALLED
from .failures import write_termination
from .stall import CHECKPOINT, EVALUATION, STEP, StepTimes, limit, stall_message

log = logging.getLogger(__name__)


class Watchdog:
    """Created once per process; `stepped` after every optimizer step, `checkpointing` around saves.

    Disabled (`watchdog.enabled: false`), it keeps time but starts no thread.
    """

    def __init__(self, cfg: WatchdogConfig):
        self.cfg = cfg
        self._lock = threading.Lock()
        self._times = StepTimes(cfg.warmup_steps)
        self._phase = STEP
        self._since = time.monotonic()  # the clock of the current step (or save) started here
        self._step = 0
        self._closed = False
        # Set when the limit may have shrunk (the warm-up ended, a save began or ended) or on close.
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="brain-watchdog", daemon=True)
        if cfg.enabled:
            self._thread.start()

    def stepped(self, step: int) -> None:
        now = time.monotonic()
        with self._lock:
            warming = not self._times.warm
            self._times.add(now - self._since)
            self._since, self._step = now, step
            if warming and self._times.warm:  # the limit may shrink from startupSeconds to the step-time rule
                self._wake.set()

    def checkpointing(self) -> ContextManager[None]:
        """A save the loop waits for gets its own limit; the next step's clock starts when it ends."""
        return self._phase_of(CHECKPOINT)

    def evaluating(self) -> ContextManager[None]:
        """So does an evaluation pass."""
        return self._phase_of(EVALUATION)

    @contextlib.contextmanager
    def _phase_of(self, phase: str) -> Iterator[None]:
        with self._lock:
            self._phase, self._since = phase, time.monotonic()
            self._wake.set()
        try:
            yield
        finally:
            with self._lock:
                self._phase, self._since = STEP, time.monotonic()
                self._wake.set()

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join()

    def _watch(self) -> None:
        while True:
            with self._lock:
                phase, since, step = self._phase, self._since, self._step
                chosen = limit(self.cfg, phase, self._times.median())
            waited = time.monotonic() - since
            if self._closed:
                return
            if waited >= chosen.seconds:
                self._fire(stall_message(phase, waited, step, chosen))
            # Until the deadline (a step since then moves it) or until the limit changes.
            self._wake.wait(chosen.seconds - waited)
            self._wake.clear()

    def _fire(self, message: str) -> None:
        log.error("stalled: %s; dumping every thread's stack and exiting with %d", message, EXIT_CODES[STALLED])
        for handler in logging.getLogger().handlers:
            handler.flush()
        sys.stdout.flush()
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        write_termination(STALLED, message)
        # The main thread may be blocked inside a collective, where no exception reaches it.
        os._exit(EXIT_CODES[STALLED])

