"""YAML with the YAML 1.2 core schema: the one way brain-train reads and writes YAML.

PyYAML's SafeLoader implements YAML 1.1, where `3e-4` is a string, `on` and
`yes` are booleans and `0o17` means nothing. kubectl, Helm and the API server
read YAML through sigs.k8s.io/yaml, which reads `3e-4`, `1E6` and `.5` as
numbers. Here plain scalars resolve as the YAML 1.2 core schema says
(https://yaml.org/spec/1.2.2/#1032-tag-resolution):

  null   ~, null, Null, NULL, or nothing
  bool   true, True, TRUE, false, False, FALSE          (yes/no/on/off/y/n are strings)
  int    [-+]?[0-9]+ (decimal, so 017 is 17), 0o[0-7]+, 0x[0-9a-fA-F]+
  float  [-+]?(.[0-9]+|[0-9]+(.[0-9]*)?)([eE][-+]?[0-9]+)?, [-+]?.inf, .nan (each in its three spellings)

everything else is a string. Merge keys (`<<: *base`) still work, as they do
in kubectl. tests/trainer/test_yaml12.py compares every case with what
sigs.k8s.io/yaml makes of it.

The writer quotes every string that YAML 1.1, YAML 1.2 or kubectl's reader
would take for something else, so what it writes reads back the same
everywhere. Torch-free.
"""

from __future__ import annotations

import math
import re
from typing import Any

import yaml
from yaml.constructor import ConstructorError

NULL = "tag:yaml.org,2002:null"
BOOL = "tag:yaml.org,2002:bool"
INT = "tag:yaml.org,2002:int"
FLOAT = "tag:yaml.org,2002:float"
MERGE = "tag:yaml.org,2002:merge"

NULL_PATTERN = re.compile(r"^(?:~|null|Null|NULL|)$")
BOOL_PATTERN = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
INT_PATTERN = re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$")
FLOAT_PATTERN = re.compile(
    r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
    r"|[-+]?\.(?:inf|Inf|INF)"
    r"|\.(?:nan|NaN|NAN))$"
)
MERGE_PATTERN = re.compile(r"^<<$")
# sigs.k8s.io/yaml (go-yaml v2) reads these as booleans too: the writer quotes them for kubectl's sake.
KUBECTL_BOOL_PATTERN = re.compile(r"^(?:y|Y|n|N)$")

DIGITS = list("0123456789")
# The first characters each plain scalar of a kind can start with (PyYAML indexes resolvers by them).
CORE_RESOLVERS = (
    (NULL, NULL_PATTERN, ["~", "n", "N", ""]),
    (BOOL, BOOL_PATTERN, list("tTfF")),
    (INT, INT_PATTERN, [*DIGITS, "-", "+"]),
    (FLOAT, FLOAT_PATTERN, [*DIGITS, "-", "+", "."]),
)


class Loader(yaml.SafeLoader):
    """SafeLoader with the YAML 1.2 core schema's implicit types."""

    yaml_implicit_resolvers: dict = {}


for _tag, _pattern, _first in (*CORE_RESOLVERS, (MERGE, MERGE_PATTERN, ["<"])):
    Loader.add_implicit_resolver(_tag, _pattern, _first)


def _scalar(loader: Loader, node: yaml.Node, pattern: re.Pattern[str], kind: str) -> str:
    value = loader.construct_scalar(node)
    if not pattern.match(value):
        # Only reachable with an explicit tag (`!!int yes`): plain scalars resolve by the same patterns.
        raise ConstructorError(None, None, f"not a YAML 1.2 {kind}: {value!r}", node.start_mark)
    return value


def _construct_int(loader: Loader, node: yaml.Node) -> int:
    value = _scalar(loader, node, INT_PATTERN, "integer")
    if value.startswith("0o"):
        return int(value[2:], 8)
    if value.startswith("0x"):
        return int(value[2:], 16)
    return int(value, 10)


def _construct_float(loader: Loader, node: yaml.Node) -> float:
    value = _scalar(loader, node, FLOAT_PATTERN, "float").lower()
    if value.endswith(".nan"):
        return math.nan
    if value.endswith(".inf"):
        return -math.inf if value.startswith("-") else math.inf
    return float(value)


def _construct_bool(loader: Loader, node: yaml.Node) -> bool:
    return _scalar(loader, node, BOOL_PATTERN, "boolean").lower() == "true"


Loader.add_constructor(INT, _construct_int)
Loader.add_constructor(FLOAT, _construct_float)
Loader.add_constructor(BOOL, _construct_bool)


class Dumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):  # type: ignore[misc]
    """SafeDumper (libyaml's when present) that also quotes what YAML 1.2 or kubectl reads as a non-string."""


for _tag, _pattern, _first in (*CORE_RESOLVERS, (BOOL, KUBECTL_BOOL_PATTERN, list("yYnN"))):
    Dumper.add_implicit_resolver(_tag, _pattern, _first)


def load(text: str) -> Any:
    """The single YAML document in `text`; yaml.YAMLError when it is not one."""
    return yaml.load(text, Loader=Loader)  # noqa: S506 - Loader is a SafeLoader


def dump(data: Any, **options: Any) -> str:
    return yaml.dump(data, Dumper=Dumper, sort_keys=False, **options)
