"""The Kubernetes "restricted" Pod Security Standard as a pure checker.

Field by field after https://kubernetes.io/docs/concepts/security/pod-security-standards/
(restricted includes every baseline control). `restricted_violations(pod_spec,
annotations)` returns one line per violated control, empty when the pod passes.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

ALLOWED_VOLUME_SOURCES = frozenset(
    {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"}
)
ALLOWED_SELINUX_TYPES = frozenset({"container_t", "container_init_t", "container_kvm_t", "container_engine_t"})
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    }
)
ALLOWED_SECCOMP = frozenset({"RuntimeDefault", "Localhost"})
APPARMOR_ANNOTATION_PREFIX = "container.apparmor.security.beta.kubernetes.io/"


def _containers(spec: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for field in ("initContainers", "containers", "ephemeralContainers"):
        for container in spec.get(field) or []:
            yield f"{field}[{container.get('name', '?')}]", container


def _seccomp_type(context: Mapping[str, Any]) -> Any:
    return (context.get("seccompProfile") or {}).get("type")


def _selinux_violations(where: str, context: Mapping[str, Any]) -> Iterator[str]:
    options = context.get("seLinuxOptions") or {}
    if options.get("type") not in (None, "", *ALLOWED_SELINUX_TYPES):
        yield f"{where}.securityContext.seLinuxOptions.type: {options['type']!r} is not allowed"
    for key in ("user", "role"):
        if options.get(key):
            yield f"{where}.securityContext.seLinuxOptions.{key}: must be unset, got {options[key]!r}"


def _apparmor_violations(where: str, context: Mapping[str, Any]) -> Iterator[str]:
    kind = (context.get("appArmorProfile") or {}).get("type")
    if kind not in (None, "RuntimeDefault", "Localhost"):
        yield f"{where}.securityContext.appArmorProfile.type: {kind!r} is not allowed"


def restricted_violations(pod_spec: Mapping[str, Any], annotations: Mapping[str, str] | None = None) -> list[str]:
    """Every restricted-profile control the pod spec (and pod annotations) violates."""
    problems: list[str] = []
    pod_context = pod_spec.get("securityContext") or {}

    # Baseline: host namespaces, host process, host paths, host ports, sysctls.
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod_spec.get(field):
            problems.append(f"spec.{field}: must be unset or false")
    if (pod_context.get("windowsOptions") or {}).get("hostProcess"):
        problems.append("spec.securityContext.windowsOptions.hostProcess: must be unset or false")
    for sysctl in pod_context.get("sysctls") or []:
        if sysctl.get("name") not in SAFE_SYSCTLS:
            problems.append(f"spec.securityContext.sysctls: {sysctl.get('name')!r} is not a safe sysctl")
    problems.extend(_selinux_violations("spec", pod_context))
    problems.extend(_apparmor_violations("spec", pod_context))
    for key, value in (annotations or {}).items():
        if key.startswith(APPARMOR_ANNOTATION_PREFIX) and value != "runtime/default" and not value.startswith("localhost/"):
            problems.append(f"metadata.annotations[{key}]: {value!r} is not allowed")

    # Restricted: volume types only from the allowed list.
    for volume in pod_spec.get("volumes") or []:
        sources = set(volume) - {"name"}
        if not sources <= ALLOWED_VOLUME_SOURCES:
            problems.append(f"spec.volumes[{volume.get('name')}]: {sorted(sources - ALLOWED_VOLUME_SOURCES)} not allowed")

    pod_non_root = pod_context.get("runAsNonRoot") is True
    pod_seccomp = _seccomp_type(pod_context)
    if pod_seccomp is not None and pod_seccomp not in ALLOWED_SECCOMP:
        problems.append(f"spec.securityContext.seccompProfile.type: must be RuntimeDefault or Localhost, got {pod_seccomp!r}")
    if pod_context.get("runAsUser") == 0:
        problems.append("spec.securityContext.runAsUser: must not be 0")

    for where, container in _containers(pod_spec):
        context = container.get("securityContext") or {}
        if context.get("privileged"):
            problems.append(f"{where}.securityContext.privileged: must be unset or false")
        if (context.get("windowsOptions") or {}).get("hostProcess"):
            problems.append(f"{where}.securityContext.windowsOptions.hostProcess: must be unset or false")
        if context.get("procMount") not in (None, "Default"):
            problems.append(f"{where}.securityContext.procMount: must be unset or Default")
        problems.extend(_selinux_violations(where, context))
        problems.extend(_apparmor_violations(where, context))
        for port in container.get("ports") or []:
            if port.get("hostPort"):
                problems.append(f"{where}.ports[{port.get('name', port.get('containerPort'))}].hostPort: must be unset or 0")
        if context.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{where}.securityContext.allowPrivilegeEscalation: must be false")
        # Non-root: set on the pod or on every container, never false on a container.
        if context.get("runAsNonRoot") is False or not (pod_non_root or context.get("runAsNonRoot") is True):
            problems.append(f"{where}.securityContext.runAsNonRoot: must be true (here or on the pod)")
        if context.get("runAsUser") == 0:
            problems.append(f"{where}.securityContext.runAsUser: must not be 0")
        seccomp = _seccomp_type(context)
        if seccomp is not None and seccomp not in ALLOWED_SECCOMP:
            problems.append(f"{where}.securityContext.seccompProfile.type: must be RuntimeDefault or Localhost, got {seccomp!r}")
        if seccomp is None and pod_seccomp is None:
            problems.append(f"{where}.securityContext.seccompProfile: must be set here or on the pod")
        capabilities = context.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            problems.append(f"{where}.securityContext.capabilities.drop: must include ALL")
        added = set(capabilities.get("add") or []) - {"NET_BIND_SERVICE"}
        if added:
            problems.append(f"{where}.securityContext.capabilities.add: {sorted(added)} not allowed")
    return problems
