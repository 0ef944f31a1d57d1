"""A fault-injecting layer around any ClusterClient (issue 17).

It raises what the real KubernetesClient raises once its own retries are
spent (`ApiUnavailable`, naming the call) or a `Conflict`, either before a
call reaches the inner client or after the inner client carried it out
("deleted, then answered 500"), and it can take the whole API down until
the test brings it back. Everything else passes through, so a test drives
the in-memory cluster underneath as usual.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Optional

from brain_operator.cluster.api import ApiUnavailable


@dataclass
class Fault:
    call: str
    kind: Optional[str]
    times: int
    after: bool
    error: Callable[[str], Exception]


class FaultyCluster:
    CALLS = ("get_job", "get", "list_children", "list_objects", "create", "delete", "patch", "patch_status",
             "patch_pod_status", "post_event")

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.down = False
        self.refused: list[str] = []
        self._faults: list[Fault] = []
        self._lock = threading.Lock()

    def fail(self, call: str, *, kind: Optional[str] = None, times: int = 1, after: bool = False,
             error: Callable[[str], Exception] = lambda what: ApiUnavailable(f"{what}: 500 Internal Server Error")) -> None:
        """The next `times` calls of `call` (on objects of `kind`) fail; `after`: once carried out."""
        assert call in self.CALLS
        self._faults.append(Fault(call, kind, times, after, error))

    def __getattr__(self, name: str) -> Any:
        # The test's side of the in-memory cluster (set_pod, exit_pod, objects, events, ...).
        return getattr(self.inner, name)

    def _fault(self, call: str, kind: Optional[str]) -> Optional[Fault]:
        with self._lock:
            for fault in self._faults:
                if fault.call == call and fault.kind in (None, kind) and fault.times > 0:
                    fault.times -= 1
                    return fault
        return None

    def _do(self, call: str, kind: Optional[str], *args: Any, **kwargs: Any) -> Any:
        what = f"{call} {kind or ''}".strip()
        if self.down:
            self.refused.append(what)
            raise ApiUnavailable(f"{what}: gave up after 5 attempt(s): ConnectionRefusedError")
        fault = self._fault(call, kind)
        if fault is not None and not fault.after:
            self.refused.append(what)
            raise fault.error(what)
        result = getattr(self.inner, call)(*args, **kwargs)
        if fault is not None:
            self.refused.append(what)
            raise fault.error(what)
        return result

    def get_job(self, namespace, name):
        return self._do("get_job", None, namespace, name)

    def get(self, ref):
        return self._do("get", ref.kind, ref)

    def list_children(self, api_version, kind, namespace, job_name):
        return self._do("list_children", kind, api_version, kind, namespace, job_name)

    def list_objects(self, api_version, kind, namespace, **selectors):
        return self._do("list_objects", kind, api_version, kind, namespace, **selectors)

    def create(self, obj):
        return self._do("create", obj["kind"], obj)

    def delete(self, ref):
        return self._do("delete", ref.kind, ref)

    def patch(self, ref, body):
        return self._do("patch", ref.kind, ref, body)

    def patch_status(self, namespace, name, patch, resource_version=None):
        return self._do("patch_status", None, namespace, name, patch, resource_version)

    def patch_pod_status(self, ref, status, resource_version):
        return self._do("patch_pod_status", ref.kind, ref, status, resource_version)

    def post_event(self, job, event):
        # Best effort, as the real client: an event the API server refuses is logged and lost, never raised.
        try:
            self._do("post_event", None, job, event)
        except ApiUnavailable:
            pass
