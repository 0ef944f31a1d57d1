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

from .cluster import ObjectRef
from .events import NORMAL, Event
from .job_status import JobStatus
from .names import CHECKPOINT_NOW_ANNOTATION


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


def answered_events(previous: Mapping[str, Any], polled: Mapping[str, Any]) -> Iterator[Event]:
    """CheckpointCommitted, with its step, when rank 0's progress answers a new request.

    `previous` is the job's status, `polled` the fields the progress poll writes over it.
    """
    before = JobStatus.read(previous).progress
    after = JobStatus.read({**previous, **polled}).progress
    request = after.checkpoint_request if after else None
    if request and request != (before.checkpoint_request if before else None):
        yield Event(
            NORMAL,
            "CheckpointCommitted",
            f"checkpoint of step {after.checkpoint_request_step} committed for {CHECKPOINT_NOW_ANNOTATION}={request}",
        )
