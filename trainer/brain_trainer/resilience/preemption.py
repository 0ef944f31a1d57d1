"""Preemption: SIGTERM, checkpoint requests, and the ranks' vote on both at step boundaries.

Kubernetes ends a pod with SIGTERM and, after its grace period, SIGKILL. A
rank that got SIGTERM cannot stop alone (its peers would wait for it in the
next collective), so every rank notes the signal and the ranks vote on it
every `preemption_vote_seconds` at a step boundary: one all-reduce, after
which all of them save the same step and leave together (`leave`). The vote
also carries rank 0's reading of the checkpoint and profile request files (one
reader, so ranks whose copies of a file update at different times still agree) and
the maximum over ranks of any figures the caller brings (intervalSteps auto's,
checkpoint/cadence.py), so that every rank decides alike from them.

    preemption = Preemption(cfg.checkpoint, rank=rank, request_file=..., profile_file=...)
    vote = preemption.vote(step, figures) if preemption.due(step) else None
    if vote and vote.stop: ...save...; preemption.leave(step)   # raises Preempted
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import torch
import torch.distributed as dist

from ..config import CheckpointConfig
from ..contract import PREEMPTED, PREEMPTED_REASON, profile_request_steps
from .failures import write_termination

log = logging.getLogger(__name__)


class Preempted(SystemExit):
    """Raised after the preemption checkpoint is committed; exits with PREEMPTED."""

    def __init__(self) -> None:
        super().__init__(PREEMPTED)


@dataclass(frozen=True)
class Vote:
    """What the ranks agreed on at one step boundary (the slowest rank's figures)."""

    stop: bool  # some rank got SIGTERM: save this step and leave
    request: Optional[str]  # a new checkpoint request ("" on ranks other than 0), or None
    step_s: float  # seconds per step since the previous vote; 0.0 at the first
    figures: tuple[float, ...] = ()  # the caller's figures, each the maximum over ranks
    profile_steps: int = 0  # a new profile request's steps, to trace from the next step on; 0: none


def steps_between_votes(period_s: float, step_s: float) -> int:
    """Steps until the next vote, for votes about period_s apart (at least every step)."""
    return max(1, int(period_s / step_s)) if step_s > 0 else 1


class Preemption:
    """Every rank makes one and calls `vote` at the same steps (`due`, or whenever a save is due).

    `group` is a process group that only this thread uses (None: one process,
    nothing to agree on).
    """

    def __init__(self, cfg: CheckpointConfig, *, rank: int, group: Any = None, request_file: Optional[Path] = None,
                 profile_file: Optional[Path] = None):
        self.enabled = cfg.enabled  # without checkpoints there is nothing to save: SIGTERM keeps its meaning
        self.period_s = cfg.preemption_vote_seconds
        self.group = group
        self.requests = RequestFile(request_file if rank == 0 else None)
        self.profiles = RequestFile(profile_file if rank == 0 else None)
        self._signalled = False
        self._next: Optional[int] = None  # step of the next vote; None: the next step
        self._last: Optional[tuple[int, float]] = None  # (step, time.perf_counter()) of the latest vote
        self._previous_handler: Any = None
        if self.enabled and threading.current_thread() is threading.main_thread():
            self._previous_handler = signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self._signalled = True  # acted on at the next vote, by every rank at once

    def due(self, step: int) -> bool:
        return self.enabled and (self._next is None or step >= self._next)

    def vote(self, step: int, figures: Sequence[float] = ()) -> Vote:
        """Collective on `group`: one all-reduce of (SIGTERM seen, seconds since the previous vote, rank 0 saw a
        new checkpoint request, the steps of a new profile request, *figures), maximum over ranks; every rank then
        computes the same next vote step. Every rank brings as many figures."""
        now = time.perf_counter()
        request = self.requests.new()
        since = now - self._last[1] if self._last else 0.0
        agreed = [float(self._signalled), since, float(request is not None), float(self._profile_steps()), *figures]
        if self.group is not None:
            reduced = torch.tensor(agreed, dtype=torch.float64)
            dist.all_reduce(reduced, op=dist.ReduceOp.MAX, group=self.group)
            agreed = reduced.tolist()
        steps = step - self._last[0] if self._last else 0
        step_s = agreed[1] / steps if steps else 0.0
        # One process has nothing to agree on: it looks after every step, for free.
        self._next = step + (steps_between_votes(self.period_s, step_s) if self.group is not None else 1)
        self._last = (step, now)
        return Vote(stop=bool(agreed[0]), request=(request or "") if agreed[2] else None, step_s=step_s,
                    figures=tuple(agreed[4:]), profile_steps=int(agreed[3]))

    def leave(self, step: int) -> None:
        """After the preemption checkpoint of `step` is committed on every rank: say so, and exit PREEMPTED."""
        write_termination(PREEMPTED_REASON, f"SIGTERM: step {step} committed, exiting to be restarted")
        self.close()
        raise Preempted()

    def close(self) -> None:
        """Give SIGTERM back its previous meaning (idempotent)."""
        if self._previous_handler is not None:
            signal.signal(signal.SIGTERM, self._previous_handler)
            self._previous_handler = None

    def _profile_steps(self) -> int:
        """Rank 0: the steps of a new profile request; a malformed one is said once and ignored."""
        request = self.profiles.new()
        if request is None:
            return 0
        try:
            return profile_request_steps(request)
        except ValueError as exc:
            log.warning("profile request ignored: %s", exc)
            return 0


class RequestFile:
    """A request passed as a file's content (a ConfigMap key): `new` says a content not seen before, once.

    Only rank 0 reads (path None on the others); a request from before this start is not repeated.
    """

    def __init__(self, path: Optional[Path]):
        self.path = path
        self._seen = self._read()

    def new(self) -> Optional[str]:
        """The file's content if it is new and not empty."""
        request = self._read()
        if not request or request == self._seen:
            return None
        self._seen = request
        return request

    def _read(self) -> str:
        if self.path is None:
            return ""
        try:
            return self.path.read_text(encoding="utf-8", errors="replace").strip()
        except OSError:
            return ""  # no request yet (the key is absent until the first one)
