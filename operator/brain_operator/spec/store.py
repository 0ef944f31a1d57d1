"""Object-store locations in a spec: `s3://bucket/prefix` URIs and the store's endpoint URL (pure).

S3 is the one protocol: Amazon S3 and the S3-compatible stores (MinIO, Ceph,
Cloudflare R2) speak it, and it is the one this project tests against. The
trainer reads the URI from trainer.yaml and the endpoint and credentials from
its environment, as the AWS tools do (docs/operator.md, "Checkpoints and data
in an object store").
"""

from __future__ import annotations

import re
from typing import Optional
from urllib.parse import urlsplit

from brain_trainer.schema import quoted

S3_SCHEME = "s3"
SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
# S3's bucket naming rules (3-63 characters; lowercase letters, digits, dots and hyphens; a letter or digit at
# each end), which MinIO, Ceph and R2 follow.
BUCKET_PATTERN = r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]"
ENDPOINT_SCHEMES = ("http", "https")


def has_scheme(value: str) -> bool:
    """`value` starts with `scheme://`: a URI, not a path."""
    return SCHEME.match(value) is not None


def uri_problem(uri: str) -> Optional[str]:
    """Why `uri` is not an `s3://bucket/prefix` URI, naming the scheme it has instead; None when it is one."""
    match = SCHEME.match(uri)
    if match is None:
        return f"must be an s3://bucket/prefix URI, got {quoted(uri)}"
    if match.group(1) != S3_SCHEME:
        return (f"scheme {quoted(match.group(1))} is not supported: only s3:// (Amazon S3 and S3-compatible stores: "
                f"MinIO, Ceph, R2), got {quoted(uri)}")
    bucket, _, prefix = uri[match.end():].partition("/")
    if not re.fullmatch(BUCKET_PATTERN, bucket):
        return (f"{quoted(bucket)} is not a bucket name (3 to 63 lowercase letters, digits, '.' and '-'), "
                f"got {quoted(uri)}")
    if prefix and any(part in ("", ".", "..") for part in prefix.rstrip("/").split("/")):
        return f"the prefix must not have empty, '.' or '..' parts, got {quoted(uri)}"
    return None


def endpoint_problem(endpoint: str, secret_field: str) -> Optional[str]:
    """Why `endpoint` is not the http(s) URL of a store; None when it is one. Credentials in it are refused:
    they belong in a Secret (`secret_field` names it), never in a manifest."""
    parts = urlsplit(endpoint)
    if parts.scheme not in ENDPOINT_SCHEMES or not parts.hostname:
        return f"must be an http:// or https:// URL such as https://minio.example:9000, got {quoted(endpoint)}"
    if parts.username is not None or parts.password is not None:
        return f"must not carry credentials: name a Secret holding them in {secret_field}"
    if parts.query or parts.fragment:
        return f"must have no query or fragment, got {quoted(endpoint)}"
    try:
        parts.port
    except ValueError:
        return f"has no valid port, got {quoted(endpoint)}"
    return None
