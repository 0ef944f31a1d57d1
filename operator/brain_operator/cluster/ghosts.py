"""Index entries whose object is gone, found by comparing the index with a fresh list (pure).

kopf keys each index by uid and drops an entry only on that object's DELETED
event; a DELETED that fell into a relist gap (a `410 Gone`, a dropped watch)
never comes, and the entry stays for the operator's lifetime
(kopf/_core/engines/indexing.py; the watch restarts without diffing).
reconcile.confirmed reads again the entries that could hide one (a
Terminating child, a name held twice), but a ghost of an object deleted at
once (a gated or unscheduled pod, a force delete, a Service or ConfigMap
deleted by hand) looks alive, and its job would wait for it, or never
re-create it, for good.

So, every few minutes, the operator lists each watched kind once for all
jobs (the watches' own label selector) and takes as ghosts the entries the
index held before the list began whose uid the list does not have. An
object created after the snapshot is not in it, so it is never taken for
one; an object deleted in between is gone anyway.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

# How often the index is checked against a fresh list: one LIST per watched kind per period, whatever the jobs.
RELIST_SECONDS = 300.0


def uids(objects: Iterable[Mapping[str, Any]]) -> frozenset[str]:
    return frozenset(uid for obj in objects if (uid := (obj.get("metadata") or {}).get("uid")))


def ghosts(indexed: Iterable[Mapping[str, Any]], listed: Iterable[Mapping[str, Any]]) -> frozenset[str]:
    """The uids of the entries the index held (`indexed`, a snapshot taken before the list) that the list lacks."""
    return uids(indexed) - uids(listed)
