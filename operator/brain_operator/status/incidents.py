"""One incident, one count: which worker exits start an incident and which are its consequences (pure).

When one worker fails, its peers often exit too: a broken collective, a
rendezvous that gave up waiting (torchrun's join timeout, or worker 0's store
gone with it), the watchdog's `stalled` left in the termination log from an
earlier round. Counting each pod would spend `runPolicy.backoffLimit` on one
failure, so the operator counts incidents:

- An **incident** starts with its **root cause**: a worker exit that is
  neither of the two below. It is charged once (when its action is Restart)
  and recorded in `status.incident` with the time its pod ended, `since`.
  Among the exits one pass sees, the root is the earliest to end with a
  reason of its own (failure_policy.consequential), else the earliest.
- A **consequence** is the exit of a pod created before the open incident's
  `since` (or seen failed in the same pass as its root): that pod was in the worker group the incident broke, whatever
  reason it gives. It costs nothing. An incident stays open until rank 0's
  step passes the step it was charged at (the group trained again), or,
  whatever rank 0 reports, until the rendezvous' join timeout has passed
  since it began; after that, an exit starts a new incident.
- An exit is **excused** when its reason is consequential and a sibling is
  Pending, Terminating, disrupted or missing: a worker waiting for a peer
  that is not there is not the peer's failure, nor its own. It costs nothing.

Two exceptions: an exit whose action is FailJob is always a root (a data
error is nobody's consequence, and it ends the job), and a disrupted pod
(reason `preempted`) is a root whose action, RestartNotCounted by default,
charges nothing, while its peers' exits are its consequences.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Mapping, Optional, Sequence

from brain_trainer.contract import format_time, parse_time

from .failure_policy import WorkerFailure, consequential
from .job_status import Incident
from ..spec.model import FAIL_JOB, RESTART

ROOT, CONSEQUENCE, EXCUSED = "root", "consequence", "excused"


@dataclass(frozen=True)
class Exit:
    """A worker pod's newly seen end: why (its WorkerFailure), when it was created and when it ended."""

    failure: WorkerFailure
    created: Optional[datetime]  # None when unknown: never taken for a member of an earlier group
    ended: datetime


@dataclass(frozen=True)
class Verdict:
    exit: Exit
    role: str  # ROOT, CONSEQUENCE or EXCUSED
    why: str = ""  # for a consequence or an excused exit: what it followed, or whom it waited for

    @property
    def charged(self) -> bool:
        """Whether it counts against runPolicy.backoffLimit: a root whose action is Restart."""
        return self.role == ROOT and self.exit.failure.action == RESTART


def still_open(incident: Optional[Incident], step: Optional[int], now: Optional[datetime] = None,
               window: Optional[float] = None) -> Optional[Incident]:
    """The incident while the group has not trained past it: rank 0's `step` (None: no report yet) has not passed
    the step it was charged at (None: it had none then, so any report is past it), and, with rank 0 silent, no
    longer than `window` seconds after it began (`since`): its consequences come within the rendezvous' join
    timeout, which the operator renders from watchdog.startupSeconds (backends/shared/workers.rendezvous_timeouts), so a
    later exit of a pod of the group it broke is that pod's own failure."""
    if incident is None:
        return None
    if now is not None and window is not None and (now - parse_time(incident.since)).total_seconds() > window:
        return None
    if step is None:
        return incident
    return incident if incident.step is not None and step <= incident.step else None


def judge(exits: Sequence[Exit], incident: Optional[Incident], blocked: Mapping[str, str],
          step: Optional[int] = None) -> tuple[list[Verdict], Optional[Incident]]:
    """Each exit's verdict (in the order given) and the incident open afterwards.

    `incident` is the one open before this pass (`still_open`), `blocked` the
    job's other worker pods that are Pending, Terminating, disrupted or
    missing (name -> which), and `step` rank 0's step, recorded in a new
    incident.
    """
    verdicts: dict[int, Verdict] = {}
    waiting = list(range(len(exits)))
    fresh = False  # whether `incident` started in this pass: then its co-failing pods, seen with it, were there
    while waiting:
        rest = []
        for i in waiting:
            verdict = _follows(exits[i], incident, blocked, fresh)
            if verdict is not None:
                verdicts[i] = verdict
            else:
                rest.append(i)
        if not rest:
            break
        root = min(rest, key=lambda i: (exits[i].failure.action != FAIL_JOB, consequential(exits[i].failure),
                                         exits[i].ended, exits[i].failure.pod))
        verdicts[root] = Verdict(exits[root], ROOT)
        cause = exits[root]
        incident = Incident(reason=cause.failure.reason, pod=cause.failure.pod, since=format_time(cause.ended),
                            step=step)
        waiting, fresh = [i for i in rest if i != root], True
    return [verdicts[i] for i in range(len(exits))], incident


def _follows(exit: Exit, incident: Optional[Incident], blocked: Mapping[str, str], fresh: bool) -> Optional[Verdict]:
    """The exit as a consequence of `incident` or excused by a blocked sibling; None for a root.

    Times have whole seconds: a pod created in the second its incident's root
    ended is taken for a member of the broken group only when both are seen
    in one pass (a replacement is created after the pass that saw the root).
    """
    failure = exit.failure
    if failure.action == FAIL_JOB:
        return None
    if incident is not None and failure.pod != incident.pod and exit.created is not None and (
            exit.created <= parse_time(incident.since) if fresh else exit.created < parse_time(incident.since)):
        return Verdict(exit, CONSEQUENCE, f"after {incident.pod}'s {incident.reason}")
    others = sorted((pod, state) for pod, state in blocked.items() if pod != failure.pod)
    if others and consequential(failure):
        return Verdict(exit, EXCUSED, "while " + ", ".join(f"{pod} is {state}" for pod, state in others))
    return None
