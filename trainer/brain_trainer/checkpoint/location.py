"""Where checkpoints live: a folder on a volume, or a prefix of an object-storage bucket (checkpoint.dir).

    root = root_of(cfg.dir)            # a Path, or a BucketPath for s3://bucket/prefix
    files = store_for(root)            # the module that keeps checkpoints there: store (volume) or bucket
    files.list_checkpoints(root), files.commit(...), files.apply_retention(root, keep_last), ...

Both modules offer the same functions with the same meaning (store.py's docstring); what differs is how a
commit is made atomic: a rename on a volume, the manifest written last on a bucket (bucket.py). Only the
manager, resume_from, the DCP reader and writer (shards.py) and the readers outside training (export,
model.init_from, generate and eval's loading, `braintrain checkpoints`, the local runner) route through here;
everything above them sees a committed checkpoint either way.

Torch-free; importing it loads no S3 client (bucket.py imports boto3 and s3fs when first used).
"""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType
from typing import Mapping, Optional, Union

from ..schema import ConfigError, FieldError
from ..uris import is_uri, place_problem
from . import bucket, store
from .bucket import BucketPath
from .bucket_lease import BucketLease
from .lease import VolumeLease

Root = Union[Path, BucketPath]


def root_of(value: str | os.PathLike) -> Root:
    """checkpoint.dir as a place: a BucketPath for s3://bucket/prefix, else a Path (a config-error for other URIs)."""
    if isinstance(value, (Path, BucketPath)):
        return value
    text = os.fspath(value)
    problem = place_problem(text)
    if problem is not None:
        raise ConfigError([FieldError("checkpoint.dir", problem)])
    if is_uri(text):
        return BucketPath.of(text)
    return Path(text)


def is_bucket(path: object) -> bool:
    return isinstance(path, BucketPath)


def store_for(path: Root) -> ModuleType:
    """The module that keeps checkpoints at `path`: bucket for a bucket's prefix, store for a folder."""
    return bucket if is_bucket(path) else store


def committed(path: Root) -> Optional[Root]:
    """The committed checkpoint `path` names: itself when it holds a manifest, else its newest committed step (a
    checkpoint.dir); None when it is neither. What export, model.init_from, generate and eval read."""
    files = store_for(path)
    return path if files.is_file(path / store.MANIFEST) else files.latest_checkpoint(path)


def lease_for(root: Root, ttl_s: float, *, rank: int, env: Mapping[str, str] = os.environ) -> VolumeLease:
    """The lease on `root`: files on a volume, conditionally written objects on a bucket (bucket_lease.py)."""
    if is_bucket(root):
        return BucketLease(root, ttl_s, rank=rank, env=env)
    return VolumeLease(root, ttl_s, rank=rank, env=env)

