"""Checkpoints and profiles on demand, the operator's part (pure): the events of a request passed on and of its answer.

A request travels as data, never as a call into a pod: the job's
`brain.ai/checkpoint-now` (or `brain.ai/profile-now`) annotation -> a key of
the job's ConfigMap (render) -> the file beside trainer.yaml in every worker's
read-only config volume, which rank 0 reads at its preemption votes. The answer
comes back in rank 0's progress document (`checkpointRequest` and
`checkpointRequestStep`; `profile`, the folder of the traces).
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping, Optional, Sequence

from brain_trainer.contract import CHECKPOINT_REQUEST_FILE, PROFILE_REQUEST_FILE, profile_request_steps

from ..objects.names import CHECKPOINT_NOW_ANNOTATION, PROFILE_NOW_ANNOTATION
from ..objects.refs import ObjectRef
from .events import NORMAL, WARNING, Event
from .job_status import JobStatus

AT_THE_BOUNDARY = "at their first step boundary after the kubelet updates their config volume"


def request_events(
    patches: Sequence[tuple[ObjectRef, Mapping[str, Any]]], existing: Mapping[ObjectRef, Mapping[str, Any]]
) -> Iterator[Event]:
    """CheckpointRequested, ProfileRequested (or a Warning for a malformed one) for a ConfigMap patch that carries
    a new request."""
    for ref, body in patches:
        if ref.kind != "ConfigMap":
            continue
        new = _new_value(CHECKPOINT_REQUEST_FILE, body, existing.get(ref))
        if new:
            yield Event(NORMAL, "CheckpointRequested",
                        f"{CHECKPOINT_NOW_ANNOTATION}={new}: the workers commit a checkpoint {AT_THE_BOUNDARY}")
        new = _new_value(PROFILE_REQUEST_FILE, body, existing.get(ref))
        if new:
            yield _profile_requested(new)


def _new_value(key: str, body: Mapping[str, Any], existing: Optional[Mapping[str, Any]]) -> Optional[str]:
    new = (body.get("data") or {}).get(key)
    old = ((existing or {}).get("data") or {}).get(key)
    return new if new and new != old else None


def _profile_requested(request: str) -> Event:
    try:
        steps = profile_request_steps(request)
    except ValueError as exc:
        return Event(WARNING, "ProfileRequestInvalid", f"{PROFILE_NOW_ANNOTATION}: {exc}; the workers ignore it")
    return Event(NORMAL, "ProfileRequested",
                 f"{PROFILE_NOW_ANNOTATION}={request}: every worker profiles the next {steps} step(s) {AT_THE_BOUNDARY}")


def answered_events(before: JobStatus, after: JobStatus) -> Iterator[Event]:
    """CheckpointCommitted, with its step, when rank 0's progress in `after` answers a request `before` had not;
    ProfileWritten, with its folder, when it names a profile `before` did not."""
    answer, earlier = after.progress, before.progress
    asked = earlier.checkpoint_request if earlier else None
    if answer is not None and answer.checkpoint_request and answer.checkpoint_request != asked:
        yield Event(
            NORMAL,
            "CheckpointCommitted",
            f"checkpoint of step {answer.checkpoint_request_step} committed for "
            f"{CHECKPOINT_NOW_ANNOTATION}={answer.checkpoint_request}",
        )
    if answer is not None and answer.profile and answer.profile != (earlier.profile if earlier else None):
        yield Event(NORMAL, "ProfileWritten",
                    f"every worker's trace written to {answer.profile}/rank-<rank>.json.gz on the checkpoint volume")
