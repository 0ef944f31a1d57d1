"""Object-store URIs, `s3://bucket/prefix`: besides a local path, the one kind of place where checkpoints
(checkpoint.dir) and token datasets (data.path, `braintrain prepare --out`) live. Pure: one grammar for the
trainer's config checks, its readers and writers, and the operator's spec checks.

S3 is the one protocol: Amazon S3 and the S3-compatible stores (MinIO, Ceph, Cloudflare R2) speak it, and it is
the one tested here (against a real S3 server on loopback). gs:// and other schemes are refused by name.
"""

from __future__ import annotations

import re
from typing import Optional

from .schema import quoted

S3 = "s3"
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
# S3's bucket naming rules (3-63 characters; lowercase letters, digits, dots and hyphens; a letter or digit at
# each end), which MinIO, Ceph and R2 follow.
BUCKET_PATTERN = r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]"


def scheme_of(value: str) -> Optional[str]:
    """The scheme of a URI (`s3` of `s3://bucket/prefix`), lowercased; None for a plain path."""
    match = _SCHEME.match(value)
    return match.group(1).lower() if match else None


def is_uri(value: str) -> bool:
    """`value` starts with `scheme://`: an object store's URI, not a path."""
    return scheme_of(value) is not None


def uri_problem(uri: str) -> Optional[str]:
    """Why `uri` is not an `s3://bucket/prefix` URI, naming the scheme it has instead; None when it is one."""
    scheme = scheme_of(uri)
    if scheme is None:
        return f"must be an s3://bucket/prefix URI, got {quoted(uri)}"
    if scheme != S3:
        return (f"scheme {quoted(scheme)} is not supported: only s3:// (Amazon S3 and S3-compatible stores: "
                f"MinIO, Ceph, R2), got {quoted(uri)}")
    bucket, _, prefix = uri[len(scheme) + 3:].partition("/")
    if not re.fullmatch(BUCKET_PATTERN, bucket):
        return (f"{quoted(bucket)} is not a bucket name (3 to 63 lowercase letters, digits, '.' and '-'), "
                f"got {quoted(uri)}")
    if prefix and any(part in ("", ".", "..") for part in prefix.rstrip("/").split("/")):
        return f"the prefix must not have empty, '.' or '..' parts, got {quoted(uri)}"
    return None


def place_problem(value: str) -> Optional[str]:
    """Why `value`, a local path or an object store's URI, names no place; None for any path and a good URI."""
    return uri_problem(value) if is_uri(value) else None
