"""The typed worker plan: what each worker runs, with which environment, volumes and ports (pure).

Both the rendered pods (backends/elastic, backends/pytorchjob) and the
local runner's processes (local/plan.py) are made from it, so `braintrain run`
executes what the cluster would (docs/architecture.md, "Worker plan").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from brain_trainer.contract import (
    AGENT_MODULE,
    CHECKPOINT_CLAIM_ENV,
    CONFIG_FILE,
    FAIL_FAST_ENV,
    LEASE_HOLDER_ENV,
    METRICS_PORT,
    METRICS_PORT_NAME,
    REASONS,
    lease_holder,
    trainer_args,
)

from ...sizing.grace import shutdown_timeout_seconds, termination_grace_seconds
from ...objects.names import config_map_name, template_claim_name, worker_pod_name, workers_service_name
from ...spec import Job, node_range
from ...spec.environment import AWS_ENDPOINT_URL, PYTHONUNBUFFERED, SHARE_RDZV_STORE
from ...spec.model import FAIL_JOB
from ...spec.owned import (
    CHECKPOINT_VOLUME,
    CONFIG_DIR,
    CONFIG_VOLUME,
    DATA_VOLUME,
    RDZV_PORT,
    RDZV_PORT_NAME,
    SHM_DIR,
    SHM_VOLUME,
)

CONFIG_PATH = f"{CONFIG_DIR}/{CONFIG_FILE}"
# torchrun reads its settings from PET_* variables; the trainer from the ConfigMap. The trainer image's entrypoint
# (Dockerfile): tini as PID 1 (reaps orphans, forwards SIGTERM) running torchrun's agent, quiet when stopped, as
# local runs do (contract.AGENT_MODULE); written out because a pod's command replaces the image's entrypoint.
COMMAND = ("tini", "--", "python", "-m", AGENT_MODULE)
# torchrun's own variables that a local run sets differently.
RDZV_ENDPOINT_ENV = "PET_RDZV_ENDPOINT"
RDZV_CONF_ENV = "PET_RDZV_CONF"
LOCAL_ADDR_ENV = "PET_LOCAL_ADDR"
# torchrun forwards SIGTERM to its workers and SIGKILLs them after this long (its default, 30 s, is too short for
# a save): grace.shutdown_timeout_seconds.
SHUTDOWN_TIMEOUT_ENV = "PET_SHUTDOWN_TIMEOUT"

# Volume kinds; OVERLAY is a volume of spec.podTemplate, which the plan only mounts.
CONFIG_MAP, CLAIM, SCRATCH, MEMORY, OVERLAY = "configMap", "claim", "scratch", "memory", "overlay"


@dataclass(frozen=True)
class Volume:
    """A volume of the worker pod and where the trainer container mounts it."""

    name: str
    mount_path: str
    kind: str  # CONFIG_MAP, CLAIM, SCRATCH (an emptyDir), MEMORY (an emptyDir in RAM) or OVERLAY
    source: Optional[str] = None  # the ConfigMap or the claim
    read_only: bool = False


@dataclass(frozen=True)
class Port:
    name: str
    number: int


@dataclass(frozen=True)
class Container:
    """The trainer container: exec-form command, ordered environment, volumes, ports, and the Secrets whose keys
    become environment variables (envFrom; a variable of `env` wins over a Secret's key of the same name)."""

    command: tuple[str, ...]
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    volumes: tuple[Volume, ...]
    ports: tuple[Port, ...]
    secrets: tuple[str, ...] = ()


@dataclass(frozen=True)
class Worker:
    """One worker pod of the elastic backend."""

    index: int
    name: str  # the pod's name and hostname
    container: Container


def checkpoint_claim_name(job: Job) -> Optional[str]:
    """The PVC mounted for checkpoints: the user's, the rendered one, or None (pod-local scratch)."""
    ckpt = job.spec.checkpoint
    if ckpt.claim_name is not None:
        return ckpt.claim_name
    if ckpt.volume_claim_template is not None:
        return template_claim_name(job.name)
    return None


def data_volume(job: Job) -> tuple[Volume, ...]:
    """spec.data.volume, read-only: its claim as the pod volume `training-data`, or the mount of a pod overlay volume."""
    spec = job.spec.data.volume
    if spec is None:
        return ()
    if spec.claim_name is not None:
        return (Volume(DATA_VOLUME, spec.mount_path, CLAIM, spec.claim_name, read_only=True),)
    return (Volume(str(spec.volume), spec.mount_path, OVERLAY, read_only=True),)


def checkpoint_volume(job: Job) -> tuple[Volume, ...]:
    """The checkpoint claim, or pod-local scratch without one; none for checkpoints in an object store."""
    mount, claim = job.spec.checkpoint.volume_mount(), checkpoint_claim_name(job)
    return () if mount is None else (Volume(CHECKPOINT_VOLUME, mount, CLAIM if claim else SCRATCH, claim),)


def volumes(job: Job) -> tuple[Volume, ...]:
    return (
        Volume(CONFIG_VOLUME, CONFIG_DIR, CONFIG_MAP, config_map_name(job.name), read_only=True),
        # NCCL and DataLoader workers share memory through /dev/shm; the runtime's default is 64 MiB.
        Volume(SHM_VOLUME, SHM_DIR, MEMORY),
        *checkpoint_volume(job),
        *data_volume(job),
    )


def store_env(job: Job) -> tuple[tuple[str, str], ...]:
    """spec.objectStore.endpoint as the AWS SDKs read it; nothing for Amazon S3 itself (the SDK's default)."""
    store = job.spec.object_store
    return ((AWS_ENDPOINT_URL, store.endpoint),) if store is not None and store.endpoint is not None else ()


def store_secrets(job: Job) -> tuple[str, ...]:
    """spec.objectStore.credentialsSecret; without it the pod's service account or the node provides credentials."""
    store = job.spec.object_store
    return (store.credentials_secret,) if store is not None and store.credentials_secret is not None else ()


def trainer_container(job: Job, launch_env: tuple[tuple[str, str], ...] = (), ports: tuple[Port, ...] = ()) -> Container:
    """torchrun starting the trainer on the mounted trainer.yaml; `launch_env` first, then NCCL's, then the object
    store's (after spec.nccl.env, so an operator default there never shadows the job's endpoint)."""
    env = (*launch_env, (SHUTDOWN_TIMEOUT_ENV, str(shutdown_timeout_seconds(termination_grace_seconds(job)))),
           *job.spec.nccl.variables(), *store_env(job), (PYTHONUNBUFFERED, "1"), (FAIL_FAST_ENV, fail_fast_reasons(job)),
           *lease_env(job))
    return Container(
        command=COMMAND,
        args=tuple(trainer_args(CONFIG_PATH)),
        env=env,
        volumes=volumes(job),
        ports=(*ports, Port(METRICS_PORT_NAME, METRICS_PORT)),
        secrets=store_secrets(job),
    )


def lease_env(job: Job) -> tuple[tuple[str, str], ...]:
    """Who holds the checkpoint volume (the job and its uid), and its claim: what a refused start names."""
    claim = checkpoint_claim_name(job)
    return ((LEASE_HOLDER_ENV, lease_holder(job.name, job.uid and f"uid {job.uid}")),
            *(((CHECKPOINT_CLAIM_ENV, claim),) if claim else ()))


def fail_fast_reasons(job: Job) -> str:
    """The reasons runPolicy.failurePolicy fails the job for, comma-separated: the trainer then also stops
    torchrun, whose restarts inside the pod would fail the same way."""
    policy = job.spec.run_policy.failure_policy
    return ",".join(reason for reason in REASONS if policy.action(reason) == FAIL_JOB)


def rendezvous_endpoint(job: Job) -> str:
    return f"{worker_pod_name(job.name, 0)}.{workers_service_name(job.name)}:{RDZV_PORT}"


def run_id(job: Job) -> str:
    """torchrun's run id (contract.RUN_ID_ENV): the job's uid, its name where it has none (a local run)."""
    return job.uid or job.name


def rendezvous_timeout_seconds(job: Job) -> int:
    """How long a worker waits for the rendezvous: for the others to join, and for worker 0's store.

    As long as a start may take (watchdog.startupSeconds): a worker 0 that is
    scheduled, pulls its image or restores later than the others keeps them
    waiting, not failing. torch's defaults (dynamic_rendezvous.py: join 600 s;
    c10d_rendezvous_backend.py: the store's read timeout, 60 s, which also
    bounds connecting to worker 0, DNS included) fail the others after a minute.
    """
    return math.ceil(job.spec.watchdog.startup_seconds)


def rendezvous_timeouts(job: Job) -> dict[str, str]:
    """torchrun's --rdzv-conf timeouts (torch 2.13's option names): join_timeout, and read_timeout, the c10d
    store's timeout for connecting and for each operation (a file store, the local runner's, has none)."""
    seconds = str(rendezvous_timeout_seconds(job))
    return {"join_timeout": seconds, "read_timeout": seconds}


def rdzv_conf(options: dict[str, str]) -> str:
    """--rdzv-conf's text: key=value pairs, comma-separated."""
    return ",".join(f"{key}={value}" for key, value in options.items())


def torchrun_env(job: Job, index: int) -> tuple[tuple[str, str], ...]:
    """torchrun's PET_* settings; pod 0 hosts the c10d store, said explicitly rather than by hostname matching."""
    spec = job.spec
    low, high = node_range(spec)
    return (
        ("PET_NNODES", f"{low}:{high}"),
        ("PET_NPROC_PER_NODE", str(spec.nproc_per_node)),
        ("PET_RDZV_BACKEND", "c10d"),
        (RDZV_ENDPOINT_ENV, rendezvous_endpoint(job)),
        ("PET_RDZV_ID", run_id(job)),
        ("PET_MAX_RESTARTS", str(spec.elastic.max_restarts)),
        (RDZV_CONF_ENV, rdzv_conf({"is_host": str(1 if index == 0 else 0), **rendezvous_timeouts(job)})),
        (SHARE_RDZV_STORE, "1"),
    )


def elastic_worker(job: Job, index: int) -> Worker:
    """Worker `index`: torchrun with the job's c10d rendezvous on pod 0."""
    container = trainer_container(job, torchrun_env(job, index), (Port(RDZV_PORT_NAME, RDZV_PORT),))
    return Worker(index=index, name=worker_pod_name(job.name, index), container=container)


def elastic_workers(job: Job) -> list[Worker]:
    return [elastic_worker(job, i) for i in range(job.spec.nodes)]
