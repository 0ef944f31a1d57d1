"""The vocabulary a job's preset is planned with: `model.vocabSize`, the token dataset's tokenizer, or the preset's.

The trainer resizes a preset to the tokenizer of its token dataset when it
opens it (`data.tokens.source.follow_vocabulary`), and the vocabulary weighs
in a checkpoint's size (embedding and head). So `braintrain estimate` and the
storage check read the dataset's manifest.json where this machine reaches it:
`data.path` as `braintrain run` reads it (`{stdlib}`, a relative path from the
manifest's folder), and a path on the data claim in the folder `braintrain run`
maps that claim to. Where it is not reachable (the operator never reads a data
volume) the preset's own vocabulary is assumed, and the text says so.
"""

from __future__ import annotations

import sysconfig
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Optional

from brain_trainer.config.presets import preset_config
from brain_trainer.data.errors import DataError
from brain_trainer.data.tokens.format import read_manifest
from brain_trainer.schema import quoted

from ..spec import Job

VOCAB_SIZE_FIELD = "spec.model.vocabSize"
PROBLEM_LIMIT = 200  # characters of each place's problem that the text quotes: data.path may be very long


@dataclass(frozen=True)
class Vocabulary:
    """`size` for the model section (None: the preset's own); `source` says where a token dataset's vocabulary
    comes from, or that the preset's was assumed ("" when the manifest itself says)."""

    size: Optional[int]
    source: str = ""


def dataset_folders(job: Job, *, base_dir: Path, claims: Path) -> list[Path]:
    """Where the token dataset of `data.path` may be on this machine, in the order to look (pure)."""
    # Deferred: local_plan renders the pods, whose grace (grace.py) reads storage, which reads this module.
    from ..local.plan import localize, rewrite_path

    path = localize(job, base_dir=base_dir, stdlib=Path(sysconfig.get_paths()["stdlib"])).spec.data.path
    if path is None:
        return []
    folders = [Path(path).expanduser()]
    volume = job.spec.data.volume
    if volume is not None and volume.claim_name is not None and PurePosixPath(path).is_absolute():
        on_claim = Path(rewrite_path(path, {volume.mount_path: claims / volume.claim_name}))
        if on_claim not in folders:
            folders.append(on_claim)
    return folders


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


def job_vocabulary(job: Job, *, base_dir: Optional[Path] = None, claims: Optional[Path] = None) -> Vocabulary:
    """The vocabulary the trainer will give the preset, read from the dataset where it is reachable from here.

    `base_dir`: the manifest's folder (default: the working directory); `claims`: where `braintrain run`
    keeps claims (default: its own default).
    """
    settled = given(job)
    if settled is not None:
        return settled
    from ..local.run import CLAIMS_DIR  # here: local imports the storage check, which imports this module

    folders = dataset_folders(job, base_dir=base_dir or Path.cwd(), claims=claims or CLAIMS_DIR)
    problems = []
    for folder in folders:
        try:
            size = read_manifest(folder).tokenizer.vocab_size
        except DataError as exc:
            problems.append(_bounded(str(exc)))
            continue
        except ValueError:  # a path the OS cannot name (an embedded NUL byte)
            problems.append(f"{quoted(str(folder))}: not a path")
            continue
        return Vocabulary(size, f"{size:,} ids, the tokenizer of {folder}")
    return assumed(job, f"the dataset is not reachable from here ({'; '.join(problems)})")


def _bounded(text: str) -> str:
    return text if len(text) <= PROBLEM_LIMIT else f"{text[:PROBLEM_LIMIT]}..."


def with_vocabulary(job: Job, vocabulary: Vocabulary) -> Job:
    """The job with its model section sized as `vocabulary` says (pure)."""
    if vocabulary.size == job.spec.model.vocab_size:
        return job
    return replace(job, spec=replace(job.spec, model=replace(job.spec.model, vocab_size=vocabulary.size)))
