"""Rank 0's goodput ledger on disk: goodput.Ledger kept in the checkpoint folder, which outlives trainers.

Written at every logging step and otherwise at most every WRITE_SECONDS (a
few hundred bytes, replaced atomically: about a millisecond on a local disk,
more on network storage), so the high-water mark a restarted trainer reads is
within half a second of the furthest step any trainer finished, and the steps
lost since the last commit count as recomputation.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Optional

from ..contract import Goodput
from ..files import write_atomic
from .goodput import Ledger, summary

log = logging.getLogger(__name__)

LEDGER_FILE = "goodput.json"
WRITE_SECONDS = 0.5


class GoodputLog:
    """The run's ledger, continued from `folder` (None: kept in memory only, as on ranks other than 0)."""

    def __init__(self, folder: Optional[Path], run_id: str, started: float, *, agent: str = "", agent_restarts: int = 0,
                 restarted_after: Optional[str] = None):
        """`agent`, `agent_restarts`, `restarted_after`: the torchrun agent that started this trainer (Ledger.begin)."""
        self.path = folder / LEDGER_FILE if folder is not None else None
        self.ledger = Ledger.begin(self._read(), run_id, started, agent=agent, agent_restarts=agent_restarts,
                                   restarted_after=restarted_after)
        self._written: Optional[float] = None  # time.monotonic() of the latest write
        self._warned = False

    def record(self, kind: str, seconds: float) -> None:
        self.ledger = self.ledger.add(kind, seconds, time.time())

    def step(self, step: int, seconds: float, kind: Optional[str] = None) -> None:
        self.ledger = self.ledger.step(step, seconds, time.time(), kind)

    def summary(self) -> Goodput:
        return summary(self.ledger)

    def save(self, *, force: bool = True) -> None:
        """Write the ledger; force=False: only if WRITE_SECONDS passed since the latest write."""
        now = time.monotonic()
        if self.path is None or not (force or self._written is None or now - self._written >= WRITE_SECONDS):
            return
        self._written = now
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(str(self.path), json.dumps(self.ledger.to_dict()) + "\n")
        except OSError as exc:  # accounting never stops training
            if not self._warned:
                log.warning("cannot write the goodput ledger %s: %s", self.path, exc.strerror or exc)
                self._warned = True

    def _read(self) -> Optional[Ledger]:
        try:
            return Ledger.from_dict(json.loads(self.path.read_text())) if self.path is not None else None
        except (OSError, ValueError):
            return None  # none yet, or damaged: the run's accounting starts again
