"""The job's NetworkPolicy: who may connect to its worker pods (docs/security.md, "Network").

Pure. torchrun's c10d rendezvous store, the process group's store and NCCL
listen on every interface of a worker without authentication, and PyTorch's
SECURITY.md says whoever reaches those stores can run code in the job. So
the policy admits the job's own pods on every port (NCCL's ports are
ephemeral) and, on the metrics port alone, the operator's namespace (it polls
rank 0's /progress) and the namespaces named for scraping /metrics. Egress is
left alone: listing it would isolate the pods' egress, DNS, their peers and
an object store (checkpoint.uri, data.uri) included. Both backends' pods
carry the job's labels, so one policy serves either.
"""

from __future__ import annotations

from typing import Any, Optional

from brain_trainer.contract import METRICS_PORT

from ...objects.names import network_policy_name
from ...spec import Job
from .common import job_labels, metadata

API_VERSION = "networking.k8s.io/v1"
KIND = "NetworkPolicy"
# Set on every namespace by the API server (Kubernetes 1.22+): a namespace selected by its name.
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


def build_network_policy(job: Job) -> Optional[dict[str, Any]]:
    """`<name>-network`, selecting the job's pods; None when the operator renders no policies."""
    if job.network is None:
        return None
    pods = {"matchLabels": job_labels(job)}
    rules: list[dict[str, Any]] = [{"from": [{"podSelector": pods}]}]
    namespaces = [n for n in (job.network.operator_namespace, *job.network.scrape_namespaces) if n]
    if namespaces:
        rules.append({
            "from": [
                {"namespaceSelector": {"matchExpressions": [
                    {"key": NAMESPACE_NAME_LABEL, "operator": "In", "values": list(dict.fromkeys(namespaces))}
                ]}}
            ],
            "ports": [{"protocol": "TCP", "port": METRICS_PORT}],
        })
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": metadata(job, network_policy_name(job.name)),
        "spec": {"podSelector": pods, "policyTypes": ["Ingress"], "ingress": rules},
    }
