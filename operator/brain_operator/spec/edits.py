"""Which spec fields may change while a job exists, and the CEL transition rules that freeze the others.

Propagated fields reach the job in flight: `nodes` and `runPolicy` act at
the next reconcile, the trainer settings below are patched into the
ConfigMap, and every worker (re)started afterwards reads them (pods carry the
digest of the trainer.yaml they were made with). Every other field is
immutable: the API server refuses the edit with a message naming the field
and what to do instead (docs/operator.md, "Changing a running job").

The rules compare a field's value with its default filled in, so writing out a
default is not a change; an optional field without a default must keep being
set or unset.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from typing import Any, Iterator

from brain_trainer.schema import camel, in_view, is_int_or_string, key_for

from .model import JobSpec

# Snake-case dotted paths below spec; a section listed whole propagates all its fields.
PROPAGATED = (
    "nodes",
    "run_policy",
    "training.steps",
    "training.log_interval",
    "training.compile",  # speed, not the run: and CEL cannot see a boolean-or-string field to freeze it
    "checkpoint.interval_steps",
    "checkpoint.keep_last",
)
WHAT_TO_DO = "delete the job and create it again (a retained checkpoint claim resumes it)"


def _manifest_path(path: str) -> str:
    return ".".join(camel(part) for part in path.split("."))


def propagated_fields() -> list[str]:
    """The propagated fields as a manifest spells them (spec.nodes, spec.training.steps, ...)."""
    return [f"spec.{_manifest_path(path)}" for path in PROPAGATED]


def immutable_fields() -> list[tuple[list[str], dataclasses.Field]]:
    """(manifest keys below spec, field) of each immutable field, a whole section where none of it propagates."""
    return [(keys, f) for keys, f, _ in _immutable(JobSpec, [])]


def _immutable(cls: type, prefix: list[str]) -> Iterator[tuple[list[str], dataclasses.Field, Any]]:
    """(keys, field, its type) of each immutable field below `prefix`."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not in_view(f, True):
            continue
        snake = ".".join([*_snake(prefix), f.name])
        if snake in PROPAGATED:
            continue
        keys = [*prefix, key_for(f, True)]
        inner = hints[f.name]
        if dataclasses.is_dataclass(inner) and any(p.startswith(f"{snake}.") for p in PROPAGATED):
            yield from _immutable(inner, keys)
        else:
            yield keys, f, inner


def _snake(prefix: list[str]) -> list[str]:
    """The snake-case names of `prefix` (manifest keys) walking down from JobSpec."""
    names, current = [], JobSpec
    for key in prefix:
        f = next(f for f in dataclasses.fields(current) if key_for(f, True) == key)
        names.append(f.name)
        current = typing.get_type_hints(current)[f.name]
    return names


def _present(root: str, keys: list[str]) -> str:
    return " && ".join(f"has({'.'.join([root, *keys[: i + 1]])})" for i in range(len(keys)))


def _literal(value: Any) -> str:
    return json.dumps(value) if isinstance(value, (str, bool, int, float)) else ""


def transition_rule(keys: list[str], f: dataclasses.Field, *, as_text: bool = False) -> tuple[str, str]:
    """(CEL rule on spec, message) keeping one field as it was.

    as_text (an int-or-string field): both sides compared as strings, as CEL
    has no `==` between an int and a string (and 40 means "40").
    """
    default = f.default if f.default is not dataclasses.MISSING else None
    new, old = ".".join(["self", *keys]), ".".join(["oldSelf", *keys])
    if as_text:
        new, old, default = f"string({new})", f"string({old})", None if default is None else str(default)
    literal = _literal(default) if default is not None else ""
    if literal:
        rule = f"({_present('self', keys)} ? {new} : {literal}) == ({_present('oldSelf', keys)} ? {old} : {literal})"
    else:
        rule = f"({_present('self', keys)}) == ({_present('oldSelf', keys)}) && (!({_present('self', keys)}) || {new} == {old})"
    return rule, f"spec.{'.'.join(keys)} cannot change while the job exists: {WHAT_TO_DO}"


def transition_rules() -> tuple[tuple[str, str], ...]:
    return tuple(transition_rule(keys, f, as_text=is_int_or_string(tp)) for keys, f, tp in _immutable(JobSpec, []))
