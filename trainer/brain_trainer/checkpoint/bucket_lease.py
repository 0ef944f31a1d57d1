"""The lease on a bucket's prefix: lease.py's generations, decisions and fencing, held with conditional writes.

    s3://bucket/prefix/lease-<generation>.json   the same record as on a volume

Taking generation g is a PUT of lease-g.json with `If-None-Match: *`: S3 creates it only when no object has
that key (412 PreconditionFailed, or 409 ConditionalRequestConflict while another create of it is in flight),
so of two starters that read the same newest generation exactly one gets the next, as with the volume's hard
link. Renewing and releasing rewrite it with `If-Match: <our last ETag>`: a renewal that finds the object
changed or gone (a newer group removed it when it took over) is refused, and this group is fenced. A commit
checks the newest generation before it writes its manifest, as the volume's does before its rename.

Before any of that, the prefix is probed (write, read, delete; bucket.probe), so that a missing bucket, denied
access or an unreachable endpoint is refused at start with its reason, on every rank, before any step.

Decisions, lines and the renewal thread are VolumeLease's (lease.py); only the I/O differs.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Callable, Optional

from ..resilience.failures import Fatal
from ..s3 import client
from . import bucket
from .bucket import BucketPath
from .lease import (
    _TRIES,
    LEASE_PREFIX,
    Record,
    VolumeLease,
    _text,
    decide,
    fenced_line,
    lease_path,
    newest_record,
    refusal_line,
)

log = logging.getLogger(__name__)

_LEASE_OBJECT = re.compile(rf"^{LEASE_PREFIX}(\d+)\.json$")
_LOST = ("PreconditionFailed", "ConditionalRequestConflict", "412", "409")  # the condition did not hold
_GONE = ("NoSuchKey", "404")  # If-Match on a deleted object


def generations(root: BucketPath) -> list[int]:
    """The generations with a lease object under root, oldest first."""
    found = (_LEASE_OBJECT.match(name) for name in bucket.objects(root, LEASE_PREFIX))
    return sorted(int(m.group(1)) for m in found if m)


def read_newest(root: BucketPath) -> Optional[Record]:
    """The newest record under the prefix; None when there is none."""
    return newest_record(root, lambda: generations(root), lambda g: bucket.read_text(lease_path(root, g)))


def put(path: BucketPath, text: str, **condition: str) -> Optional[str]:
    """PUT under a condition (IfNoneMatch or IfMatch); the new ETag, or None when the condition did not hold."""
    try:
        reply = client().put_object(Bucket=path.bucket, Key=path.key, Body=text.encode("utf-8"), **condition)
    except Exception as exc:
        if bucket.error_code(exc) in _LOST + _GONE:
            return None
        raise
    return str(reply["ETag"])


class BucketLease(VolumeLease):
    """VolumeLease on a bucket's prefix: the same acquire, renewals, check and release, with objects."""

    _etag: Optional[str] = None  # of our record's last write: the condition of the next

    def _take(self) -> Optional[str]:
        problem = bucket.probe(self.root)
        if problem is not None:
            return problem
        for _ in range(_TRIES):
            newest = self.newest()
            how, record = decide(newest, self.holder, time.time(), self.ttl_s)
            if record is None:
                assert newest is not None
                return refusal_line(newest, self.where, time.time())
            etag = put(lease_path(self.root, record.generation), _text(record), IfNoneMatch="*")
            if etag is not None:
                self.record, self._etag = record, etag
                self._remove_older(record.generation)
                self._log_taken(how, newest)
                return None
        return f"{self.where}: {_TRIES} other worker groups took its lease while this one tried; not starting"

    def _remove_older(self, generation: int) -> None:
        older = [lease_path(self.root, g).key for g in generations(self.root) if g < generation]
        bucket.delete_keys(self.root.bucket, older)

    def newest(self) -> Optional[Record]:
        return read_newest(self.root)

    def _rewrite(self, change: Callable[[Record, float], Record]) -> bool:
        """Rewrite our record (renewed or released) if it is still the one we wrote; whether it is still ours."""
        assert self.record is not None and self._etag is not None
        try:
            self.check()
        except Fatal:
            log.error("%s", self.fenced)
            return False
        record = change(self.record, time.time())
        etag = put(lease_path(self.root, record.generation), _text(record), IfMatch=self._etag)
        if etag is None:
            self.fenced = fenced_line(self.record.generation, self.newest(), self.where)
            log.error("%s (its lease object changed under it)", self.fenced)
            return False
        self.record, self._etag = record, etag
        return True
