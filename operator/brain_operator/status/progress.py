"""Rank 0's progress document -> `status.progress`, `status.lastCheckpoint`, `status.goodput` and
`status.inPodRestarts` (pure).

The operator asks each running elastic job's rank-0 `/progress` endpoint
once per resync (POLL_SECONDS), as an observation of that resync's
reconcile; the plan merges the answer here, so a large fleet does not flood
the API server: a document that did not change leaves the status as it was.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any, Mapping, Optional

from brain_trainer.contract import Goodput, Progress, checkpoint_path, format_time

from .job_status import RUNNING, JobStatus, LastCheckpoint

# How often the operator polls rank 0's progress (and reconciles every job: handlers' resync).
POLL_SECONDS = 30.0


def reports_progress(backend: str, phase: Optional[str]) -> bool:
    """Whether rank 0's document is asked for, and taken: an elastic job that runs (Kubeflow's pods are not ours)."""
    return backend == "elastic" and phase == RUNNING


def shown(progress: Progress, now: datetime) -> Progress:
    """The document as status shows it: 4 significant digits, whole seconds, the operator's clock.

    The newest checkpoint goes to `lastCheckpoint`, with its path, goodput to `goodput` and the in-pod restarts
    beside `restarts`, instead.
    """
    return replace(
        progress,
        loss=_round(progress.loss),
        eval_loss=_round(progress.eval_loss),
        tokens_per_second=_round(progress.tokens_per_second),
        mfu=_round(progress.mfu),
        eta_seconds=None if progress.eta_seconds is None else int(progress.eta_seconds),
        last_checkpoint_step=None,
        goodput=None,
        in_pod_restarts=None,
        last_in_pod_restart=None,
        updated_at=format_time(now),
    )


def shown_goodput(goodput: Goodput) -> Goodput:
    """Goodput as status shows it: the ratio to 3 decimals, whole seconds."""
    seconds = {key: float(round(value)) for key, value in vars(goodput).items() if key.endswith("_seconds")}
    return Goodput(ratio=round(goodput.ratio, 3), **seconds)


def progress_status(doc: Optional[Mapping[str, Any]], status: JobStatus, *, now: datetime, root: str) -> JobStatus:
    """`status` with rank 0's document in its `progress`, `lastCheckpoint` and `goodput`, when the document is news.

    `doc` is None when no worker was asked or none answered: the previous
    values stand, so a restarting pod never blanks what `kubectl get btj`
    shows. Neither does a document that changed only its time: `updatedAt`
    stays when the operator last saw it change (stalled.py), and no patch is due.
    `root`: where the checkpoints live in a pod (the mount path, or the object store's URI).
    """
    progress = Progress.read(doc)
    if progress is None:
        return status
    out = replace(status, progress=shown(progress, now))
    if progress.last_checkpoint_step:
        step = progress.last_checkpoint_step
        out = replace(out, last_checkpoint=LastCheckpoint(step=step, path=checkpoint_path(root, step)))
    if progress.goodput is not None:
        out = replace(out, goodput=shown_goodput(progress.goodput))
    if (progress.in_pod_restarts or 0) > status.in_pod_restarts:  # never decreases: an older document is no news
        out = replace(out, in_pod_restarts=progress.in_pod_restarts, last_in_pod_restart=progress.last_in_pod_restart)
    return out if _untimed(out) != _untimed(status) else status


def _untimed(status: JobStatus) -> tuple[Any, ...]:
    """What the document says, without when the operator saw it (the time alone is no news)."""
    progress = None if status.progress is None else replace(status.progress, updated_at=None)
    return progress, status.last_checkpoint, status.goodput, status.in_pod_restarts


def _round(value: Optional[float]) -> Optional[float]:
    # Status is for humans and printer columns: 4 significant digits.
    return None if value is None else float(f"{value:.4g}")
