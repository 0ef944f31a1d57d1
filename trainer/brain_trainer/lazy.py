"""Lazy package exports (PEP 562): torch-heavy names load on first use, so the
torch-free modules beside them stay importable without torch."""

from __future__ import annotations

from importlib import import_module
from typing import Any, Callable


def lazy_exports(package: str, where: dict[str, str], namespace: dict[str, Any]) -> Callable[[str], Any]:
    """A module `__getattr__` importing each name in `where` from its submodule on first access."""

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(f".{where[name]}", package), name)
        # Cache it; this also replaces the attribute that importing a submodule of
        # the same name (`.train`) set on the package, so the name stays the object.
        namespace[name] = value
        return value

    return __getattr__
