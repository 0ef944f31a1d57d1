"""Rank 0's progress document -> `status.progress`, `status.lastCheckpoint` and `status.goodput` (pure).

The operator polls each running job's rank-0 `/progress` endpoint once per
resync (POLL_SECONDS); these functions decide what to write, so
a large fleet does not flood the API server: a job's status is patched only
when the answer changed.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any, Mapping, Optional

from brain_trainer.contract import Goodput, Progress, checkpoint_path, format_time

from .job_status import JobStatus, LastCheckpoint

# How often the operator polls rank 0's progress (and reconciles every job: handlers' resync).
POLL_SECONDS = 30.0
# The status fields the progress poll owns (reconcile keeps them as they are).
POLLED = ("progress", "lastCheckpoint", "goodput")


def shown(progress: Progress, now: datetime) -> Progress:
    """The document as status shows it: 4 significant digits, whole seconds, the operator's clock.

    The newest checkpoint goes to `lastCheckpoint`, with its path, and goodput to `goodput`, instead.
    """
    return replace(
        progress,
        loss=_round(progress.loss),
        eval_loss=_round(progress.eval_loss),
        tokens_per_second=_round(progress.tokens_per_second),
        eta_seconds=None if progress.eta_seconds is None else int(progress.eta_seconds),
        last_checkpoint_step=None,
        goodput=None,
        updated_at=format_time(now),
    )


def shown_goodput(goodput: Goodput) -> Goodput:
    """Goodput as status shows it: the ratio to 3 decimals, whole seconds."""
    seconds = {key: float(round(value)) for key, value in vars(goodput).items() if key.endswith("_seconds")}
    return Goodput(ratio=round(goodput.ratio, 3), **seconds)


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
        if progress.goodput is not None:
            status = replace(status, goodput=shown_goodput(progress.goodput))
    written = status.to_dict()
    return {key: written[key] for key in POLLED if key in written}


def changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether a patch is worth sending (the timestamp alone is not news)."""
    strip = lambda p: {k: v for k, v in (p or {}).items() if k != "updatedAt"}  # noqa: E731
    return strip(old.get("progress")) != strip(new.get("progress")) or any(
        old.get(key) != new.get(key) for key in ("lastCheckpoint", "goodput")
    )


def _round(value: Optional[float]) -> Optional[float]:
    # Status is for humans and printer columns: 4 significant digits.
    return None if value is None else float(f"{value:.4g}")
