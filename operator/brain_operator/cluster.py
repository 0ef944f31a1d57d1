"""The operator's only door to the Kubernetes API: a small, idempotent client.

`ClusterClient` names the handful of calls reconcile makes; `KubernetesClient`
implements them over the official `kubernetes` package's dynamic client, so
one code path serves core kinds and custom resources (PyTorchJob) alike.
Tests use an in-memory implementation of the same protocol.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Protocol

from brain_trainer.contract import format_time
from kubernetes import client, config
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import ConflictError, DynamicApiError, NotFoundError, ResourceNotFoundError

from .events import Event
from .logs import job_logger
from .names import JOB_NAME_LABEL, label_selector
from .spec import API_VERSION, KIND

MERGE_PATCH = "application/merge-patch+json"
COMPONENT = "brain-operator"
# The API server refuses longer event messages.
EVENT_MESSAGE_LIMIT = 1024

log = logging.getLogger(__name__)


@dataclass(frozen=True, order=True)
class ObjectRef:
    api_version: str
    kind: str
    namespace: str
    name: str

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> "ObjectRef":
        meta = obj.get("metadata") or {}
        return cls(obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"])


class ClusterClient(Protocol):
    def get_job(self, namespace: str, name: str) -> Optional[dict]:
        """The BrainTrainingJob, or None when it is gone."""

    def list_children(self, api_version: str, kind: str, namespace: str, job_name: str) -> list[dict]:
        """Objects of one kind labelled `brain.ai/job-name=<job_name>`."""

    def list_objects(
        self, api_version: str, kind: str, namespace: str, *, label_selector: str = "", field_selector: str = ""
    ) -> list[dict]:
        """Objects of one kind another controller made for a job (Kueue's Workloads); [] when the kind is not served."""

    def create(self, obj: Mapping[str, Any]) -> bool:
        """Create unless it exists; True when this call created it."""

    def delete(self, ref: ObjectRef) -> None:
        """Delete; an object already gone is fine."""

    def patch(self, ref: ObjectRef, body: Mapping[str, Any]) -> None:
        """JSON merge patch of an object's spec or metadata."""

    def patch_status(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        """JSON merge patch of a BrainTrainingJob's status subresource (None removes a key)."""

    def post_event(self, job: Mapping[str, Any], event: Event) -> None:
        """Record a Kubernetes Event on the job; best effort, never fails the reconcile."""


class KubernetesClient:
    """ClusterClient over a real API server (in-cluster config, else ~/.kube/config)."""

    def __init__(self, api_client: Any = None) -> None:
        if api_client is None:
            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
            api_client = client.ApiClient()
        self._dynamic = DynamicClient(api_client)

    def _resource(self, api_version: str, kind: str) -> Any:
        return self._dynamic.resources.get(api_version=api_version, kind=kind)

    def get_job(self, namespace: str, name: str) -> Optional[dict]:
        try:
            return self._resource(API_VERSION, KIND).get(name=name, namespace=namespace).to_dict()
        except NotFoundError:
            return None

    def list_children(self, api_version: str, kind: str, namespace: str, job_name: str) -> list[dict]:
        selector = label_selector({JOB_NAME_LABEL: job_name})
        found = self._resource(api_version, kind).get(namespace=namespace, label_selector=selector)
        return list(found.to_dict().get("items") or [])

    def list_objects(
        self, api_version: str, kind: str, namespace: str, *, label_selector: str = "", field_selector: str = ""
    ) -> list[dict]:
        try:
            resource = self._resource(api_version, kind)
        except ResourceNotFoundError:
            return []  # e.g. Kueue is not installed
        found = resource.get(namespace=namespace, label_selector=label_selector or None, field_selector=field_selector or None)
        return list(found.to_dict().get("items") or [])

    def create(self, obj: Mapping[str, Any]) -> bool:
        ref = ObjectRef.of(obj)
        try:
            self._resource(ref.api_version, ref.kind).create(body=dict(obj), namespace=ref.namespace)
        except ConflictError:
            return False
        return True

    def delete(self, ref: ObjectRef) -> None:
        try:
            self._resource(ref.api_version, ref.kind).delete(
                name=ref.name, namespace=ref.namespace, body={"propagationPolicy": "Background"}
            )
        except NotFoundError:
            pass

    def patch(self, ref: ObjectRef, body: Mapping[str, Any]) -> None:
        self._resource(ref.api_version, ref.kind).patch(
            body=dict(body), name=ref.name, namespace=ref.namespace, content_type=MERGE_PATCH
        )

    def patch_status(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        self._resource(API_VERSION, KIND).status.patch(
            body={"status": dict(patch)}, name=name, namespace=namespace, content_type=MERGE_PATCH
        )

    def post_event(self, job: Mapping[str, Any], event: Event) -> None:
        meta = job["metadata"]
        now = format_time()
        # Named as client-go's recorder names events: the object's name and the time in hex nanoseconds.
        event_name = f"{meta['name']}.{time.time_ns():x}"
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": event_name, "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": job["apiVersion"], "kind": job["kind"], "name": meta["name"],
                "namespace": meta["namespace"], "uid": meta.get("uid", ""),
            },
            "type": event.type,
            "reason": event.reason,
            "message": event.message[:EVENT_MESSAGE_LIMIT],
            "source": {"component": COMPONENT},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            self._resource("v1", "Event").create(body=body, namespace=meta["namespace"])
        except DynamicApiError as err:
            # Events are commentary: losing one must not stop the job's reconcile.
            job_logger(log, meta["namespace"], meta["name"]).warning("could not post event %s: %s", event.reason, err)
