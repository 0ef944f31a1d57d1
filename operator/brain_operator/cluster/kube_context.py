"""The current cluster as kubectl finds it, for commands a user runs (`braintrain logs`, `braintrain status`).

kubectl's order: $KUBECONFIG or ~/.kube/config and its current context (with the context's namespace), else the
pod's own service account. No cluster is one line (NoCluster), not a traceback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class NoCluster(Exception):
    """No kubeconfig and no in-cluster service account, or the API server does not answer."""


def current_cluster(namespace: Optional[str] = None) -> tuple[Any, Any, str]:
    """(CoreV1Api, CustomObjectsApi, namespace): `namespace`, else the context's, else default."""
    from kubernetes import client, config

    try:
        config.load_kube_config()
        _, active = config.list_kube_config_contexts()
        found = (active or {}).get("context", {}).get("namespace")
    except (config.ConfigException, OSError) as kube_error:
        try:
            config.load_incluster_config()
        except config.ConfigException:
            raise NoCluster(f"no cluster: no kubeconfig ({kube_error}) and not in a pod") from None
        found = SERVICE_ACCOUNT_NAMESPACE.read_text().strip() if SERVICE_ACCOUNT_NAMESPACE.exists() else None
    api = client.ApiClient()
    return client.CoreV1Api(api), client.CustomObjectsApi(api), namespace or found or "default"
