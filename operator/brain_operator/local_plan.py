"""Rendered worker pods -> local process plans (pure: no processes, no files).

The local runner executes exactly what the cluster would run: the objects
from the elastic renderer. This module decides how each pod becomes a local
`torchrun` agent: its argv, its environment with the workers' DNS names
pointing at 127.0.0.1 and the rendezvous on a free local port, and its volumes
as folders under the job's work directory, with every in-pod mount path
rewritten to the local folder (in args, env and the ConfigMap's files).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Iterable, Mapping, Optional

import yaml
from brain_trainer.progress import PROGRESS_FILE_ENV

from .render import JOB_NAME_LABEL, REPLICA_INDEX_LABEL
from .spec import LAUNCH_ENV_KEYS, LAUNCH_ENV_PREFIXES

__all__ = [
    "LocalPlan",
    "LocalRunError",
    "LocalWorker",
    "STDLIB_PLACEHOLDER",
    "localize_manifest",
    "plan_local",
    "process_env",
    "rewrite_path",
]

LOOPBACK = "127.0.0.1"
TRAINER_FILE = "trainer.yaml"

# A data path may start with this placeholder: the local runner expands it to
# the Python standard library's folder, text that every machine has.
STDLIB_PLACEHOLDER = "{stdlib}"


class LocalRunError(RuntimeError):
    """The job cannot run on this machine; the message is one line for the user."""


@dataclass(frozen=True)
class LocalWorker:
    """One worker pod as a local torchrun agent; `scratch_dirs` are its emptyDirs."""

    name: str
    argv: list[str]
    env: dict[str, str]
    scratch_dirs: list[Path]


@dataclass(frozen=True)
class LocalPlan:
    """Everything the runner creates and starts for one job."""

    job_name: str
    workdir: Path
    checkpoint_dir: Path
    progress_file: Path
    total_steps: int
    backoff_limit: int
    files: dict[Path, str]
    dirs: list[Path]
    workers: list[LocalWorker]


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


def _rewrite_tree(node: Any, mounts: Mapping[str, Path]) -> Any:
    if isinstance(node, str):
        return rewrite_path(node, mounts)
    if isinstance(node, list):
        return [_rewrite_tree(v, mounts) for v in node]
    if isinstance(node, dict):
        return {k: _rewrite_tree(v, mounts) for k, v in node.items()}
    return node


def localize_manifest(manifest: Mapping[str, Any], *, base_dir: Path, stdlib: Path) -> dict[str, Any]:
    """The manifest with `spec.data.path` made absolute for this machine.

    `{stdlib}` expands to the Python standard library's folder; a relative
    path is taken relative to the manifest's folder, as its reader sees it.
    """
    spec = manifest.get("spec")
    data = spec.get("data") if isinstance(spec, Mapping) else None
    path = data.get("path") if isinstance(data, Mapping) else None
    if not isinstance(path, str) or not path:
        return dict(manifest)
    if path.startswith(STDLIB_PLACEHOLDER):
        local = str(stdlib) + path[len(STDLIB_PLACEHOLDER) :]
    elif PurePosixPath(path).is_absolute() or path.startswith("~"):
        return dict(manifest)
    else:
        local = str(base_dir / path)
    return {**manifest, "spec": {**spec, "data": {**data, "path": local}}}


def _by_kind(objects: Iterable[Mapping[str, Any]], kind: str) -> list[Mapping[str, Any]]:
    return [o for o in objects if o.get("kind") == kind]


def _container(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return pod["spec"]["containers"][0]


def _mount_of(pod: Mapping[str, Any], path: str) -> str:
    """The name of the pod's volume whose mount holds `path` (the deepest one)."""
    holding = [m for m in _container(pod).get("volumeMounts", []) if _below(path, m["mountPath"]) is not None]
    if not holding:
        raise LocalRunError(f"{path} is on no volume of pod {pod['metadata']['name']}")
    return max(holding, key=lambda m: len(m["mountPath"]))["name"]


def _folders(pod: Mapping[str, Any], checkpoint_volume: str, workdir: Path) -> tuple[dict[str, Path], dict[str, Path]]:
    """(shared, per-pod) local folders of the pod's volumes, by volume name.

    The volume holding checkpoints is `checkpoints/`, shared by every local
    pod whatever its kind (a ReadWriteMany claim gives the same in a cluster),
    so a failed group and a rerun resume from it. ConfigMaps and other claims
    are shared folders named after the volume; an emptyDir belongs to its pod.
    """
    shared, scratch = {}, {}
    for volume in pod["spec"].get("volumes", []):
        name = volume["name"]
        if name == checkpoint_volume:
            shared[name] = workdir / "checkpoints"
        elif "configMap" in volume or "persistentVolumeClaim" in volume:
            shared[name] = workdir / name
        elif "emptyDir" in volume:
            scratch[name] = workdir / "tmp" / pod["metadata"]["name"] / name
        else:
            raise LocalRunError(f"pod {pod['metadata']['name']}: volume {name} has no local equivalent")
    return shared, scratch


def _env_value(pod: Mapping[str, Any], var: Mapping[str, Any]) -> str:
    if "value" in var:
        return str(var["value"])
    field_path = var.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
    meta = pod["metadata"]
    known = {
        "metadata.name": meta["name"],
        "metadata.namespace": meta.get("namespace", "default"),
        "status.podIP": LOOPBACK,
        "status.hostIP": LOOPBACK,
    }
    if field_path not in known:
        raise LocalRunError(f"pod {meta['name']}: env {var['name']} comes from {var.get('valueFrom')!r}, which has no local equivalent")
    return known[field_path]


def _dns_names(pods: list[Mapping[str, Any]]) -> set[str]:
    """Every name cluster DNS gives the worker pods: hostname.subdomain[.namespace[.svc[.cluster.local]]]."""
    names = set()
    for pod in pods:
        spec, ns = pod["spec"], pod["metadata"].get("namespace", "default")
        if spec.get("hostname") and spec.get("subdomain"):
            short = f"{spec['hostname']}.{spec['subdomain']}"
            names |= {short, f"{short}.{ns}", f"{short}.{ns}.svc", f"{short}.{ns}.svc.cluster.local"}
    return names


def _rewrite_host(value: str, hosts: set[str]) -> str:
    host, sep, port = value.rpartition(":")
    if sep and host in hosts:
        return f"{LOOPBACK}:{port}"
    return LOOPBACK if value in hosts else value


def _argv(pod: Mapping[str, Any], python: str, mounts: Mapping[str, Path]) -> list[str]:
    container = _container(pod)
    command = list(container.get("command", []))
    if command != ["torchrun"]:
        raise LocalRunError(f"pod {pod['metadata']['name']}: the local runner starts torchrun, not {command!r}")
    return [python, "-m", "torch.distributed.run", *(rewrite_path(a, mounts) for a in container.get("args", []))]


def _nproc(pod: Mapping[str, Any]) -> int:
    env = {v["name"]: v.get("value") for v in _container(pod).get("env", [])}
    return int(env.get("PET_NPROC_PER_NODE") or 1)


def _config_files(
    objects: list[Mapping[str, Any]], pod: Mapping[str, Any], shared: Mapping[str, Path], mounts: Mapping[str, Path], metrics_port: int
) -> dict[Path, str]:
    """The pod's ConfigMaps as files; YAML files get in-pod paths rewritten, trainer.yaml a local metrics port."""
    config_maps = {c["metadata"]["name"]: c for c in _by_kind(objects, "ConfigMap")}
    files = {}
    for volume in pod["spec"].get("volumes", []):
        if "configMap" not in volume:
            continue
        for name, text in config_maps[volume["configMap"]["name"]].get("data", {}).items():
            if name.endswith((".yaml", ".yml")):
                data = _rewrite_tree(yaml.safe_load(text), mounts)
                if name == TRAINER_FILE and isinstance(data.get("metrics"), dict) and data["metrics"].get("port"):
                    data["metrics"]["port"] = metrics_port
                text = yaml.safe_dump(data, sort_keys=False)
            files[shared[volume["name"]] / name] = text
    return files


def plan_local(
    objects: list[Mapping[str, Any]],
    *,
    workdir: Path,
    rdzv_port: int,
    metrics_port: int,
    python: str,
    backoff_limit: int,
    cpu_count: int,
) -> LocalPlan:
    """Map the elastic renderer's objects onto local processes under `workdir` (absolute).

    On one machine the rendezvous and rank 0's metrics endpoint need free
    ports (`rdzv_port`, `metrics_port`) instead of the cluster's fixed ones.
    """
    pods = sorted(_by_kind(objects, "Pod"), key=lambda p: int(p["metadata"]["labels"][REPLICA_INDEX_LABEL]))
    if not pods:
        raise LocalRunError("the rendered job has no worker pods")
    config_map = next((c for c in _by_kind(objects, "ConfigMap") if TRAINER_FILE in c.get("data", {})), None)
    if config_map is None:
        raise LocalRunError(f"the rendered job has no ConfigMap with {TRAINER_FILE}")
    trainer = yaml.safe_load(config_map["data"][TRAINER_FILE])
    checkpoint_volume = _mount_of(pods[0], trainer["checkpoint"]["dir"])
    shared, _ = _folders(pods[0], checkpoint_volume, workdir)
    shared_mounts = {m["mountPath"]: shared[m["name"]] for m in _container(pods[0])["volumeMounts"] if m["name"] in shared}
    hosts = _dns_names(pods)
    procs = sum(_nproc(p) for p in pods)
    progress_file = workdir / "progress.json"

    workers = []
    for pod in pods:
        _, scratch = _folders(pod, checkpoint_volume, workdir)
        folders = {**shared, **scratch}
        mounts = {m["mountPath"]: folders[m["name"]] for m in _container(pod).get("volumeMounts", [])}
        env = {}
        for var in _container(pod).get("env", []):
            env[var["name"]] = _rewrite_host(rewrite_path(_env_value(pod, var), mounts), hosts)
        env["PET_RDZV_ENDPOINT"] = f"{LOOPBACK}:{rdzv_port}"
        # The address this agent advertises to the others (the pod IP in a cluster).
        env["PET_LOCAL_ADDR"] = LOOPBACK
        env[PROGRESS_FILE_ENV] = str(progress_file)
        # torchrun sets one thread per process only when a node runs several; local
        # agents share one machine, so its cores are split between all processes.
        env.setdefault("OMP_NUM_THREADS", str(max(1, cpu_count // procs)))
        workers.append(LocalWorker(pod["metadata"]["name"], _argv(pod, python, mounts), env, list(scratch.values())))

    return LocalPlan(
        job_name=pods[0]["metadata"]["labels"][JOB_NAME_LABEL],
        workdir=workdir,
        checkpoint_dir=Path(rewrite_path(trainer["checkpoint"]["dir"], shared_mounts)),
        progress_file=progress_file,
        total_steps=int(trainer["training"]["steps"]),
        backoff_limit=backoff_limit,
        files=_config_files(objects, pods[0], shared, shared_mounts, metrics_port),
        dirs=sorted(set(shared.values())),
        workers=workers,
    )


def process_env(inherited: Mapping[str, str], worker: LocalWorker) -> dict[str, str]:
    """The worker's whole environment: the caller's, less launch variables (a worker gets those only from its pod), plus the pod's."""
    clean = {k: v for k, v in inherited.items() if k not in LAUNCH_ENV_KEYS and not k.startswith(LAUNCH_ENV_PREFIXES)}
    return {**clean, **worker.env}
