"""The operator's only door to the Kubernetes API: a small, idempotent client.

`ClusterClient` (api.py) names the handful of calls reconcile makes; `KubernetesClient`
implements them over the official `kubernetes` package's dynamic client, so
one code path serves core kinds and custom resources (PyTorchJob) alike.
Tests use an in-memory implementation of the same protocol.

Each call is retried on 429, 5xx, timeouts and lost connections with
jittered exponential backoff (honouring Retry-After) for a bounded time,
then fails with `ApiUnavailable` naming the call; the handlers retry the
whole job soon after (handlers.py). A create answered 409 AlreadyExists is
"exists already" only when the object there is ours and not Terminating
(`already_exists`); otherwise, and on any other 409 (a status write whose
resourceVersion is stale), it is a `Conflict`, on which reconcile re-reads
and plans again. Any other 4xx on a create (403 from Pod Security Admission
or a quota, 422 from validation, 400, 404) is `Refused`, carrying the API
server's code, reason and message: trying again changes nothing until the
job or the namespace does.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any, Callable, Mapping, Optional, Sequence, TypeVar

import urllib3
from brain_trainer.contract import format_time
from kubernetes import client, config
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import ConflictError, DynamicApiError, NotFoundError, ResourceNotFoundError

from .api import ApiUnavailable, Conflict, Refused, already_exists, error_status
from .backoff import Backoff, retry_after
from .discovery import OLD_WORKLOAD, OPTIONAL, ServedApis, verb
from ..status.events import Event
from ..logs import job_logger
from ..objects.names import JOB_NAME_LABEL, label_selector
from ..objects.refs import ObjectRef
from ..objects.schedulers import WORKLOAD
from ..spec import API_VERSION, KIND

MERGE_PATCH = "application/merge-patch+json"
COMPONENT = "brain-operator"
# The API server refuses longer event messages.
EVENT_MESSAGE_LIMIT = 1024
# Answers worth another try: throttled, or the server (or a proxy before it) failing for now.
RETRIED_STATUSES = frozenset({429, 500, 502, 503, 504})
CALL_BACKOFF = Backoff(base=0.2, cap=2.0)
# How long one call keeps trying before the handlers' per-job retry takes over.
CALL_DEADLINE_SECONDS = 15.0
# A server that accepted the connection but does not answer is retried like one that refused it.
REQUEST_TIMEOUT_SECONDS = 10.0
# The 409 reason for a duplicate name; other 409s are conflicts.
ALREADY_EXISTS = "AlreadyExists"
# The version a kind is read and written at where the cluster does not serve the one the operator names (Kueue
# 0.14 and earlier serve Workloads only as v1beta1: discovery.OLD_WORKLOAD).
OLDER_VERSIONS = {WORKLOAD: OLD_WORKLOAD}

T = TypeVar("T")

log = logging.getLogger(__name__)


class KubernetesClient:
    """ClusterClient over a real API server (in-cluster config, else ~/.kube/config).

    `sleep`, `clock` and `rng` are the retry loop's, replaceable in tests.
    """

    def __init__(
        self,
        api_client: Any = None,
        *,
        deadline: float = CALL_DEADLINE_SECONDS,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        rng: Callable[[], float] = random.random,
    ) -> None:
        if api_client is None:
            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
            api_client = client.ApiClient()
        self._api = api_client
        self._dynamic = DynamicClient(api_client)
        self._deadline, self._sleep, self._clock, self._rng = deadline, sleep, clock, rng

    def _resource(self, api_version: str, kind: str) -> Any:
        """The API resource, at an older version where only that one is served (a Workload of Kueue 0.14)."""
        try:
            return self._dynamic.resources.get(api_version=api_version, kind=kind)
        except ResourceNotFoundError:
            older = OLDER_VERSIONS.get((api_version, kind))
            if older is None:
                raise
            return self._dynamic.resources.get(api_version=older[0], kind=kind)

    def _call(self, what: str, call: Callable[[], T]) -> T:
        """`call`, retried while the API server answers 429/5xx or not at all, until the deadline."""
        give_up = self._clock() + self._deadline
        attempt = 0
        while True:
            try:
                return call()
            except DynamicApiError as err:
                if err.status not in RETRIED_STATUSES:
                    raise
                failure, asked = f"{err.status} {err.reason}", retry_after((err.headers or {}).get("Retry-After"))
            except (urllib3.exceptions.HTTPError, OSError) as err:
                failure, asked = f"{type(err).__name__}: {err}", None
            wait = asked if asked is not None else CALL_BACKOFF.delay(attempt, self._rng)
            attempt += 1
            if self._clock() + wait > give_up:
                raise ApiUnavailable(f"{what}: gave up after {attempt} attempt(s): {failure}")
            log.debug("%s: %s; retrying in %.2f s", what, failure, wait)
            self._sleep(wait)

    def discover(self, namespaces: Sequence[str]) -> ServedApis:
        """The API server's discovery document of each optional group version (a 404: not served), then one
        SelfSubjectAccessReview per served kind and namespace: may the operator create it (list a Workload) there?"""
        served: dict[tuple[str, str], str] = {}
        for api_version in sorted({version for version, _ in OPTIONAL}):
            for resource in self._resources(api_version):
                kind = (api_version, resource.get("kind", ""))
                if kind in OPTIONAL and "/" not in resource.get("name", "/"):
                    served[kind] = resource["name"]
        forbidden = frozenset(
            (namespace, *kind) for kind, plural in served.items() for namespace in namespaces
            if not self._may(verb(kind), namespace, kind[0].split("/")[0], plural)
        )
        return ServedApis(served=frozenset(served), forbidden=forbidden)

    def _resources(self, api_version: str) -> list[dict[str, Any]]:
        try:
            found = self._call(f"discover {api_version}", lambda: self._api.call_api(
                f"/apis/{api_version}", "GET", response_type="object", auth_settings=["BearerToken"],
                _return_http_data_only=True, _request_timeout=REQUEST_TIMEOUT_SECONDS))
        except client.ApiException as err:
            if err.status in (403, 404):
                return []
            raise
        return list((found or {}).get("resources") or [])

    def _may(self, action: str, namespace: str, group: str, plural: str) -> bool:
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                  "spec": {"resourceAttributes": {"namespace": namespace, "verb": action, "group": group,
                                                  "resource": plural}}}
        answer = self._call(f"may {action} {plural}.{group} in {namespace or 'every namespace'}", lambda: client
                            .AuthorizationV1Api(self._api)
                            .create_self_subject_access_review(review, _request_timeout=REQUEST_TIMEOUT_SECONDS))
        return bool(answer.status and answer.status.allowed)

    def get_job(self, namespace: str, name: str) -> Optional[dict]:
        return self.get(ObjectRef(API_VERSION, KIND, namespace, name))

    def get(self, ref: ObjectRef) -> Optional[dict]:
        try:
            return self._call(f"get {ref}", lambda: self._resource(ref.api_version, ref.kind).get(
                name=ref.name, namespace=ref.namespace, _request_timeout=REQUEST_TIMEOUT_SECONDS).to_dict())
        except NotFoundError:
            return None

    def list_children(self, api_version: str, kind: str, namespace: str, job_name: str) -> list[dict]:
        selector = label_selector({JOB_NAME_LABEL: job_name})
        found = self._call(f"list {kind} {namespace} -l {selector}", lambda: self._resource(api_version, kind).get(
            namespace=namespace, label_selector=selector, _request_timeout=REQUEST_TIMEOUT_SECONDS))
        return list(found.to_dict().get("items") or [])

    def list_objects(
        self, api_version: str, kind: str, namespace: str, *, label_selector: str = "", field_selector: str = ""
    ) -> list[dict]:
        def call() -> Any:
            return self._resource(api_version, kind).get(
                namespace=namespace, label_selector=label_selector or None, field_selector=field_selector or None,
                _request_timeout=REQUEST_TIMEOUT_SECONDS)

        try:
            found = self._call(f"list {kind} {namespace} {label_selector or field_selector}".rstrip(), call)
        except ResourceNotFoundError:
            return []  # e.g. Kueue is not installed
        # Read at an older version (OLDER_VERSIONS), each item is named as asked: the fields read are the same.
        return [{**item, "apiVersion": api_version} for item in found.to_dict().get("items") or []]

    def create(self, obj: Mapping[str, Any]) -> Optional[dict]:
        ref = ObjectRef.of(obj)
        try:
            created = self._call(f"create {ref}", lambda: self._resource(ref.api_version, ref.kind).create(
                body=dict(obj), namespace=ref.namespace, _request_timeout=REQUEST_TIMEOUT_SECONDS))
        except ConflictError as err:
            if error_status(err.body).get("reason") != ALREADY_EXISTS:
                raise Conflict(f"create {ref}: {err.summary()}") from err
            # A retry of a create the server carried out also lands here; so does a name still held by a
            # Terminating pod or another owner's object: which one it is, only the object says.
            existing = self.get(ref)
            if existing is None:
                raise Conflict(f"create {ref}: AlreadyExists, then gone") from err
            already_exists(obj, existing)
            return None
        except DynamicApiError as err:
            # _call let it through: not retried, so a 4xx the object itself (or the namespace) brought on.
            if err.status is not None and 400 <= err.status < 500:
                raise Refused.of(f"create {ref}", err.status, err.body) from err
            raise
        return created.to_dict()

    def delete(self, ref: ObjectRef) -> None:
        body: dict[str, Any] = {"propagationPolicy": "Background"}
        if ref.uid:
            body["preconditions"] = {"uid": ref.uid}
        try:
            self._call(f"delete {ref}", lambda: self._resource(ref.api_version, ref.kind).delete(
                name=ref.name, namespace=ref.namespace, body=body, _request_timeout=REQUEST_TIMEOUT_SECONDS))
        except NotFoundError:
            pass
        except ConflictError:
            pass  # the uid precondition failed: the object meant is gone, another of its name stays

    def patch(self, ref: ObjectRef, body: Mapping[str, Any]) -> None:
        self._call(f"patch {ref}", lambda: self._resource(ref.api_version, ref.kind).patch(
            body=dict(body), name=ref.name, namespace=ref.namespace, content_type=MERGE_PATCH,
            _request_timeout=REQUEST_TIMEOUT_SECONDS))

    def patch_status(
        self, namespace: str, name: str, patch: Mapping[str, Any], resource_version: Optional[str] = None
    ) -> Optional[str]:
        body: dict[str, Any] = {"status": dict(patch)}
        if resource_version is not None:
            # A patch that names a resourceVersion is applied only to that version (optimistic concurrency).
            body["metadata"] = {"resourceVersion": resource_version}
        try:
            written = self._call(f"patch {KIND} {namespace}/{name} status", lambda: self._resource(
                API_VERSION, KIND).status.patch(body=body, name=name, namespace=namespace, content_type=MERGE_PATCH,
                                                _request_timeout=REQUEST_TIMEOUT_SECONDS))
        except ConflictError as err:
            raise Conflict(f"patch {KIND} {namespace}/{name} status: {err.summary()}") from err
        return (written.to_dict().get("metadata") or {}).get("resourceVersion")

    def patch_pod_status(self, ref: ObjectRef, status: Mapping[str, Any], resource_version: str) -> None:
        body = {"metadata": {"resourceVersion": resource_version}, "status": dict(status)}
        try:
            self._call(f"patch {ref} status", lambda: self._resource(ref.api_version, ref.kind).status.patch(
                body=body, name=ref.name, namespace=ref.namespace, content_type=MERGE_PATCH,
                _request_timeout=REQUEST_TIMEOUT_SECONDS))
        except NotFoundError:
            pass
        except ConflictError as err:
            raise Conflict(f"patch {ref} status: {err.summary()}") from err

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
            self._call(f"create Event {meta['namespace']}/{event_name}", lambda: self._resource("v1", "Event").create(
                body=body, namespace=meta["namespace"], _request_timeout=REQUEST_TIMEOUT_SECONDS))
        except ConflictError:
            pass  # a retry of a create the server carried out: posted once
        except (DynamicApiError, ApiUnavailable) as err:
            # Events are commentary: losing one must not stop the job's reconcile.
            job_logger(log, meta["namespace"], meta["name"]).warning("could not post event %s: %s", event.reason, err)
