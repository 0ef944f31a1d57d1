"""Which of the trainer's rooms the operator imports (docs/architecture.md, "What the operator imports").

The operator's pure code (spec, renderers, status, policies, estimate...) reads the trainer through `PURE` only:
the config it parses, the planner, the worker contract and the error schema. A thin shell that runs trainer work
imports more, each room listed below with its reason, keyed by module: when modules move, move their keys.
"""

from __future__ import annotations

import ast
from pathlib import Path

OPERATOR = Path(__file__).resolve().parents[2] / "operator" / "brain_operator"

PURE = frozenset({"config", "plan", "contract", "uris", "schema", "version"})
SHELLS = {
    # argument parsers of `braintrain export` and `prepare`, and the commands export, prepare, doctor, generate
    # and eval (hf and inference are imported when those commands run); `checkpoints` lists a location's steps
    "brain_operator.cli": {"checkpoint", "data", "hf", "inference", "model", "resilience"},
    # `braintrain run`: the checkpoints it resumes from and sets aside, a free port for the local rendezvous
    "brain_operator.local.run": {"checkpoint", "parallel"},
    # reads a token dataset's manifest (the trainer's format) for the vocabulary the trainer will give the model
    "brain_operator.local.dataset": {"data"},
}


def module_name(path: Path) -> str:
    parts = path.relative_to(OPERATOR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def trainer_rooms(source: str) -> set[str]:
    """The brain_trainer rooms `source` imports, at any depth of its code (`from brain_trainer import x`: the
    package's face, `__init__`)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module)
    return {(name.split(".") + ["__init__"])[1] for name in names if name.split(".")[0] == "brain_trainer"}


def operator_imports() -> dict[str, set[str]]:
    """Each operator module's trainer rooms."""
    return {module_name(path): trainer_rooms(path.read_text()) for path in sorted(OPERATOR.rglob("*.py"))}


def beyond_allowed(imports: dict[str, set[str]]) -> list[str]:
    return [f"{module} imports brain_trainer.{room}" for module, rooms in imports.items()
            for room in sorted(rooms - PURE - SHELLS.get(module, set()))]


def test_the_operator_imports_only_the_trainers_pure_rooms_but_in_its_shells():
    imports = operator_imports()
    assert len(imports) > 30 and imports["brain_operator.sizing.estimate"] >= {"plan"}  # the walk sees what it checks
    assert beyond_allowed(imports) == []


def test_every_shell_listed_exists_and_needs_its_rooms():
    imports = operator_imports()
    assert [module for module in SHELLS if module not in imports] == []  # a moved shell: move its key
    assert {module: sorted(rooms - imports[module]) for module, rooms in SHELLS.items()} == {m: [] for m in SHELLS}


def test_a_planted_import_of_the_model_from_a_renderer_is_caught():
    planted = "def build():\n    from brain_trainer.model.brain_ai import BrainAI\n    return BrainAI\n"
    imports = {**operator_imports(), "brain_operator.backends.planted": trainer_rooms(planted)}
    assert beyond_allowed(imports) == ["brain_operator.backends.planted imports brain_trainer.model"]
