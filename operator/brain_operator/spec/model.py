"""The BrainTrainingJob spec as typed dataclasses: the trainer's own config sections plus operator-only ones.

`spec.model`, `spec.training`, `spec.distributed` and `spec.data` ARE the
trainer's config classes (brain_trainer.config.TrainerSections, which JobSpec
extends), and `spec.checkpoint` extends
the trainer's CheckpointConfig with where the checkpoints live: each trainer
setting is declared once, with the same section and name in trainer.yaml
(docs/architecture.md, "One declaration per setting"). Everything else here
is the operator's: image, nodes, resources, storage, NCCL, scheduling, run
policy and the pod overlay (spec/overlay.py).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

from brain_trainer.config import CheckpointConfig, DataConfig, TrainerSections
from brain_trainer.plan.layout import micro_batch_problems, micro_batches_field, spread_problems, world_problems
from brain_trainer.schema import Names, quoted, setting
from brain_trainer.uris import is_uri, uri_problem

from ..objects.schedulers import GANG_MODES, GANG_NONE, NATIVE_POD_GROUP
from .corev1 import core_problems, core_setting
from .environment import AWS_ENDPOINT_URL, NCCL_DEBUG, NCCL_IB_DISABLE, NCCL_SOCKET_IFNAME, check_env
from .kube import (
    ACCESS_MODES,
    DNS_LABEL_MAX,
    GPU_RESOURCE,
    LABEL_VALUE_PATTERN,
    PULL_POLICIES,
    QUANTITY_PATTERN,
    RESOURCE_NAME_PATTERN,
    SHARED_WRITE_MODES,
    SUBDOMAIN_PATTERN,
)
from .overlay import PodTemplateOverlay, job_problems, trainer_env_paths, within
from .store import endpoint_problem
from .topology import topology_problems
from .owned import CONFIG_DIR, SHM_DIR

JOB_BACKENDS = ("elastic", "pytorchjob")
NCCL_DEBUG_LEVELS = ("VERSION", "WARN", "INFO", "TRACE")
# Paths the worker pod itself mounts: the trainer config and shared memory.
POD_MOUNTS = (CONFIG_DIR, SHM_DIR)
RETAIN, DELETE = "Retain", "Delete"
RECLAIM_POLICIES = (RETAIN, DELETE)


@dataclass
class ElasticSpec:
    """torchrun's elastic range (--nnodes=MIN:MAX) and restart budget."""

    min_nodes: Optional[int] = setting(None, minimum=1, help="fewest nodes the job keeps training with; default: nodes")
    max_nodes: Optional[int] = setting(None, minimum=1, help="most nodes the job may scale to; default: nodes")
    max_restarts: int = setting(3, minimum=0, help="torchrun --max-restarts: worker-group restarts inside the pods")

    def check(self, name: Names) -> Iterator[tuple[str, str]]:
        if self.min_nodes is not None and self.max_nodes is not None and self.min_nodes > self.max_nodes:
            yield "min_nodes", f"must be <= {name('max_nodes')} ({self.max_nodes}), got {self.min_nodes}"


@dataclass
class ResourcesSpec:
    """Per-pod requests and limits (Kubernetes quantities)."""

    requests: dict[str, int | str] = setting(default_factory=dict, help="e.g. cpu: 2, memory: 8Gi")
    limits: dict[str, int | str] = setting(default_factory=dict, help=f"e.g. {GPU_RESOURCE}: 8 (GPUs mean NCCL when backend is auto)")

    def check(self, name: Names) -> Iterator[tuple[str, str]]:
        for field_name in ("requests", "limits"):
            for resource, quantity in getattr(self, field_name).items():
                if not re.fullmatch(RESOURCE_NAME_PATTERN, resource):
                    yield f"{field_name}.{resource}", "is not a valid resource name"
                elif isinstance(quantity, int) and quantity < 0:
                    yield f"{field_name}.{resource}", f"must not be negative, got {quantity}"
                elif isinstance(quantity, str) and not re.fullmatch(QUANTITY_PATTERN, quantity):
                    yield f"{field_name}.{resource}", f"must be a quantity such as 2, 500m or 8Gi, got {quoted(quantity)}"

    def gpus(self) -> int:
        value = self.limits.get(GPU_RESOURCE, self.requests.get(GPU_RESOURCE, 0))
        return int(value) if re.fullmatch("[0-9]+", str(value)) else 0


@dataclass
class VolumeClaimTemplate:
    """The checkpoint PVC the operator creates (`<name>-checkpoints`)."""

    access_modes: list[str] = setting(
        default_factory=lambda: ["ReadWriteMany"], help="multi-node jobs need ReadWriteMany: every rank writes its shard"
    )
    storage: str = setting("10Gi", pattern=QUANTITY_PATTERN, help="requested size")
    storage_class_name: Optional[str] = setting(None, pattern=SUBDOMAIN_PATTERN, help="default: the cluster's default class")

    def check(self, name: Names) -> Iterator[tuple[str, str]]:
        if not self.access_modes:
            yield "access_modes", "must name at least one access mode"
        for mode in self.access_modes:
            if mode not in ACCESS_MODES:
                yield "access_modes", f"must be one of {', '.join(ACCESS_MODES)}; got {quoted(mode)}"


@dataclass
class CheckpointSpec(CheckpointConfig):
    """The trainer's checkpoint settings, and where they live: an object store (uri), a claim, else pod-local scratch."""

    uri: Optional[str] = setting(
        None, help="s3://bucket/prefix: checkpoints in an object store, no volume (spec.objectStore says how to reach "
        "it); instead of claimName or volumeClaimTemplate"
    )
    claim_name: Optional[str] = setting(None, pattern=SUBDOMAIN_PATTERN, help="an existing PVC to mount")
    volume_claim_template: Optional[VolumeClaimTemplate] = setting(None, help="a PVC the operator creates for the job")
    mount_path: str = setting("/checkpoints", pattern=r"/.*", help="absolute path inside the pods")
    reclaim_policy: str = setting(
        RETAIN,
        choices=RECLAIM_POLICIES,
        help="Retain: the claim made from volumeClaimTemplate outlives the job; Delete: it is deleted with the job",
    )

    def check(self, name: Names) -> Iterator[tuple[str, str]]:
        yield from super().check(name)
        if self.claim_name is not None and self.volume_claim_template is not None:
            yield "volume_claim_template", f"set either {name('claim_name')} or {name('volume_claim_template')}, not both"
        if self.uri is not None:
            problem = uri_problem(self.uri)
            if problem:
                yield "uri", problem
            for other in ("claim_name", "volume_claim_template"):
                if getattr(self, other) is not None:
                    yield "uri", f"set either {name('uri')} or {name(other)}, not both"
        if self.mount_path.rstrip("/") in ("", *POD_MOUNTS):
            yield "mount_path", f"must not be {quoted(self.mount_path)} (used by the pod itself)"

    def location(self) -> str:
        """Where the trainer finds the checkpoints in a pod: the URI, else the volume's mount path."""
        return self.uri if self.uri is not None else self.mount_path

    def volume_mount(self) -> Optional[str]:
        """The checkpoint volume's mount path in a pod; None for checkpoints in an object store (no volume)."""
        return None if self.uri is not None else self.mount_path

    def trainer_config(self, folder: str) -> CheckpointConfig:
        """The trainer's part, with the checkpoint folder the operator derived."""
        own = {f.name: getattr(self, f.name) for f in dataclasses.fields(CheckpointConfig)}
        return CheckpointConfig(**{**own, "dir": folder})


@dataclass
class DataVolumeSpec:
    """The volume holding the training data, mounted read-only in every worker."""

    claim_name: Optional[str] = setting(None, pattern=SUBDOMAIN_PATTERN, help="a PersistentVolumeClaim holding the data")
    volume: Optional[str] = setting(
        None, pattern=SUBDOMAIN_PATTERN,
        help="instead of a claim: the name of a volume in spec.podTemplate.spec.volumes (NFS, CSI, ...)",
    )
    mount_path: str = setting("/data", pattern=r"/.*", help="where the trainer sees it; data.path names a file or folder below")

    def check(self, name: Names) -> Iterator[tuple[str, str]]:
        if (self.claim_name is None) == (self.volume is None):
            yield "claim_name", f"set either {name('claim_name')} or {name('volume')}"
        if self.mount_path.rstrip("/") in ("", *POD_MOUNTS):
            yield "mount_path", f"must not be {quoted(self.mount_path)} (used by the pod itself)"


@dataclass
class DataSpec(DataConfig):
    """The trainer's data settings, and where the data lives: a volume, or an object store (uri)."""

    volume: Optional[DataVolumeSpec] = setting(None, help="mount a volume read-only for data.path")
    uri: Optional[str] = setting(
        None, help="source tokens: s3://bucket/prefix of a prepared token dataset, read from an object store "
        "(spec.objectStore says how to reach it); instead of path and volume"
    )

    def check(self, name: Names) -> Iterator[tuple[str, str]]:
        # The trainer's rules, less the path a URI stands in for.
        yield from ((f, m) for f, m in super().check(name) if self.uri is None or f != "path")
        if self.volume is not None and self.path is not None and not within(self.path, self.volume.mount_path):
            yield "path", f"must be {name('volume.mount_path')} ({self.volume.mount_path}) or lie below it, got {quoted(self.path)}"
        if self.path is not None and is_uri(self.path):
            yield "path", f"a URI goes in {name('uri')}, got {quoted(self.path)}"
        if self.uri is None:
            return
        problem = uri_problem(self.uri)
        if problem:
            yield "uri", problem
        if self.source != "tokens":
            yield "uri", f"applies to {name('source')} tokens (a folder braintrain prepare made), got {quoted(self.source)}"
        for other in ("path", "volume"):
            if getattr(self, other) is not None:
                yield "uri", f"set either {name('uri')} or {name(other)}, not both"

    def trainer_config(self) -> DataConfig:
        """The trainer's part; a URI is the trainer's data.path."""
        own = {f.name: getattr(self, f.name) for f in dataclasses.fields(DataConfig)}
        return DataConfig(**{**own, "path": self.uri if self.uri is not None else self.path})


@dataclass
class ObjectStoreSpec:
    """How the workers reach the S3-compatible store of checkpoint.uri and data.uri (one per job).

    One, as the endpoint is one environment variable of the trainer. Without
    credentialsSecret the AWS SDK's default chain finds credentials: the pod's
    service account (EKS IRSA, Pod Identity) or the node's role.
    """

    endpoint: Optional[str] = setting(
        None, help="http(s) URL of an S3-compatible store (MinIO, Ceph, R2), set as AWS_ENDPOINT_URL; default: "
        "Amazon S3"
    )
    credentials_secret: Optional[str] = setting(
        None, pattern=SUBDOMAIN_PATTERN, help="a Secret of the job's namespace whose keys become the trainer's "
        "environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION...)"
    )

    def check(self, name: Names) -> Iterator[tuple[str, str]]:
        problem = None if self.endpoint is None else endpoint_problem(self.endpoint, name("credentials_secret"))
        if problem:
            yield "endpoint", problem


@dataclass
class NcclSpec:
    """NCCL settings, rendered as environment variables."""

    debug: Optional[str] = setting(None, choices=NCCL_DEBUG_LEVELS, help=NCCL_DEBUG)
    socket_ifname: Optional[str] = setting(None, help=f"{NCCL_SOCKET_IFNAME}, e.g. eth0 or ^lo,docker")
    ib_disable: Optional[bool] = setting(None, help=NCCL_IB_DISABLE)
    env: dict[str, str] = setting(default_factory=dict, help="extra variables; reserved torchrun keys are refused")

    def check(self, name: Names) -> Iterator[tuple[str, str]]:
        yield from check_env(self.env, "env")

    def variables(self) -> list[tuple[str, str]]:
        """(name, value) of each variable: the typed fields first, then the extra keys in order."""
        typed = [
            (NCCL_DEBUG, self.debug),
            (NCCL_SOCKET_IFNAME, self.socket_ifname),
            (NCCL_IB_DISABLE, None if self.ib_disable is None else "1" if self.ib_disable else "0"),
        ]
        return [(k, v) for k, v in typed if v is not None] + sorted(self.env.items())


@dataclass
class TopologySpec:
    """Kueue's Topology Aware Scheduling of the workers: every worker within one domain of the node label (required),
    or as few as fit (preferred); backends/elastic/topology.py renders it."""

    required: Optional[str] = setting(None, pattern=RESOURCE_NAME_PATTERN,
                                      help="a node label (kubernetes.io/hostname, a rack or block label): all workers "
                                      "in one of its domains, or none admitted")
    preferred: Optional[str] = setting(None, pattern=RESOURCE_NAME_PATTERN,
                                       help="a node label: workers in one of its domains if they fit, else in as few "
                                       "domains of the levels above as they fit")

    def check(self, name: Names) -> Iterator[tuple[str, str]]:
        if (self.required is None) == (self.preferred is None):
            yield "required", f"set either {name('required')} or {name('preferred')}"


@dataclass
class SchedulingSpec:
    """Where the pods may run."""

    node_selector: dict[str, str] = setting(default_factory=dict)
    tolerations: list[dict[str, Any]] = core_setting("tolerations")
    affinity: Optional[dict[str, Any]] = core_setting("affinity")
    priority_class_name: Optional[str] = setting(None, pattern=SUBDOMAIN_PATTERN)
    scheduler_name: Optional[str] = setting(None)
    queue_name: Optional[str] = setting(None, pattern=LABEL_VALUE_PATTERN, help="Kueue LocalQueue (kueue.x-k8s.io/queue-name)")
    gang: str = setting(
        GANG_NONE,
        choices=GANG_MODES,
        help="elastic backend: a PodGroup of elastic.minNodes workers for Kubernetes (native), scheduler-plugins' "
        "coscheduling or Volcano",
    )
    volcano_queue: Optional[str] = setting(
        None, pattern=SUBDOMAIN_PATTERN, help="Volcano queue of the PodGroup (gang: volcano) or of the PyTorchJob's schedulingPolicy"
    )
    topology: Optional[TopologySpec] = setting(
        None, help="topology-aware placement by Kueue (needs queueName): ranks ordered so consecutive ranks share the "
        "lowest level"
    )

    def check(self, name: Names) -> Iterator[tuple[str, str]]:
        # Typed as the overlay is: an unknown key, a wrong type or a 700-deep tree stops here, naming the path,
        # and never reaches a pod (or a renderer that would recurse through it).
        yield from core_problems(self)
        if self.queue_name is not None and len(self.queue_name) > DNS_LABEL_MAX:
            yield "queue_name", f"must be at most {DNS_LABEL_MAX} characters, got {len(self.queue_name)}"


RESTART, RESTART_NOT_COUNTED, FAIL_JOB = "Restart", "RestartNotCounted", "FailJob"
FAILURE_ACTIONS = (RESTART, RESTART_NOT_COUNTED, FAIL_JOB)


def _action(default: str, why: str) -> Any:
    return setting(default, choices=FAILURE_ACTIONS, help=why)


@dataclass
class FailurePolicySpec:
    """What a worker failure leads to, by the reason the trainer names: Restart (counted against backoffLimit),
    RestartNotCounted, or FailJob. One field per reason of brain_trainer.contract.REASONS, then the operator's
    own (failure_policy.OPERATOR_REASONS)."""

    preempted: str = _action(RESTART_NOT_COUNTED, "the trainer was stopped (SIGTERM, eviction) and committed a checkpoint")
    storage_full: str = _action(FAIL_JOB, "the checkpoint volume is full: a restart fails the same way")
    out_of_memory: str = _action(RESTART, "host or accelerator memory ran out (also the kubelet's OOMKilled)")
    data_error: str = _action(FAIL_JOB, "the dataset is missing, damaged or undecodable")
    config_error: str = _action(FAIL_JOB, "the trainer refused its configuration")
    collective_timeout: str = _action(RESTART, "a collective timed out, or a peer vanished")
    stalled: str = _action(RESTART, "the hang watchdog stopped a rank that made no progress")
    fenced: str = _action(FAIL_JOB, "a newer worker group or another job took the checkpoint volume: this group must "
                          "not write it again")
    network_error: str = _action(RESTART, "a rank did not join the preflight all-reduce, or the network broke it")
    error: str = _action(RESTART, "anything else, including a pod that names no reason")
    admission_rejected: str = _action(
        RESTART_NOT_COUNTED, "the kubelet refused to start the pod (OutOfnvidia.com/gpu, UnexpectedAdmissionError, "
        "NodeAffinity, NodeShutdown): its trainer never ran"
    )

    def action(self, reason: str) -> str:
        return getattr(self, reason.replace("-", "_"))


@dataclass
class RunPolicySpec:
    """Restart budget, deadline, clean-up and suspension of the whole job."""

    backoff_limit: int = setting(3, minimum=0, help="failed pods recreated (failurePolicy: Restart) before the job fails")
    active_deadline_seconds: Optional[int] = setting(
        None, minimum=1, help="fail the job this long after it started, as a Kubernetes Job: time Pending counts; "
        "time Queued by Kueue and Suspended does not (the clock starts at admission, and again on resume)"
    )
    ttl_seconds_after_finished: Optional[int] = setting(
        None, minimum=0, help="delete the workers this long after the job finished; the job and its status stay"
    )
    suspend: bool = setting(False, help="delete the pods and keep the job")
    termination_grace_period_seconds: Optional[int] = setting(
        None, minimum=1, help="seconds a stopped worker has to commit a checkpoint before it is killed: the pods' "
        "terminationGracePeriodSeconds (torchrun's shutdown timeout ends 30 s earlier); default: the planned "
        "checkpoint save's time, at least 300"
    )
    failure_policy: FailurePolicySpec = field(default_factory=FailurePolicySpec)


@dataclass
class JobSpec(TrainerSections):
    """Desired state of a BrainTrainingJob: the trainer's sections, then the operator's."""

    data: DataSpec = field(default_factory=DataSpec)  # the trainer's DataConfig plus the data volume; keeps its place

    image: Optional[str] = setting(None, help="trainer image (required unless the operator has a default)")
    image_pull_policy: str = setting("IfNotPresent", choices=PULL_POLICIES)
    backend: str = setting("elastic", choices=JOB_BACKENDS, help="elastic: operator-managed pods; pytorchjob: Kubeflow")
    nodes: int = setting(1, minimum=1, help="worker pods")
    nproc_per_node: int = setting(1, minimum=1, help="training processes per pod (GPUs per pod)")
    elastic: ElasticSpec = field(default_factory=ElasticSpec)
    resources: ResourcesSpec = field(default_factory=ResourcesSpec)
    checkpoint: CheckpointSpec = field(default_factory=CheckpointSpec)
    object_store: Optional[ObjectStoreSpec] = setting(
        None, help="the endpoint and credentials of the store that checkpoint.uri and data.uri name"
    )
    nccl: NcclSpec = field(default_factory=NcclSpec)
    scheduling: SchedulingSpec = field(default_factory=SchedulingSpec)
    run_policy: RunPolicySpec = field(default_factory=RunPolicySpec)
    pod_template: PodTemplateOverlay = field(default_factory=PodTemplateOverlay)

    def check(self, name: Names) -> Iterator[tuple[str, str]]:
        yield from super().check(name)
        volume, checkpoints = self.data.volume, self.checkpoint.volume_mount()
        data_mount = volume.mount_path if volume is not None else None
        for path, message in job_problems(self.pod_template, checkpoints, self.scheduling.priority_class_name,
                                          data_mount):
            yield f"pod_template.{path}", message
        if volume is not None:
            if volume.volume is not None and volume.volume not in {v.get("name") for v in self.pod_template.spec.volumes}:
                yield "data.volume.volume", f"{quoted(volume.volume)} names no volume of {name('pod_template.spec.volumes')}"
            if checkpoints is not None and (within(volume.mount_path, checkpoints) or within(checkpoints, volume.mount_path)):
                yield "data.volume.mount_path", f"must not overlap {name('checkpoint.mount_path')} ({checkpoints})"
        yield from self._store_problems(name)
        yield from topology_problems(self, name)
        if self.scheduling.gang != GANG_NONE and self.backend != "elastic":
            yield (
                "scheduling.gang",
                f"applies to the elastic backend; for {self.backend}, Kubeflow's training operator makes the PodGroup "
                "(its --gang-scheduler-name)",
            )
        low, high = self.node_range()
        if self.nodes < low:
            yield "nodes", f"must be >= {name('elastic.min_nodes')} ({low}), got {self.nodes}"
        elif self.nodes > high:
            yield "nodes", f"must be <= {name('elastic.max_nodes')} ({high}), got {self.nodes}"
        template = self.checkpoint.volume_claim_template
        if template is not None and high > 1 and not set(template.access_modes) & set(SHARED_WRITE_MODES):
            yield (
                "checkpoint.volume_claim_template.access_modes",
                f"a job of up to {high} nodes needs ReadWriteMany (every rank writes its shard), got {', '.join(template.access_modes)}",
            )
        spread = list(spread_problems(self.distributed, self.nproc_per_node, "nproc_per_node", name))
        yield from spread
        if not spread:
            yield from self._node_range_problems(low, high, name)

    def uses_store(self) -> bool:
        """Checkpoints, data or initial weights in an object store: the workers reach it over the network."""
        init_from = self.model.init_from
        return self.checkpoint.uri is not None or self.data.uri is not None or bool(init_from and is_uri(init_from))

    def _store_problems(self, name: Names) -> Iterator[tuple[str, str]]:
        """spec.objectStore serves a URI, and its endpoint is the one AWS_ENDPOINT_URL of the trainer."""
        store = self.object_store
        if store is None:
            return
        if not self.uses_store():
            yield "object_store", (f"applies to {name('checkpoint.uri')} and {name('data.uri')} (and an s3:// "
                                   f"{name('model.init_from')}): set one, or remove it")
        if store.endpoint is None:
            return
        why = f"{quoted(AWS_ENDPOINT_URL)} is set from {name('object_store.endpoint')}: set the endpoint there alone"
        if AWS_ENDPOINT_URL in self.nccl.env:
            yield f"nccl.env.{AWS_ENDPOINT_URL}", why
        for path in trainer_env_paths(self.pod_template, AWS_ENDPOINT_URL):
            yield f"pod_template.{path}", why

    def _node_range_problems(self, low: int, high: int, name: Names) -> Iterator[tuple[str, str]]:
        """The layout and the batch at every node count of the range; stops at the first bad one (few consecutive
        counts can all divide one batch)."""
        distributed, gbs = self.distributed, self.training.global_batch_size
        ranks_per_step = distributed.tp * distributed.pp
        for n in range(low, high + 1):
            world = self.nproc_per_node * n
            layout = [(field, f"{message} ({n} nodes x {self.nproc_per_node})")
                      for field, message in world_problems(distributed, world, self.nproc_per_node, name)]
            if layout:
                yield from layout
                return
            per_step = self.training.micro_batch_size * world // ranks_per_step
            if gbs is not None and gbs % per_step:
                across = f"{name('nproc_per_node')} x {name('nodes')}"
                if ranks_per_step > 1:
                    across = f"({across} / ({name('distributed.pipeline_parallel')} x {name('distributed.tensor_parallel')}))"
                yield (
                    "training.global_batch_size",
                    f"must be a multiple of {name('training.micro_batch_size')} x {across} ({per_step} at {n} nodes), "
                    f"got {gbs}",
                )
                return
            micro_batches = distributed.gradient_accumulation_steps if gbs is None else gbs // per_step
            field = micro_batches_field(gbs)
            pipeline = [(f, f"{message} at {n} nodes") for f, message in
                        micro_batch_problems(distributed, micro_batches, field, name)]
            if pipeline:
                yield from pipeline
                return

    def node_range(self) -> tuple[int, int]:
        """(min, max) nodes for torchrun's --nnodes; an unset bound is `nodes` (a job without a range is fixed)."""
        low, high = self.elastic.min_nodes, self.elastic.max_nodes
        return (self.nodes if low is None else low), (self.nodes if high is None else high)


@dataclass(frozen=True)
class NetworkAccess:
    """Who, besides the job's own pods, may reach its workers: the metrics port only (docs/security.md).

    The operator's namespace, because the operator polls rank 0's /progress by
    pod IP; and the namespaces Prometheus scrapes /metrics from.
    """

    operator_namespace: Optional[str] = None
    scrape_namespaces: tuple[str, ...] = ()


@dataclass
class Job:
    """A parsed BrainTrainingJob: identity from metadata plus the typed spec."""

    name: str
    namespace: str
    uid: str
    generation: int
    spec: JobSpec
    checkpoint_request: Optional[str] = None  # the brain.ai/checkpoint-now annotation, when set
    profile_request: Optional[str] = None  # the brain.ai/profile-now annotation, when set
    # metadata.creationTimestamp (the API server's): where runPolicy.activeDeadlineSeconds starts counting.
    created: Optional[str] = None
    # The apiVersion of Kubernetes' PodGroup that `gang: native` renders: the one the cluster serves (cluster/discovery.py).
    native_pod_group: str = NATIVE_POD_GROUP[0]
    # The job's NetworkPolicy admits these (the operator's setting); None: no policy is rendered.
    network: Optional[NetworkAccess] = NetworkAccess()
