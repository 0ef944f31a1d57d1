"""Import boundaries: the operator never loads torch, the repo layout never shadows the stdlib's `operator`, and
the trainer's rooms import one way only (docs/architecture.md, "The trainer")."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import processes
import pytest

ROOT = Path(__file__).resolve().parents[1]
TRAINER = ROOT / "trainer" / "brain_trainer"
# Top to bottom: a module imports from its own room or from a room on a lower line, never from one on its own
# line or above (so no two rooms import each other, even through a third). The entry points and the package's
# face sit on top; `plan` (torch-free: the planner, the layout, the stage cut) under every room that runs torch;
# `files`, `version` and `lazy` are leaves.
LAYERS = (
    ("__init__", "__main__", "agent", "export", "tokens"),
    ("hf",),
    ("inference",),
    ("loop",),
    ("data", "model"),
    ("parallel",),
    ("checkpoint",),
    ("resilience", "observe"),
    ("plan",),
    ("config",),
    ("contract", "uris"),
    ("schema", "files", "version", "lazy", "s3"),
)
LAYER = {room: depth for depth, rooms in enumerate(LAYERS) for room in rooms}

IMPORT_ALL = """
import importlib, pkgutil, sys
import brain_operator
names = [m.name for m in pkgutil.walk_packages(brain_operator.__path__, "brain_operator.")]
assert "brain_operator.handlers" in names and "brain_operator.backends.elastic.render" in names, names
culprit = "-"
for name in names:
    importlib.import_module(name)
    if "torch" in sys.modules and culprit == "-":
        culprit = name
print(len(names), culprit)
"""


def run(code: str) -> processes.Finished:
    # The repo root as working directory: where `operator/` could shadow the stdlib.
    return processes.run([sys.executable, "-c", code], cwd=ROOT, timeout=300)


def test_no_module_of_brain_operator_imports_torch():
    done = run(IMPORT_ALL)
    assert done.returncode == 0, done.stderr
    count, culprit = done.stdout.split()
    assert int(count) >= 8
    assert culprit == "-", f"importing {culprit} loaded torch"


def test_the_cli_and_the_operators_pure_rooms_do_not_load_the_kubernetes_package():
    # Only cluster/client.py talks to the API server; every braintrain command would pay for its import.
    done = run("import sys, brain_operator.cli, brain_operator.reconcile, brain_operator.backends; "
               "print('kubernetes' in sys.modules)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_torch_imports_from_the_repo_root():
    assert not (ROOT / "operator" / "__init__.py").exists(), "operator/ must not be a package: it shadows the stdlib"
    done = run("import torch, operator; print(operator.__file__)")
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).parent != ROOT / "operator"


def room_of(module: str) -> str:
    """brain_trainer.checkpoint.store -> checkpoint; brain_trainer.files -> files."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def module_name(path: Path) -> str:
    parts = path.relative_to(TRAINER.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> set[str]:
    """Every brain_trainer module `path` imports, at any depth of its code (a deferred import is still an arrow)."""
    package = module_name(path).split(".") if path.name == "__init__.py" else module_name(path).split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("brain_trainer")}
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = ".".join([*base, *(node.module.split(".") if node.module else [])])
            if target.startswith("brain_trainer"):
                # `from . import shards` names a module; `from .store import x` a module's attribute.
                found |= {f"{target}.{a.name}" if not node.module else target for a in node.names}
    return found


def arrows() -> list[tuple[str, str, str]]:
    """(importing module, its room, the imported room) for every import between two rooms."""
    out = []
    for path in sorted(TRAINER.rglob("*.py")):
        module = module_name(path)
        here = room_of(module) if "." in module else "__init__"
        for target in imported(path):
            there = room_of(target)
            if there != here:
                out.append((module, here, there))
    return out


def test_every_module_of_the_trainer_lives_in_a_known_room():
    rooms = {room_of(module_name(path)) for path in TRAINER.rglob("*.py")}
    assert rooms <= set(LAYER), sorted(rooms - set(LAYER))
    assert {"loop", "data", "model", "parallel", "plan", "checkpoint", "resilience", "observe", "config"} <= rooms


def upward(found: list[tuple[str, str, str]]) -> list[str]:
    return [f"{module} ({here}) imports {there}" for module, here, there in found if LAYER[there] <= LAYER[here]]


def test_the_trainers_rooms_import_downwards_only():
    found = arrows()
    assert len(found) > 50  # the walk sees the imports it checks
    assert upward(found) == []


def test_a_planted_import_of_a_torch_room_from_the_planner_is_caught():
    planted = ("brain_trainer.plan.memory", "plan", "parallel")
    assert upward([*arrows(), planted]) == ["brain_trainer.plan.memory (plan) imports parallel"]


def test_everything_under_plan_imports_without_torch():
    code = ("import importlib, pkgutil, sys, brain_trainer.plan as plan\n"
            "names = [m.name for m in pkgutil.walk_packages(plan.__path__, 'brain_trainer.plan.')]\n"
            "for name in names:\n"
            "    importlib.import_module(name)\n"
            "print(len(names), 'torch' in sys.modules)")
    done = run(code)
    assert done.returncode == 0, done.stderr
    count, torch_loaded = done.stdout.split()
    assert int(count) >= 10 and torch_loaded == "False"


@pytest.mark.parametrize("room", ["config", "plan", "model", "parallel", "data", "checkpoint", "observe", "resilience",
                                  "loop"])
def test_each_rooms_face_is_torch_free(room):
    done = run(f"import sys, brain_trainer.{room}; print('torch' in sys.modules)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
