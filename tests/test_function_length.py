"""No function of either package is longer than LIMIT lines (docstring included, decorators not): a longer one
does more than one thing, and is split (tests/function_length.py measures)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from function_length import function_lengths, long_functions

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"operator": ROOT / "operator" / "brain_operator", "trainer": ROOT / "trainer" / "brain_trainer"}
LIMIT = 60
# Each function allowed to be longer, and why; the test fails once one of them is short again.
EXCEPTIONS: dict[str, str] = {}


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_function_is_longer_than_the_limit(package):
    long = long_functions(PACKAGES[package], LIMIT)
    assert len(function_lengths(PACKAGES[package])) > 200  # the walk sees the functions it checks
    assert sorted(set(long) - set(EXCEPTIONS)) == []


def test_every_exception_is_still_needed():
    long = {name for path in PACKAGES.values() for name in long_functions(path, LIMIT)}
    assert sorted(set(EXCEPTIONS) - long) == []


def test_the_measure_counts_docstrings_and_nested_functions_but_not_decorators(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "mod.py").write_text(textwrap.dedent('''\
        import functools


        @functools.cache
        @functools.wraps(print)
        def short():
            """One
            docstring."""
            return 1


        class Box:
            def method(self):
                def inner():
                    return 2
                return inner()
        '''))
    assert function_lengths(package) == {"pkg.mod:short": 4, "pkg.mod:Box.method": 4, "pkg.mod:Box.method.inner": 2}
    assert long_functions(package, 3) == {"pkg.mod:short": 4, "pkg.mod:Box.method": 4}
