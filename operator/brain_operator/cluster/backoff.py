"""How long to wait before trying again: jittered exponential backoff, and per-job retries (no I/O).

Two users: the cluster client, which retries one API call on 429, 5xx and
timeouts (honouring the server's Retry-After), and the handlers, which
reconcile a job again soon after a pass failed instead of leaving it to the
periodic resync, or in minutes after a create the API server refused
(nothing changes until the job or the namespace does). Jitter keeps a fleet of jobs from retrying in lockstep
against an API server that is just coming back.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass
from typing import Callable, Optional


@dataclass(frozen=True)
class Backoff:
    """Waits of base, 2*base, 4*base, ... capped at `cap`, each shortened by up to half at random."""

    base: float
    cap: float

    def delay(self, attempt: int, rng: Callable[[], float] = random.random) -> float:
        full = min(self.cap, self.base * 2 ** min(attempt, 32))
        return full * (1 - rng() / 2)


def retry_after(value: Optional[str]) -> Optional[float]:
    """The seconds a Retry-After header asks for; None when absent or not a number of seconds.

    The HTTP date form is not used by the Kubernetes API server, which sends whole seconds.
    """
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and seconds >= 0 else None


class JobRetries:
    """Which jobs to reconcile again after a failed pass, and when (thread-safe; times from the caller's clock).

    A transient failure waits `backoff`; a refusal waits `refusal`, and until then `holds` the job back from the
    resync too.
    """

    def __init__(self, backoff: Backoff, refusal: Backoff, rng: Callable[[], float] = random.random) -> None:
        self._backoff, self._refusal = backoff, refusal
        self._rng = rng
        self._lock = threading.Lock()
        self._attempts: dict[tuple[str, str], int] = {}
        self._due: dict[tuple[str, str], float] = {}
        self._refused: set[tuple[str, str]] = set()

    def failed(self, job: tuple[str, str], now: float, *, refused: bool = False) -> float:
        """Schedule the job's next attempt (`refused`: after a refusal); returns the delay chosen."""
        with self._lock:
            attempt = self._attempts.get(job, 0)
            self._attempts[job] = attempt + 1
            delay = (self._refusal if refused else self._backoff).delay(attempt, self._rng)
            self._due[job] = now + delay
            (self._refused.add if refused else self._refused.discard)(job)
            return delay

    def succeeded(self, job: tuple[str, str]) -> None:
        with self._lock:
            self._attempts.pop(job, None)
            self._due.pop(job, None)
            self._refused.discard(job)

    def holds(self, job: tuple[str, str], now: float) -> bool:
        """Whether a refusal's wait for the job is not over: the resync leaves it to its scheduled attempt."""
        with self._lock:
            return job in self._refused and self._due.get(job, now) > now

    def take_due(self, now: float) -> list[tuple[str, str]]:
        """The jobs whose attempt is due, no longer scheduled (a new failure schedules them again)."""
        with self._lock:
            due = sorted(job for job, at in self._due.items() if at <= now)
            for job in due:
                del self._due[job]
            return due

    def wait(self, now: float) -> Optional[float]:
        """Seconds until the next attempt is due; None when none is scheduled."""
        with self._lock:
            return max(0.0, min(self._due.values()) - now) if self._due else None
