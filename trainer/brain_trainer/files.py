"""Small files that must never be read half-written: one atomic replace for every writer.

The checkpoint manifest, a dataset's manifest, the goodput ledger (which must
outlive the trainer) and the progress document all go through `write_atomic`.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def fsync_dir(path: str | os.PathLike) -> None:
    """Make a rename or creation inside `path` survive a crash of the machine."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike, text: str, *, durable: bool = True) -> None:
    """Replace the file at `path` so that readers see the old content or the new, never a prefix.

    `durable` also puts the content and the rename on disk before returning; a
    document that is rewritten at every logging step and only shown (progress)
    skips those two flushes.
    """
    final = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}-", suffix=".tmp", dir=final.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        os.unlink(tmp)
        raise
    if durable:
        fsync_dir(final.parent)
