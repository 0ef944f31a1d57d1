"""Import boundaries: the operator never loads torch, and the repo layout never shadows the stdlib's `operator`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

IMPORT_ALL = """
import importlib, pkgutil, sys
import brain_operator
names = [m.name for m in pkgutil.walk_packages(brain_operator.__path__, "brain_operator.")]
assert "brain_operator.handlers" in names and "brain_operator.render.elastic" in names, names
culprit = "-"
for name in names:
    importlib.import_module(name)
    if "torch" in sys.modules and culprit == "-":
        culprit = name
print(len(names), culprit)
"""


def run(code: str) -> subprocess.CompletedProcess:
    # The repo root as working directory: where `operator/` could shadow the stdlib.
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_no_module_of_brain_operator_imports_torch():
    done = run(IMPORT_ALL)
    assert done.returncode == 0, done.stderr
    count, culprit = done.stdout.split()
    assert int(count) >= 8
    assert culprit == "-", f"importing {culprit} loaded torch"


def test_torch_imports_from_the_repo_root():
    assert not (ROOT / "operator" / "__init__.py").exists(), "operator/ must not be a package: it shadows the stdlib"
    done = run("import torch, operator; print(operator.__file__)")
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).parent != ROOT / "operator"
