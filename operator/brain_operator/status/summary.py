"""`braintrain status JOB`: what `kubectl get btj -o wide` and the conditions say, in one screen. Pure."""

from __future__ import annotations

from typing import Any, Iterator, Optional

from brain_trainer.contract import Progress

from .job_status import WORKERS_READY, JobStatus


def summary_lines(job: dict[str, Any]) -> list[str]:
    """The lines `braintrain status` prints for a BrainTrainingJob object as the API server holds it."""
    meta, spec = job.get("metadata") or {}, job.get("spec") or {}
    status = JobStatus.read(job.get("status") or {})
    head = [f"{meta.get('name')} ({meta.get('namespace')}): {status.phase or 'not reconciled yet'}",
            f"nodes {status.nodes or '-'}", f"backend {spec.get('backend', 'elastic')}"]
    if status.strategy:
        head.append(f"strategy {status.strategy}")
    lines = [", ".join(head)]
    if status.progress is not None:
        lines.append(f"progress: {_progress(status.progress)}")
    lines.extend(_troubles(status))
    if status.last_checkpoint is not None:
        lines.append(f"last checkpoint: step {status.last_checkpoint.step} at {status.last_checkpoint.path}")
    if status.goodput is not None:
        lines.append(f"goodput: {status.goodput.ratio:.1%} of {status.goodput.wall_seconds:.0f} s")
    if status.conditions:
        lines.append("conditions:")
        lines.extend(f"  {c.type}={c.status}" + "".join(f" {p}" for p in (c.reason, c.message) if p)
                     for c in status.conditions)
    return lines


def _progress(progress: Progress) -> str:
    parts = [f"step {progress.step}" + (f"/{progress.total_steps}" if progress.total_steps is not None else "")]
    for label, value, form in (("loss", progress.loss, "{:.4f}"), ("eval loss", progress.eval_loss, "{:.4f}"),
                               ("tokens/s", progress.tokens_per_second, "{:.0f}"), ("MFU", progress.mfu, "{:.1%}"),
                               ("ETA", _duration(progress.eta_seconds), "{}"), ("at", progress.updated_at, "{}")):
        if value is not None:
            parts.append(f"{label} {form.format(value)}")
    return ", ".join(parts)


def _troubles(status: JobStatus) -> Iterator[str]:
    """Restarts, the latest failure's reason and incident, and why workers wait."""
    restarts = f"restarts: {status.restarts} (in pod: {status.in_pod_restarts})"
    yield restarts + (f", reason {status.reason}" if status.reason else "")
    if status.last_in_pod_restart:
        yield f"last in-pod restart: {status.last_in_pod_restart}"
    if status.incident is not None:
        incident = status.incident
        yield (f"incident: {incident.reason} on {incident.pod} since {incident.since}"
               + (f" at step {incident.step}" if incident.step is not None else ""))
    waiting = status.find(WORKERS_READY)
    if waiting is not None and waiting.status != "True":
        yield f"waiting: {waiting.reason or ''} {waiting.message or ''}".rstrip()


def _duration(seconds: Optional[float]) -> Optional[str]:
    if seconds is None:
        return None
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"
