"""What the operator asks of the Kubernetes API, and how a call can fail: the `ClusterClient` protocol that
reconcile and the backends plan against, its errors, and the ownership rules a create follows. Kept apart from
`client.py` (the implementation over the `kubernetes` package) so that pure code and the CLI never load that
package.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Optional, Protocol, Sequence

from ..objects.refs import ObjectRef
from ..spec import API_VERSION, KIND
from ..status.events import Event
from .discovery import ServedApis


class ApiUnavailable(RuntimeError):
    """A call that kept failing with a retryable error until its time ran out; the message names the call."""


class Conflict(RuntimeError):
    """A 409 that is not "ours, exists already": re-read and plan again."""


class Refused(RuntimeError):
    """A create the API server refused for good (4xx but 409 and 429): its code, reason and message, as sent."""

    def __init__(self, what: str, code: int, reason: str, message: str) -> None:
        super().__init__(f"{what}: {code} {reason}: {message}")
        self.code, self.reason, self.message = code, reason, message

    @classmethod
    def of(cls, what: str, code: int, body: Any) -> "Refused":
        """From the Status object the API server answers with (`body`, JSON text or parsed); its message names
        the object, the policy and the field, as `kubectl` shows it."""
        status = error_status(body)
        reason = status.get("reason") if isinstance(status.get("reason"), str) else ""
        message = status.get("message") if isinstance(status.get("message"), str) else ""
        return cls(what, code, reason or "Refused", message or f"the API server answered {code}")


def controller_uid(obj: Mapping[str, Any]) -> Optional[str]:
    """The uid of the BrainTrainingJob that controls `obj` (its controller owner reference), None when none does."""
    for owner in (obj.get("metadata") or {}).get("ownerReferences") or ():
        if owner.get("controller") and owner.get("kind") == KIND and owner.get("apiVersion") == API_VERSION:
            return owner.get("uid")
    return None


def already_exists(wanted: Mapping[str, Any], existing: Mapping[str, Any]) -> None:
    """A create answered 409 AlreadyExists: fine (None) when the object there is the one wanted, already made
    (the same controller uid, or neither has one) and not on its way out; else a `Conflict`.

    A Terminating pod of the same name (a lost node's) would never run the
    replacement; an object another job of the same name left behind is not
    ours to adopt (reconcile plans again from what it lists).
    """
    ref = ObjectRef.of(wanted)
    if (existing.get("metadata") or {}).get("deletionTimestamp"):
        raise Conflict(f"create {ref}: the name is held by an object being deleted")
    if controller_uid(existing) != controller_uid(wanted):
        raise Conflict(f"create {ref}: the name is held by an object of another owner ({controller_uid(existing)})")


class ClusterClient(Protocol):
    def get_job(self, namespace: str, name: str) -> Optional[dict]:
        """The BrainTrainingJob, or None when it is gone."""

    def get(self, ref: ObjectRef) -> Optional[dict]:
        """One object as the API server holds it now, or None when it is gone."""

    def list_children(self, api_version: str, kind: str, namespace: str, job_name: str) -> list[dict]:
        """Objects of one kind labelled `brain.ai/job-name=<job_name>`."""

    def list_objects(
        self, api_version: str, kind: str, namespace: str, *, label_selector: str = "", field_selector: str = ""
    ) -> list[dict]:
        """Objects of one kind another controller made for a job (Kueue's Workloads); [] when the kind is not served."""

    def create(self, obj: Mapping[str, Any]) -> Optional[dict]:
        """Create unless it exists already as wanted (`already_exists`): the object as stored (its uid), or None
        when it existed. Raises Conflict on any other 409."""

    def delete(self, ref: ObjectRef) -> None:
        """Delete (only the object with ref.uid, when given); an object already gone is fine."""

    def patch(self, ref: ObjectRef, body: Mapping[str, Any]) -> None:
        """JSON merge patch of an object's spec or metadata."""

    def patch_status(
        self, namespace: str, name: str, patch: Mapping[str, Any], resource_version: Optional[str] = None
    ) -> Optional[str]:
        """JSON merge patch of a BrainTrainingJob's status subresource (None removes a key); with the
        `resource_version` it was planned from, a write since is a Conflict. Returns the new resourceVersion."""

    def patch_pod_status(self, ref: ObjectRef, status: Mapping[str, Any], resource_version: str) -> None:
        """JSON merge patch of a pod's status subresource (pods/status), applied only to `resource_version`: a
        write since is a Conflict; a pod gone is fine (backends/lost_pods.py)."""

    def post_event(self, job: Mapping[str, Any], event: Event) -> None:
        """Record a Kubernetes Event on the job; best effort, never fails the reconcile."""

    def discover(self, namespaces: Sequence[str]) -> ServedApis:
        """Which optional APIs the cluster serves, and which of them the operator may not create in `namespaces`
        ("" for every namespace)."""


def error_status(body: Any) -> dict[str, Any]:
    """The Status object an API error carries ({} when it carries none)."""
    try:
        status = json.loads(body or "{}") if isinstance(body, (str, bytes)) else body
    except ValueError:
        return {}
    return status if isinstance(status, dict) else {}
