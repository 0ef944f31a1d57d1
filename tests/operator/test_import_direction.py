"""The operator's rooms import one way only (docs/architecture.md, "The operator"): renderers and planners never
reach the local runner or the pass, the status rules never reach the cluster client, and no two rooms import each
other, even through a third. A deferred import (inside a function) is an arrow like any other."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OPERATOR = ROOT / "operator" / "brain_operator"
# Top to bottom: a module imports from its own room or from a room on a lower line, never from one on its own line
# or above. A room is a folder of the package, or a module at its top; the package's face (`__init__`: the
# version, parse_job, render) sits below the two shells that name its version.
LAYERS = (
    ("cli", "crd"),
    ("handlers", "local"),
    ("__init__", "metrics", "reconcile"),
    ("backends",),
    ("cluster", "sizing"),
    ("status",),
    ("spec", "logs"),
    ("objects",),
)
LAYER = {room: depth for depth, rooms in enumerate(LAYERS) for room in rooms}


def module_name(path: Path, package: Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def room_of(module: str) -> str:
    """brain_operator.backends.elastic.plan -> backends; brain_operator.reconcile -> reconcile."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imported(path: Path, package: Path) -> set[str]:
    """Every module of the package that `path` imports, at any depth of its code."""
    modules = {module_name(p, package) for p in package.rglob("*.py")}
    top, here = package.name, module_name(path, package)
    base = here.split(".") if path.name == "__init__.py" else here.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.split(".")[0] == top}
        elif isinstance(node, ast.ImportFrom):
            start = base[: len(base) - node.level + 1] if node.level else []
            target = ".".join([*start, *(node.module.split(".") if node.module else [])])
            if target.split(".")[0] == top:
                # `from . import handlers` names a module, `from . import __version__` and `from .spec import Job`
                # a module's attribute.
                found |= {f"{target}.{a.name}" if f"{target}.{a.name}" in modules else target for a in node.names}
    return found


def arrows(package: Path) -> list[tuple[str, str, str]]:
    """(importing module, its room, the imported room) for every import between two rooms of `package`."""
    out = []
    for path in sorted(package.rglob("*.py")):
        module = module_name(path, package)
        here = room_of(module)
        for target in imported(path, package):
            there = room_of(target)
            if there != here:
                out.append((module, here, there))
    return out


def upward(package: Path) -> list[str]:
    return [f"{module} ({here}) imports {there}" for module, here, there in arrows(package)
            if LAYER[there] <= LAYER[here]]


def test_every_module_of_the_operator_lives_in_a_known_room():
    rooms = {room_of(module_name(path, OPERATOR)) for path in OPERATOR.rglob("*.py")}
    assert rooms == set(LAYER), (sorted(rooms - set(LAYER)), sorted(set(LAYER) - rooms))


def test_the_operators_rooms_import_downwards_only():
    assert len(arrows(OPERATOR)) > 100  # the walk sees the imports it checks
    assert upward(OPERATOR) == []


def circles(package: Path) -> list[list[str]]:
    """Modules that import each other, even through others (deferred imports included), each circle once."""
    graph = {module_name(path, package): imported(path, package) for path in package.rglob("*.py")}
    circles, done = [], set()
    for start in sorted(graph):
        path, seen = [start], {start: 0}
        stack = [iter(sorted(graph[start]))]
        while stack:
            target = next(stack[-1], None)
            if target is None:
                stack.pop()
                del seen[path.pop()]
            elif target == start and frozenset(path) not in done:
                done.add(frozenset(path))
                circles.append(list(path))
            elif target in graph and target not in seen and target > start:
                seen[target] = len(path)
                path.append(target)
                stack.append(iter(sorted(graph[target])))
    return circles


def test_no_module_of_the_operator_imports_itself_through_others():
    assert circles(OPERATOR) == []


def test_a_planted_upward_import_is_caught(tmp_path):
    """A copy of the operator where a renderer reaches the local runner, deferred inside a function as the old
    circle's imports were, and where a status rule reads the cluster client at the top."""
    copy = tmp_path / OPERATOR.name
    shutil.copytree(OPERATOR, copy, ignore=shutil.ignore_patterns("__pycache__", "*.json"))
    assert upward(copy) == []
    workers = copy / "backends" / "shared" / "workers.py"
    workers.write_text(workers.read_text() + "\n\ndef _planted():\n    from ...local.plan import localize\n")
    waiting = copy / "status" / "waiting.py"
    waiting.write_text("import brain_operator.cluster.client\n" + waiting.read_text())
    assert upward(copy) == [
        "brain_operator.backends.shared.workers (backends) imports local",
        "brain_operator.status.waiting (status) imports cluster",
    ]


def test_a_room_importing_its_own_line_is_caught(tmp_path):
    """Two rooms on one line may not import each other, in either direction."""
    copy = tmp_path / OPERATOR.name
    shutil.copytree(OPERATOR, copy, ignore=shutil.ignore_patterns("__pycache__", "*.json"))
    grace = copy / "sizing" / "grace.py"
    grace.write_text(grace.read_text() + "\n\ndef _planted():\n    from ..cluster import client\n")
    assert upward(copy) == ["brain_operator.sizing.grace (sizing) imports cluster"]


def test_a_planted_circle_is_caught(tmp_path):
    """The old circle, closed again by a deferred import: the storage check reaching for the local runner."""
    copy = tmp_path / OPERATOR.name
    shutil.copytree(OPERATOR, copy, ignore=shutil.ignore_patterns("__pycache__", "*.json"))
    storage = copy / "sizing" / "storage.py"
    storage.write_text(storage.read_text() + "\n\ndef _planted():\n    from ..local.dataset import job_vocabulary\n")
    found = circles(copy)
    old = {f"brain_operator.{m}" for m in ("backends.shared.workers", "sizing.grace", "sizing.storage", "local.dataset",
                                           "local.plan")}
    assert found and all("brain_operator.sizing.storage" in c for c in found)
    assert old in [set(c) for c in found]
