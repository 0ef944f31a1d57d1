"""One self-contained Python file from a module of ours: its definitions, with what it imports from brain_trainer
copied in (only the definitions reached, their source as written), so that the file runs where brain-train is
not installed and cannot drift from the code it was made from.

Imports from other packages (torch, transformers) stay imports; relative imports within the module's own folder
stay relative (transformers copies those files along: dynamic_module_utils.get_relative_imports); a name reached
in two modules of ours must be one definition. Annotations are not followed: the files use postponed annotations.
Torch-free: it reads source text only.
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

PACKAGE = "brain_trainer"
Key = tuple[str, str]  # (module, name)


@dataclass(frozen=True)
class Definition:
    """A top-level definition of a module: its source lines (comments just above included) and the names it uses."""

    source: str
    uses: frozenset[str]
    annotations: frozenset[str]  # names only annotations read: imported when another package's, never copied


@dataclass
class Module:
    name: str
    definitions: dict[str, Definition] = field(default_factory=dict)
    imports: dict[str, tuple[str, str | None, int]] = field(default_factory=dict)  # local -> (module, attr, level)


def _annotations(node: ast.AST) -> list[ast.AST]:
    found = []
    for child in ast.walk(node):
        if isinstance(child, ast.arg) and child.annotation is not None:
            found.append(child.annotation)
        elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) and child.returns is not None:
            found.append(child.returns)
        elif isinstance(child, ast.AnnAssign):
            found.append(child.annotation)
    return found


def _names(node: ast.AST, skip: set[int]) -> Iterator[str]:
    stack = [node]
    while stack:
        current = stack.pop()
        if id(current) in skip:
            continue
        if isinstance(current, ast.Name) and isinstance(current.ctx, ast.Load):
            yield current.id
        stack.extend(ast.iter_child_nodes(current))


def _used_names(node: ast.AST) -> tuple[set[str], set[str]]:
    """(names a definition reads at run time, names only its annotations read)."""
    annotations = _annotations(node)
    runtime = set(_names(node, {id(a) for a in annotations}))
    return runtime, {name for a in annotations for name in _names(a, set())} - runtime


def _start(node: ast.AST, lines: list[str]) -> int:
    """The first line of a definition: its decorators, and the comment lines right above."""
    start = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))]) - 1
    while start > 0 and lines[start - 1].lstrip().startswith("#"):
        start -= 1
    return start


def _defined_names(node: ast.stmt) -> list[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
    return [t.id for t in targets if isinstance(t, ast.Name)]


def _absolute(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")[: -node.level]
    return ".".join(base + ([node.module] if node.module else []))


def _without(node: ast.stmt, lines: list[str], omit: frozenset[str]) -> tuple[str, list[ast.AST]]:
    """A definition's source and the nodes it runs, the methods named in `omit` (Class.method) left out."""
    start, cut, kept = _start(node, lines), set(), [node]
    if isinstance(node, ast.ClassDef):
        dropped = [m for m in node.body if f"{node.name}.{getattr(m, 'name', '')}" in omit]
        for method in dropped:
            cut.update(range(_start(method, lines), method.end_lineno))
        kept = [*node.bases, *node.decorator_list, *(m for m in node.body if m not in dropped)]
    source = "\n".join(line for i, line in enumerate(lines[start : node.end_lineno], start) if i not in cut)
    return source, kept


def parse_module(name: str, omit: frozenset[str] = frozenset()) -> Module:
    """The top-level definitions and imports of module `name` (found, not imported); methods in `omit` left out."""
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(name)
    text = Path(spec.origin).read_text(encoding="utf-8")
    lines = text.splitlines()
    parsed = Module(name)
    for node in ast.parse(text).body:
        if isinstance(node, ast.Import):
            for alias in node.names:
                parsed.imports[alias.asname or alias.name.split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0], None, 0)
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            for alias in node.names:
                parsed.imports[alias.asname or alias.name] = (_absolute(name, node), alias.name, node.level)
        else:
            source, kept = _without(node, lines, omit)
            runtime, annotated = set(), set()
            for part in kept:
                reads, annotates = _used_names(part)
                runtime |= reads
                annotated |= annotates
            for defined in _defined_names(node):
                parsed.definitions[defined] = Definition(source, frozenset(runtime), frozenset(annotated - runtime))
    return parsed


class Inliner:
    """Collects definitions in dependency order, and the imports of other packages they need."""

    def __init__(self, home: str, omit: frozenset[str] = frozenset()):
        self.home = home  # the package whose relative imports are kept (the files written beside this one)
        self.omit = omit
        self.modules: dict[str, Module] = {}
        self.order: list[Key] = []
        self.seen: dict[str, Key] = {}
        self.external: dict[str, str] = {}  # local name -> import statement

    def module(self, name: str) -> Module:
        if name not in self.modules:
            self.modules[name] = parse_module(name, self.omit)
        return self.modules[name]

    def add(self, module: str, name: str) -> None:
        """Definition `name` of `module`, after everything it uses."""
        key = (module, name)
        if self.seen.get(name) == key:
            return
        if name in self.seen:
            raise ValueError(f"{name} is defined in both {self.seen[name][0]} and {module}")
        self.seen[name] = key
        definition = self.module(module).definitions[name]
        for used in sorted(definition.uses):
            self.resolve(module, used)
        for annotation in sorted(definition.annotations):
            self.import_for_annotation(module, annotation)
        self.order.append(key)

    def import_for_annotation(self, module: str, name: str) -> None:
        """Another package's name an annotation reads is imported (typing.get_type_hints works); ours is not copied."""
        source, _, _ = self.module(module).imports.get(name, (PACKAGE, None, 0))
        if source.split(".")[0] != PACKAGE:
            self.resolve(module, name)

    def resolve(self, module: str, name: str) -> None:
        parsed = self.module(module)
        if name in parsed.definitions:
            self.add(module, name)
            return
        if name not in parsed.imports:
            return  # a builtin, or a local of the definition
        source, attr, _ = parsed.imports[name]
        if source.startswith(self.home + "."):  # a file written beside this one
            self.external[name] = f"from .{source.rsplit('.', 1)[1]} import {attr}"
        elif source.split(".")[0] == PACKAGE:
            if attr != name or name not in self.module(source).definitions:
                raise ValueError(f"{module}: {name} must be a definition of {source}, imported under its own name")
            self.add(source, name)
        elif attr is None:
            self.external[name] = f"import {source}" if source == name else f"import {source} as {name}"
        else:
            self.external[name] = f"from {source} import {attr}" + ("" if attr == name else f" as {name}")

    def text(self, docstring: str) -> str:
        imports = sorted(set(self.external.values()), key=lambda line: (line.startswith("from ."),
                                                                        line.startswith("from"), line))
        body = "\n\n\n".join(self.modules[module].definitions[name].source for module, name in self.order)
        head = f'"""{docstring}"""\n\nfrom __future__ import annotations\n\n'
        return head + "\n".join(imports) + "\n\n\n" + body + "\n"


def inline(module: str, docstring: str, omit: frozenset[str] = frozenset()) -> str:
    """Module `module` as one file: every top-level definition of it, with what they use of brain_trainer copied in
    (the methods named in `omit`, Class.method, left out)."""
    inliner = Inliner(module.rsplit(".", 1)[0], omit)
    for name in inliner.module(module).definitions:
        inliner.add(module, name)
    return inliner.text(docstring)
