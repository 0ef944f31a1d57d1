"""The plans of a job the operator will not run as asked (pure): an invalid spec, an API the cluster lacks, an
overlay the policy no longer allows, a create the API server refused. Each says why in the status, once."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any, Mapping, Optional

from brain_trainer.schema import ConfigError

from ..cluster.api import Refused
from ..spec import OverlayRefused
from ..status.compute import (BACKEND_UNAVAILABLE, INVALID_SPEC, invalid_status, is_terminal, overlay_refused_status,
                              refused_status)
from ..status.events import WARNING, Event, compute_events, overlay_refusal_event, refusal_event
from ..status.job_status import VALID, JobStatus, read_status
from .writes import POD, PYTORCHJOB, Plan, kind_of

# The children that carry the pod overlay: none is created while the policy refuses the overlay.
OVERLAID = (POD, PYTORCHJOB)


def plan_invalid(manifest: Mapping[str, Any], message: str, now: datetime, reason: str = INVALID_SPEC) -> Plan:
    """A spec the operator cannot run: no child is touched; the status says why (Valid=False with `reason` and
    `message`, every bad field for an invalid spec)."""
    before = read_status(manifest)
    generation = (manifest.get("metadata") or {}).get("generation")
    generation = generation if isinstance(generation, int) else 0
    status = invalid_status(before, generation, message, now, reason)
    return Plan(status=status, events=tuple(compute_events(before, status, [])))


def plan_unavailable(manifest: Mapping[str, Any], message: str, now: datetime) -> Plan:
    """A job the cluster cannot run as asked (discovery.missing): Failed, Valid=False BackendUnavailable, nothing
    created, and a Warning saying what to install or set, once per message; it starts once the API is there."""
    the_plan = plan_invalid(manifest, message, now, BACKEND_UNAVAILABLE)
    if valid_message(manifest.get("status") or {}) == message:
        return the_plan
    return replace(the_plan, events=(Event(WARNING, BACKEND_UNAVAILABLE, message), *the_plan.events))


def held_by_policy(the_plan: Plan, refusal: OverlayRefused, before: JobStatus, now: datetime) -> Plan:
    """The plan of a job whose running pods' overlay the policy no longer allows: it creates no pod (nor
    PyTorchJob), its status says Valid=False naming each field and setting, with a Warning once per message.

    The pods that run are left alone, as Pod Security Admission leaves running pods when a namespace's level
    is raised; a finished job's status stays as it was.
    """
    creates = tuple(obj for obj in the_plan.creates if kind_of(obj) not in OVERLAID)
    if is_terminal(the_plan.status):
        return replace(the_plan, creates=creates)
    message = f"{field_errors(refusal)} (running pods are left alone; none is created until the policy or the overlay changes)"
    status = overlay_refused_status(the_plan.status, before, message, now)
    event = overlay_refusal_event(before, status)
    return replace(the_plan, status=status, creates=creates, events=(*the_plan.events, *([event] if event else [])))


def plan_refused(status: JobStatus, err: Refused, now: datetime) -> Plan:
    """A create the API server refused: CreateRefused=True and `reason` FailedCreate with its message, and a
    Warning FailedCreate event when the message is new."""
    refused = refused_status(status, err.message, now)
    event = refusal_event(status, refused)
    return Plan(status=refused, events=(event,) if event else ())


def internal_error(err: Exception) -> str:
    """What Valid=False says of an exception the operator raised on a job: its type and first line."""
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0] if lines else 'no message'}"


def field_errors(err: ConfigError) -> str:
    return "; ".join(str(e) for e in err.errors)


def valid_message(status: Mapping[str, Any]) -> Optional[str]:
    return next((c.get("message") for c in status.get("conditions") or () if c.get("type") == VALID), None)
