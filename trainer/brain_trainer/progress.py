"""Writing the progress document (brain_trainer.contract.Progress) where the local runner reads it.

An atomic replace, so a reader (the local runner's display) never sees a
half-written file; `write_atomic` serves other small documents (the goodput ledger) alike.
"""

from __future__ import annotations

import os
import tempfile

from .contract import Progress


def write_progress(path: str, progress: Progress) -> None:
    """Replace the document at `path` atomically."""
    write_atomic(path, progress.to_json())


def write_atomic(path: str, text: str) -> None:
    """Replace the file at `path` atomically (temp file in the same folder + os.replace)."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
