"""Where `braintrain run` finds a job's token dataset on this machine, and the vocabulary read from it.

`data.path` as `braintrain run` reads it (`{stdlib}`, a relative path from the manifest's folder: plan.localize),
and a path on the data claim in the folder `braintrain run` maps that claim to. `braintrain validate` and
`braintrain estimate` read it the same way and pass it to the pure storage check and estimate
(sizing/vocabulary.py says what a vocabulary is, and what is assumed where the dataset is out of reach).
"""

from __future__ import annotations

import sysconfig
from pathlib import Path, PurePosixPath
from typing import Optional

from brain_trainer.data.errors import DataError
from brain_trainer.data.tokens.format import read_manifest
from brain_trainer.schema import quoted

from ..sizing.vocabulary import Vocabulary, assumed, given
from ..spec import Job
from .plan import CLAIMS_DIR, localize, rewrite_path

PROBLEM_LIMIT = 200  # characters of each place's problem that the text quotes: data.path may be very long


def dataset_folders(job: Job, *, base_dir: Path, claims: Path) -> list[Path]:
    """Where the token dataset of `data.path` may be on this machine, in the order to look (pure)."""
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


def job_vocabulary(job: Job, *, base_dir: Optional[Path] = None, claims: Optional[Path] = None) -> Vocabulary:
    """The vocabulary the trainer will give the preset, read from the dataset where it is reachable from here.

    `base_dir`: the manifest's folder (default: the working directory); `claims`: where `braintrain run`
    keeps claims (default: its own default).
    """
    settled = given(job)
    if settled is not None:
        return settled
    if job.spec.data.uri is not None:
        return assumed(job, f"the dataset is in an object store ({job.spec.data.uri}), not read from here")
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
