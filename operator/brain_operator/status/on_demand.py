"""Checkpoint on demand, the operator's part (pure): the events of a request passed on and of its checkpoint.

The request travels as data, never as a call into a pod: the job's
`brain.ai/checkpoint-now` annotation -> a key of the job's ConfigMap (render)
-> the file beside trainer.yaml in every worker's read-only config volume,
which rank 0 reads at its preemption votes. The answer comes back in rank 0's
progress document (`checkpointRequest`, `checkpointRequestStep`).
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping, Sequence

from brain_trainer.contract import CHECKPOINT_REQUEST_FILE

from ..objects.refs import ObjectRef
from .events import NORMAL, Event
from .job_status import JobStatus
from ..objects.names import CHECKPOINT_NOW_ANNOTATION


def request_events(
    patches: Sequence[tuple[ObjectRef, Mapping[str, Any]]], existing: Mapping[ObjectRef, Mapping[str, Any]]
) -> Iterator[Event]:
    """CheckpointRequested for a ConfigMap patch that carries a new request."""
    for ref, body in patches:
        if ref.kind != "ConfigMap":
            continue
        new = (body.get("data") or {}).get(CHECKPOINT_REQUEST_FILE)
        old = ((existing.get(ref) or {}).get("data") or {}).get(CHECKPOINT_REQUEST_FILE)
        if new and new != old:
            yield Event(
                NORMAL,
                "CheckpointRequested",
                f"{CHECKPOINT_NOW_ANNOTATION}={new}: the workers commit a checkpoint at their first step boundary "
                f"after the kubelet updates their config volume",
            )


def answered_events(before: JobStatus, after: JobStatus) -> Iterator[Event]:
    """CheckpointCommitted, with its step, when rank 0's progress in `after` answers a request `before` had not."""
    answer, asked = after.progress, before.progress.checkpoint_request if before.progress else None
    if answer is not None and answer.checkpoint_request and answer.checkpoint_request != asked:
        yield Event(
            NORMAL,
            "CheckpointCommitted",
            f"checkpoint of step {answer.checkpoint_request_step} committed for "
            f"{CHECKPOINT_NOW_ANNOTATION}={answer.checkpoint_request}",
        )
