"""The children a job's passes created that the watches have not shown yet, so none is created twice.

The operator reads a job's children from its kopf indexes, which lag the
API server: a pass that runs before the watch delivered a pod made by the
pass before would create it again (409 AlreadyExists at best). Kubernetes'
own Job and ReplicaSet controllers keep *expectations* for this: after a
create a controller expects to observe it, and until it does, or until
ExpectationsTimeout (5 minutes) passes, it counts it as there rather than
create it again (kubernetes pkg/controller/controller_utils.go,
ControllerExpectations). `Expectations` keeps them per job (namespace,
name and uid: a job re-created under its name expects nothing of the old
one's), and `unseen` hands reconcile the objects to count as present.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Mapping, Sequence

from ..objects.refs import ObjectRef

# controller_utils.go ExpectationsTimeout: past it, an object never observed is created again.
EXPECTATIONS_TIMEOUT = timedelta(minutes=5)

JobKey = tuple[str, str, str]


@dataclass
class Expectations:
    timeout: timedelta = EXPECTATIONS_TIMEOUT
    _created: dict[JobKey, dict[ObjectRef, tuple[datetime, dict[str, Any]]]] = field(default_factory=dict)
    # Jobs are reconciled on several threads at once (each under its own lock).
    _guard: threading.Lock = field(default_factory=threading.Lock)

    def created(self, job: JobKey, obj: Mapping[str, Any], now: datetime) -> None:
        """`obj`, as the API server stored it, was created for `job` at `now`."""
        with self._guard:
            self._created.setdefault(job, {})[ObjectRef.of(obj)] = (now, dict(obj))

    def unseen(self, job: JobKey, children: Sequence[Mapping[str, Any]], now: datetime) -> list[dict[str, Any]]:
        """The objects created for `job` that `children` does not show yet, within the timeout; the others are
        forgotten (observed, or waited for long enough)."""
        refs = [ObjectRef.of(child) for child in children]
        # The very object created (its uid), not an older one of its name the watch still shows.
        seen = {(ref, ref.uid) for ref in refs}
        with self._guard:
            pending = self._created.get(job, {})
            for ref, (when, _) in list(pending.items()):
                observed = (ref, ref.uid) in seen if ref.uid else ref in refs
                if observed or now - when >= self.timeout:
                    del pending[ref]
            if not pending:
                self._created.pop(job, None)
            return [dict(obj) for _, obj in pending.values()]

    def observed(self, uid: str) -> None:
        """The watch delivered an event (added, modified or deleted) of the object with `uid`: its create is
        observed, as the Job controller's informer handlers tell its expectations (job_controller.go addPod,
        deletePod). A child deleted before any pass saw it is then missing at once, not counted as there until
        the timeout."""
        with self._guard:
            for key, pending in list(self._created.items()):
                for ref in [ref for ref in pending if ref.uid == uid]:
                    del pending[ref]
                if not pending:
                    del self._created[key]

    def forget(self, namespace: str, name: str) -> None:
        """The job is gone: nothing of it is expected any more."""
        with self._guard:
            for key in [key for key in self._created if key[:2] == (namespace, name)]:
                del self._created[key]
