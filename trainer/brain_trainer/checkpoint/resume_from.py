"""checkpoint.resume_from: which committed checkpoint a run starts from (docs/checkpoints.md, "Where a run starts").

`latest` resumes from the newest committed checkpoint; `none` starts from
scratch; a step resumes from that committed checkpoint. What would be in the
way (every checkpoint for `none`, the newer ones for a step) is moved into a
set-aside folder on the same volume (store.set_aside), never deleted.

Applied once per run. A restart of the run (torchrun's, a replaced pod,
`braintrain run` again) must continue from the checkpoints the run wrote
itself, not set them aside again (`none` would start over at every restart).
RECORD in the checkpoint folder maps each run id (torchrun's: the job's uid in
a cluster, its name locally) to the value the run last applied; a value is
applied when the record does not hold it for this run: a new job, or another
value, applies it again.

Torch-free and collective-free: rank 0 applies it; the local runner asks what
a run will start from.
"""

from __future__ import annotations

import json
import logging
from typing import Optional

from ..config import RESUME_LATEST, RESUME_NONE, CheckpointConfig
from . import location

log = logging.getLogger(__name__)

RECORD = "resume-from.json"  # {run id: the resume_from it applied}


def _record(root: location.Root) -> dict[str, str]:
    try:
        record = json.loads(location.store_for(root).read_text(root / RECORD))
    except (OSError, ValueError):
        return {}  # none yet (write_atomic never leaves a torn one)
    return record if isinstance(record, dict) else {}


def pending(root: location.Root, cfg: CheckpointConfig, run_id: str) -> bool:
    """Whether this run has yet to apply cfg.resume_from (a run never recorded has applied `latest`)."""
    return cfg.enabled and _record(root).get(run_id, RESUME_LATEST) != str(cfg.resume_from)


def _newest_kept(cfg: CheckpointConfig) -> Optional[int]:
    """The newest step that stays in place: -1 for none (nothing), the step, None for latest (everything)."""
    return -1 if cfg.resume_from == RESUME_NONE else cfg.resume_step()


def refusal(root: location.Root, cfg: CheckpointConfig, run_id: str) -> Optional[str]:
    """Why the run cannot start as asked (a step that is not committed), or None."""
    step = cfg.resume_step()
    if step is None or not pending(root, cfg, run_id):
        return None
    committed = sorted(c.step for c in location.store_for(root).list_checkpoints(root) if c.manifest is not None)
    if step in committed:
        return None
    return (f"step {step} is not a committed checkpoint in {root}; "
            f"committed: {', '.join(map(str, committed)) or 'none'}")


def start_point(root: location.Root, cfg: CheckpointConfig, run_id: str) -> Optional[store.Candidate]:
    """The committed checkpoint the run will start from (before verification), once resume_from is applied."""
    kept = _newest_kept(cfg) if pending(root, cfg, run_id) else None
    return next((c for c in location.store_for(root).list_checkpoints(root)
                 if c.manifest is not None and (kept is None or c.step <= kept)), None)


def apply(root: location.Root, cfg: CheckpointConfig, run_id: str) -> Optional[str]:
    """Set aside what is in the way of cfg.resume_from, once per run; returns refusal()'s line instead, if any.

    The record is written after the moves: a crash in between applies it again
    at the next start, which finds nothing more in the way.
    """
    if not pending(root, cfg, run_id):
        return None
    line = refusal(root, cfg, run_id)
    if line is not None:
        return line
    kept = _newest_kept(cfg)
    files = location.store_for(root)  # a volume's or a bucket's (location.py)
    doomed = [path for step, path in files.lineage(root) if kept is not None and step > kept]
    if doomed:
        target = files.set_aside(root, doomed, f"resume-from-{cfg.resume_from}")
        start = "from scratch" if kept < 0 else f"from step {kept}"
        log.warning("checkpoint.resume_from %s: moved %s aside to %s; starting %s (once for run %r: its restarts "
                    "continue from its own checkpoints)", cfg.resume_from, ", ".join(p.name for p in doomed), target,
                    start, run_id)
    files.write_text(root / RECORD, json.dumps({**_record(root), run_id: str(cfg.resume_from)}, sort_keys=True))
    return None
