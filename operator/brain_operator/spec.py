"""The BrainTrainingJob custom resource: typed spec, parsing with field-named errors, translation to TrainerConfig.

Pure and torch-free. Every constraint lives once, on a dataclass field: the
parser enforces it and `brain_operator.crd` turns the same fields into the
CRD's OpenAPI schema. Fields shared with the trainer copy their default,
choices and bounds from `brain_trainer.config` (see `_like`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Optional

from brain_trainer.config import (
    DISTRIBUTED_PRESETS,
    CheckpointConfig,
    DataConfig,
    DistributedConfig,
    ModelConfig,
    TrainerConfig,
    TrainingConfig,
)
from brain_trainer.memory import resolve_distributed
from brain_trainer.schema import ConfigError, FieldError, from_dict, setting, to_dict

GROUP = "brain.ai"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "BrainTrainingJob"
PLURAL = "braintrainingjobs"
SINGULAR = "braintrainingjob"
SHORT_NAME = "btj"

JOB_BACKENDS = ("elastic", "pytorchjob")
PULL_POLICIES = ("Always", "IfNotPresent", "Never")
NCCL_DEBUG_LEVELS = ("VERSION", "WARN", "INFO", "TRACE")
ACCESS_MODES = ("ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod")
# Modes that let pods on different nodes write the same volume.
SHARED_WRITE_MODES = ("ReadWriteMany",)

# A job's pods are named `<name>-worker-<i>` and its Service `<name>-workers`:
# Service names are DNS-1035 labels, pod hostnames DNS-1123 labels (63 chars).
NAME_PATTERN = r"[a-z]([-a-z0-9]*[a-z0-9])?"
NAMESPACE_PATTERN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS_LABEL_MAX = 63
WORKER_SUFFIX = "-worker-"
SUBDOMAIN_PATTERN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
LABEL_VALUE_PATTERN = r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
ENV_NAME_PATTERN = r"[A-Za-z_][A-Za-z0-9_]*"
RESOURCE_NAME_PATTERN = r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
QUANTITY_PATTERN = r"\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|[KMGTPE]i|[numkMGTPE])?"
GPU_RESOURCE = "nvidia.com/gpu"

# What decides how torchrun launches: its PET_* contract and the rank variables it sets itself.
LAUNCH_ENV_PREFIXES = ("PET_", "TORCHELASTIC_")
LAUNCH_ENV_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")
# Environment the renderers own: the launch variables and the keys rendered from typed fields.
RESERVED_ENV_PREFIXES = LAUNCH_ENV_PREFIXES
RESERVED_ENV_KEYS = (
    *LAUNCH_ENV_KEYS,
    "PYTHONUNBUFFERED",
    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE",
    "NCCL_DEBUG",
    "NCCL_SOCKET_IFNAME",
    "NCCL_IB_DISABLE",
)


def _like(cls: type, name: str, **changes: Any) -> Any:
    """A spec field with the same default, choices, bounds and help as `cls.name` in the trainer config."""
    source = next(f for f in dataclasses.fields(cls) if f.name == name)
    meta = {**source.metadata, **changes}
    default = meta.pop("default", source.default)
    return setting(default, **meta)


def reserved_env_key(name: str) -> bool:
    return name in RESERVED_ENV_KEYS or name.startswith(RESERVED_ENV_PREFIXES)


def _check_env(env: Mapping[str, str], field_name: str) -> Iterator[tuple[str, str]]:
    for key in env:
        if not re.fullmatch(ENV_NAME_PATTERN, key):
            yield f"{field_name}.{key}", f"{key!r} is not a valid environment variable name"
        elif reserved_env_key(key):
            yield f"{field_name}.{key}", f"{key!r} is reserved (set by the operator or torchrun) and cannot be overridden"


@dataclass
class ElasticSpec:
    """torchrun's elastic range (--nnodes=MIN:MAX) and restart budget."""

    min_nodes: Optional[int] = setting(None, minimum=1, help="fewest nodes the job keeps training with; default: nodes")
    max_nodes: Optional[int] = setting(None, minimum=1, help="most nodes the job may scale to; default: nodes")
    max_restarts: int = setting(3, minimum=0, help="torchrun --max-restarts: worker-group restarts inside the pods")

    def check(self) -> Iterator[tuple[str, str]]:
        if self.min_nodes is not None and self.max_nodes is not None and self.min_nodes > self.max_nodes:
            yield "min_nodes", f"must be <= maxNodes ({self.max_nodes}), got {self.min_nodes}"


@dataclass
class ResourcesSpec:
    """Per-pod requests and limits (Kubernetes quantities)."""

    requests: dict[str, int | str] = setting(default_factory=dict, help="e.g. cpu: 2, memory: 8Gi")
    limits: dict[str, int | str] = setting(default_factory=dict, help=f"e.g. {GPU_RESOURCE}: 8 (GPUs mean NCCL when backend is auto)")

    def check(self) -> Iterator[tuple[str, str]]:
        for field_name in ("requests", "limits"):
            for name, quantity in getattr(self, field_name).items():
                if not re.fullmatch(RESOURCE_NAME_PATTERN, name):
                    yield f"{field_name}.{name}", "is not a valid resource name"
                elif isinstance(quantity, int) and quantity < 0:
                    yield f"{field_name}.{name}", f"must not be negative, got {quantity}"
                elif isinstance(quantity, str) and not re.fullmatch(QUANTITY_PATTERN, quantity):
                    yield f"{field_name}.{name}", f"must be a quantity such as 2, 500m or 8Gi, got {quantity!r}"

    def gpus(self) -> int:
        value = self.limits.get(GPU_RESOURCE, self.requests.get(GPU_RESOURCE, 0))
        return int(value) if re.fullmatch("[0-9]+", str(value)) else 0


@dataclass
class TrainingSpec:
    """The optimisation loop; gradientAccumulationSteps and globalBatchSize are alternatives."""

    steps: int = _like(TrainingConfig, "steps")
    micro_batch_size: int = _like(TrainingConfig, "micro_batch_size")
    gradient_accumulation_steps: int = _like(DistributedConfig, "gradient_accumulation_steps", help="micro-batches per optimizer step")
    global_batch_size: Optional[int] = _like(TrainingConfig, "global_batch_size")
    seq_len: int = _like(TrainingConfig, "seq_len")
    learning_rate: float = _like(TrainingConfig, "learning_rate")
    min_lr_ratio: float = _like(TrainingConfig, "min_lr_ratio")
    warmup_steps: int = _like(TrainingConfig, "warmup_steps")
    lr_scaling: str = _like(TrainingConfig, "lr_scaling", help="linear: scale the LR by effective batch / referenceBatchSize")
    reference_batch_size: int = _like(TrainingConfig, "reference_batch_size", help="batch at which learningRate was tuned")
    weight_decay: float = _like(TrainingConfig, "weight_decay")
    grad_clip: float = _like(TrainingConfig, "grad_clip")
    precision: Optional[str] = _like(
        DistributedConfig, "mixed_precision_policy", default=None, help="fp32, bf16 or fp16; default: the model preset's"
    )
    seed: int = _like(TrainingConfig, "seed")
    log_interval: int = _like(TrainingConfig, "log_interval")
    compile: bool = _like(TrainingConfig, "compile")

    def check(self) -> Iterator[tuple[str, str]]:
        if self.global_batch_size is not None:
            if self.gradient_accumulation_steps != 1:
                yield "gradient_accumulation_steps", "set either gradientAccumulationSteps or globalBatchSize, not both"
            elif self.global_batch_size % self.micro_batch_size:
                yield (
                    "global_batch_size",
                    f"must be a multiple of microBatchSize ({self.micro_batch_size}), got {self.global_batch_size}",
                )


@dataclass
class DistributedSpec:
    """How the model is spread over ranks; unset fields take the model preset's recommendation."""

    strategy: str = _like(DistributedConfig, "strategy")
    fsdp_sharding: Optional[str] = _like(DistributedConfig, "fsdp_sharding", default=None)
    activation_checkpointing: Optional[bool] = _like(DistributedConfig, "activation_checkpointing", default=None)
    cpu_offload: Optional[bool] = _like(DistributedConfig, "cpu_offload", default=None)
    backend: str = _like(DistributedConfig, "backend")
    find_unused_parameters: bool = _like(DistributedConfig, "find_unused_parameters")


@dataclass
class DataSpec:
    """Where training sequences come from."""

    source: str = _like(DataConfig, "source")
    path: Optional[str] = _like(DataConfig, "path")
    num_workers: int = _like(DataConfig, "num_workers")
    num_samples: int = _like(DataConfig, "num_samples")

    def check(self) -> Iterator[tuple[str, str]]:
        if self.source == "files" and not self.path:
            yield "path", "required when source is 'files'"


@dataclass
class VolumeClaimTemplate:
    """The checkpoint PVC the operator creates (`<name>-checkpoints`)."""

    access_modes: list[str] = setting(
        default_factory=lambda: ["ReadWriteMany"], help="multi-node jobs need ReadWriteMany: every rank writes its shard"
    )
    storage: str = setting("10Gi", pattern=QUANTITY_PATTERN, help="requested size")
    storage_class_name: Optional[str] = setting(None, pattern=SUBDOMAIN_PATTERN, help="default: the cluster's default class")

    def check(self) -> Iterator[tuple[str, str]]:
        if not self.access_modes:
            yield "access_modes", "must name at least one access mode"
        for mode in self.access_modes:
            if mode not in ACCESS_MODES:
                yield "access_modes", f"must be one of {', '.join(ACCESS_MODES)}; got {mode!r}"


@dataclass
class CheckpointSpec:
    """Where and how often checkpoints are written; without a claim they are pod-local scratch."""

    claim_name: Optional[str] = setting(None, pattern=SUBDOMAIN_PATTERN, help="an existing PVC to mount")
    volume_claim_template: Optional[VolumeClaimTemplate] = setting(None, help="a PVC the operator creates for the job")
    mount_path: str = setting("/checkpoints", pattern=r"/.*", help="absolute path inside the pods")
    interval_steps: int = _like(CheckpointConfig, "interval_steps")
    keep_last: int = _like(CheckpointConfig, "keep_last")
    async_save: bool = _like(CheckpointConfig, "async_save", key="async")

    def check(self) -> Iterator[tuple[str, str]]:
        if self.claim_name is not None and self.volume_claim_template is not None:
            yield "volume_claim_template", "set either claimName or volumeClaimTemplate, not both"
        if self.mount_path.rstrip("/") in ("", "/etc/brain", "/dev/shm"):
            yield "mount_path", f"must not be {self.mount_path!r} (used by the pod itself)"


@dataclass
class NcclSpec:
    """NCCL settings, rendered as environment variables."""

    debug: Optional[str] = setting(None, choices=NCCL_DEBUG_LEVELS, help="NCCL_DEBUG")
    socket_ifname: Optional[str] = setting(None, help="NCCL_SOCKET_IFNAME, e.g. eth0 or ^lo,docker")
    ib_disable: Optional[bool] = setting(None, help="NCCL_IB_DISABLE")
    timeout_seconds: int = _like(DistributedConfig, "timeout_seconds")
    env: dict[str, str] = setting(default_factory=dict, help="extra variables; reserved torchrun keys are refused")

    def check(self) -> Iterator[tuple[str, str]]:
        yield from _check_env(self.env, "env")


@dataclass
class SchedulingSpec:
    """Where the pods may run."""

    node_selector: dict[str, str] = setting(default_factory=dict)
    tolerations: list[dict[str, Any]] = setting(default_factory=list)
    affinity: Optional[dict[str, Any]] = setting(None)
    priority_class_name: Optional[str] = setting(None, pattern=SUBDOMAIN_PATTERN)
    scheduler_name: Optional[str] = setting(None)
    queue_name: Optional[str] = setting(None, pattern=LABEL_VALUE_PATTERN, help="Kueue LocalQueue (kueue.x-k8s.io/queue-name)")

    def check(self) -> Iterator[tuple[str, str]]:
        if self.queue_name is not None and len(self.queue_name) > DNS_LABEL_MAX:
            yield "queue_name", f"must be at most {DNS_LABEL_MAX} characters, got {len(self.queue_name)}"


@dataclass
class RunPolicySpec:
    """Restart budget, deadline, clean-up and suspension of the whole job."""

    backoff_limit: int = setting(3, minimum=0, help="failed pods recreated before the job fails (evictions do not count)")
    active_deadline_seconds: Optional[int] = setting(None, minimum=1, help="fail the job after this long")
    ttl_seconds_after_finished: Optional[int] = setting(
        None, minimum=0, help="delete the workers this long after the job finished; the job and its status stay"
    )
    suspend: bool = setting(False, help="delete the pods and keep the job (Kueue sets this)")


@dataclass
class JobSpec:
    """Desired state of a BrainTrainingJob."""

    image: Optional[str] = setting(None, help="trainer image (required unless the operator has a default)")
    image_pull_policy: str = setting("IfNotPresent", choices=PULL_POLICIES)
    backend: str = setting("elastic", choices=JOB_BACKENDS, help="elastic: operator-managed pods; pytorchjob: Kubeflow")
    nodes: int = setting(1, minimum=1, help="worker pods")
    nproc_per_node: int = setting(1, minimum=1, help="training processes per pod (GPUs per pod)")
    elastic: ElasticSpec = field(default_factory=ElasticSpec)
    resources: ResourcesSpec = field(default_factory=ResourcesSpec)
    model: ModelConfig = field(default_factory=ModelConfig)
    training: TrainingSpec = field(default_factory=TrainingSpec)
    distributed: DistributedSpec = field(default_factory=DistributedSpec)
    data: DataSpec = field(default_factory=DataSpec)
    checkpoint: CheckpointSpec = field(default_factory=CheckpointSpec)
    nccl: NcclSpec = field(default_factory=NcclSpec)
    scheduling: SchedulingSpec = field(default_factory=SchedulingSpec)
    run_policy: RunPolicySpec = field(default_factory=RunPolicySpec)

    def check(self) -> Iterator[tuple[str, str]]:
        low, high = node_range(self)
        if self.nodes < low:
            yield "nodes", f"must be >= elastic.minNodes ({low}), got {self.nodes}"
        elif self.nodes > high:
            yield "nodes", f"must be <= elastic.maxNodes ({high}), got {self.nodes}"
        template = self.checkpoint.volume_claim_template
        if template is not None and high > 1 and not set(template.access_modes) & set(SHARED_WRITE_MODES):
            yield (
                "checkpoint.volume_claim_template.access_modes",
                f"a job of up to {high} nodes needs ReadWriteMany (every rank writes its shard), got {', '.join(template.access_modes)}",
            )
        gbs = self.training.global_batch_size
        if gbs is not None:
            # Stops at the first bad size: few consecutive sizes can all divide one batch.
            for n in range(low, high + 1):
                per_step = self.training.micro_batch_size * self.nproc_per_node * n
                if gbs % per_step:
                    yield (
                        "training.global_batch_size",
                        f"must be a multiple of microBatchSize x nprocPerNode x nodes ({per_step} at {n} nodes), got {gbs}",
                    )
                    break


# The elastic bounds as CEL rules on `spec`, so the API server refuses an
# out-of-range `kubectl scale` too (the scale subresource writes spec.nodes).
_NODES = f"(has(self.nodes) ? self.nodes : {JobSpec().nodes})"
API_SERVER_RULES = (
    (
        "!has(self.elastic) || !has(self.elastic.minNodes) || !has(self.elastic.maxNodes)"
        " || self.elastic.minNodes <= self.elastic.maxNodes",
        "elastic.minNodes must be <= elastic.maxNodes",
    ),
    (
        f"!has(self.elastic) || !has(self.elastic.minNodes) || {_NODES} >= self.elastic.minNodes",
        "nodes must be >= elastic.minNodes",
    ),
    (
        f"!has(self.elastic) || !has(self.elastic.maxNodes) || {_NODES} <= self.elastic.maxNodes",
        "nodes must be <= elastic.maxNodes",
    ),
)


@dataclass
class Job:
    """A parsed BrainTrainingJob: identity from metadata plus the typed spec."""

    name: str
    namespace: str
    uid: str
    generation: int
    spec: JobSpec


@dataclass(frozen=True)
class OperatorDefaults:
    """Cluster-wide defaults the operator applies to jobs that omit them (set by the Helm chart)."""

    image: Optional[str] = None
    image_pull_policy: Optional[str] = None
    nccl_env: Mapping[str, str] = field(default_factory=dict)

    ENV_IMAGE = "BRAIN_TRAINER_IMAGE"
    ENV_PULL_POLICY = "BRAIN_TRAINER_IMAGE_PULL_POLICY"
    ENV_NCCL = "BRAIN_NCCL_ENV"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> "OperatorDefaults":
        """Read BRAIN_TRAINER_IMAGE, BRAIN_TRAINER_IMAGE_PULL_POLICY and BRAIN_NCCL_ENV (a JSON object)."""
        errors: list[FieldError] = []
        policy = environ.get(cls.ENV_PULL_POLICY) or None
        if policy is not None and policy not in PULL_POLICIES:
            errors.append(FieldError(cls.ENV_PULL_POLICY, f"must be one of {', '.join(PULL_POLICIES)}; got {policy!r}"))
        nccl_env: Any = {}
        raw = environ.get(cls.ENV_NCCL, "").strip()
        if raw:
            try:
                nccl_env = json.loads(raw)
            except json.JSONDecodeError as exc:
                errors.append(FieldError(cls.ENV_NCCL, f"must be a JSON object: {exc.msg}"))
            if not isinstance(nccl_env, dict) or not all(isinstance(v, str) for v in nccl_env.values()):
                errors.append(FieldError(cls.ENV_NCCL, f"must map names to string values, got {raw!r}"))
                nccl_env = {}
            errors.extend(FieldError(cls.ENV_NCCL, message) for _, message in _check_env(nccl_env, cls.ENV_NCCL))
        if errors:
            raise ConfigError(errors)
        return cls(image=environ.get(cls.ENV_IMAGE) or None, image_pull_policy=policy, nccl_env=nccl_env)


_TOP_LEVEL = ("apiVersion", "kind", "metadata", "spec", "status")


def parse_job(manifest: Any, *, require_image: bool = True, defaults: Optional[OperatorDefaults] = None) -> Job:
    """Validate a BrainTrainingJob manifest into a Job, or raise ConfigError naming every bad field.

    `require_image=False` serves the local runner, which runs the trainer from
    this checkout. `defaults` fill the image, pull policy and NCCL env a job omits.
    """
    if not isinstance(manifest, Mapping):
        raise ConfigError([FieldError("", f"a BrainTrainingJob must be a mapping, got {type(manifest).__name__}")])
    errors: list[FieldError] = []
    for key in manifest:
        if key not in _TOP_LEVEL:
            errors.append(FieldError(str(key), f"unknown field (known fields: {', '.join(_TOP_LEVEL)})"))
    if manifest.get("apiVersion") != API_VERSION:
        errors.append(FieldError("apiVersion", f"must be {API_VERSION}, got {manifest.get('apiVersion')!r}"))
    if manifest.get("kind") != KIND:
        errors.append(FieldError("kind", f"must be {KIND}, got {manifest.get('kind')!r}"))
    name, namespace, uid, generation = _metadata(manifest.get("metadata"), errors)
    spec = _spec(manifest.get("spec"), defaults, errors)
    if spec is not None:
        if require_image and not spec.image:
            errors.append(FieldError("spec.image", "required: the trainer image the workers run"))
        if name is not None:
            longest = f"{name}{WORKER_SUFFIX}{node_range(spec)[1] - 1}"
            if len(longest) > DNS_LABEL_MAX:
                errors.append(
                    FieldError(
                        "metadata.name",
                        f"too long: pod hostname {longest!r} would exceed {DNS_LABEL_MAX} characters ({len(longest)})",
                    )
                )
    if errors:
        raise ConfigError(errors)
    return Job(name=name, namespace=namespace, uid=uid, generation=generation, spec=spec)


def _metadata(metadata: Any, errors: list[FieldError]) -> tuple[Any, str, str, int]:
    """Name, namespace, uid and generation; other metadata (labels, managedFields...) is the API server's."""
    if not isinstance(metadata, Mapping):
        errors.append(FieldError("metadata", f"must be a mapping with a name, got {metadata!r}"))
        return None, "default", "", 0
    name = metadata.get("name")
    if not isinstance(name, str) or not re.fullmatch(NAME_PATTERN, name):
        errors.append(
            FieldError("metadata.name", f"must be a lowercase DNS label (letters, digits, '-', starting with a letter), got {name!r}")
        )
        name = None
    namespace = metadata.get("namespace", "default")
    if not isinstance(namespace, str) or len(namespace) > DNS_LABEL_MAX or not re.fullmatch(NAMESPACE_PATTERN, namespace):
        errors.append(FieldError("metadata.namespace", f"must be a DNS label, got {namespace!r}"))
    uid = metadata.get("uid", "")
    if not isinstance(uid, str):
        errors.append(FieldError("metadata.uid", f"must be a string, got {uid!r}"))
    generation = metadata.get("generation", 0)
    if not isinstance(generation, int) or isinstance(generation, bool):
        errors.append(FieldError("metadata.generation", f"must be an integer, got {generation!r}"))
    return name, namespace, uid, generation


def _spec(data: Any, defaults: Optional[OperatorDefaults], errors: list[FieldError]) -> Optional[JobSpec]:
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
    return spec


# ---- resolved values (status shows them; the renderers use them) ----


def node_range(spec: JobSpec) -> tuple[int, int]:
    """(min, max) nodes for torchrun's --nnodes; an unset bound is `nodes` (a job without a range is fixed)."""
    low, high = spec.elastic.min_nodes, spec.elastic.max_nodes
    return (spec.nodes if low is None else low), (spec.nodes if high is None else high)


def is_elastic(spec: JobSpec) -> bool:
    low, high = node_range(spec)
    return low < high


def world_size(spec: JobSpec) -> int:
    return spec.nodes * spec.nproc_per_node


def uses_gpus(spec: JobSpec) -> bool:
    return spec.resources.gpus() > 0


def resolved_backend(spec: JobSpec) -> str:
    """The collective backend: nccl when the pods request GPUs and backend is auto."""
    return DistributedConfig(backend=spec.distributed.backend).resolved_backend(uses_gpus(spec))


def resolved_strategy(spec: JobSpec) -> str:
    """The strategy status reports, as the trainer will resolve it.

    `auto` on multi-rank GPU pods stays `auto`: the trainer plans against the
    real device memory at start-up, which the operator cannot see.
    """
    if spec.distributed.strategy == "auto" and uses_gpus(spec) and world_size(spec) > 1:
        return "auto"
    return resolve_distributed(_trainer_config(spec), world_size(spec), None).strategy


def effective_batch_size(job: Job) -> int:
    """Sequences per optimizer step at the job's current size."""
    return trainer_config(job).effective_batch_size(world_size(job.spec))


def trainer_config(job: Job) -> TrainerConfig:
    """The trainer.yaml the workers read: spec fields mapped onto brain_trainer.config."""
    return _trainer_config(job.spec)


def _trainer_config(spec: JobSpec) -> TrainerConfig:
    preset = DISTRIBUTED_PRESETS[spec.model.preset]
    training = {f.name: getattr(spec.training, f.name) for f in dataclasses.fields(TrainingConfig) if hasattr(spec.training, f.name)}
    dist = spec.distributed
    # Under strategy auto the planner adds checkpointing and offload as rungs of its
    # ladder; the preset's recommendation applies to an explicitly chosen strategy.
    planner_decides = dist.strategy == "auto"
    distributed = dataclasses.replace(
        preset,
        strategy=dist.strategy,
        fsdp_sharding=_first(dist.fsdp_sharding, preset.fsdp_sharding),
        activation_checkpointing=_first(
            dist.activation_checkpointing, False if planner_decides else preset.activation_checkpointing
        ),
        cpu_offload=_first(dist.cpu_offload, False if planner_decides else preset.cpu_offload),
        backend=dist.backend,
        find_unused_parameters=dist.find_unused_parameters,
        gradient_accumulation_steps=spec.training.gradient_accumulation_steps,
        mixed_precision_policy=_first(spec.training.precision, preset.mixed_precision_policy),
        num_nodes=spec.nodes,
        timeout_seconds=spec.nccl.timeout_seconds,
    )
    checkpoint = CheckpointConfig(
        dir=spec.checkpoint.mount_path,
        interval_steps=spec.checkpoint.interval_steps,
        keep_last=spec.checkpoint.keep_last,
        async_save=spec.checkpoint.async_save,
    )
    data = {f.name: getattr(spec.data, f.name) for f in dataclasses.fields(DataConfig) if hasattr(spec.data, f.name)}
    return TrainerConfig(
        model=dataclasses.replace(spec.model),
        training=TrainingConfig(**training),
        distributed=distributed,
        data=DataConfig(**data),
        checkpoint=checkpoint,
    )


def _first(value: Any, fallback: Any) -> Any:
    return fallback if value is None else value


def spec_to_dict(spec: JobSpec) -> dict[str, Any]:
    """The spec as camelCase YAML-ready data (the inverse of parsing)."""
    return to_dict(spec, camel_case=True)


__all__ = [
    "API_VERSION",
    "GROUP",
    "VERSION",
    "KIND",
    "PLURAL",
    "SINGULAR",
    "SHORT_NAME",
    "ConfigError",
    "Job",
    "JobSpec",
    "OperatorDefaults",
    "parse_job",
    "trainer_config",
    "node_range",
    "is_elastic",
    "world_size",
    "resolved_backend",
    "resolved_strategy",
    "effective_batch_size",
    "reserved_env_key",
    "spec_to_dict",
]
