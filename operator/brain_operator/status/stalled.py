"""A running job that reports no progress: the `Stalled` condition and its events (pure).

Seen from outside, from what rank 0 reports: `status.progress.updatedAt` is
when the operator last saw the progress document change. The trainer's own
watchdog limits (`spec.watchdog`) apply to the time between two reports,
which are `training.logInterval` steps apart: a job is stalled when no news
came for `max(stepTimeFactor x logInterval x step time, floorSeconds)`, or
for `startupSeconds` since it (re)entered Running without a report since,
plus one progress poll (the operator looks every POLL_SECONDS). The step time
follows from the document: `etaSeconds / (totalSteps - step)`. The local
runner applies the same limit to the document it reads.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Optional

from brain_trainer.config import WatchdogConfig
from brain_trainer.contract import Progress, format_time, parse_time

from .events import NORMAL, WARNING, Event
from .job_status import RUNNING, STALLED, Condition, JobStatus
from .progress import POLL_SECONDS

NO_PROGRESS, PROGRESSING = "NoProgress", "Progressing"


@dataclass(frozen=True)
class Quiet:
    """Since when a running job has had no news, how long that is, and how long it may be."""

    since: datetime
    seconds: float
    limit: float
    why: str


def report_limit(watchdog: WatchdogConfig, log_interval: int, progress: Optional[Progress]) -> tuple[float, str]:
    """Seconds a running trainer may go between two progress reports, and how that was chosen."""
    step_time = _step_time(progress)
    if step_time is None:
        return watchdog.startup_seconds, "startupSeconds, no step time reported yet"
    scaled = watchdog.step_time_factor * log_interval * step_time
    if scaled > watchdog.floor_seconds:
        return scaled, f"{watchdog.step_time_factor:g} x logInterval {log_interval} x step time {step_time:.3g} s"
    return watchdog.floor_seconds, "floorSeconds"


def quiet(watchdog: WatchdogConfig, log_interval: int, progress: Optional[Progress], running_since: Optional[datetime],
          now: datetime, slack: float = POLL_SECONDS) -> Optional[Quiet]:
    """How long since the last news of a running job (a report, or entering Running); None without either."""
    reported = parse_time(progress.updated_at) if progress is not None and progress.updated_at else None
    if reported is not None and (running_since is None or reported >= running_since):
        limit, why = report_limit(watchdog, log_interval, progress)
        since = reported
    elif running_since is not None:
        # Since the job (re)entered Running: its trainers are starting, as the watchdog's warm-up allows.
        limit, why, since = watchdog.startup_seconds, "startupSeconds, no report since the job started running", running_since
    else:
        return None
    return Quiet(since, (now - since).total_seconds(), limit + slack, why)


def stalled_status(watchdog: WatchdogConfig, log_interval: int, status: JobStatus, before: JobStatus,
                   now: datetime) -> tuple[JobStatus, list[Event]]:
    """The new status with its Stalled condition set or cleared (the previous one's, if any, carried over), and
    the event of a change."""
    old = before.find(STALLED)
    running = status.condition(RUNNING)
    seen = None
    if status.phase == RUNNING and running is not None:
        since = parse_time(running.last_transition_time) if running.last_transition_time else None
        seen = quiet(watchdog, log_interval, status.progress, since, now)
    if seen is None and old is None:
        return status, []
    # Messages that stay the same while the state does: no status patch on every pass.
    if seen is not None and seen.seconds > seen.limit:
        where = f"at step {status.progress.step}" if status.progress else "and no report yet"
        new = Condition(STALLED, "True", NO_PROGRESS, f"no progress since {format_time(seen.since)} {where} "
                                                      f"(limit {seen.limit:.0f} s: {seen.why})")
    elif seen is not None:
        new = Condition(STALLED, "False", PROGRESSING, "progress reported within the limit")
    else:
        new = Condition(STALLED, "False", status.phase or "", "not running")
    flipped = old is None or old.status != new.status
    new = replace(new, last_transition_time=format_time(now) if flipped else old.last_transition_time)
    events = []
    if flipped and new.status == "True":
        events.append(Event(WARNING, "Stalled", new.message))
    elif flipped and old is not None and old.status == "True":
        step = f" at step {status.progress.step}" if status.progress else ""
        events.append(Event(NORMAL, "Progressing", f"progress again{step}" if new.reason == PROGRESSING
                            else f"no longer stalled: {new.reason}"))
    # Only the conditions change: every other field stays as the pass made it.
    return replace(status, conditions=[c for c in status.conditions if c.type != STALLED] + [new]), events


def _step_time(progress: Optional[Progress]) -> Optional[float]:
    if progress is None or progress.eta_seconds is None or not progress.total_steps or progress.step >= progress.total_steps:
        return None
    return progress.eta_seconds / (progress.total_steps - progress.step)
