"""One job per checkpoint volume: a lease on the folder, and a fencing generation for every worker group.

Why: two jobs sharing a claim both wrote (and re-wrote) the same step folders,
and after a network partition an old worker group may still write while the
group that replaced it already does.

On disk, beside the checkpoints, the lease is the newest of the files

    checkpoint.dir/lease-<generation>.json   holder, since, renewed, ttl_s, released

Every new worker group (a job's first start, each torchrun restart, each
regroup after a replaced pod) takes generation newest + 1 before its first
restore or save (`VolumeLease.acquire`: rank 0 decides, one broadcast tells
every rank). Taking is creating that file exclusively: the record is written
to a temporary file, then hard-linked to its name, which fails when the name
exists. Of two starters that read the same newest generation exactly one gets
the next; the other reads again and finds the winner's live lease. A link
also means that nobody ever reads a half-written record.

What a starter does with the newest record (`decide`, pure):

- none: take generation 1;
- the same holder (`contract.LEASE_HOLDER_ENV`: the job and its uid, or its
  work directory locally): a new group of the same job, take over at once;
- released (its holder's run ended: finished, preempted or failed) or
  expired (not renewed for its `ttl_s`: its holder was killed or cut off):
  take over;
- else refuse: `config-error` naming the folder (and claim), the holder and
  since when, on every rank, before any step.

Fencing: a commit reads the newest generation just before its rename
(`check`); a newer one means that another group holds the volume, so the
commit is refused with `fenced` and this group stops (rank 0 raises; its
peers lose it in their next collective). The uncommitted folder is left: its
name is the step's, which the newer group may be writing right now, and a
`.tmp` is never loaded (the next start removes it). Between that read and the
rename lie microseconds, not a step; the guarantee is that a group fenced
before it commits never renames.

Renewal: a daemon thread on rank 0 rewrites the record's renewal time every
`ttl_s / RENEWALS_PER_TTL` seconds. No collective and nothing per step; unlike
a hook on steps or commits, it keeps a live job's lease through a restore, a
compile or steps longer than the TTL. It is also how a group that lost the
volume learns so between commits: it stops renewing and the loop's next step
raises `fenced` on rank 0 (`raise_if_fenced`). The renewal time is the wall
clock of the holder's node, compared with the reader's: keep the TTL well
above the nodes' clock skew.

Release: a run releases its lease however it ends (finished, preempted, or
failed: CheckpointManager.close, on every exit path of the loop), unless a
newer generation fenced it out; only a process killed outright (SIGKILL, the
hang watchdog's exit) leaves its lease to expire.

Torch-free and collective-free: the caller passes its broadcast.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

from ..contract import CHECKPOINT_CLAIM_ENV, CONFIG_ERROR_REASON, FENCED, LEASE_HOLDER_ENV, format_time
from ..files import fsync_dir, write_atomic
from ..resilience.failures import Fatal

log = logging.getLogger(__name__)

LEASE_PREFIX = "lease-"
_LEASE_FILE = re.compile(rf"^{LEASE_PREFIX}(\d+)\.json$")
RENEWALS_PER_TTL = 4
# Lost races in a row before a start gives up (each loss means another starter took a generation).
_TRIES = 20

# How a start got the volume (or did not).
FIRST, SAME_HOLDER, RELEASED, EXPIRED, REFUSED = "first", "same holder", "released", "expired", "refused"


@dataclass(frozen=True)
class Record:
    """One generation's lease: who holds the volume, since when, and until when without a renewal."""

    generation: int
    holder: str
    since: float  # when this holder's run of generations began (epoch seconds)
    renewed: float
    ttl_s: float
    released: bool = False

    @property
    def expires(self) -> float:
        return self.renewed + self.ttl_s


# -- the decision (pure) --


def decide(newest: Optional[Record], holder: str, now: float, ttl_s: float) -> tuple[str, Optional[Record]]:
    """(how, the record to take) for a new group of `holder` that found `newest`; None to take when refused."""
    if newest is None:
        return FIRST, Record(1, holder, now, now, ttl_s)
    if newest.holder == holder:
        how = SAME_HOLDER
    elif newest.released:
        how = RELEASED
    elif now >= newest.expires:
        how = EXPIRED
    else:
        return REFUSED, None
    since = newest.since if how == SAME_HOLDER else now
    return how, Record(newest.generation + 1, holder, since, now, ttl_s)


def renewed(record: Record, now: float) -> Record:
    return replace(record, renewed=now)


def released(record: Record, now: float) -> Record:
    return replace(record, renewed=now, released=True)


def _when(epoch: float) -> str:
    return format_time(datetime.fromtimestamp(epoch, timezone.utc))


def refusal_line(newest: Record, where: str, now: float) -> str:
    return (f"{where} is in use by {newest.holder} since {_when(newest.since)} (lease generation "
            f"{newest.generation}, renewed {max(0.0, now - newest.renewed):.0f} s ago, expires at "
            f"{_when(newest.expires)} unless renewed): one job at a time writes a checkpoint volume; stop the other "
            "job, or start this one once that one has ended")


def fenced_line(ours: int, newest: Optional[Record], where: str) -> str:
    by = f"{newest.holder} (generation {newest.generation})" if newest else "a newer worker group"
    return f"{where} was taken over by {by}; this worker group (generation {ours}) stops without committing"


# -- the files --


def lease_path(root: Path, generation: int) -> Path:
    return root / f"{LEASE_PREFIX}{generation:08d}.json"


def generations(root: Path) -> list[int]:
    """The generations with a lease file in root, oldest first."""
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    return sorted(int(m.group(1)) for m in map(_LEASE_FILE.match, names) if m)


def _parse(generation: int, text: str) -> Record:
    try:
        fields = {k: v for k, v in json.loads(text).items() if not k.endswith("_utc")}  # _utc: for people only
        return Record(**{**fields, "generation": generation})
    except (ValueError, TypeError, AttributeError):  # not ours, or damaged: a lease nobody renews
        return Record(generation, "an unreadable lease", 0.0, 0.0, 0.0)


def newest_record(root: Any, listed: Callable[[], list[int]], text_of: Callable[[int], str]) -> Optional[Record]:
    """The newest of the generations `listed` gives, read by `text_of` (a volume's files, a bucket's objects); None
    when there is none. A newest deleted under us (FileNotFoundError) is listed and read again."""
    for _ in range(_TRIES):
        found = listed()
        if not found:
            return None
        try:
            return _parse(found[-1], text_of(found[-1]))
        except FileNotFoundError:
            continue
    raise RuntimeError(f"{root}: the newest lease kept vanishing")


def read_newest(root: Path) -> Optional[Record]:
    """The newest record in the folder; None when there is none."""
    return newest_record(root, lambda: generations(root), lambda g: lease_path(root, g).read_text())


def _text(record: Record) -> str:
    fields = {k: v for k, v in asdict(record).items() if k != "generation"}  # the file's name holds it
    return json.dumps({**fields, "since_utc": _when(record.since), "renewed_utc": _when(record.renewed)}, sort_keys=True)


def create(root: Path, record: Record) -> bool:
    """Write the record under its generation's name unless that name exists; whether it was ours to write."""
    fd, tmp = tempfile.mkstemp(prefix=f".{LEASE_PREFIX}", suffix=".tmp", dir=root)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(_text(record))
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, lease_path(root, record.generation))  # atomic and exclusive: EEXIST if another took it
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)
    fsync_dir(root)
    return True


def remove_older(root: Path, generation: int) -> None:
    for older in generations(root):
        if older < generation:
            lease_path(root, older).unlink(missing_ok=True)


# -- rank 0's hold on the volume --


def holder_of(env: Mapping[str, str]) -> str:
    """This job's holder text: the runner's, else (a trainer started by hand) the host and working directory."""
    return env.get(LEASE_HOLDER_ENV) or f"a trainer on {socket.gethostname()} in {os.getcwd()}"


def place_of(root: Path, env: Mapping[str, str]) -> str:
    claim = env.get(CHECKPOINT_CLAIM_ENV)
    return f"checkpoint claim {claim} ({root})" if claim else f"checkpoint folder {root}"


class VolumeLease:
    """This group's lease on the checkpoint folder: acquire (collective), renew (rank 0's thread), check, release."""

    def __init__(self, root: Path, ttl_s: float, *, rank: int, env: Mapping[str, str] = os.environ):
        self.root = root
        self.ttl_s = ttl_s
        self.rank = rank
        self.holder = holder_of(env)
        self.where = place_of(root, env)
        self.record: Optional[Record] = None  # rank 0's, once taken
        self.acquired = False  # on every rank
        self.fenced: Optional[str] = None  # the line, once the renewal thread found a newer generation
        self._lock = threading.Lock()  # the thread's renewals against release and the commit's check
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def acquire(self, broadcast: Callable[[Any], Any]) -> None:
        """Take the volume before the first restore or save. Collective through `broadcast` (rank 0's value to all),
        once: a refusal raises the same config-error on every rank."""
        if self.acquired:
            return
        refusal = self._take() if self.rank == 0 else None
        refusal = broadcast(refusal)
        if refusal is not None:
            raise Fatal(CONFIG_ERROR_REASON, refusal)
        self.acquired = True
        if self.rank == 0:
            self._thread = threading.Thread(target=self._renew_until_stopped, name="checkpoint-lease", daemon=True)
            self._thread.start()

    def _take(self) -> Optional[str]:
        self.root.mkdir(parents=True, exist_ok=True)
        for _ in range(_TRIES):
            newest = self.newest()
            how, record = decide(newest, self.holder, time.time(), self.ttl_s)
            if record is None:
                return refusal_line(newest, self.where, time.time())
            if create(self.root, record):
                self.record = record
                remove_older(self.root, record.generation)
                self._log_taken(how, newest)
                return None
        return f"{self.where}: {_TRIES} other worker groups took its lease while this one tried; not starting"

    def _log_taken(self, how: str, previous: Optional[Record]) -> None:
        assert self.record is not None
        after = "" if previous is None else f" after {previous.holder} (generation {previous.generation}, {how})"
        log.info("checkpoint lease generation %d of %s taken by %s%s", self.record.generation, self.where,
                 self.holder, after)

    def manifest_fields(self) -> dict[str, Any]:
        """Who commits: every manifest names its writer."""
        assert self.record is not None
        return {"lease": {"holder": self.holder, "generation": self.record.generation}}

    def newest(self) -> Optional[Record]:
        """The newest record where the checkpoints live (a subclass keeps them elsewhere: bucket_lease.py)."""
        return read_newest(self.root)

    def check(self) -> None:
        """Raise `fenced` when a newer generation holds the volume (rank 0, before a commit's rename or manifest)."""
        assert self.record is not None
        newest = self.newest()
        if newest is not None and newest.generation > self.record.generation:
            self.fenced = fenced_line(self.record.generation, newest, self.where)
            raise Fatal(FENCED, self.fenced)

    def raise_if_fenced(self) -> None:
        """Rank 0, at a step: stop once the renewal thread found the volume taken over."""
        if self.fenced is not None:
            raise Fatal(FENCED, self.fenced)

    def _renew_until_stopped(self) -> None:
        while not self._stop.wait(self.ttl_s / RENEWALS_PER_TTL):
            with self._lock:
                if self._stop.is_set() or not self._rewrite(renewed):
                    return

    def _rewrite(self, change: Callable[[Record, float], Record]) -> bool:
        """Rewrite our record (renewed or released) unless fenced; whether it is still ours."""
        assert self.record is not None
        try:
            self.check()
        except Fatal:
            log.error("%s", self.fenced)
            return False
        self.record = change(self.record, time.time())
        write_atomic(lease_path(self.root, self.record.generation), _text(self.record))
        return True

    def release(self) -> None:
        """Rank 0, when the run ends (its final or preemption commit, or an error): a new job may take the volume at
        once. Idempotent; a group fenced out by a newer generation writes nothing (`_rewrite` checks first)."""
        self.stop()
        with self._lock:
            if self.record is None or self.record.released or self.fenced is not None:
                return
            if self._rewrite(released):
                log.info("checkpoint lease generation %d of %s released", self.record.generation, self.where)

    def stop(self) -> None:
        """End the renewals. Idempotent."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            with self._lock:
                pass  # a renewal in progress finishes before the caller goes on
