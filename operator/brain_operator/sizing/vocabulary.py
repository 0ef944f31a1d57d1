"""The vocabulary a job's preset is planned with: `model.vocabSize`, the token dataset's tokenizer, or the preset's.

The trainer resizes a preset to the tokenizer of its token dataset when it
opens it (`data.tokens.source.follow_vocabulary`), and the vocabulary weighs
in a checkpoint's size (embedding and head). So `braintrain estimate` and the
storage check take the vocabulary of the dataset's manifest.json where this
machine reaches it, read by the caller (local/dataset.py, as `braintrain run`
finds the dataset). Where it is not reachable (the operator never reads a data
volume) the preset's own vocabulary is assumed, and the text says so.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from brain_trainer.config.presets import preset_config

from ..spec import Job

VOCAB_SIZE_FIELD = "spec.model.vocabSize"


@dataclass(frozen=True)
class Vocabulary:
    """`size` for the model section (None: the preset's own); `source` says where a token dataset's vocabulary
    comes from, or that the preset's was assumed ("" when the manifest itself says)."""

    size: Optional[int]
    source: str = ""


def given(job: Job) -> Optional[Vocabulary]:
    """The vocabulary the manifest itself settles: model.vocabSize, a user model's, byte-level data's (pure)."""
    model = job.spec.model
    if model.vocab_size is not None or model.entrypoint or job.spec.data.source != "tokens":
        return Vocabulary(model.vocab_size)
    return None


def assumed(job: Job, why: str) -> Vocabulary:
    """The preset's own vocabulary, for a token dataset whose tokenizer is not read (pure)."""
    settled = given(job)
    if settled is not None:
        return settled
    size = preset_config(job.spec.model.preset).vocab_size
    return Vocabulary(None, f"{size:,} ids assumed, the preset's: {why}; {VOCAB_SIZE_FIELD} sets it")


def with_vocabulary(job: Job, vocabulary: Vocabulary) -> Job:
    """The job with its model section sized as `vocabulary` says (pure)."""
    if vocabulary.size == job.spec.model.vocab_size:
        return job
    return replace(job, spec=replace(job.spec, model=replace(job.spec.model, vocab_size=vocabulary.size)))
