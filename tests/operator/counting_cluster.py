"""A ClusterClient layer that counts the API calls reconcile makes, by verb (issue 14).

`watched` stands for the operator's kopf indexes: every child of the
in-memory cluster as the watches would deliver it (children.observed_child),
read from memory without an API call, as reconcile reads the indexes.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Optional

from brain_operator.cluster.children import WATCHED_KINDS, observed_child
from brain_operator.reconcile import Observed

VERBS = {
    "get_job": "GET", "get": "GET", "list_children": "LIST", "list_objects": "LIST", "create": "CREATE", "delete": "DELETE",
    "patch": "PATCH", "patch_status": "PATCH status", "patch_pod_status": "PATCH pod status",
    "post_event": "CREATE event",
}


class CountingCluster:
    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name not in VERBS:
            return attr  # the test's side of the cluster

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[VERBS[name]] += 1
            return attr(*args, **kwargs)

        return counted

    def take(self) -> Counter[str]:
        """The calls since the last take."""
        calls, self.calls = self.calls, Counter()
        return calls


def watched(cluster: Any) -> Observed:
    """The children of the watched kinds as the indexes hold them; None for the others (listed)."""

    def observed(namespace: str, name: str, kind: tuple[str, str]) -> Optional[list[dict]]:
        if kind not in WATCHED_KINDS:
            return None
        return [observed_child(child) for child in cluster.list_children(*kind, namespace, name)]

    return observed
