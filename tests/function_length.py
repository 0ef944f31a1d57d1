"""How long a package's functions are: a small AST walk shared by the packages' function-length tests.

A function's length is its lines from `def` to its last line, its docstring included and its decorators not;
a nested function counts inside its parent and on its own; methods are named `Class.method`.
"""

from __future__ import annotations

import ast
from pathlib import Path

FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _lengths(node: ast.AST, prefix: str) -> dict[str, int]:
    out = {}
    for child in ast.iter_child_nodes(node):
        if isinstance(child, FUNCTIONS):
            name = f"{prefix}{child.name}"
            out[name] = child.end_lineno - child.lineno + 1
            out.update(_lengths(child, f"{name}."))
        elif isinstance(child, ast.ClassDef):
            out.update(_lengths(child, f"{prefix}{child.name}."))
        else:
            out.update(_lengths(child, prefix))
    return out


def function_lengths(package_dir: Path) -> dict[str, int]:
    """Every function and method of the package -> its length in lines, named `module.path:Qualified.name`."""
    lengths = {}
    for path in sorted(Path(package_dir).rglob("*.py")):
        module = ".".join(path.relative_to(Path(package_dir).parent).with_suffix("").parts)
        for name, length in _lengths(ast.parse(path.read_text()), "").items():
            lengths[f"{module}:{name}"] = length
    return lengths


def long_functions(package_dir: Path, limit: int) -> dict[str, int]:
    """The functions and methods of the package longer than `limit` lines -> their lengths."""
    return {name: length for name, length in function_lengths(package_dir).items() if length > limit}
