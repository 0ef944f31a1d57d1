"""Writing the progress document (brain_trainer.contract.Progress) where the local runner reads it.

An atomic replace, so a reader (the local runner's display) never sees a
half-written file. Shown, not kept: it skips the flushes to disk.
"""

from __future__ import annotations

from ..contract import Progress
from ..files import write_atomic


def write_progress(path: str, progress: Progress) -> None:
    """Replace the document at `path` atomically."""
    write_atomic(path, progress.to_json(), durable=False)
