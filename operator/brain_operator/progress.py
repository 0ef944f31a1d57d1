"""Rank 0's progress document -> `status.progress` and `status.lastCheckpoint` (pure).

The operator polls each running job's rank-0 `/progress` endpoint once per
resync (`handlers.RESYNC_SECONDS`); these functions decide what to write, so
a large fleet does not flood the API server: a job's status is patched only
when the answer changed.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any, Mapping, Optional

from brain_trainer.contract import Progress, checkpoint_path, format_time

from .job_status import JobStatus, LastCheckpoint

# The status fields the progress poll owns (reconcile keeps them as they are).
POLLED = ("progress", "lastCheckpoint")


def shown(progress: Progress, now: datetime) -> Progress:
    """The document as status shows it: 4 significant digits, whole seconds, the operator's clock.

    The newest checkpoint goes to `lastCheckpoint`, with its path, instead.
    """
    return replace(
        progress,
        loss=_round(progress.loss),
        eval_loss=_round(progress.eval_loss),
        tokens_per_second=_round(progress.tokens_per_second),
        eta_seconds=None if progress.eta_seconds is None else int(progress.eta_seconds),
        last_checkpoint_step=None,
        updated_at=format_time(now),
    )


def progress_status(
    doc: Optional[Mapping[str, Any]], previous: Mapping[str, Any], *, now: datetime, mount_path: str
) -> dict[str, Any]:
    """The `progress` and `lastCheckpoint` fields of the new status.

    `doc` is None when the worker could not be reached: the previous values
    stand, so a restarting pod never blanks what `kubectl get btj` shows.
    """
    status = JobStatus.read(previous)
    progress = Progress.read(doc)
    if progress is not None:
        status = replace(status, progress=shown(progress, now))
        if progress.last_checkpoint_step:
            step = progress.last_checkpoint_step
            status = replace(status, last_checkpoint=LastCheckpoint(step=step, path=checkpoint_path(mount_path, step)))
    written = status.to_dict()
    return {key: written[key] for key in POLLED if key in written}


def changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether a patch is worth sending (the timestamp alone is not news)."""
    strip = lambda p: {k: v for k, v in (p or {}).items() if k != "updatedAt"}  # noqa: E731
    return strip(old.get("progress")) != strip(new.get("progress")) or old.get("lastCheckpoint") != new.get("lastCheckpoint")


def _round(value: Optional[float]) -> Optional[float]:
    # Status is for humans and printer columns: 4 significant digits.
    return None if value is None else float(f"{value:.4g}")
