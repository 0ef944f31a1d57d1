"""Rank 0's progress document -> `status.progress` and `status.lastCheckpoint` (pure).

The operator polls each running job's rank-0 `/progress` endpoint once per
resync (`handlers.RESYNC_SECONDS`); these functions decide what to write, so
a large fleet does not flood the API server: a job's status is patched only
when the answer changed.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Mapping, Optional

from .status import format_time

def checkpoint_path(mount_path: str, step: int) -> str:
    """Where the trainer commits the checkpoint of `step` (see brain_trainer.checkpoint)."""
    return f"{mount_path.rstrip('/')}/step-{step:08d}"


def json_object(text: str | bytes) -> Optional[dict[str, Any]]:
    """A progress document parsed from `text`; None for anything else (garbage, a list, a torn write)."""
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def number(doc: Mapping[str, Any], key: str) -> Optional[float]:
    """A numeric field of a progress document; None when absent or not a number (true is not 1)."""
    value = doc.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def progress_status(
    doc: Optional[Mapping[str, Any]], previous: Mapping[str, Any], *, now: datetime, mount_path: str
) -> dict[str, Any]:
    """The `progress` and `lastCheckpoint` fields of the new status.

    `doc` is None when the worker could not be reached: the previous values
    stand, so a restarting pod never blanks what `kubectl get btj` shows.
    """
    out = {k: previous[k] for k in ("progress", "lastCheckpoint") if k in previous}
    step = number(doc, "step") if doc else None
    if step is None:
        return out
    progress = {
        "step": int(step),
        "totalSteps": _int_or_none(number(doc, "total_steps")),
        "loss": _round(number(doc, "loss")),
        "tokensPerSecond": _round(number(doc, "tokens_per_second")),
        "etaSeconds": _int_or_none(number(doc, "eta_seconds")),
        "updatedAt": format_time(now),
    }
    out["progress"] = {k: v for k, v in progress.items() if v is not None}
    ckpt = number(doc, "last_checkpoint_step")
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
