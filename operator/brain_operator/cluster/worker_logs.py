"""`braintrain logs JOB`: every worker pod's log, each line prefixed with its pod and node rank.

Against the current kubeconfig's cluster (cluster_api.py). The worker pods are
the job's `status.selector`. Following, a pod that appears later (a replaced
worker, under the same name or a new one) is followed from its start, each
pod by its uid, until the job has ended and every stream has closed.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

from ..status.job_status import TERMINAL
from ..objects.names import JOB_NAME_LABEL, REPLICA_INDEX_LABEL
from ..objects.resource import GROUP, PLURAL, VERSION
from ..spec.owned import PYTORCHJOB_CONTAINER, TRAINER_CONTAINER

POLL_SECONDS = 1.0  # how often a follower looks for new worker pods and the job's end
STARTED = ("Running", "Succeeded", "Failed")  # phases whose pods have a log to read
DURATION = re.compile(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")


def since_seconds(text: str) -> int:
    """`--since` as kubectl spells it (30s, 10m, 1h30m) in seconds."""
    match = DURATION.fullmatch(text)
    if not text or match is None:
        raise ValueError(f"--since: must be a duration such as 30s, 10m or 1h, got {text!r}")
    hours, minutes, seconds = (int(g or 0) for g in match.groups())
    return hours * 3600 + minutes * 60 + seconds


@dataclass(frozen=True)
class Worker:
    name: str
    uid: str
    rank: Optional[int]  # the node rank: the pod's replica index, when it carries one
    container: str

    @property
    def prefix(self) -> str:
        return f"[{self.name}" + (f" node {self.rank}]" if self.rank is not None else "]")


def worker(pod: Any) -> Worker:
    """A worker pod (a kubernetes V1Pod) as the follower needs it."""
    labels = pod.metadata.labels or {}
    index = labels.get(REPLICA_INDEX_LABEL, "")
    names = [c.name for c in pod.spec.containers]
    container = next((n for n in (TRAINER_CONTAINER, PYTORCHJOB_CONTAINER) if n in names), names[0])
    return Worker(pod.metadata.name, pod.metadata.uid or pod.metadata.name, int(index) if index.isdigit() else None,
                  container)


def read_job(custom: Any, namespace: str, name: str) -> dict[str, Any]:
    """The BrainTrainingJob `name` as the API server holds it (a CustomObjectsApi's get)."""
    return custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)


def lines_of(stream: Any) -> Iterator[str]:
    """The text lines of a streamed log (a urllib3 response), as they arrive."""
    pending = b""
    for chunk in stream.stream(4096, decode_content=True):
        pending += chunk
        *complete, pending = pending.split(b"\n")
        for line in complete:
            yield line.decode(errors="replace")
    if pending:
        yield pending.decode(errors="replace")


class Logs:
    """The job's worker logs through `core` (a CoreV1Api) and `custom` (a CustomObjectsApi), to `write`."""

    def __init__(self, core: Any, custom: Any, namespace: str, job: str, write: Callable[[str], None], *,
                 rank: Optional[int] = None, since: Optional[int] = None, stop: Optional[threading.Event] = None):
        self.core, self.custom, self.namespace, self.job = core, custom, namespace, job
        self.rank, self.since = rank, since
        self.stop = stop or threading.Event()
        self._write_lock = threading.Lock()
        self._write = write
        self._streams: dict[str, threading.Thread] = {}

    def print_once(self) -> None:
        for w in self._workers(STARTED):
            for line in lines_of(self._log(w, follow=False)):
                self._line(w, line)

    def follow(self) -> None:
        """Until the job ended and its streams closed, or `stop` is set."""
        while True:
            ended = self._job_phase() in TERMINAL
            for w in self._workers(STARTED):
                if w.uid not in self._streams:
                    thread = threading.Thread(target=self._stream, args=(w,), name=f"logs-{w.name}", daemon=True)
                    self._streams[w.uid] = thread
                    thread.start()
            if ended and not any(t.is_alive() for t in self._streams.values()) or self.stop.wait(POLL_SECONDS):
                return

    def _stream(self, w: Worker) -> None:
        try:
            for line in lines_of(self._log(w, follow=True)):
                self._line(w, line)
        except Exception as exc:  # a pod deleted mid-stream, a dropped connection: the others go on
            self._line(w, f"(log stream ended: {type(exc).__name__})")

    def _log(self, w: Worker, *, follow: bool) -> Any:
        options = {"since_seconds": self.since} if self.since else {}
        return self.core.read_namespaced_pod_log(w.name, self.namespace, container=w.container, follow=follow,
                                                 _preload_content=False, **options)

    def _line(self, w: Worker, line: str) -> None:
        with self._write_lock:
            self._write(f"{w.prefix} {line}")

    def _job(self) -> dict[str, Any]:
        return read_job(self.custom, self.namespace, self.job)

    def _job_phase(self) -> Optional[str]:
        return (self._job().get("status") or {}).get("phase")

    def _workers(self, phases: tuple[str, ...]) -> list[Worker]:
        selector = (self._job().get("status") or {}).get("selector") or f"{JOB_NAME_LABEL}={self.job}"
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=selector).items
        found = [worker(p) for p in pods if (p.status and p.status.phase) in phases]
        return sorted((w for w in found if self.rank is None or w.rank == self.rank),
                      key=lambda w: (w.rank is None, w.rank, w.name))
