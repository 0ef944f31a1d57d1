"""Cluster-wide defaults the operator applies to jobs that omit them (the Helm chart sets them)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from brain_trainer.schema import ConfigError, FieldError, from_dict, quoted

from .environment import check_env
from .kube import PULL_POLICIES, is_namespace
from .model import NetworkAccess
from .overlay_policy import OverlayPolicy


@dataclass(frozen=True)
class OperatorDefaults:
    """The trainer image, its pull policy and pull secrets, and extra NCCL variables for jobs that name none;
    who may reach every job's workers (its NetworkPolicy; None: the chart turned policies off)."""

    image: Optional[str] = None
    image_pull_policy: Optional[str] = None
    nccl_env: Mapping[str, str] = field(default_factory=dict)
    # Secrets every job's pods pull with, besides the job's own spec.podTemplate.spec.imagePullSecrets.
    image_pull_secrets: tuple[str, ...] = ()
    # What spec.podTemplate may ask of the worker pods (the chart's podOverlayPolicy); unset, nothing beyond the safe settings.
    overlay_policy: OverlayPolicy = field(default_factory=OverlayPolicy)
    network: Optional[NetworkAccess] = NetworkAccess()

    ENV_IMAGE = "BRAIN_TRAINER_IMAGE"
    ENV_PULL_POLICY = "BRAIN_TRAINER_IMAGE_PULL_POLICY"
    ENV_NCCL = "BRAIN_NCCL_ENV"
    ENV_PULL_SECRETS = "BRAIN_TRAINER_IMAGE_PULL_SECRETS"
    ENV_OVERLAY_POLICY = "BRAIN_POD_OVERLAY_POLICY"
    ENV_NETWORK_POLICY = "BRAIN_NETWORK_POLICY"
    # The chart sets it from the downward API (metadata.namespace).
    ENV_NAMESPACE = "BRAIN_OPERATOR_NAMESPACE"
    ENV_SCRAPE_NAMESPACES = "BRAIN_SCRAPE_NAMESPACES"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> "OperatorDefaults":
        """Read BRAIN_TRAINER_IMAGE, BRAIN_TRAINER_IMAGE_PULL_POLICY, BRAIN_NCCL_ENV (a JSON object),
        BRAIN_TRAINER_IMAGE_PULL_SECRETS (a JSON list of {name: ...}, as the chart's values write it),
        BRAIN_POD_OVERLAY_POLICY (the chart's podOverlayPolicy as a JSON object),
        BRAIN_NETWORK_POLICY (`false` turns the jobs' NetworkPolicies off), BRAIN_OPERATOR_NAMESPACE and
        BRAIN_SCRAPE_NAMESPACES (a JSON list of namespace names)."""
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
        overlay_policy = _overlay_policy(environ.get(cls.ENV_OVERLAY_POLICY, "").strip(), errors)
        network = _network(environ, errors)
        if errors:
            raise ConfigError(errors)
        return cls(
            image=environ.get(cls.ENV_IMAGE) or None, image_pull_policy=policy, nccl_env=nccl_env, image_pull_secrets=secrets,
            overlay_policy=overlay_policy,
            network=network,
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


def _overlay_policy(raw: str, errors: list[FieldError]) -> OverlayPolicy:
    if not raw:
        return OverlayPolicy()
    try:
        return from_dict(OverlayPolicy, json.loads(raw), path=OperatorDefaults.ENV_OVERLAY_POLICY, camel_case=True)
    except json.JSONDecodeError as exc:
        errors.append(FieldError(OperatorDefaults.ENV_OVERLAY_POLICY, f"must be a JSON object: {exc.msg}"))
    except ConfigError as exc:
        errors.extend(exc.errors)
    return OverlayPolicy()


def _network(environ: Mapping[str, str], errors: list[FieldError]) -> Optional[NetworkAccess]:
    switch = environ.get(OperatorDefaults.ENV_NETWORK_POLICY, "").strip().lower()
    if switch not in ("", "true", "false"):
        errors.append(FieldError(OperatorDefaults.ENV_NETWORK_POLICY, f"must be true or false, got {switch!r}"))
    raw = environ.get(OperatorDefaults.ENV_SCRAPE_NAMESPACES, "").strip()
    try:
        scrape = json.loads(raw) if raw else []
    except json.JSONDecodeError:
        scrape = None
    if not isinstance(scrape, list) or not all(isinstance(n, str) and is_namespace(n) for n in scrape):
        errors.append(FieldError(OperatorDefaults.ENV_SCRAPE_NAMESPACES, f"must be a JSON list of namespace names, got {raw!r}"))
        scrape = []
    own = environ.get(OperatorDefaults.ENV_NAMESPACE, "").strip() or None
    if own is not None and not is_namespace(own):
        errors.append(FieldError(OperatorDefaults.ENV_NAMESPACE, f"must be a namespace name, got {own!r}"))
    if switch == "false":
        return None
    return NetworkAccess(operator_namespace=own, scrape_namespaces=tuple(dict.fromkeys(scrape)))
