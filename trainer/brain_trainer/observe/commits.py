"""Committed checkpoints, told to whoever listens in this process: rank 0's metrics endpoint counts each save's
size and time. The checkpoint manager tells; it need not know who listens (none without an endpoint)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Commit:
    step: int
    bytes: int  # the committed folder's files
    seconds: float  # from the start of the save (after any wait for the previous one) to its commit


Listener = Callable[[Commit], None]
_listeners: list[Listener] = []
_lock = threading.Lock()  # an asynchronous save commits from the manager's thread


def listen(listener: Listener) -> Callable[[], None]:
    """Call `listener` at each commit from now on; returns what stops it."""
    with _lock:
        _listeners.append(listener)

    def stop() -> None:
        with _lock:
            if listener in _listeners:
                _listeners.remove(listener)

    return stop


def committed(commit: Commit) -> None:
    with _lock:
        listeners = list(_listeners)
    for listener in listeners:
        listener(commit)
