"""Writing the progress document (brain_trainer.contract.Progress) where the local runner reads it.

An atomic replace, so a reader (the local runner's display) never sees a
half-written file.
"""

from __future__ import annotations

import os
import tempfile

from .contract import Progress


def write_progress(path: str, progress: Progress) -> None:
    """Replace the document at `path` atomically (temp file in the same folder + os.replace)."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".progress-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(progress.to_json())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
