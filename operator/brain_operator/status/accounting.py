"""Which worker failures a job has already handled, so none is lost or counted twice (pure).

A failed worker pod is handled once: the pass that first sees it counts it
in `status.restarts` (or retries it free after a disruption), records its
uid in `status.handledFailures` and posts its WorkerFailed event, and only
after that status write is the pod deleted (`reconcile.apply`). A pass cut
short by an API error has therefore either recorded the failure (its uid
stops any later pass from counting it again) or changed nothing (the next
pass finds the failed pod and does it all).

A uid is kept while its pod still exists, terminating included: a deleted
pod is never seen again, so the list is bounded by the job's own pods.
What a failure costs (counted, free, or ending the job) is decided by the
plan; this module only says which failures are new.
"""

from __future__ import annotations

from typing import Any, Collection, Iterable, Mapping


def pod_uid(pod: Mapping[str, Any]) -> str:
    return (pod.get("metadata") or {}).get("uid") or ""


def unhandled(failed: Iterable[Mapping[str, Any]], handled: Collection[str]) -> list[Mapping[str, Any]]:
    """The failed pods no earlier pass has handled."""
    return [pod for pod in failed if pod_uid(pod) not in handled]


def still_handled(handled: Iterable[str], present: Iterable[Mapping[str, Any]], new: Iterable[Mapping[str, Any]]) -> list[str]:
    """The uids to record: earlier ones whose pods still exist, then this pass's, oldest first."""
    exists = {pod_uid(pod) for pod in present}
    out = [uid for uid in handled if uid in exists]
    out += [uid for uid in map(pod_uid, new) if uid and uid not in out]
    return out
