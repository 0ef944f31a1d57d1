"""How long a stopped worker gets to commit a checkpoint (pure).

SIGTERM (a preemption, an eviction, a drain, suspend, a scale-down) makes the
trainer commit a checkpoint before it exits (docs/checkpoints.md). The kubelet
SIGKILLs the container `terminationGracePeriodSeconds` after it signalled it,
and torchrun SIGKILLs its workers `--shutdown-timeout` after it forwarded the
signal; so the grace must fit one save, and torchrun's timeout must end a
little before the grace does, or torchrun is killed before it reaps its
workers. `spec.runPolicy.terminationGracePeriodSeconds` sets the grace; unset,
it is the planned save's time (the checkpoint's size from the memory planner,
storage.checkpoint_size, over a conservative write rate), at least
MIN_GRACE_SECONDS.
"""

from __future__ import annotations

import math
from typing import Optional

from ..spec import Job
from .storage import checkpoint_size

# The grace before it was configurable, and the least a default gives: a small model's save, a slow volume.
MIN_GRACE_SECONDS = 300
# What one node is assumed to write to shared checkpoint storage: a network file system client's rate, low on
# purpose (a save that is cut short loses the work since the previous checkpoint).
PLANNED_WRITE_BYTES_PER_SECOND = 100e6
# torchrun's shutdown timeout ends this long before the grace does, so torchrun itself exits in time.
SHUTDOWN_MARGIN_SECONDS = 30


def planned_save_seconds(job: Job) -> Optional[int]:
    """Seconds one checkpoint save takes at the planned write rate, every node writing its share; None when the
    size is unknown (a user model, checkpoints off)."""
    size = checkpoint_size(job)
    if size is None:
        return None
    return math.ceil(size / job.spec.nodes / PLANNED_WRITE_BYTES_PER_SECOND)


def termination_grace_seconds(job: Job) -> int:
    """The worker pods' terminationGracePeriodSeconds: the job's, else room for the planned save and torchrun's
    margin, at least MIN_GRACE_SECONDS."""
    chosen = job.spec.run_policy.termination_grace_period_seconds
    if chosen is not None:
        return chosen
    save = planned_save_seconds(job) or 0
    return max(MIN_GRACE_SECONDS, save + SHUTDOWN_MARGIN_SECONDS)


def shutdown_timeout_seconds(grace: int) -> int:
    """torchrun's --shutdown-timeout within `grace`: SHUTDOWN_MARGIN_SECONDS less, or half a short grace."""
    return max(1, grace - min(SHUTDOWN_MARGIN_SECONDS, grace // 2))
