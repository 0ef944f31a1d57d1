"""`spec.podTemplate`: an overlay on every worker pod of both backends, typed by Kubernetes' own core/v1 schemas.

Pure. The overlay is a small pod template: labels and annotations, and the
PodSpec fields of corev1.POD_SPEC_FIELDS. Its `containers` are sidecars,
except an entry named `trainer`, which adds env, envFrom, volumeMounts and
securityContext.capabilities.add to the trainer container (on both backends).
Everything the operator sets itself (spec/owned.py) is refused, naming the
path; backends/shared/overlay.py merges the rest (docs/operator.md, "The pod overlay").
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, ClassVar, Iterable, Iterator, Mapping, Optional

from brain_trainer.schema import Names, setting

from .corev1 import core_problems, core_setting as _core
from .environment import reserved_env_key
from .owned import CONFIG_DIR, PORTS, PYTORCHJOB_CONTAINER, SHM_DIR, TRAINER_CONTAINER, VOLUMES, owned_key

# Label syntax (Kubernetes' validation): an optional DNS-subdomain prefix, a name of up to 63 characters.
LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
LABEL_KEY_PATTERN = rf"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?{LABEL_NAME}"
LABEL_MAX = 63
DNS_POLICIES = ("ClusterFirst", "ClusterFirstWithHostNet", "Default")
# What the trainer entry may carry; where each other container setting lives instead.
TRAINER_FIELDS = ("name", "env", "envFrom", "volumeMounts", "securityContext")
TRAINER_ELSEWHERE = {
    "image": "set spec.image",
    "imagePullPolicy": "set spec.imagePullPolicy",
    "resources": "set spec.resources",
    "command": "the operator runs torchrun with the trainer's arguments",
    "args": "the operator runs torchrun with the trainer's arguments",
    "ports": "the rendezvous and metrics ports are the operator's",
}
# Environment the trainer container may not take from the overlay: torchrun's and the
# operator's own variables, and NCCL's (spec.nccl.env is their one place).
OVERLAY_RESERVED_ENV_PREFIXES = ("MASTER_", "NCCL_", "BRAIN_")
# env[].valueFrom and envFrom[] references that must name their object (Kubernetes
# accepts an empty name and the pod then fails at start).
NAMED_REFERENCES = ("secretKeyRef", "configMapKeyRef")
NAMED_SOURCES = ("secretRef", "configMapRef")



@dataclass
class PodMetadataOverlay:
    """Labels and annotations added to every worker pod."""

    labels: dict[str, str] = setting(default_factory=dict, help="added to each worker pod; keys the operator sets are refused")
    annotations: dict[str, str] = setting(default_factory=dict, help="added to each worker pod; keys the operator sets are refused")

    def check(self, name: Names) -> Iterator[tuple[str, str]]:
        for field_name, values in (("labels", self.labels), ("annotations", self.annotations)):
            for key, value in values.items():
                path = f"{field_name}.{key}"
                if owned_key(key):
                    yield path, "reserved: the operator (or Kueue, a gang scheduler) sets this key"
                elif not _valid_key(key):
                    yield path, f"{key!r} is not a valid {field_name[:-1]} key"
                elif field_name == "labels" and (len(value) > LABEL_MAX or not re.fullmatch(f"({LABEL_NAME})?", value)):
                    yield path, f"must be a label value of at most {LABEL_MAX} characters, got {value!r}"


@dataclass
class PodSpecOverlay:
    """Kubernetes PodSpec fields added to every worker pod, merged by name with the operator's."""

    # PodSpec fields the overlay refuses because spec.scheduling carries them (both backends read them there).
    ELSEWHERE: ClassVar[Mapping[str, str]] = {
        key: f"spec.scheduling.{key}" for key in ("nodeSelector", "tolerations", "affinity", "schedulerName")
    }

    image_pull_secrets: list[dict[str, Any]] = _core("imagePullSecrets")
    service_account_name: Optional[str] = _core("serviceAccountName")
    automount_service_account_token: Optional[bool] = _core(
        "automountServiceAccountToken",
        "mount the service account's API token; the operator leaves it unmounted unless this is true",
    )
    volumes: list[dict[str, Any]] = _core("volumes")
    init_containers: list[dict[str, Any]] = _core("initContainers")
    containers: list[dict[str, Any]] = _core(
        "containers",
        "sidecar containers; an entry named trainer adds env, envFrom, volumeMounts and "
        "securityContext.capabilities.add to the trainer container",
    )
    priority_class_name: Optional[str] = _core("priorityClassName")
    host_network: Optional[bool] = _core("hostNetwork")
    dns_policy: Optional[str] = _core("dnsPolicy")
    runtime_class_name: Optional[str] = _core("runtimeClassName")

    def check(self, name: Names) -> Iterator[tuple[str, str]]:
        problems = list(core_problems(self))
        yield from problems
        if problems:
            return  # the rules below read well-formed values
        if self.dns_policy is not None and self.dns_policy not in DNS_POLICIES:
            yield "dnsPolicy", f"must be one of {', '.join(DNS_POLICIES)}; got {self.dns_policy!r}"
        yield from _named(self.image_pull_secrets, "imagePullSecrets")
        yield from _unique(self.image_pull_secrets, "imagePullSecrets")
        yield from _unique(self.volumes, "volumes")
        for i, volume in enumerate(self.volumes):
            if volume["name"] in VOLUMES:
                yield f"volumes[{i}].name", f"{volume['name']!r} clashes with the operator's volume of that name"
        everything = [*self.init_containers, *self.containers]
        yield from _unique(everything, "containers", "initContainers and containers")
        volumes = {v["name"] for v in self.volumes} | set(VOLUMES)
        for list_name, containers in (("initContainers", self.init_containers), ("containers", self.containers)):
            for i, container in enumerate(containers):
                path = f"{list_name}[{i}]"
                if container["name"] == TRAINER_CONTAINER and list_name == "containers":
                    yield from _trainer_entry(container, path, volumes)
                    continue
                if container["name"] in (TRAINER_CONTAINER, PYTORCHJOB_CONTAINER):
                    yield f"{path}.name", f"{container['name']!r} is the trainer container's name"
                yield from _container_problems(container, path, volumes)

    def trainer(self) -> Mapping[str, Any]:
        """The entry that adds to the trainer container ({} when none)."""
        return next((c for c in self.containers if c.get("name") == TRAINER_CONTAINER), {})

    def sidecars(self) -> list[dict[str, Any]]:
        return [c for c in self.containers if c.get("name") != TRAINER_CONTAINER]


@dataclass
class PodTemplateOverlay:
    """An overlay on every worker pod of both backends: labels, annotations and Kubernetes PodSpec fields."""

    metadata: PodMetadataOverlay = field(default_factory=PodMetadataOverlay)
    spec: PodSpecOverlay = field(default_factory=PodSpecOverlay)


def job_problems(overlay: PodTemplateOverlay, checkpoint_mount: Optional[str], priority_class: Optional[str],
                 data_mount: Optional[str] = None) -> Iterator[tuple[str, str]]:
    """Rules across the overlay and the rest of the spec: `(path below podTemplate, message)`; a mount of None
    is no volume (checkpoints or data in an object store)."""
    spec = overlay.spec
    if spec.priority_class_name is not None and priority_class is not None:
        yield "spec.priorityClassName", "set either spec.scheduling.priorityClassName or spec.podTemplate.spec.priorityClassName, not both"
    index = next((i for i, c in enumerate(spec.containers) if c.get("name") == TRAINER_CONTAINER), None)
    if index is None:
        return
    for j, mount in enumerate(spec.containers[index].get("volumeMounts") or []):
        path = mount.get("mountPath")
        owned = (CONFIG_DIR, SHM_DIR, *(m for m in (checkpoint_mount, data_mount) if m))
        if isinstance(path, str) and any(within(path, mount) for mount in owned):
            yield (
                f"spec.containers[{index}].volumeMounts[{j}].mountPath",
                f"{path!r} is the trainer's own mount (the trainer config, shared memory, checkpoints or data)",
            )


def trainer_env_paths(overlay: PodTemplateOverlay, variable: str) -> Iterator[str]:
    """The path below podTemplate of each env entry of the trainer entry that sets `variable`."""
    for i, container in enumerate(overlay.spec.containers):
        if container.get("name") == TRAINER_CONTAINER:
            for j, entry in enumerate(container.get("env") or []):
                if entry.get("name") == variable:
                    yield f"spec.containers[{i}].env[{j}].name"


def within(path: str, mount: str) -> bool:
    """`path` is `mount` or below it, once both are normalised (`/checkpoints/../etc/brain` is `/etc/brain`)."""
    inner, outer = PurePosixPath(_normal(path)), PurePosixPath(_normal(mount))
    return inner == outer or outer in inner.parents


def _normal(path: str) -> str:
    """`path` as the node resolves it: `.`, `..` and repeated slashes folded.

    posixpath keeps a leading `//` (POSIX leaves its meaning open); Linux reads it as `/`.
    """
    normal = posixpath.normpath(path)
    return "/" + normal.lstrip("/") if normal.startswith("/") else normal


def _valid_key(key: str) -> bool:
    prefix, _, rest = key.rpartition("/")
    return re.fullmatch(LABEL_KEY_PATTERN, key) is not None and len(rest) <= LABEL_MAX and len(prefix) <= 253


def _unique(items: Iterable[Mapping[str, Any]], list_name: str, where: str = "") -> Iterator[tuple[str, str]]:
    seen: set[str] = set()
    for i, item in enumerate(items):
        item_name = item.get("name")
        if item_name in seen:
            yield f"{list_name}[{i}].name", f"{item_name!r} appears twice in {where or list_name}"
        seen.add(item_name)


def _named(references: Iterable[Mapping[str, Any]], path: str) -> Iterator[tuple[str, str]]:
    for i, reference in enumerate(references):
        if not reference.get("name"):
            yield f"{path}[{i}].name", "required: the name of the object referred to"


def _env_problems(container: Mapping[str, Any], path: str) -> Iterator[tuple[str, str]]:
    """References to a Secret or ConfigMap without its name."""
    for i, variable in enumerate(container.get("env") or []):
        value_from = variable.get("valueFrom") or {}
        for source in NAMED_REFERENCES:
            if source in value_from and not value_from[source].get("name"):
                yield f"{path}.env[{i}].valueFrom.{source}.name", "required: the name of the object to read"
    for i, source in enumerate(container.get("envFrom") or []):
        for kind in NAMED_SOURCES:
            if kind in source and not source[kind].get("name"):
                yield f"{path}.envFrom[{i}].{kind}.name", "required: the name of the object to read"


def _mount_problems(container: Mapping[str, Any], path: str, volumes: set[str]) -> Iterator[tuple[str, str]]:
    for i, mount in enumerate(container.get("volumeMounts") or []):
        if mount["name"] not in volumes:
            yield f"{path}.volumeMounts[{i}].name", f"{mount['name']!r} names no volume of podTemplate.spec.volumes"


def _container_problems(container: Mapping[str, Any], path: str, volumes: set[str]) -> Iterator[tuple[str, str]]:
    """A sidecar or init container: may mount the operator's volumes, may not take its ports."""
    yield from _env_problems(container, path)
    yield from _mount_problems(container, path, volumes)
    for i, port in enumerate(container.get("ports") or []):
        if port.get("containerPort") in PORTS.values() or port.get("name") in PORTS:
            yield f"{path}.ports[{i}]", f"reserved: the trainer serves {', '.join(f'{n} on {p}' for n, p in PORTS.items())}"


def _trainer_entry(container: Mapping[str, Any], path: str, volumes: set[str]) -> Iterator[tuple[str, str]]:
    for key in container:
        if key not in TRAINER_FIELDS:
            hint = TRAINER_ELSEWHERE.get(key, f"only {', '.join(TRAINER_FIELDS[1:])} may be added to the trainer container")
            yield f"{path}.{key}", f"reserved: {hint}"
    for i, variable in enumerate(container.get("env") or []):
        if reserved_env_key(variable["name"]) or variable["name"].startswith(OVERLAY_RESERVED_ENV_PREFIXES):
            yield (
                f"{path}.env[{i}].name",
                f"{variable['name']!r} is reserved (torchrun's or the operator's); NCCL variables go in spec.nccl.env",
            )
    yield from _unique(container.get("env") or [], f"{path}.env")
    yield from _env_problems(container, path)
    own = set(VOLUMES)
    for i, mount in enumerate(container.get("volumeMounts") or []):
        if mount["name"] in own:
            yield f"{path}.volumeMounts[{i}].name", f"{mount['name']!r} is already mounted in the trainer by the operator"
    yield from _mount_problems(container, path, volumes)
    context = container.get("securityContext") or {}
    for key in context:
        if key != "capabilities":
            yield f"{path}.securityContext.{key}", "reserved: the trainer runs restricted; only capabilities.add may be set"
    for key in context.get("capabilities") or {}:
        if key != "add":
            yield f"{path}.securityContext.capabilities.{key}", "reserved: the operator drops ALL; only add may be set"
