"""Which optional APIs the cluster serves and the operator may use, learned from the cluster, never guessed (pure).

The cluster client (`cluster.KubernetesClient.discover`) asks the API server's
discovery which of `OPTIONAL` it serves, and a SelfSubjectAccessReview
whether the operator may create each one served (every authenticated user may
ask both: the default `system:discovery` and `system:basic-user` roles). The
answer is this module's `ServedApis`, a plain value the handlers refresh at
start and on a slow timer and hand to every reconcile: a job that needs
what is missing is refused before anything is created (`missing`), and
`gang: native` renders for the newest version of Kubernetes' PodGroup served
(`native_pod_group`), and a job that names a Kueue queue (spec.scheduling.queueName)
needs Kueue's Workload API: without it the queue label is read by no one and
the job would wait for an admission that never comes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..objects.schedulers import COSCHEDULING_POD_GROUP, GANG_COSCHEDULING, GANG_NATIVE, GANG_VOLCANO, VOLCANO_POD_GROUP, WORKLOAD
from ..spec import Job

PYTORCHJOB = ("kubeflow.org/v1", "PyTorchJob")
# Kubernetes' own PodGroup, newest first: v1alpha2 in 1.36, v1alpha3 and v1beta1 in 1.37 (kubernetes-validate's
# schemas of those releases, generated from upstream's OpenAPI). The object we render, spec.schedulingPolicy.gang.minCount,
# has one shape in all three (tests/operator/test_gangs.py validates it against each).
NATIVE_POD_GROUP_VERSIONS = ("scheduling.k8s.io/v1beta1", "scheduling.k8s.io/v1alpha3", "scheduling.k8s.io/v1alpha2")
NATIVE_KIND = "PodGroup"
# Kueue's Workload, newest first: v1beta2 from Kueue 0.15, v1beta1 alone up to 0.14 (kueue apis/kueue). The fields
# the operator reads and writes (spec.active, status.conditions, the job-uid label) are the same in both; the client
# reads an older version's Workloads as WORKLOAD (cluster.KubernetesClient, OLDER_VERSIONS).
OLD_WORKLOAD = ("kueue.x-k8s.io/v1beta1", WORKLOAD[1])
OPTIONAL: tuple[tuple[str, str], ...] = (
    PYTORCHJOB,
    COSCHEDULING_POD_GROUP,
    VOLCANO_POD_GROUP,
    *((version, NATIVE_KIND) for version in NATIVE_POD_GROUP_VERSIONS),
    WORKLOAD,
    OLD_WORKLOAD,
)
# What to do about each missing API (docs/operator.md, "Why is my job not running").
REMEDY = {
    PYTORCHJOB: "install the Kubeflow training operator (kubeflow.org/v1 PyTorchJob)",
    COSCHEDULING_POD_GROUP: "install scheduler-plugins' coscheduling (the scheduling.x-k8s.io/v1alpha1 PodGroup CRD "
                            "and its scheduler)",
    VOLCANO_POD_GROUP: "install Volcano (the scheduling.volcano.sh/v1beta1 PodGroup CRD and its scheduler)",
    (GANG_NATIVE, NATIVE_KIND): "run Kubernetes 1.36 or later with the GenericWorkload and GangScheduling feature "
                                "gates and the scheduling.k8s.io runtime-config of its version (docs/operator.md)",
    WORKLOAD: "install Kueue (its kueue.x-k8s.io/v1beta2 Workload API), or remove spec.scheduling.queueName to run "
              "the job without a queue",
}
# The operator creates every optional kind but Kueue's Workloads, which it only lists (Kueue makes them).
VERBS = {WORKLOAD: "list", OLD_WORKLOAD: "list"}
# The chart value that grants the operator each API it may otherwise not use.
CHART_VALUE = {PYTORCHJOB: "pytorchjob.enabled=true"}


@dataclass(frozen=True)
class ServedApis:
    """The optional (apiVersion, kind)s the cluster serves, and those the operator may not use as it needs to
    (`verb`; by namespace, "" for every namespace)."""

    served: frozenset[tuple[str, str]] = frozenset()
    forbidden: frozenset[tuple[str, str, str]] = frozenset()

    def serves(self, kind: tuple[str, str]) -> bool:
        return kind in self.served

    def allows(self, namespace: str, kind: tuple[str, str]) -> bool:
        return (namespace, *kind) not in self.forbidden and ("", *kind) not in self.forbidden

    def workload(self) -> tuple[str, str]:
        """Kueue's Workload at the newest version served (WORKLOAD when none is, to say what is missing)."""
        return next((kind for kind in (WORKLOAD, OLD_WORKLOAD) if kind in self.served), WORKLOAD)

    def native_pod_group(self) -> Optional[str]:
        """The newest scheduling.k8s.io PodGroup version served, None when there is none."""
        return next((v for v in NATIVE_POD_GROUP_VERSIONS if (v, NATIVE_KIND) in self.served), None)


def needed(job: Job, apis: ServedApis) -> list[tuple[str, str]]:
    """The optional APIs `job` creates or reads; `gang: native` needs any one version of the PodGroup."""
    spec = job.spec
    out = []
    if spec.backend == "pytorchjob":
        out.append(PYTORCHJOB)
    if spec.scheduling.queue_name:
        out.append(apis.workload())
    gang = spec.scheduling.gang if spec.backend != "pytorchjob" else None
    if gang == GANG_COSCHEDULING:
        out.append(COSCHEDULING_POD_GROUP)
    elif gang == GANG_VOLCANO:
        out.append(VOLCANO_POD_GROUP)
    elif gang == GANG_NATIVE:
        out.append((apis.native_pod_group() or GANG_NATIVE, NATIVE_KIND))
    return out


def missing(job: Job, apis: ServedApis) -> Optional[str]:
    """Why the cluster cannot run `job` as asked (what is not served or not allowed, and what to do), else None."""
    problems = []
    for kind in needed(job, apis):
        if kind[0] == GANG_NATIVE:
            problems.append(f"spec.scheduling.gang: native needs Kubernetes' PodGroup (any of "
                            f"{', '.join(NATIVE_POD_GROUP_VERSIONS)}), which this cluster does not serve: "
                            f"{REMEDY[kind]}")
        elif not apis.serves(kind):
            problems.append(f"{_field(job, kind)} needs {kind[0]} {kind[1]}, which this cluster does not serve: "
                            f"{REMEDY[kind]}")
        elif not apis.allows(job.namespace, kind):
            how = f"set the chart value {CHART_VALUE[kind]}" if kind in CHART_VALUE else "grant it in the chart's RBAC"
            problems.append(f"{_field(job, kind)} needs {kind[0]} {kind[1]}, which the operator may not {verb(kind)} in "
                            f"namespace {job.namespace}: {how}")
    return "; ".join(problems) or None


def _field(job: Job, kind: tuple[str, str]) -> str:
    if kind == PYTORCHJOB:
        return "spec.backend: pytorchjob"
    if kind[1] == WORKLOAD[1]:
        return f"spec.scheduling.queueName: {job.spec.scheduling.queue_name}"
    return "spec.scheduling.gang"


def verb(kind: tuple[str, str]) -> str:
    """What the operator does with `kind`, the verb discovery asks the API server whether it may."""
    return VERBS.get(kind, "create")
