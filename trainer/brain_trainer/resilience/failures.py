"""Why a trainer died: fatal errors classified into the contract's reasons (docs/training.md, "When training fails").

`classify` is pure: an exception in, `(reason, one human line)` out.
`report` is the thin shell `python -m brain_trainer` ends with: it logs the
traceback once (on the rank that failed; a rank a peer's failure took down
logs one line), writes `brain.ai/<reason>: <line>` to the termination log,
stops its torchrun agent when the reason fails the job anyway (FAIL_FAST_ENV:
a restart inside the pod would fail the same way) and returns the reason's
exit code. `begin_attempt` empties the termination log when a pod's workers
start, and returns the reason the attempt before left there (why torchrun
restarted them in place: an in-pod restart). Torch-free: torch's exception types are
looked up only when torch is loaded (an error before that cannot be one).
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import sys
from typing import Iterator, Optional

from ..contract import (
    COLLECTIVE_TIMEOUT,
    CONFIG_ERROR_REASON,
    DATA_ERROR,
    ERROR,
    EXIT_CODES,
    FAIL_FAST_ENV,
    OUT_OF_MEMORY,
    SECONDARY_REASONS,
    STORAGE_FULL,
    TERMINATION_LOG,
    TERMINATION_LOG_ENV,
    TERMINATION_MESSAGE_MAX,
    parse_termination,
    restart_count,
    termination_message,
)
from ..schema import ConfigError

log = logging.getLogger(__name__)

# errno values of a full volume: no space left, or the user's quota spent.
STORAGE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
# What gloo and the c10d store say when a peer vanished or a collective timed out
# (torch raises plain RuntimeErrors for some of them).
_COLLECTIVE_TEXTS = ("connection closed by peer", "connection reset by peer", "timed out", "timeout",
                     "broken pipe", "socket closed")


# An in-pod restart after an attempt that wrote no termination message: killed (SIGKILL, the kernel's OOM killer)
# or crashed in native code.
UNNAMED_FAILURE = "unknown: the failed attempt named no reason (killed, or crashed in native code)"


class Fatal(Exception):
    """An error whose reason and line the raiser already knows (a full checkpoint volume, an OOM with its plan).

    Any exception with a `reason` of the contract's (data.errors.DataError) is
    classified the same way, its message as the line.
    """

    def __init__(self, reason: str, line: str):
        super().__init__(line)
        self.reason = reason
        self.line = line


def causes(exc: BaseException) -> Iterator[BaseException]:
    """The exception, what caused it, and what a checkpoint failure wraps (DCP gathers every rank's error)."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        current = todo.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        failures = getattr(current, "failures", None)  # torch.distributed.checkpoint's CheckpointException
        if isinstance(failures, dict):
            todo += [pair[0] for pair in failures.values() if isinstance(pair, tuple) and pair]
        todo += [e for e in (current.__cause__, current.__context__) if e is not None]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else "(no message)"


def _is_oom(exc: BaseException) -> bool:
    torch = sys.modules.get("torch")
    return isinstance(exc, MemoryError) or (torch is not None and isinstance(exc, torch.OutOfMemoryError))


def _is_collective(exc: BaseException) -> bool:
    dist = sys.modules.get("torch.distributed")
    if dist is not None and isinstance(exc, getattr(dist, "DistError", ())):
        return True
    text = str(exc).lower()
    return isinstance(exc, (RuntimeError, ConnectionError, TimeoutError)) and any(t in text for t in _COLLECTIVE_TEXTS)


def classify(exc: BaseException) -> tuple[str, str]:
    """(reason, one human line) for an exception that ends the trainer."""
    chain = list(causes(exc))
    for cause in chain:
        reason = getattr(cause, "reason", None)
        if reason in EXIT_CODES:
            return reason, cause.line if isinstance(cause, Fatal) else _first_line(cause)
    for cause in chain:
        if isinstance(cause, OSError) and cause.errno in STORAGE_ERRNOS:
            where = f" writing {cause.filename}" if cause.filename else ""
            return STORAGE_FULL, f"{os.strerror(cause.errno)}{where}"
    if any(_is_oom(cause) for cause in chain):
        return OUT_OF_MEMORY, _first_line(exc) if not isinstance(exc, MemoryError) else "MemoryError"
    if isinstance(exc, ConfigError):
        more = f" (and {len(exc.errors) - 1} more)" if len(exc.errors) > 1 else ""
        return CONFIG_ERROR_REASON, f"{exc.errors[0]}{more}"
    if any(isinstance(cause, UnicodeDecodeError) for cause in chain):
        return DATA_ERROR, _first_line(exc)
    if any(_is_collective(cause) for cause in chain):
        return COLLECTIVE_TIMEOUT, f"{type(exc).__name__}: {_first_line(exc)}"
    return ERROR, f"{type(exc).__name__}: {_first_line(exc)}"


SAID = "_brain_said"  # set on an exception once `say` has logged it and written its termination message


def write_termination(reason: str, line: str) -> None:
    """Write the termination message Kubernetes (or the local runner) reads.

    Ranks of one pod share the file, emptied at each start (begin_attempt):
    a rank that something else took down (a SECONDARY reason: a peer's failure,
    the SIGTERM that followed it) does not overwrite the reason another rank wrote.
    """
    path = os.environ.get(TERMINATION_LOG_ENV, TERMINATION_LOG)
    if reason in SECONDARY_REASONS:
        try:
            with open(path) as f:
                if parse_termination(f.read()) is not None:
                    return
        except OSError:
            pass
    try:
        with open(path, "w") as f:
            f.write(termination_message(reason, line))
    except OSError:
        pass  # not in a container, or not writable: the exit code and the log still say it


def begin_attempt() -> Optional[str]:
    """Forget the reason of an earlier attempt in this pod (torchrun restarts its workers in place); call once per
    pod (local rank 0), before any rank can fail.

    Returns why torchrun restarted the workers (`reason: line`, as the attempt before wrote it; UNNAMED_FAILURE
    when torchrun counted a failure that wrote nothing), or None when nothing says: the termination log is the one
    record that outlives the workers inside the pod. (A restart for a peer pod's failure leaves the echo this pod
    saw, `preempted` or `collective-timeout`, and no count.) Whether this start is an in-pod restart at all is
    the goodput ledger's to judge.
    """
    path = os.environ.get(TERMINATION_LOG_ENV, TERMINATION_LOG)
    said = None
    try:
        with open(path, errors="replace") as f:
            said = parse_termination(f.read(TERMINATION_MESSAGE_MAX))
        os.truncate(path, 0)
    except OSError:
        pass
    if said is not None:
        return f"{said[0]}: {said[1]}"
    return UNNAMED_FAILURE if restart_count() > 0 else None


def say(exc: BaseException, rank: Optional[str] = None) -> tuple[str, str]:
    """Log why the trainer dies and write the termination message, once per exception; returns (reason, line).

    The loop says it as soon as it fails, before its cleanup unwinds: a peer pod that fails fast gets this one
    stopped (SIGTERM) meanwhile, which would lose the reason. `report` then does not say it twice."""
    reason, line = classify(exc)
    if getattr(exc, SAID, False):
        return reason, line
    where = f"rank {rank}: " if rank is not None else ""
    if isinstance(exc, ConfigError):
        for error in exc.errors:  # one line per bad field, never a traceback
            print(f"error: {error}", file=sys.stderr, flush=True)
    elif reason in SECONDARY_REASONS or (isinstance(exc, Fatal) and exc.__cause__ is None):
        # No traceback: the cause is on another rank, or the trainer decided it and the line says why.
        log.error("%s%s: %s", where, reason, line)
    else:  # the traceback of what failed, not of the Fatal that explains it
        log.error("%s%s: %s", where, reason, line, exc_info=exc.__cause__ if isinstance(exc, Fatal) else exc)
    write_termination(reason, line)
    setattr(exc, SAID, True)
    return reason, line


def report(exc: BaseException, rank: Optional[str] = None) -> int:
    """Say why the trainer dies (`say`, unless said already), stop torchrun restarting the workers where the
    reason fails the job anyway; returns the exit code."""
    reason, _ = say(exc, rank)
    if reason in os.environ.get(FAIL_FAST_ENV, "").split(",") and "TORCHELASTIC_RUN_ID" in os.environ:
        # torchrun (our parent) would restart the workers; stopped, it ends the pod with this message.
        os.kill(os.getppid(), signal.SIGTERM)
    return EXIT_CODES[reason]
