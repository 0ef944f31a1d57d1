"""A BrainTrainingJob manifest -> Job, or ConfigError naming every bad field (pure)."""

from __future__ import annotations

import re
from typing import Any, Mapping, Optional

from brain_trainer.contract import parse_time
from brain_trainer.schema import ConfigError, FieldError, from_dict, quoted

from ..objects.names import CHECKPOINT_NOW_ANNOTATION, PROFILE_NOW_ANNOTATION, worker_pod_name
from .defaults import OperatorDefaults
from .kube import DNS_LABEL_MAX, NAME_PATTERN, is_namespace
from .model import Job, JobSpec
from .overlay_policy import OverlayRefused, policy_problems
from ..objects.resource import API_VERSION, KIND

_TOP_LEVEL = ("apiVersion", "kind", "metadata", "spec", "status")
IMAGE_FIELD = "spec.image"


def parse_job(manifest: Any, *, require_image: bool = True, defaults: Optional[OperatorDefaults] = None) -> Job:
    """Validate a BrainTrainingJob manifest into a Job, or raise ConfigError naming every bad field.

    `require_image=False` serves the local runner, which runs the trainer from
    this checkout. `defaults` fill the image, pull policy and NCCL env a job omits, bound its pod overlay
    (without them, by the safe default policy) and say who may reach its workers (without them: a
    NetworkPolicy admitting only the job's own pods). A spec whose only faults are what its overlay asks
    beyond the policy raises OverlayRefused, a ConfigError that carries the job as parsed.
    """
    if not isinstance(manifest, Mapping):
        raise ConfigError([FieldError("", f"a BrainTrainingJob must be a mapping, got {type(manifest).__name__}")])
    errors: list[FieldError] = []
    for key in manifest:
        if key not in _TOP_LEVEL:
            errors.append(FieldError(str(key), f"unknown field (known fields: {', '.join(_TOP_LEVEL)})"))
    if manifest.get("apiVersion") != API_VERSION:
        errors.append(FieldError("apiVersion", f"must be {API_VERSION}, got {quoted(manifest.get('apiVersion'))}"))
    if manifest.get("kind") != KIND:
        errors.append(FieldError("kind", f"must be {KIND}, got {quoted(manifest.get('kind'))}"))
    name, namespace, uid, generation = _metadata(manifest.get("metadata"), errors)
    refusals: list[FieldError] = []
    spec = _spec(manifest.get("spec"), defaults, errors, refusals)
    if spec is not None:
        if require_image and not spec.image:
            errors.append(FieldError(IMAGE_FIELD, f"required: the trainer image the workers run; set it, or the "
                                                  f"operator's default in the environment variable {OperatorDefaults.ENV_IMAGE}"))
        if name is not None:
            longest = worker_pod_name(name, spec.node_range()[1] - 1)
            if len(longest) > DNS_LABEL_MAX:
                errors.append(
                    FieldError(
                        "metadata.name",
                        f"too long: pod hostname {longest!r} would exceed {DNS_LABEL_MAX} characters ({len(longest)})",
                    )
                )
    if len(errors) > len(refusals):
        raise ConfigError(errors)
    job = Job(name=name, namespace=namespace, uid=uid, generation=generation, spec=spec,
              checkpoint_request=_annotation(manifest.get("metadata"), CHECKPOINT_NOW_ANNOTATION),
              profile_request=_annotation(manifest.get("metadata"), PROFILE_NOW_ANNOTATION),
              created=_created(manifest.get("metadata")),
              network=(defaults or OperatorDefaults()).network)
    if refusals:
        raise OverlayRefused(refusals, job)
    return job


def job_or_none(manifest: Mapping[str, Any], defaults: Optional[OperatorDefaults] = None) -> Optional[Job]:
    """The job, also one whose overlay only the policy refuses (its pods may run); None for an invalid spec."""
    try:
        return parse_job(manifest, defaults=defaults)
    except OverlayRefused as err:
        return err.job
    except ConfigError:
        return None


def _created(metadata: Any) -> Optional[str]:
    """metadata.creationTimestamp when it is one (the API server always writes it; a local manifest has none)."""
    created = metadata.get("creationTimestamp") if isinstance(metadata, Mapping) else None
    try:
        return created if isinstance(created, str) and parse_time(created) else None
    except ValueError:
        return None


def _annotation(metadata: Any, key: str) -> Optional[str]:
    """An on-demand request's annotation (checkpoint-now, profile-now), when set and not blank."""
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    value = annotations.get(key) if isinstance(annotations, Mapping) else None
    return (value.strip() or None) if isinstance(value, str) else None


def _metadata(metadata: Any, errors: list[FieldError]) -> tuple[Any, str, str, int]:
    """Name, namespace, uid and generation; other metadata (labels, managedFields...) is the API server's."""
    if not isinstance(metadata, Mapping):
        errors.append(FieldError("metadata", f"must be a mapping with a name, got {quoted(metadata)}"))
        return None, "default", "", 0
    name = metadata.get("name")
    if not isinstance(name, str) or not re.fullmatch(NAME_PATTERN, name):
        errors.append(
            FieldError("metadata.name", f"must be a lowercase DNS label (letters, digits, '-', starting with a letter), got {quoted(name)}")
        )
        name = None
    namespace = metadata.get("namespace", "default")
    if not isinstance(namespace, str) or not is_namespace(namespace):
        errors.append(FieldError("metadata.namespace", f"must be a DNS label, got {quoted(namespace)}"))
    uid = metadata.get("uid", "")
    if not isinstance(uid, str):
        errors.append(FieldError("metadata.uid", f"must be a string, got {quoted(uid)}"))
    generation = metadata.get("generation", 0)
    if not isinstance(generation, int) or isinstance(generation, bool):
        errors.append(FieldError("metadata.generation", f"must be an integer, got {quoted(generation)}"))
    return name, namespace, uid, generation


def _spec(data: Any, defaults: Optional[OperatorDefaults], errors: list[FieldError],
          refusals: list[FieldError]) -> Optional[JobSpec]:
    """The typed spec, its faults added to `errors`; the overlay policy's refusals go to `refusals` as well."""
    try:
        spec = from_dict(JobSpec, data, path="spec", camel_case=True)
    except ConfigError as exc:
        errors.extend(exc.errors)
        return None
    if defaults is not None:
        spec.image = spec.image or defaults.image
        if "imagePullPolicy" not in (data or {}) and defaults.image_pull_policy:
            spec.image_pull_policy = defaults.image_pull_policy
        spec.nccl.env = {**defaults.nccl_env, **spec.nccl.env}
        overlay = spec.pod_template.spec
        own = {secret.get("name") for secret in overlay.image_pull_secrets}
        overlay.image_pull_secrets = [
            *({"name": name} for name in defaults.image_pull_secrets if name not in own),
            *overlay.image_pull_secrets,
        ]
    policy = (defaults or OperatorDefaults()).overlay_policy
    refusals.extend(FieldError(f"spec.podTemplate.{path}", message) for path, message in policy_problems(spec.pod_template, policy))
    errors.extend(refusals)
    return spec
