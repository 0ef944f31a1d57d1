"""Typed configuration dataclasses <-> plain dicts, with errors that name the field.

One mechanism serves the trainer's YAML (snake_case keys), the operator's
BrainTrainingJob spec (camelCase keys) and the CRD's OpenAPI schema, so every
constraint (type, enum, minimum, required) is written once, on the dataclass
field, with `setting(...)`.

Two views of one tree (docs/architecture.md, "One declaration per setting"):

- the trainer view (`camel_case=False`): trainer.yaml, snake_case keys, every field
  (trainer.yaml also takes the manifest's camelCase keys: `trainer_spelling`);
- the manifest view (`camel_case=True`): a BrainTrainingJob, camelCase keys, and
  no field declared `derived=True`: the operator fills those when it renders
  trainer.yaml (the checkpoint folder, the metrics port, the world layout).

Rules across fields live in a dataclass's `check(self, name)`, which yields
`(dotted_field, message)`; `name("training.micro_batch_size")` spells another
field as the reader wrote it (`training.microBatchSize` in a manifest).

Torch-free on purpose: the operator imports it.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import reprlib
import types
import typing
from dataclasses import MISSING, dataclass
from typing import Any, Callable, Iterable, Mapping

# How much of a value or a path an error message quotes: what it was given may be a megabyte, or 10000 deep.
QUOTE_LIMIT = 80
PATH_LIMIT = 200
_QUOTE = reprlib.Repr()
_QUOTE.maxlevel, _QUOTE.maxstring, _QUOTE.maxother = 3, QUOTE_LIMIT, QUOTE_LIMIT

# How a `check` spells another field: `name("training.micro_batch_size")`.
Names = Callable[[str], str]

__all__ = [
    "Names",
    "ConfigError",
    "FieldError",
    "setting",
    "from_dict",
    "to_dict",
    "valid_fields",
    "openapi_schema",
    "key_for",
    "in_view",
    "camel",
    "spelling",
    "trainer_spelling",
    "is_int_or_string",
    "is_bool_or_string",
    "quoted",
]


@dataclass(frozen=True)
class FieldError:
    path: str
    message: str

    def __str__(self) -> str:
        # A path carries the user's own keys; an unknown key a megabyte long stays one short line.
        path = self.path if len(self.path) <= PATH_LIMIT else f"{self.path[:PATH_LIMIT]}... ({len(self.path)} characters)"
        return f"{path}: {self.message}" if self.path else self.message


class ConfigError(ValueError):
    """One or more invalid fields; `errors` lists each with its path."""

    def __init__(self, errors: Iterable[FieldError]):
        self.errors = list(errors)
        super().__init__("\n".join(str(e) for e in self.errors))


def setting(
    default: Any = MISSING,
    *,
    default_factory: Any = MISSING,
    choices: tuple[str, ...] | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
    exclusive_minimum: bool = False,
    pattern: str | None = None,
    help: str = "",
    key: str | None = None,
    derived: bool = False,
    schema: dict | None = None,
) -> Any:
    """A dataclass field with the constraints that validation and the CRD share.

    `key` overrides the dict key (e.g. `async`, a Python keyword); `derived`
    keeps the field out of the manifest view (the operator sets it); `schema`
    is the OpenAPI schema of a value this module cannot describe from its type
    (a Kubernetes core/v1 object), used verbatim by `openapi_schema` (the
    owning class's `check` validates the value against it).
    """
    meta = {
        "choices": choices,
        "minimum": minimum,
        "maximum": maximum,
        "exclusive_minimum": exclusive_minimum,
        "pattern": pattern,
        "help": help,
        "key": key,
        "derived": derived,
        "schema": schema,
    }
    if default_factory is not MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def in_view(f: dataclasses.Field, camel_case: bool) -> bool:
    """Whether a field belongs to the view: the manifest view leaves out derived fields."""
    return f.init and not (camel_case and f.metadata.get("derived"))


def key_for(f: dataclasses.Field, camel_case: bool) -> str:
    explicit = f.metadata.get("key")
    if explicit:
        return explicit
    return camel(f.name) if camel_case else f.name


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    # Resolving string annotations dominates parsing; a class's hints never change.
    return typing.get_type_hints(cls)


@functools.lru_cache(maxsize=None)
def _fields(cls: type, camel_case: bool) -> tuple[tuple[str, dataclasses.Field, Any], ...]:
    """(key, field, type) of each field in the view: what every reader and writer walks, computed once."""
    hints = _hints(cls)
    return tuple((key_for(f, camel_case), f, hints[f.name]) for f in dataclasses.fields(cls) if in_view(f, camel_case))


@functools.lru_cache(maxsize=None)
def _keys(cls: type, camel_case: bool) -> dict[str, None]:
    """The keys of the view, in declaration order (a dict: ordered, with fast membership)."""
    return dict.fromkeys(key for key, _, _ in _fields(cls, camel_case))


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0], True
    return tp, False


def quoted(value: Any) -> str:
    """A value as an error message quotes it (strings in quotes), bounded in length and depth whatever it holds."""
    text = _QUOTE.repr(value)
    return text if len(text) <= QUOTE_LIMIT else f"{text[:QUOTE_LIMIT]}..."


_TYPE_WORDS = {int: "an integer", float: "a number", str: "a string", bool: "a boolean"}


def is_int_or_string(tp: Any) -> bool:
    """`int | str`: Kubernetes' int-or-string (quantities such as `2` or `"500m"`)."""
    return typing.get_origin(tp) in (typing.Union, types.UnionType) and set(typing.get_args(tp)) == {int, str}


def is_bool_or_string(tp: Any) -> bool:
    """`bool | str`: a switch with words besides true and false (`training.compile: auto`)."""
    return typing.get_origin(tp) in (typing.Union, types.UnionType) and set(typing.get_args(tp)) == {bool, str}


@functools.lru_cache(maxsize=None)
def _shape(tp: Any) -> tuple[str, Any, bool]:
    """(kind, inner type, optional) of a field type: dataclass, list, dict, any, int-or-string, bool-or-string or
    scalar."""
    tp, optional = _unwrap_optional(tp)
    if dataclasses.is_dataclass(tp):
        return "dataclass", tp, optional
    origin = typing.get_origin(tp)
    if origin is list:
        return "list", typing.get_args(tp)[0], optional
    if origin is dict:
        return "dict", typing.get_args(tp)[1], optional
    if tp is Any:
        return "any", tp, optional
    if is_int_or_string(tp):
        return "int-or-string", tp, optional
    if is_bool_or_string(tp):
        return "bool-or-string", tp, optional
    return "scalar", tp, optional


def _convert(tp: Any, value: Any, path: str, camel_case: bool, errors: list[FieldError]) -> Any:
    kind, tp, optional = _shape(tp)
    if value is None:
        if optional:
            return None
        errors.append(FieldError(path, "must not be null"))
        return None
    if kind == "dataclass":
        if not isinstance(value, Mapping):
            errors.append(FieldError(path, f"must be a mapping, got {quoted(value)}"))
            return None
        return _build(tp, value, path, camel_case, errors)
    if kind == "list":
        if not isinstance(value, list):
            errors.append(FieldError(path, f"must be a list, got {quoted(value)}"))
            return None
        return [_convert(tp, v, f"{path}[{i}]", camel_case, errors) for i, v in enumerate(value)]
    if kind == "dict":
        val_tp = tp
        if not isinstance(value, Mapping):
            errors.append(FieldError(path, f"must be a mapping, got {quoted(value)}"))
            return None
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                errors.append(FieldError(path, f"keys must be strings, got {quoted(k)}"))
                continue
            out[k] = v if val_tp is Any else _convert(val_tp, v, f"{path}.{k}", camel_case, errors)
        return out
    if kind == "any":
        return value
    if kind == "int-or-string":
        if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
            return value
        errors.append(FieldError(path, f"must be an integer or a string, got {quoted(value)}"))
        return None
    if kind == "bool-or-string":
        if isinstance(value, (bool, str)):
            return value  # which words a string may be: its choices
        errors.append(FieldError(path, f"must be a boolean or a string, got {quoted(value)}"))
        return None
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    else:  # pragma: no cover - a programming error in a config dataclass
        raise TypeError(f"unsupported config type {tp!r} at {path}")
    errors.append(FieldError(path, f"must be {_TYPE_WORDS[tp]}, got {quoted(value)}"))
    return None


def _check_constraints(f: dataclasses.Field, tp: Any, value: Any, path: str, errors: list[FieldError]) -> None:
    if value is None:
        return
    m = f.metadata
    choices = m.get("choices")
    if is_bool_or_string(_unwrap_optional(tp)[0]):  # its choices are its words besides true and false
        if isinstance(value, str) and value not in choices:
            quoted_boolean = " (unquoted: a YAML boolean)" if value.lower() in ("true", "false") else ""
            errors.append(FieldError(path, f"must be true, false or {', '.join(choices)}; got {quoted(value)}{quoted_boolean}"))
        return
    if choices and value not in choices:
        errors.append(FieldError(path, f"must be one of {', '.join(choices)}; got {quoted(value)}"))
    lo = m.get("minimum")
    if lo is not None and isinstance(value, (int, float)):
        if m.get("exclusive_minimum") and not value > lo:
            errors.append(FieldError(path, f"must be > {lo}, got {value}"))
        elif not m.get("exclusive_minimum") and value < lo:
            errors.append(FieldError(path, f"must be >= {lo}, got {value}"))
    hi = m.get("maximum")
    if hi is not None and isinstance(value, (int, float)) and value > hi:
        errors.append(FieldError(path, f"must be <= {hi}, got {value}"))
    pattern = m.get("pattern")
    if pattern and isinstance(value, str) and not re.fullmatch(pattern, value):
        errors.append(FieldError(path, f"must match {pattern}, got {quoted(value)}"))


def _build(cls: type, data: Mapping, path: str, camel_case: bool, errors: list[FieldError]) -> Any:
    fields = _fields(cls, camel_case)
    prefix = f"{path}." if path else ""
    known = _keys(cls, camel_case)
    elsewhere = getattr(cls, "ELSEWHERE", {})  # {key: the field it belongs in}: a key users put in the wrong place
    for key in data:
        if key not in known:
            hint = f"; did you mean {elsewhere[key]}?" if key in elsewhere else ""
            errors.append(FieldError(f"{prefix}{key}", f"unknown field{hint} (known fields: {', '.join(known)})"))
    kwargs = {}
    n_before = len(errors)
    for key, f, tp in fields:
        fpath = f"{prefix}{key}"
        if key not in data:
            if f.default is MISSING and f.default_factory is MISSING:
                errors.append(FieldError(fpath, "required field is missing"))
            continue
        value = _convert(tp, data[key], fpath, camel_case, errors)
        _check_constraints(f, tp, value, fpath, errors)
        kwargs[f.name] = value
    if len(errors) > n_before:
        return None
    obj = cls(**kwargs)
    check = getattr(obj, "check", None)
    if check is not None:
        name = functools.partial(_field_key, cls, camel_case=camel_case)
        for dotted, message in check(name):
            errors.append(FieldError(f"{prefix}{name(dotted)}", message))
    return obj


def _field_key(cls: type, dotted: str, camel_case: bool) -> str:
    """A dotted snake_case attribute path below `cls`, spelled as the view's keys."""
    if not camel_case:
        return dotted
    out, current = [], cls
    for part in dotted.split("."):
        f = next((f for f in dataclasses.fields(current) if f.name == part), None) if current else None
        if f is None:
            out.append(part)
            current = None
            continue
        out.append(key_for(f, True))
        tp, _ = _unwrap_optional(_hints(current)[f.name])
        current = tp if dataclasses.is_dataclass(tp) else None
    return ".".join(out)


def spelling(cls: type, *, camel_case: bool, prefix: str = "") -> Names:
    """The Names that spell a dotted snake_case path below `cls` as a view's reader wrote it, after `prefix`."""
    return lambda dotted: prefix + _field_key(cls, dotted, camel_case)


def trainer_spelling(cls: type, data: Any, *, path: str = "") -> Any:
    """`data` for the trainer view with every manifest-view key (camelCase) renamed to the trainer's: a section
    pasted from a manifest into trainer.yaml means the same. The names are the fields' own (key_for); a field
    given in both spellings is a ConfigError naming both. What is not a mapping is left for from_dict to judge."""
    errors: list[FieldError] = []
    renamed = _respelled(cls, data, path, errors)
    if errors:
        raise ConfigError(errors)
    return renamed


def _respelled(cls: type, data: Any, path: str, errors: list[FieldError]) -> Any:
    if not isinstance(data, Mapping):
        return data
    prefix = f"{path}." if path else ""
    by_key = {key: (key, tp) for key, _, tp in _fields(cls, False)}
    by_key |= {key_for(f, True): by_key[key] for key, f, _ in _fields(cls, False)}
    out: dict[Any, Any] = {}
    given_as: dict[Any, Any] = {}
    for key, value in data.items():
        name, tp = by_key.get(key, (key, None))
        if name in out:
            errors.append(FieldError(f"{prefix}{name}", f"given twice, as {given_as[name]} and as {key}"))
            continue
        given_as[name] = key
        out[name] = value if tp is None else _respelled_value(tp, value, f"{prefix}{name}", errors)
    return out


def _respelled_value(tp: Any, value: Any, path: str, errors: list[FieldError]) -> Any:
    kind, inner, _ = _shape(tp)
    if kind == "dataclass":
        return _respelled(inner, value, path, errors)
    if kind == "list" and isinstance(value, list) and dataclasses.is_dataclass(_shape(inner)[1]):
        return [_respelled_value(inner, v, f"{path}[{i}]", errors) for i, v in enumerate(value)]
    if kind == "dict" and isinstance(value, Mapping) and dataclasses.is_dataclass(_shape(inner)[1]):
        return {k: _respelled_value(inner, v, f"{path}.{k}", errors) for k, v in value.items()}
    return value


def from_dict(cls: type, data: Any, *, path: str = "", camel_case: bool = False) -> Any:
    """Build `cls` from a mapping, or raise ConfigError listing every bad field.

    Unknown keys are errors (in the manifest view, derived fields too); a
    dataclass's `ELSEWHERE` class attribute ({key: the field it belongs in})
    turns one into "did you mean". A dataclass may define `check(self, name)`
    yielding `(dotted_field, message)` pairs for rules across fields; see the
    module docstring.
    """
    errors: list[FieldError] = []
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError([FieldError(path, f"must be a mapping, got {quoted(data)}")])
    obj = _build(cls, data, path, camel_case, errors)
    if errors:
        raise ConfigError(errors)
    return obj


def valid_fields(cls: type, data: Any, *, camel_case: bool = False) -> dict[str, Any]:
    """The top-level entries of `data` that are valid fields of `cls` on their own; the rest dropped.

    For documents another version of the other half may have written: what
    this version understands is read, nothing else stops it.
    """
    if not isinstance(data, Mapping):
        return {}
    kept = {}
    for key, f, tp in _fields(cls, camel_case):
        if key not in data:
            continue
        errors: list[FieldError] = []
        value = _convert(tp, data[key], key, camel_case, errors)
        _check_constraints(f, tp, value, key, errors)
        if not errors:
            kept[key] = data[key]
    return kept


def to_dict(obj: Any, *, camel_case: bool = False, drop_none: bool = True) -> Any:
    """The inverse of from_dict: plain dicts, lists and scalars, in the view `camel_case` names."""
    if dataclasses.is_dataclass(obj):
        out = {}
        for key, f, _ in _fields(type(obj), camel_case):
            value = to_dict(getattr(obj, f.name), camel_case=camel_case, drop_none=drop_none)
            if value is None and drop_none:
                continue
            out[key] = value
        return out
    if isinstance(obj, list):
        return [to_dict(v, camel_case=camel_case, drop_none=drop_none) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v, camel_case=camel_case, drop_none=drop_none) for k, v in obj.items()}
    return obj


_OPENAPI_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean"}


def _type_schema(tp: Any, camel_case: bool) -> dict:
    tp, _ = _unwrap_optional(tp)
    if dataclasses.is_dataclass(tp):
        return openapi_schema(tp, camel_case=camel_case)
    origin = typing.get_origin(tp)
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        return {"type": "array", "items": _type_schema(item_tp, camel_case)}
    if origin is dict:
        _, val_tp = typing.get_args(tp)
        if val_tp is Any:
            return {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        return {"type": "object", "additionalProperties": _type_schema(val_tp, camel_case)}
    if tp is Any:
        return {"x-kubernetes-preserve-unknown-fields": True}
    if is_int_or_string(tp):
        return {"x-kubernetes-int-or-string": True, "anyOf": [{"type": "integer"}, {"type": "string"}]}
    if is_bool_or_string(tp):
        # A structural schema has no boolean-or-string type, and CEL cannot see a field without one: the API server
        # takes any value here, and the parser (braintrain validate, the operator) refuses all but the choices.
        return {"x-kubernetes-preserve-unknown-fields": True}
    return {"type": _OPENAPI_TYPES[tp]}


def openapi_schema(cls: type, *, camel_case: bool = True) -> dict:
    """A structural OpenAPI v3 schema for a config dataclass (for the CRD: the manifest view)."""
    hints = _hints(cls)
    props, required = {}, []
    for f in dataclasses.fields(cls):
        if not in_view(f, camel_case):
            continue
        key = key_for(f, camel_case)
        m = f.metadata
        schema = dict(m["schema"]) if m.get("schema") else _type_schema(hints[f.name], camel_case)
        if m.get("help"):
            schema = {"description": m["help"], **schema}
        if m.get("choices") and not is_bool_or_string(_unwrap_optional(hints[f.name])[0]):
            schema["enum"] = list(m["choices"])
        if m.get("minimum") is not None:
            schema["minimum"] = m["minimum"]
            if m.get("exclusive_minimum"):
                schema["exclusiveMinimum"] = True
        if m.get("maximum") is not None:
            schema["maximum"] = m["maximum"]
        if m.get("pattern"):
            # OpenAPI patterns match anywhere; ours match the whole value.
            schema["pattern"] = f"^(?:{m['pattern']})$"
        if _unwrap_optional(hints[f.name])[1]:
            schema["nullable"] = True
        props[key] = schema
        if f.default is MISSING and f.default_factory is MISSING:
            required.append(key)
    out: dict = {"type": "object", "properties": props}
    doc = (cls.__doc__ or "").strip()
    if doc and not doc.startswith(cls.__name__ + "("):
        out = {"description": doc.splitlines()[0], **out}
    if required:
        out["required"] = required
    return out
