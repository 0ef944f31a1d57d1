"""Rank 0's progress document -> `status.progress` and `status.lastCheckpoint` (pure).

The operator polls each running job's rank-0 `/progress` endpoint on a timer;
these functions decide when to poll and what to write, so a large fleet does
not flood the API server: a job is polled at most once per interval and its
status is patched only when the answer changed.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Mapping, Optional

# Minimum seconds between two polls of one job.
POLL_INTERVAL_SECONDS = 15.0


def due_for_poll(last_polled: Optional[datetime], now: datetime, interval: float = POLL_INTERVAL_SECONDS) -> bool:
    return last_polled is None or now - last_polled >= timedelta(seconds=interval)


def checkpoint_path(mount_path: str, step: int) -> str:
    """Where the trainer commits the checkpoint of `step` (see brain_trainer.checkpoint)."""
    return f"{mount_path.rstrip('/')}/step-{step:08d}"


def _number(doc: Mapping[str, Any], key: str) -> Optional[float]:
    value = doc.get(key)
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def progress_status(
    doc: Optional[Mapping[str, Any]], previous: Mapping[str, Any], *, now: datetime, mount_path: str
) -> dict[str, Any]:
    """The `progress` and `lastCheckpoint` fields of the new status.

    `doc` is None when the worker could not be reached: the previous values
    stand, so a restarting pod never blanks what `kubectl get btj` shows.
    """
    out = {k: previous[k] for k in ("progress", "lastCheckpoint") if k in previous}
    step = _number(doc, "step") if doc else None
    if step is None:
        return out
    progress = {
        "step": int(step),
        "totalSteps": _int_or_none(_number(doc, "total_steps")),
        "loss": _round(_number(doc, "loss")),
        "tokensPerSecond": _round(_number(doc, "tokens_per_second")),
        "etaSeconds": _int_or_none(_number(doc, "eta_seconds")),
        "updatedAt": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    out["progress"] = {k: v for k, v in progress.items() if v is not None}
    ckpt = _number(doc, "last_checkpoint_step")
    if ckpt is not None and ckpt > 0:
        out["lastCheckpoint"] = {"step": int(ckpt), "path": checkpoint_path(mount_path, int(ckpt))}
    return out


def changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether a patch is worth sending (the timestamp alone is not news)."""
    strip = lambda p: {k: v for k, v in (p or {}).items() if k != "updatedAt"}  # noqa: E731
    return strip(old.get("progress")) != strip(new.get("progress")) or old.get("lastCheckpoint") != new.get("lastCheckpoint")


def _round(value: Optional[float]) -> Optional[float]:
    # Status is for humans and printer columns: 4 significant digits.
    return None if value is None else float(f"{value:.4g}")


def _int_or_none(value: Optional[float]) -> Optional[int]:
    return None if value is None else int(value)
