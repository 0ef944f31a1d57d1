"""The BrainTrainingJob custom resource: typed spec, parsing, defaults, API-server rules, derived values.

Pure and torch-free. The resource's identity (group, version, kind) is
brain_operator.objects.resource, re-exported here. Each module has one job:

    kube         what Kubernetes accepts (name patterns, quantities, access modes)
    store        object-store locations: s3:// URIs and the store's endpoint URL
    environment  the environment variables the operator owns
    model        the typed spec: the trainer's config sections plus operator-only ones
    defaults     cluster-wide defaults from the operator's environment
    parse        manifest -> Job, with errors that name the field
    cel          rules the API server enforces itself
    edits        which fields may change in flight, and the transition rules freezing the others
    owned        what the operator owns in a worker pod (names the overlay may not use)
    corev1       Kubernetes' core/v1 schemas for the pod overlay, and a checker
    overlay      spec.podTemplate: the pod overlay and its rules
    overlay_policy  what the overlay may ask for beyond the safe settings (the chart's podOverlayPolicy)
    derive       what follows from a job (size, backend, strategy, trainer.yaml)
    overrides    `--set PATH=VALUE`: the manifest changed before it is parsed
"""

from brain_trainer.schema import ConfigError

from .cel import API_SERVER_RULES, TRANSITION_RULES
from .defaults import OperatorDefaults
from .derive import (
    effective_batch_size,
    is_elastic,
    node_range,
    resolved_backend,
    resolved_strategy,
    spec_to_dict,
    trainer_config,
    uses_gpus,
    world_size,
)
from .environment import RESERVED_ENV_KEYS, RESERVED_ENV_PREFIXES, reserved_env_key
from .model import JOB_BACKENDS, CheckpointSpec, Job, JobSpec
from .overlay_policy import OverlayPolicy, OverlayRefused
from .parse import job_or_none, parse_job
from ..objects.resource import API_VERSION, GROUP, KIND, PLURAL, SHORT_NAME, SINGULAR, VERSION

__all__ = [
    "API_SERVER_RULES",
    "TRANSITION_RULES",
    "API_VERSION",
    "GROUP",
    "JOB_BACKENDS",
    "KIND",
    "PLURAL",
    "RESERVED_ENV_KEYS",
    "RESERVED_ENV_PREFIXES",
    "SHORT_NAME",
    "SINGULAR",
    "VERSION",
    "CheckpointSpec",
    "ConfigError",
    "Job",
    "JobSpec",
    "OperatorDefaults",
    "OverlayPolicy",
    "OverlayRefused",
    "effective_batch_size",
    "is_elastic",
    "node_range",
    "job_or_none",
    "parse_job",
    "reserved_env_key",
    "resolved_backend",
    "resolved_strategy",
    "spec_to_dict",
    "trainer_config",
    "uses_gpus",
    "world_size",
]
