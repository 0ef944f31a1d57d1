"""The project's version, written once: `version` in pyproject.toml.

Installed (a wheel, or `pip install -e`), it comes from the distribution's
metadata; run from a source checkout that was never installed, from the
pyproject.toml beside the sources. Torch-free: the operator reads it too.
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

DISTRIBUTION = "brain-train"
# trainer/brain_trainer/version.py -> the repository root.
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
# PEP 440 for "no idea": sorts below every release.
UNKNOWN = "0+unknown"


def source_version(pyproject: Path = PYPROJECT) -> str:
    """`project.version` of a pyproject.toml; UNKNOWN when there is none to read."""
    try:
        import tomllib  # Python 3.11+
    except ImportError:
        return UNKNOWN
    try:
        return str(tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["version"])
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
        return UNKNOWN


def project_version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return source_version()


__version__ = project_version()
