"""This process's S3 clients, boto3's and s3fs's: one of each, shared by the checkpoint store
(checkpoint/bucket.py) and the token dataset reader (data/tokens/bucket.py).

The endpoint is AWS_ENDPOINT_URL's (else AWS's own), the credentials boto's default chain's (the environment,
a mounted Secret's variables, the pod's service account through IRSA or EKS Pod Identity, the node's role):
never a manifest's or a config's. Clients are made per process and per endpoint: s3fs's event loop does not
survive a fork (DataLoader workers), and a test points a process at another server by changing the variable.
boto3 and s3fs (aiobotocore: a second of imports) load when first used, so only a bucket's job pays for them.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable

ENDPOINT_ENV = "AWS_ENDPOINT_URL"
# s3fs's buffer: one multipart part of a shard upload, one read-ahead (S3's 10,000 parts: files up to 320 GB).
PART_BYTES = 32 << 20
# A few tries with short timeouts, not botocore's minute per connection: an unreachable endpoint is named in
# seconds.
CLIENT_CONFIG = {"connect_timeout": 10, "read_timeout": 120, "retries": {"max_attempts": 3, "mode": "standard"}}

_made: dict[tuple[str, int, str | None], Any] = {}
_lock = threading.Lock()


def _one(kind: str, make: Callable[[], Any]) -> Any:
    key = (kind, os.getpid(), os.environ.get(ENDPOINT_ENV))
    with _lock:
        if key not in _made:
            _made[key] = make()
        return _made[key]


def _client() -> Any:
    import boto3
    from botocore.config import Config

    return boto3.session.Session().client("s3", config=Config(**CLIENT_CONFIG))


def _filesystem() -> Any:
    import s3fs

    # No listing cache: another job, or this job's other ranks, change the prefix under us.
    return s3fs.S3FileSystem(use_listings_cache=False, skip_instance_cache=True, default_block_size=PART_BYTES,
                             config_kwargs=CLIENT_CONFIG)


def client() -> Any:
    """boto3's S3 client: the calls s3fs does not offer (conditional writes, multipart listings, copies)."""
    return _one("client", _client)


def filesystem() -> Any:
    """s3fs's file system: streamed multipart uploads and ranged reads."""
    return _one("filesystem", _filesystem)
