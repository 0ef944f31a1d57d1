"""YAML as kubectl reads it: the one way brain-train reads and writes YAML.

kubectl (and the API server, and Helm for values files) turn YAML into JSON
with sigs.k8s.io/yaml, whose resolver is go-yaml v2's
(kubernetes-sigs/yaml goyaml.v2/resolve.go). PyYAML's SafeLoader implements
YAML 1.1 strictly, which disagrees with it where users notice: `3e-4` and
`1E6` are strings to PyYAML and numbers to kubectl. A plain scalar resolves
here as go-yaml v2 resolves it:

  null   ~, null, Null, NULL, or nothing
  bool   true/True/TRUE, yes/Yes/YES, on/On/ON, y/Y and false/False/FALSE, no/No/NO, off/Off/OFF, n/N
  int    after removing every "_": Go's strconv.ParseInt(s, 0, 64), then ParseUint: decimal,
         0x/0X hex, 0o/0O octal, 0b/0B binary, and a leading 0 octal (017 is 15)
  float  after removing "_": [-+]?(\\.[0-9]+|[0-9]+(\\.[0-9]*)?)([eE][-+]?[0-9]+)?;
         .5-style scalars as they are; .inf/.Inf/.INF (signed), .nan/.NaN/.NAN

everything else (dates, 1:20, 0xZZ, _1) is a string, merge keys (`<<: *base`)
work, and mapping keys become strings as JSON needs (`on:` is "true", `1:` is "1"). So what `braintrain validate` accepts is what `kubectl apply` sends the
API server; tests/trainer/test_kubeyaml.py holds every case to the real Go
code (through Helm's values parser, which calls the same library).

Hostile input is bounded as kubectl bounds it. go-yaml v2 (gopkg.in/yaml.v2
decode.go, allowedAliasRatio, CVE-2019-11253) counts every node it decodes,
alias expansions included, and gives up with "document contains excessive
aliasing" once more than 1000 decodes of which more than 100 came from
aliases exceed the allowed share: 99% up to 400,000 decodes, falling linearly
to 10% at 4,000,000. The same count runs here over the composed node graph
before anything is built, so a billion-laughs document stops after about a
thousand steps. Its scanner (scannerc.go, max_flow_level and max_indents)
refuses nesting deeper than 10000; Python's composer recurses about two
frames per level under a 1000-frame stack, so the limit here is MAX_DEPTH,
far deeper than any Kubernetes object, and the error is the same one line.

The writer quotes every string that this reader or PyYAML's YAML 1.1 would
take for something else, so what it writes reads back the same everywhere.
Torch-free.
"""

from __future__ import annotations

import math
import re
from typing import Any, Optional

import yaml
from yaml.composer import ComposerError
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, ScalarNode, SequenceNode

NULL = "tag:yaml.org,2002:null"
BOOL = "tag:yaml.org,2002:bool"
INT = "tag:yaml.org,2002:int"
FLOAT = "tag:yaml.org,2002:float"
STR = "tag:yaml.org,2002:str"
MERGE = "tag:yaml.org,2002:merge"

# go-yaml v2's resolve table: plain scalars that are looked up, not parsed.
_TABLE: dict[str, tuple[str, Any]] = {
    "": (NULL, None),
    **{text: (NULL, None) for text in ("~", "null", "Null", "NULL")},
    **{text: (BOOL, True) for text in ("y", "Y", "yes", "Yes", "YES", "on", "On", "ON", "true", "True", "TRUE")},
    **{text: (BOOL, False) for text in ("n", "N", "no", "No", "NO", "off", "Off", "OFF", "false", "False", "FALSE")},
    **{f"{sign}.{inf}": (FLOAT, -math.inf if sign == "-" else math.inf)
       for sign in ("", "+", "-") for inf in ("inf", "Inf", "INF")},
    **{f".{nan}": (FLOAT, math.nan) for nan in ("nan", "NaN", "NAN")},
    "<<": (MERGE, "<<"),
}
# go-yaml v2's yamlStyleFloat, and what Go's ParseFloat takes of a scalar starting with ".".
_FLOAT = re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$")
_DOT_FLOAT = re.compile(r"^\.[0-9]+([eE][-+]?[0-9]+)?$")
# Go's base-0 integer syntax: sign, then a 0x/0o/0b prefix, a leading 0 (octal), or decimal digits.
_GO_INT = re.compile(r"^([-+]?)(0[xX][0-9a-fA-F]+|0[oO][0-7]+|0[bB][01]+|0[0-7]*|[1-9][0-9]*)$")
_INT64 = (-(2**63), 2**63 - 1)
# Nesting limit (kubectl's is 10000; see the module docstring for why this one is lower).
MAX_DEPTH = 100
# go-yaml v2 decode.go: alias_ratio_range_low/high and the floor below which aliasing is never judged.
_ALIAS_RANGE = (400_000, 4_000_000)
_MIN_DECODES, _MIN_ALIASED = 1000, 100
_UINT64_MAX = 2**64 - 1


def _go_int(text: str) -> Optional[int]:
    """strconv.ParseInt(text, 0, 64), falling back to ParseUint, as go-yaml v2 tries them; None when neither parses."""
    match = _GO_INT.match(text)
    if match is None:
        return None
    sign, digits = match.groups()
    if digits[:2].lower() in ("0x", "0o", "0b"):
        value = int(digits[2:], {"x": 16, "o": 8, "b": 2}[digits[1].lower()])
    elif digits[0] == "0" and len(digits) > 1:
        value = int(digits[1:], 8)
    else:
        value = int(digits)
    value = -value if sign == "-" else value
    if _INT64[0] <= value <= _INT64[1] or (sign != "-" and value <= _UINT64_MAX):
        return value
    return None


def resolve_plain(text: str) -> tuple[str, Any]:
    """(tag, value) of a plain scalar, as go-yaml v2 resolves it: by table, then by its first character."""
    if text in _TABLE:
        return _TABLE[text]
    if text[0] == "." and _DOT_FLOAT.match(text):
        return FLOAT, float(text)
    if text[0] in "+-0123456789":
        plain = text.replace("_", "")
        number = _go_int(plain)
        if number is not None:
            return INT, number
        if _FLOAT.match(plain):
            return FLOAT, float(plain)
    return STR, text


def _json_key(key: Any, node: yaml.Node) -> str:
    """A mapping key as sigs.k8s.io/yaml's conversion to JSON spells it (JSON keys are strings)."""
    if isinstance(key, str):
        return key
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, int):
        return str(key)
    if isinstance(key, float) and key.is_integer():
        return str(int(key))
    if isinstance(key, float):
        return repr(key)
    raise ConstructorError(None, None, f"unsupported map key {key!r}", node.start_mark)


def _allowed_alias_ratio(decodes: int) -> float:
    """go-yaml v2's allowedAliasRatio: the share of decodes that may come from aliases."""
    low, high = _ALIAS_RANGE
    if decodes <= low:
        return 0.99
    if decodes >= high:
        return 0.10
    return 0.99 - 0.89 * (decodes - low) / (high - low)


def _check_aliasing(root: yaml.Node) -> None:
    """go-yaml v2's excessive-aliasing rule, counted over the node graph in document order.

    A node met a second time is an alias; it and everything under it count as
    alias-driven decodes, as go-yaml counts them while it expands the alias.
    The walk stops as soon as the rule is broken, so a bomb costs ~1000 steps.
    """
    decodes = aliased = 0
    seen: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, in_alias = stack.pop()
        in_alias = in_alias or id(node) in seen
        seen.add(id(node))
        decodes += 1
        aliased += in_alias
        if aliased > _MIN_ALIASED and decodes > _MIN_DECODES and aliased / decodes > _allowed_alias_ratio(decodes):
            raise ComposerError(None, None, "document contains excessive aliasing", node.start_mark)
        if isinstance(node, MappingNode):
            children = [child for pair in node.value for child in pair]
        elif isinstance(node, SequenceNode):
            children = node.value
        else:
            continue
        stack.extend((child, in_alias) for child in reversed(children))


class Loader(yaml.SafeLoader):
    """SafeLoader whose plain scalars resolve as go-yaml v2's do, with go-yaml's bounds on nesting and aliases."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Optional[yaml.Node], index: Any) -> yaml.Node:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise ComposerError(None, None, f"exceeded max depth of {MAX_DEPTH}", self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_document(self, node: yaml.Node) -> Any:
        _check_aliasing(node)
        return super().construct_document(node)

    def resolve(self, kind: type, value: Any, implicit: tuple[bool, bool]) -> str:
        if kind is ScalarNode and implicit[0]:
            return resolve_plain(value)[0]
        return super().resolve(kind, value, implicit)

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[str, Any]:
        # Keys become strings before they meet in one dict (True and 1 would collide as Python keys).
        self.flatten_mapping(node)
        return {
            _json_key(self.construct_object(key_node, deep=deep), key_node): self.construct_object(value_node, deep=deep)
            for key_node, value_node in node.value
        }


def _construct(kind: str, loader: Loader, node: yaml.Node) -> Any:
    text = loader.construct_scalar(node)
    tag, value = resolve_plain(text)
    if tag == INT and kind == FLOAT:
        return float(value)  # `!!float 3`, as go-yaml v2 allows
    if tag != kind:
        # Only reachable with an explicit tag (`!!int yes`): plain scalars resolve by the same function.
        raise ConstructorError(None, None, f"cannot read {text!r} as {kind.rsplit(':', 1)[-1]}", node.start_mark)
    return value


for _kind in (INT, FLOAT, BOOL, NULL):
    Loader.add_constructor(_kind, lambda loader, node, kind=_kind: _construct(kind, loader, node))


class Dumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):  # type: ignore[misc]
    """SafeDumper (libyaml's when present) that also quotes what kubectl would read as a non-string."""

    def resolve(self, kind: type, value: Any, implicit: tuple[bool, bool]) -> str:
        tag = super().resolve(kind, value, implicit)
        if kind is ScalarNode and implicit[0] and tag == STR:
            # A string the reader would take for another type: resolving it as that type makes the emitter quote it.
            return resolve_plain(value)[0]
        return tag


def _str(dumper: Dumper, value: str) -> ScalarNode:
    # A text of several lines as a literal block: a ConfigMap's trainer.yaml reads as the file it is, in
    # `braintrain render` and in `kubectl get -o yaml` of what it applied (the emitter falls back to quotes
    # for text a block cannot hold, such as trailing spaces).
    return dumper.represent_scalar(STR, value, style="|" if "\n" in value else None)


Dumper.add_representer(str, _str)


def load(text: str) -> Any:
    """The single YAML document in `text`; yaml.YAMLError when it is not one."""
    return yaml.load(text, Loader=Loader)  # noqa: S506 - Loader is a SafeLoader


def dump(data: Any, **options: Any) -> str:
    return yaml.dump(data, Dumper=Dumper, sort_keys=False, **options)


def dump_all(documents: Any, **options: Any) -> str:
    """Several documents, `---`-separated (what `kubectl apply -f` reads)."""
    return yaml.dump_all(documents, Dumper=Dumper, sort_keys=False, **options)
