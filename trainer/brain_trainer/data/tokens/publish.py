"""`braintrain prepare --out s3://bucket/prefix`: a dataset prepared in a local folder, then published to the bucket.

Prepared locally first (the writer's own atomic folder, in a temporary folder
that is removed after), so that tokenizing is never held up by the store and
a failed run uploads nothing. Publishing then puts shards and tokenizer first,
each shard in one PUT carrying the manifest's CRC-32 (the store refuses bytes
that do not match it, and reports it on HEAD to every reader), and
manifest.json last: a reader finds no dataset or a complete one. A dataset
replaced with --force loses its manifest first, so no reader ever opens the
old manifest over new shards.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import DataError
from .bucket import BucketFolder
from .format import MANIFEST, SPLITS, TOKENIZER_FILE, Manifest, parse_manifest

_DATASET_FILE = re.compile(rf"(train|validation)-\d{{5}}\.bin|{re.escape(TOKENIZER_FILE)}|{re.escape(MANIFEST)}")


def check_bucket_destination(folder: BucketFolder, force: bool) -> None:
    """DataError unless nothing is stored under the prefix, or (with force) a dataset prepared before."""
    if not folder.names():
        return
    if not force:
        raise DataError(f"{folder.uri}: already exists; --force replaces a dataset prepared before")
    text = folder.read_text(MANIFEST)
    if text is None:
        raise DataError(f"{folder.uri}: exists and is not a token dataset; not replacing it")
    parse_manifest(text, folder.uri_of(MANIFEST))


def dataset_files(manifest: Manifest) -> list[str]:
    """The files of a dataset other than its manifest, shards first."""
    shards = [s.name for split in SPLITS for s in manifest.split(split).shards]
    return shards + ([manifest.tokenizer.file] if manifest.tokenizer.file else [])


def stale_objects(stored: list[str], manifest: Manifest) -> list[str]:
    """Objects of a replaced dataset that the new one does not overwrite (never a file a dataset does not have)."""
    kept = {*dataset_files(manifest), MANIFEST}
    return [name for name in stored if _DATASET_FILE.fullmatch(name) and name not in kept]


def publish(local: Path, folder: BucketFolder, manifest: Manifest) -> None:
    """Upload the dataset folder `local` (its manifest is `manifest`) to `folder`, manifest.json last."""
    stored = folder.names()
    if MANIFEST in stored:
        folder.remove([MANIFEST])  # from here the old dataset is gone: nothing reads a mix of two
    crc32 = {s.name: s.crc32 for split in SPLITS for s in manifest.split(split).shards}
    for name in dataset_files(manifest):
        folder.upload(local / name, name, crc32.get(name))
    folder.remove(stale_objects(stored, manifest))
    folder.upload(local / MANIFEST, MANIFEST)
