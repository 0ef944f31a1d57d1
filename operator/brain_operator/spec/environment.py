"""The environment variables the operator owns, and the rule that keeps users' keys off them."""

from __future__ import annotations

import re
from typing import Iterator, Mapping

from brain_trainer.contract import CHECKPOINT_CLAIM_ENV, FAIL_FAST_ENV, LAUNCH_ENV_KEYS, LAUNCH_ENV_PREFIXES, LEASE_HOLDER_ENV
from brain_trainer.schema import quoted

from .kube import ENV_NAME_PATTERN

PYTHONUNBUFFERED = "PYTHONUNBUFFERED"
# A restarted worker group must not read the dead group's gloo/NCCL addresses
# from a store it shares with torchrun (pytorch/pytorch#135712).
SHARE_RDZV_STORE = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
# spec.nccl's typed fields, by the variable each one renders.
NCCL_DEBUG = "NCCL_DEBUG"
NCCL_SOCKET_IFNAME = "NCCL_SOCKET_IFNAME"
NCCL_IB_DISABLE = "NCCL_IB_DISABLE"
# spec.objectStore.endpoint, by the name the AWS SDKs and CLI read it by (the trainer's S3 client among them).
AWS_ENDPOINT_URL = "AWS_ENDPOINT_URL"

RESERVED_ENV_PREFIXES = LAUNCH_ENV_PREFIXES
RESERVED_ENV_KEYS = (*LAUNCH_ENV_KEYS, PYTHONUNBUFFERED, SHARE_RDZV_STORE, NCCL_DEBUG, NCCL_SOCKET_IFNAME, NCCL_IB_DISABLE,
                     FAIL_FAST_ENV, LEASE_HOLDER_ENV, CHECKPOINT_CLAIM_ENV)


def reserved_env_key(name: str) -> bool:
    return name in RESERVED_ENV_KEYS or name.startswith(RESERVED_ENV_PREFIXES)


def check_env(env: Mapping[str, str], field_name: str) -> Iterator[tuple[str, str]]:
    """Each key that is not a variable name, or that the operator or torchrun sets itself."""
    for key in env:
        if not re.fullmatch(ENV_NAME_PATTERN, key):
            yield f"{field_name}.{key}", f"{quoted(key)} is not a valid environment variable name"
        elif reserved_env_key(key):
            yield f"{field_name}.{key}", f"{quoted(key)} is reserved (set by the operator or torchrun) and cannot be overridden"
