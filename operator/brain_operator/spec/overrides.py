"""`--set PATH=VALUE`: a manifest with fields under `spec` replaced, before it is parsed (pure).

PATH is the manifest's own spelling below `spec` (`training.steps`,
`checkpoint.intervalSteps`; a leading `spec.` is optional). `[N]` after a key
indexes a list, as the spec's errors spell it (`scheduling.tolerations[0].key`):
an existing item, or the one after the last. A dot inside a key is written
`\\.` (`scheduling.nodeSelector.kubernetes\\.io/arch=arm64`), as Helm's `--set`
writes it. VALUE is YAML read as the manifest is (`config.kubeyaml`: `3e-4` is
a number, `"10"` a string, `{a: 1}` a mapping, nothing at all null, which
gives an optional field its default back). Nothing here knows the spec's
fields: the result is parsed by `parse_job` like any manifest, so a wrong key
or value gets the same one line it would get in the file.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

import yaml

from brain_trainer.config import kubeyaml
from brain_trainer.schema import ConfigError, FieldError, quoted

__all__ = ["Override", "apply_overrides", "as_flags", "attribute", "parse_overrides"]

ROOT = "spec"
# One key of a PATH, then its list indices: `tolerations[0]`.
_SEGMENT = re.compile(r"(?P<key>[^\[\]]+)(?P<indices>(?:\[[0-9]+\])*)")
_INDEX = re.compile(r"\[([0-9]+)\]")
# Splits a PATH at its dots, but not at an escaped one.
_DOT = re.compile(r"(?<!\\)\.")

Step = Union[str, int]


@dataclass(frozen=True)
class Override:
    """One `--set`: the keys and list indices below `spec`, and the value as YAML reads it."""

    text: str  # as given on the command line
    steps: tuple[Step, ...]
    value: Any

    @property
    def field(self) -> str:
        """The field as the spec's errors spell it: `spec.scheduling.tolerations[0].key`."""
        return spell(self.steps)


def spell(steps: Sequence[Step]) -> str:
    return ROOT + "".join(f"[{step}]" if isinstance(step, int) else f".{step}" for step in steps)


def _steps(path: str) -> Optional[tuple[Step, ...]]:
    """The keys and indices of a PATH, or None when it is no path."""
    if path == ROOT or path.startswith(ROOT + "."):
        path = path[len(ROOT) + 1 :]
    steps: list[Step] = []
    for part in _DOT.split(path) if path else []:
        match = _SEGMENT.fullmatch(part)
        if match is None:
            return None
        steps.append(match["key"].replace("\\.", "."))
        steps.extend(int(index) for index in _INDEX.findall(match["indices"]))
    return tuple(steps) or None


def _yaml_problem(exc: yaml.YAMLError) -> str:
    problem = getattr(exc, "problem", None) or getattr(exc, "context", None) or str(exc)
    return " ".join(problem.split())


def parse_overrides(texts: Iterable[str]) -> list[Override]:
    """Each `PATH=VALUE`, in order; ConfigError names every one that is not."""
    found, errors = [], []
    for text in texts:
        path, sep, raw = text.partition("=")
        steps = _steps(path.strip()) if sep else None
        if steps is None:
            errors.append(FieldError("--set", f"expected PATH=VALUE with PATH a field under spec "
                                              f"(training.steps=10, scheduling.tolerations[0].key=gpu), got {quoted(text)}"))
            continue
        try:
            value = kubeyaml.load(raw)
        except yaml.YAMLError as exc:
            errors.append(FieldError(spell(steps), f"--set value {quoted(raw)} is not valid YAML ({_yaml_problem(exc)}); "
                                                   f"quote it as in a manifest: {path}='\"...\"'"))
            continue
        found.append(Override(text, steps, value))
    if errors:
        raise ConfigError(errors)
    return found


def _with(container: Any, steps: tuple[Step, ...], value: Any, done: tuple[Step, ...]) -> Any:
    """A copy of `container` with `value` at `steps` below it; copies only what lies on the way."""
    step, rest = steps[0], steps[1:]
    if isinstance(step, int):
        items = [] if container is None else container
        if not isinstance(items, list):
            raise _not(done, container, "a list")
        if step > len(items):
            raise ConfigError([FieldError(spell(done + steps[:1]), f"past the end of the list ({_items(len(items))}): "
                                                                   f"--set replaces an item or appends one at [{len(items)}]")])
        below = items[step] if step < len(items) else None
        new = value if not rest else _with(below, rest, value, done + (step,))
        return [*items[:step], new, *items[step + 1 :]]
    mapping = {} if container is None else container
    if not isinstance(mapping, Mapping):
        raise _not(done, container, "a mapping")
    new = value if not rest else _with(mapping.get(step), rest, value, done + (step,))
    return {**mapping, step: new}


def _items(count: int) -> str:
    return f"{count} item" + ("" if count == 1 else "s")


def _not(done: tuple[Step, ...], found: Any, wanted: str) -> ConfigError:
    return ConfigError([FieldError(spell(done), f"is {quoted(found)}, not {wanted}: --set cannot reach below it")])


def apply_overrides(manifest: Mapping[str, Any], overrides: Sequence[Override]) -> dict[str, Any]:
    """The manifest with each override applied in order (a later one wins); `manifest` itself is left as it is.

    A missing or null mapping or list on the way is created; ConfigError when
    the way runs into a value of another kind, or an index lies past a list's end.
    """
    result = dict(manifest)
    for override in overrides:
        result[ROOT] = _with(result.get(ROOT), override.steps, override.value, ())
    return result


def attribute(errors: Iterable[FieldError], overrides: Sequence[Override]) -> list[FieldError]:
    """The errors, each that lies on an override's path (at, above or below its field) saying which `--set` made it
    (the last such: it won)."""
    out = []
    for error in errors:
        source = next((o for o in reversed(overrides) if _related(error.path, o.field)), None)
        out.append(error if source is None else FieldError(error.path, f"{error.message} (--set {source.text})"))
    return out


def _related(path: str, field: str) -> bool:
    shorter, longer = sorted((path, field), key=len)
    return longer == shorter or longer.startswith((shorter + ".", shorter + "["))


def as_flags(texts: Iterable[str]) -> str:
    """The overrides as a shell would take them back: `--set training.steps=10 --set 'data.path=a b'`."""
    return " ".join(f"--set {shlex.quote(text)}" for text in texts)
