"""The progress document rank 0 publishes at each logging step.

`Progress` and `format_progress` are pure; `write_progress` is the only I/O:
an atomic replace, so a reader (the local runner's display) never sees a
half-written file.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Any, Optional

PROGRESS_FILE_ENV = "BRAIN_PROGRESS_FILE"


@dataclass(frozen=True)
class Progress:
    step: int
    total_steps: int
    loss: float
    tokens_per_second: float
    eta_seconds: float
    last_checkpoint_step: Optional[int]
    updated_at: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def eta_seconds(step: int, total_steps: int, seconds_per_step: float) -> float:
    return max(0, total_steps - step) * seconds_per_step


def utc_timestamp(now: Optional[datetime] = None) -> str:
    """RFC 3339 in UTC with a Z suffix, as Kubernetes writes times."""
    now = now or datetime.now(timezone.utc)
    return now.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_progress(progress: Progress) -> str:
    return json.dumps(progress.as_dict(), sort_keys=True) + "\n"


def write_progress(path: str, progress: Progress) -> None:
    """Replace the document at `path` atomically (temp file in the same folder + os.replace)."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".progress-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(format_progress(progress))
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
