"""The object store's endpoint URL in a spec (pure); its `s3://bucket/prefix` URIs are the trainer's grammar
(brain_trainer/uris.py), which the spec checks share.

The trainer reads the URI from trainer.yaml and the endpoint and credentials
from its environment, as the AWS tools do (docs/operator.md, "Checkpoints and
data in an object store").
"""

from __future__ import annotations

from typing import Optional
from urllib.parse import urlsplit

from brain_trainer.schema import quoted

ENDPOINT_SCHEMES = ("http", "https")


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
