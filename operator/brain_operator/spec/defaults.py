"""Cluster-wide defaults the operator applies to jobs that omit them (the Helm chart sets them)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from brain_trainer.schema import ConfigError, FieldError, quoted

from .environment import check_env
from .kube import PULL_POLICIES


@dataclass(frozen=True)
class OperatorDefaults:
    """The trainer image, its pull policy and pull secrets, and extra NCCL variables for jobs that name none."""

    image: Optional[str] = None
    image_pull_policy: Optional[str] = None
    nccl_env: Mapping[str, str] = field(default_factory=dict)
    # Secrets every job's pods pull with, besides the job's own spec.podTemplate.spec.imagePullSecrets.
    image_pull_secrets: tuple[str, ...] = ()

    ENV_IMAGE = "BRAIN_TRAINER_IMAGE"
    ENV_PULL_POLICY = "BRAIN_TRAINER_IMAGE_PULL_POLICY"
    ENV_NCCL = "BRAIN_NCCL_ENV"
    ENV_PULL_SECRETS = "BRAIN_TRAINER_IMAGE_PULL_SECRETS"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> "OperatorDefaults":
        """Read BRAIN_TRAINER_IMAGE, BRAIN_TRAINER_IMAGE_PULL_POLICY, BRAIN_NCCL_ENV (a JSON object) and
        BRAIN_TRAINER_IMAGE_PULL_SECRETS (a JSON list of {name: ...}, as the chart's values write it)."""
        errors: list[FieldError] = []
        policy = environ.get(cls.ENV_PULL_POLICY) or None
        if policy is not None and policy not in PULL_POLICIES:
            errors.append(FieldError(cls.ENV_PULL_POLICY, f"must be one of {', '.join(PULL_POLICIES)}; got {quoted(policy)}"))
        nccl_env: Any = {}
        raw = environ.get(cls.ENV_NCCL, "").strip()
        if raw:
            try:
                nccl_env = json.loads(raw)
            except json.JSONDecodeError as exc:
                errors.append(FieldError(cls.ENV_NCCL, f"must be a JSON object: {exc.msg}"))
            if not isinstance(nccl_env, dict) or not all(isinstance(v, str) for v in nccl_env.values()):
                errors.append(FieldError(cls.ENV_NCCL, f"must map names to string values, got {quoted(raw)}"))
                nccl_env = {}
            errors.extend(FieldError(cls.ENV_NCCL, message) for _, message in check_env(nccl_env, cls.ENV_NCCL))
        secrets = _pull_secrets(environ.get(cls.ENV_PULL_SECRETS, "").strip(), errors)
        if errors:
            raise ConfigError(errors)
        return cls(
            image=environ.get(cls.ENV_IMAGE) or None, image_pull_policy=policy, nccl_env=nccl_env, image_pull_secrets=secrets
        )


def _pull_secrets(raw: str, errors: list[FieldError]) -> tuple[str, ...]:
    if not raw:
        return ()
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        value = exc
    names = [item.get("name") for item in value if isinstance(item, dict)] if isinstance(value, list) else []
    if not isinstance(value, list) or len(names) != len(value) or not all(isinstance(n, str) and n for n in names):
        errors.append(FieldError(OperatorDefaults.ENV_PULL_SECRETS, f"must be a JSON list of {{\"name\": SECRET}}, got {quoted(raw)}"))
        return ()
    return tuple(names)
