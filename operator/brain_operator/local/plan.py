"""A parsed job's worker plan -> local process plans (pure: no processes, no files).

The local runner executes exactly what the cluster would run: the typed
worker plan the elastic renderer makes its pods from (backends/shared/workers.py).
This module decides how each worker becomes a local `torchrun` agent: its
argv, its environment with the workers' DNS names pointing at 127.0.0.1 and
the c10d rendezvous in a file store of the attempt's own (below), and its
volumes as folders under the job's work directory, with every in-pod mount
path rewritten to the local folder (in args and env). trainer.yaml is the
operator's own, with the derived fields (the checkpoint folder, the metrics
port) given local values.

An object store (`checkpoint.uri`, `data.uri`) is the trainer's to reach:
trainer.yaml carries the URI as a pod's does, and the endpoint and
credentials come from the user's own environment (`AWS_ENDPOINT_URL`,
`AWS_ACCESS_KEY_ID`, a profile...), never from the manifest: a local run
does not set `spec.objectStore.endpoint` and cannot read the cluster's
Secret. Its checkpoints then have no local folder.

The rendezvous: in a cluster pod 0's agent hosts a TCP store on a fixed port
of its own address. On one machine a port would have to be chosen free and
bound later by pod 0's agent, and in between anyone could take it, another
run's agent among them, whose store the other pods would then join (under the
same rendezvous id when it runs the same job). A file store (`store_type=file`,
the endpoint its path) has no port to lose: the runner gives every attempt a
new file in the work directory, which no other run or earlier attempt shares.
The rendezvous id stays the job's run id, as in a cluster (its uid there, its
name here): the goodput ledger keeps one account per run id across restarts.

A persistent volume claim is a folder named after it in the claims folder
(`braintrain run --claims`, default `runs/claims/`), outside the job's work
directory, so, as in a cluster, it outlives the run: another run, with a new
work directory, that mounts the same claim resumes from its checkpoints
(README, "What the demo shows").
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Callable, Mapping, Optional

from brain_trainer.config import TrainerConfig
from brain_trainer.uris import is_uri
from brain_trainer.contract import (
    AGENT_MODULE,
    CONFIG_FILE,
    LAUNCH_ENV_KEYS,
    LAUNCH_ENV_PREFIXES,
    LEASE_HOLDER_ENV,
    PROGRESS_FILE_ENV,
    TERMINATION_LOG_ENV,
    lease_holder,
)

from ..sizing.grace import termination_grace_seconds
from ..objects.names import workers_service_name
from ..backends.shared.workers import (
    CHECKPOINT_VOLUME,
    CLAIM,
    CONFIG_MAP,
    LOCAL_ADDR_ENV,
    OVERLAY,
    store_env,
    RDZV_CONF_ENV,
    RDZV_ENDPOINT_ENV,
    Worker,
    elastic_workers,
    rdzv_conf,
    rendezvous_timeouts,
)
from ..spec import Job, trainer_config
from ..spec.owned import CONFIG_VOLUME, DATA_VOLUME
from ..status.waiting import RUN_CONTAINER_ERROR, UNSCHEDULABLE, Waiting

__all__ = [
    "CLAIMS_DIR",
    "LocalPlan",
    "LocalRunError",
    "LocalWorker",
    "missing_claim",
    "not_started",
    "STDLIB_PLACEHOLDER",
    "request_file",
    "localize",
    "plan_local",
    "process_env",
    "rewrite_path",
]

LOOPBACK = "127.0.0.1"

# A data path may start with this placeholder: the local runner expands it to
# the Python standard library's folder, text that every machine has.
STDLIB_PLACEHOLDER = "{stdlib}"
# The progress document rank 0 writes, in the work directory.
PROGRESS_FILE = "progress.json"
# Where `braintrain run` keeps persistent volume claims unless told (this module's docstring).
CLAIMS_DIR = Path("runs") / "claims"


class LocalRunError(RuntimeError):
    """The job cannot run on this machine; the message is one line for the user."""


@dataclass(frozen=True)
class LocalWorker:
    """One worker pod as a local torchrun agent; `scratch_dirs` are its emptyDirs, `termination_log` its
    container's termination message file."""

    name: str
    argv: list[str]
    env: dict[str, str]
    scratch_dirs: list[Path]
    termination_log: Path


@dataclass(frozen=True)
class LocalPlan:
    """Everything the runner creates and starts for one job."""

    job_name: str
    workdir: Path
    checkpoint_dir: Optional[Path]  # None: checkpoints in an object store (checkpoint.uri)
    progress_file: Path
    total_steps: int
    backoff_limit: int
    job: Job  # as parsed and localised: its failure policy and checkpoint settings
    files: dict[Path, str]
    dirs: list[Path]
    workers: list[LocalWorker]
    rendezvous: Path  # the attempt's file store
    # SIGTERM to SIGKILL when the runner stops a group, as the kubelet gives a pod its terminationGracePeriodSeconds.
    grace_seconds: int
    # spec.data.volume.claimName's folder: it must exist already, as a pod's claim must (missing_claim).
    data_claim: Optional[Path] = None


def _below(value: str, mount: str) -> Optional[str]:
    """The part of `value` below the in-pod mount path ("" for the mount itself); None outside it."""
    root = mount.rstrip("/")
    if value in (mount, root):
        return ""
    return value[len(root) + 1 :] if value.startswith(root + "/") else None


def rewrite_path(value: str, mounts: Mapping[str, Path]) -> str:
    """A value that is, or lies under, an in-pod mount path, moved to the local folder."""
    for mount in sorted(mounts, key=len, reverse=True):
        rest = _below(value, mount)
        if rest is not None:
            return str(mounts[mount] / rest)
    return value


def localize(job: Job, *, base_dir: Path, stdlib: Path) -> Job:
    """The job with the paths it reads, `spec.data.path` and `spec.model.initFrom`, made absolute for this machine.

    `{stdlib}` expands to the Python standard library's folder; a relative
    path is taken relative to the manifest's folder, as its reader sees it
    (the trainers run in the work directory, where it would mean nothing). An
    s3:// URI stays as it is.
    """
    data = replace(job.spec.data, path=_local_path(job.spec.data.path, base_dir, stdlib))
    model = replace(job.spec.model, init_from=_local_path(job.spec.model.init_from, base_dir, stdlib))
    return replace(job, spec=replace(job.spec, data=data, model=model))


def _local_path(path: Optional[str], base_dir: Path, stdlib: Path) -> Optional[str]:
    if not path or is_uri(path) or PurePosixPath(path).is_absolute() or path.startswith("~"):
        return path
    if path.startswith(STDLIB_PLACEHOLDER):
        return str(stdlib) + path[len(STDLIB_PLACEHOLDER) :]
    return str(base_dir / path)


def _folders(worker: Worker, workdir: Path, claims: Path) -> tuple[dict[str, Path], dict[str, Path]]:
    """(shared, per-pod) local folders of the worker's volumes, by volume name.

    A claim (of checkpoints or of data) is the folder of that name in
    `claims`. The checkpoint volume without a claim is the work directory's
    `checkpoints/`, shared by every local pod all the same, so a failed group
    and a rerun in the same work directory resume from it. ConfigMaps are
    shared folders named after the volume, as is a pod overlay volume the data
    lives on (`volumes/<name>/`); an emptyDir belongs to its pod.
    """
    shared, scratch = {}, {}
    for volume in worker.container.volumes:
        if volume.kind == CLAIM:
            shared[volume.name] = claims / str(volume.source)
        elif volume.name == CHECKPOINT_VOLUME:
            shared[volume.name] = workdir / "checkpoints"
        elif volume.kind == CONFIG_MAP:
            shared[volume.name] = workdir / volume.name
        elif volume.kind == OVERLAY:
            shared[volume.name] = workdir / "volumes" / volume.name
        else:
            scratch[volume.name] = workdir / "tmp" / worker.name / volume.name
    return shared, scratch


def _dns_names(job: Job, workers: list[Worker]) -> set[str]:
    """Every name cluster DNS gives the worker pods: hostname.subdomain[.namespace[.svc[.cluster.local]]]."""
    names = set()
    for worker in workers:
        short = f"{worker.name}.{workers_service_name(job.name)}"
        names |= {short, f"{short}.{job.namespace}", f"{short}.{job.namespace}.svc", f"{short}.{job.namespace}.svc.cluster.local"}
    return names


def _rewrite_host(value: str, hosts: set[str]) -> str:
    host, sep, port = value.rpartition(":")
    if sep and host in hosts:
        return f"{LOOPBACK}:{port}"
    return LOOPBACK if value in hosts else value


def plan_local(
    job: Job,
    *,
    workdir: Path,
    claims: Path,
    rendezvous: Path,
    metrics_port: int,
    python: str,
    cpu_count: int,
) -> LocalPlan:
    """Map the job's workers onto local processes under `workdir` (absolute), its claims under `claims`.

    On one machine the rendezvous is the file store `rendezvous` (a new file
    for each attempt, in `workdir`), and rank 0's metrics endpoint needs a free
    port (`metrics_port`) instead of the cluster's fixed one.
    """
    workers = elastic_workers(job)
    shared, _ = _folders(workers[0], workdir, claims)
    checkpoint_dir = shared.get(CHECKPOINT_VOLUME)
    config = _local_config(job, workers[0], shared, checkpoint_dir, metrics_port)
    # torchrun sets one thread per process only when a node runs several; local
    # agents share one machine, so its cores are split between all processes.
    threads = max(1, cpu_count // (job.spec.nodes * job.spec.nproc_per_node))
    hosts = _dns_names(job, workers)
    local_workers = [_local_worker(job, worker, workdir, claims, shared, hosts, rendezvous, python, threads)
                     for worker in workers]
    config_folder = next(shared[v.name] for v in workers[0].container.volumes if v.kind == CONFIG_MAP)
    return LocalPlan(
        job_name=job.name,
        workdir=workdir,
        checkpoint_dir=checkpoint_dir,
        progress_file=workdir / PROGRESS_FILE,
        total_steps=job.spec.training.steps,
        backoff_limit=job.spec.run_policy.backoff_limit,
        job=job,
        files={config_folder / CONFIG_FILE: config.to_yaml()},
        dirs=sorted({*shared.values(), workdir / "termination", rendezvous.parent}),
        workers=local_workers,
        rendezvous=rendezvous,
        grace_seconds=termination_grace_seconds(job),
        data_claim=shared.get(DATA_VOLUME),
    )


def _local_config(job: Job, first: Worker, shared: Mapping[str, Path], checkpoint_dir: Optional[Path],
                  metrics_port: int) -> TrainerConfig:
    """trainer.yaml for a local run: its paths on the local folders (a URI as it is), rank 0's metrics on
    `metrics_port`."""
    # Loopback: the progress display reads it here, and nobody else on the network should.
    config = trainer_config(job, checkpoint_dir=None if checkpoint_dir is None else str(checkpoint_dir),
                            metrics_port=metrics_port, metrics_address=LOOPBACK)
    # Volumes are read and written at their local folders: data and initial weights on a mounted volume (the
    # checkpoint claim's `/checkpoints/export/...`), TensorBoard on one (rank 0, worker 0, writes it; a relative
    # folder is below the work directory).
    shared_mounts = {v.mount_path: shared[v.name] for v in first.container.volumes if v.name in shared}
    if config.data.path:
        config = replace(config, data=replace(config.data, path=rewrite_path(config.data.path, shared_mounts)))
    if config.model.init_from:
        init_from = rewrite_path(config.model.init_from, shared_mounts)
        config = replace(config, model=replace(config.model, init_from=init_from))
    if config.metrics.tensorboard_dir:
        metrics = replace(config.metrics, tensorboard_dir=rewrite_path(config.metrics.tensorboard_dir, shared_mounts))
        config = replace(config, metrics=metrics)
    return config


def _local_worker(job: Job, worker: Worker, workdir: Path, claims: Path, shared: Mapping[str, Path],
                  hosts: set[str], rendezvous: Path, python: str, threads: int) -> LocalWorker:
    """One worker pod as a local torchrun agent: its folders, environment and command on this machine."""
    _, scratch = _folders(worker, workdir, claims)
    folders = {**shared, **scratch}
    mounts = {v.mount_path: folders[v.name] for v in worker.container.volumes}
    # The object store's endpoint is the user's own here (the module's docstring), as are its credentials.
    manifest_only = {name for name, _ in store_env(job)}
    env = {name: _rewrite_host(rewrite_path(value, mounts), hosts) for name, value in worker.container.env
           if name not in manifest_only}
    env[RDZV_ENDPOINT_ENV] = str(rendezvous)
    env[RDZV_CONF_ENV] = rdzv_conf({"store_type": "file", **rendezvous_timeouts(job)})
    # The address this agent advertises to the others (the pod IP in a cluster).
    env[LOCAL_ADDR_ENV] = LOOPBACK
    env[PROGRESS_FILE_ENV] = str(workdir / PROGRESS_FILE)
    # The checkpoint volume's holder is the work directory here (the uid in a cluster): a rerun in it takes
    # its claim over at once, another job's run on the same claim is refused while this one holds it.
    env[LEASE_HOLDER_ENV] = lease_holder(job.name, str(workdir))
    # The pod's /dev/termination-log, where its trainers say why they ended.
    termination_log = workdir / "termination" / worker.name
    env[TERMINATION_LOG_ENV] = str(termination_log)
    env.setdefault("OMP_NUM_THREADS", str(threads))
    # torchrun's agent, quiet when stopped (contract.AGENT_MODULE): every stop of a local run is a SIGTERM.
    argv = [python, "-m", AGENT_MODULE, *(rewrite_path(a, mounts) for a in worker.container.args)]
    return LocalWorker(worker.name, argv, env, list(scratch.values()), termination_log)


def not_started(worker: LocalWorker, err: OSError) -> str:
    """The one line of a worker whose agent could not be started, as the kubelet says of a container it cannot run."""
    wait = Waiting(RUN_CONTAINER_ERROR, f"{worker.argv[0]} could not be started: {err.strerror or err}",
                   (worker.name,))
    return f"{wait.reason}: {wait.text()}"


def missing_claim(plan: LocalPlan, is_dir: Callable[[Path], bool]) -> Optional[str]:
    """The one line of a run whose data claim has no folder, in the scheduler's words for a pod whose claim does
    not exist (the VolumeBinding plugin's Unschedulable), else None. Its folder is not made empty: the trainers
    would read no data."""
    volume = plan.job.spec.data.volume
    if plan.data_claim is None or volume is None or is_dir(plan.data_claim):
        return None
    wait = Waiting(UNSCHEDULABLE, f'persistentvolumeclaim "{volume.claim_name}" not found: no folder {plan.data_claim} '
                                  f"(spec.data.volume.claimName: {volume.claim_name}; braintrain run --claims)",
                   tuple(w.name for w in plan.workers))
    return f"{wait.reason}: {wait.text()}"


def cluster_only(job: Job) -> Optional[str]:
    """The one line refusing what only the operator honours (runPolicy.suspend, activeDeadlineSeconds), else None:
    a local run that ignored them would not be the run the manifest asks for."""
    policy = job.spec.run_policy
    if policy.suspend:
        return "spec.runPolicy.suspend: true: the job is suspended, nothing runs; set it false to run locally"
    if policy.active_deadline_seconds is not None:
        return (f"spec.runPolicy.activeDeadlineSeconds: {policy.active_deadline_seconds}: braintrain run does not "
                "enforce a deadline; remove it to run locally")
    return None


def request_file(workdir: Path, name: str) -> Path:
    """Where `braintrain checkpoint` (`profile`) asks a run in `workdir` for a checkpoint (a profile): the file
    `name` beside trainer.yaml, in the ConfigMap's folder, as the operator puts the job's checkpoint-now
    (profile-now) annotation into the ConfigMap."""
    return workdir / CONFIG_VOLUME / name


def process_env(inherited: Mapping[str, str], worker: LocalWorker) -> dict[str, str]:
    """The worker's whole environment: the caller's, less launch variables (a worker gets those only from its pod), plus the pod's."""
    clean = {k: v for k, v in inherited.items() if k not in LAUNCH_ENV_KEYS and not k.startswith(LAUNCH_ENV_PREFIXES)}
    return {**clean, **worker.env}
