"""The overlay policy: what `spec.podTemplate` may ask of a worker pod beyond the safe settings (pure).

Whoever may create a BrainTrainingJob creates pods through it, so `create` on
BrainTrainingJobs is `create pods` within this policy (docs/security.md, "The
pod overlay"). The policy is the chart's `podOverlayPolicy`
(OperatorDefaults.overlay_policy); each setting lifts one group of the Pod
Security Standards' controls
(https://kubernetes.io/docs/concepts/security/pod-security-standards/), and
all are off by default. The overlay cannot set the pod's own securityContext
(sysctls, pod-level seccomp and SELinux), hostPID, hostIPC or ephemeral
containers at all (they are not among corev1.POD_SPEC_FIELDS), so no setting
covers them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

from brain_trainer.schema import ConfigError, FieldError, camel, setting

from .overlay import PodTemplateOverlay, within

# The chart's values key: a refusal names the setting to change by it.
POLICY_VALUES = "podOverlayPolicy"
DEFAULT_SERVICE_ACCOUNT = "default"
# Baseline's SELinux control: these types, or none; user and role unset.
CONTAINER_SELINUX_TYPES = ("", "container_t", "container_init_t", "container_kvm_t", "container_engine_t")
# Before Kubernetes 1.30's securityContext.appArmorProfile (not in the 1.29 schemas the overlay is checked
# against), a container's AppArmor profile is this annotation; baseline allows the runtime's or a local one.
APPARMOR_ANNOTATION_PREFIX = "container.apparmor.security.beta.kubernetes.io/"
CONFINED_APPARMOR = ("runtime/default", "localhost/")


@dataclass
class OverlayPolicy:
    """What spec.podTemplate may ask of the worker pods beyond the safe settings; all off by default."""

    privileged: bool = setting(
        False, help="securityContext.privileged and windowsOptions.hostProcess (baseline: Privileged Containers, HostProcess)"
    )
    privilege_escalation: bool = setting(
        False, help="securityContext.allowPrivilegeEscalation: true (restricted: Privilege Escalation)"
    )
    root: bool = setting(
        False, help="securityContext.runAsUser or runAsGroup 0, runAsNonRoot: false (restricted: Running as Non-root)"
    )
    capabilities: list[str] = setting(
        default_factory=list,
        help="capabilities securityContext.capabilities.add may name, e.g. [IPC_LOCK] for RDMA (baseline: Capabilities)",
    )
    unconfined: bool = setting(
        False,
        help="seccomp Unconfined, AppArmor other than runtime/default or localhost/*, procMount Unmasked, SELinux "
        "options beyond the container types (baseline: Seccomp, AppArmor, /proc Mount Type, SELinux)",
    )
    host_ports: bool = setting(False, help="ports[].hostPort (baseline: Host Ports)")
    host_network: bool = setting(False, help="hostNetwork: true (baseline: Host Namespaces)")
    host_paths: list[str] = setting(
        default_factory=list,
        help="node paths a hostPath volume may name, each with what lies below it; / allows any (baseline: HostPath Volumes)",
    )
    service_accounts: list[str] = setting(
        default_factory=list, help="ServiceAccounts serviceAccountName may name besides the namespace's default"
    )
    service_account_token: bool = setting(
        False, help="the pod's API token: automountServiceAccountToken: true, projected serviceAccountToken volumes"
    )


class OverlayRefused(ConfigError):
    """A spec valid but for what its overlay asks beyond the policy (`errors`, each naming the field and the
    setting); `job` is the job parsed as if the policy allowed it, for the pods that already run it."""

    def __init__(self, errors: list[FieldError], job: Any):
        super().__init__(errors)
        self.job = job


# (setting, field below a container, whether the field's value needs the setting); the core/v1 schema check
# has run, so the values have their Kubernetes types (no boolean passes for the integer 0).
CONTAINER_RULES: tuple[tuple[str, str, Callable[[Any], bool]], ...] = (
    ("privileged", "securityContext.privileged", lambda v: v is True),
    ("privileged", "securityContext.windowsOptions.hostProcess", lambda v: v is True),
    ("privilege_escalation", "securityContext.allowPrivilegeEscalation", lambda v: v is True),
    ("root", "securityContext.runAsUser", lambda v: v == 0),
    ("root", "securityContext.runAsGroup", lambda v: v == 0),
    ("root", "securityContext.runAsNonRoot", lambda v: v is False),
    ("unconfined", "securityContext.procMount", lambda v: v not in (None, "Default")),
    ("unconfined", "securityContext.seccompProfile.type", lambda v: v == "Unconfined"),
    ("unconfined", "securityContext.seLinuxOptions.type", lambda v: v not in (None, *CONTAINER_SELINUX_TYPES)),
    ("unconfined", "securityContext.seLinuxOptions.user", bool),
    ("unconfined", "securityContext.seLinuxOptions.role", bool),
)


def policy_problems(overlay: PodTemplateOverlay, policy: OverlayPolicy) -> Iterator[tuple[str, str]]:
    """What the overlay asks for beyond the policy: `(path below podTemplate, message naming the setting)`."""
    spec = overlay.spec
    if spec.host_network and not policy.host_network:
        yield "spec.hostNetwork", _refused(policy, "host_network")
    account = spec.service_account_name or DEFAULT_SERVICE_ACCOUNT
    if account != DEFAULT_SERVICE_ACCOUNT and account not in policy.service_accounts:
        yield "spec.serviceAccountName", _refused(policy, "service_accounts", account)
    if spec.automount_service_account_token and not policy.service_account_token:
        yield "spec.automountServiceAccountToken", _refused(policy, "service_account_token")
    for i, volume in enumerate(spec.volumes):
        host_path = (volume.get("hostPath") or {}).get("path")
        if host_path is not None and not any(within(host_path, allowed) for allowed in policy.host_paths):
            yield f"spec.volumes[{i}].hostPath.path", _refused(policy, "host_paths", host_path)
        for j, source in enumerate((volume.get("projected") or {}).get("sources") or []):
            if "serviceAccountToken" in source and not policy.service_account_token:
                yield f"spec.volumes[{i}].projected.sources[{j}].serviceAccountToken", _refused(policy, "service_account_token")
    for key, value in overlay.metadata.annotations.items():
        if key.startswith(APPARMOR_ANNOTATION_PREFIX) and not value.startswith(CONFINED_APPARMOR) and not policy.unconfined:
            yield f"metadata.annotations.{key}", _refused(policy, "unconfined", value)
    for list_name, containers in (("initContainers", spec.init_containers), ("containers", spec.containers)):
        for i, container in enumerate(containers):
            yield from _container_problems(container, f"spec.{list_name}[{i}]", policy)


def _container_problems(container: Mapping[str, Any], path: str, policy: OverlayPolicy) -> Iterator[tuple[str, str]]:
    for name, dotted, needs in CONTAINER_RULES:
        if needs(_get(container, dotted)) and not getattr(policy, name):
            yield f"{path}.{dotted}", _refused(policy, name)
    for i, port in enumerate(container.get("ports") or []):
        if port.get("hostPort") and not policy.host_ports:
            yield f"{path}.ports[{i}].hostPort", _refused(policy, "host_ports")
    allowed = {_capability(c) for c in policy.capabilities}
    for i, capability in enumerate(_get(container, "securityContext.capabilities.add") or []):
        if _capability(capability) not in allowed:
            yield f"{path}.securityContext.capabilities.add[{i}]", _refused(policy, "capabilities", capability)


def _capability(name: str) -> str:
    # Runtimes take SYS_ADMIN and CAP_SYS_ADMIN alike; the allow-list must not miss either spelling.
    return name.upper().removeprefix("CAP_")


def _get(mapping: Mapping[str, Any], dotted: str) -> Any:
    value: Any = mapping
    for key in dotted.split("."):
        value = value.get(key) if isinstance(value, Mapping) else None
    return value


def _refused(policy: OverlayPolicy, name: str, value: Any = None) -> str:
    current = getattr(policy, name)
    shown = f"[{', '.join(current)}]" if isinstance(current, list) else str(current).lower()
    asked = f"{value!r} is " if value is not None else ""
    return f"{asked}not allowed by the operator's overlay policy ({POLICY_VALUES}.{camel(name)}: {shown})"
