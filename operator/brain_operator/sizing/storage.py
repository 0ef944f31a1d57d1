"""Will the checkpoints fit? (pure, torch-free)

A checkpoint's size comes from the memory planner's byte counts
(`brain_trainer.plan.checkpoint_size.preset_checkpoint_bytes`: fp32 parameters, AdamW's two
moments, the extra state). The checkpoint volume must hold `keepLast`
committed checkpoints and the one being written: `(keepLast + 1) x` that
size. `braintrain validate`, `braintrain estimate` and the operator refuse a
`volumeClaimTemplate` smaller than that, with the vocabulary the trainer will
give the preset (vocabulary.py: a token dataset's tokenizer's where this
machine reaches the dataset, said as assumed where not); a `claimName`'s size is known only
to the cluster, so the operator warns in an event; `braintrain run` checks
that its checkpoint folder has room for the next checkpoint before it starts,
as the trainer does before each save (docs/checkpoints.md, "Room for
checkpoints").
"""

from __future__ import annotations

from typing import Optional

from brain_trainer.plan import planned_model, preset_checkpoint_bytes
from brain_trainer.schema import ConfigError, FieldError

from ..status.events import WARNING, Event
from ..spec import Job
from ..spec.kube import quantity_value
from .vocabulary import Vocabulary, with_vocabulary

TEMPLATE_STORAGE = "spec.checkpoint.volumeClaimTemplate.storage"


class StorageTooSmall(ConfigError):
    """The checkpoint volume cannot hold the checkpoints the job keeps (one field error, naming both figures)."""


def size_text(size: float) -> str:
    return f"{size / 1e9:,.1f} GB" if size >= 1e9 else f"{size / 1e6:,.1f} MB"


def checkpoint_size(job: Job) -> Optional[int]:
    """Bytes of one committed checkpoint; None without checkpoints or for a user model (its size is unknown here)."""
    if not job.spec.checkpoint.enabled or job.spec.model.entrypoint:
        return None
    return preset_checkpoint_bytes(planned_model(job.spec.model))


def room_needed(job: Job) -> Optional[tuple[int, int]]:
    """(bytes the checkpoint volume needs, one checkpoint's bytes): keepLast committed ones and one being written."""
    size = checkpoint_size(job)
    return None if size is None else ((job.spec.checkpoint.keep_last + 1) * size, size)


def _room_text(needed: int, size: int, keep_last: int) -> str:
    return f"(checkpoint.keepLast {keep_last} + 1) x {size_text(size)} per checkpoint = {size_text(needed)}"


def check_storage(job: Job, vocabulary: Vocabulary) -> None:
    """Raise StorageTooSmall when the volumeClaimTemplate is smaller than the checkpoints need.

    `vocabulary`: the model's, as the caller found it (local/dataset.py reads a token dataset's; the operator
    assumes the preset's).
    """
    template = job.spec.checkpoint.volume_claim_template
    if template is None:
        return
    room = room_needed(with_vocabulary(job, vocabulary))
    if room is None:
        return
    storage = quantity_value(template.storage) or 0.0
    if storage < room[0]:
        have = f"{template.storage} ({size_text(storage)})"
        why = f" (vocabulary: {vocabulary.source})" if vocabulary.source else ""
        raise StorageTooSmall([FieldError(TEMPLATE_STORAGE, f"{have} cannot hold {_room_text(*room, job.spec.checkpoint.keep_last)}{why}")])


def storage_lines(job: Job) -> list[str]:
    """What `braintrain estimate` says about the checkpoint volume."""
    room = room_needed(job)
    if room is None:
        return ["checkpoint size: unknown (checkpoints off, or a user model)"]
    needed, size = room
    ckpt = job.spec.checkpoint
    where = (f"object store {ckpt.uri}: its room is the store's" if ckpt.uri
             else f"{TEMPLATE_STORAGE}: {ckpt.volume_claim_template.storage}, covers it" if ckpt.volume_claim_template
             else f"claim {ckpt.claim_name}: its size is known only to the cluster" if ckpt.claim_name
             else "pod-local scratch: the node's disk must hold it")
    return [f"checkpoint: {size_text(size)} each; keepLast {ckpt.keep_last} + 1 being written = {size_text(needed)}",
            where]


def unchecked_claim_event(job: Job) -> Optional[Event]:
    """A claimName's size is the cluster's to know: say what it must hold."""
    claim, room = job.spec.checkpoint.claim_name, room_needed(job)
    if claim is None or room is None:
        return None
    return Event(WARNING, "CheckpointStorageUnchecked",
                 f"checkpoint claim {claim} is not sized by the operator: it must hold "
                 f"{_room_text(*room, job.spec.checkpoint.keep_last)}, or the trainer fails with storage-full")


def local_shortfall(job: Job, *, free: int, folder: str) -> Optional[str]:
    """One line when a local checkpoint folder has no room for the next checkpoint, else None (the trainer
    checks the same before each save)."""
    size = checkpoint_size(job)
    if size is None or free >= size:
        return None
    return (f"storage-full: {folder} has {size_text(free)} free; the next checkpoint needs {size_text(size)} "
            f"(checkpoint.keepLast {job.spec.checkpoint.keep_last})")
