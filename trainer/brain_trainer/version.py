"""The project's version, written once: `version` in pyproject.toml; and the torch versions the trainer supports.

Installed (a wheel, or `pip install -e`), it comes from the distribution's
metadata; run from a source checkout that was never installed, from the
pyproject.toml beside the sources. Torch-free: the operator reads it too.
"""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path
from typing import Optional

DISTRIBUTION = "brain-train"
# trainer/brain_trainer/version.py -> the repository root.
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
# PEP 440 for "no idea": sorts below every release.
UNKNOWN = "0+unknown"
# The torch releases the trainer supports, (major, minor) from FIRST up to but excluding BEYOND: GPU base images
# often carry an older torch than the one the dev install pins (Makefile: torch==2.13.0, the newest supported).
# pyproject's trainer extra declares the same range (TORCH_REQUIREMENT; a test keeps them equal).
TORCH_FIRST = (2, 11)
TORCH_BEYOND = (2, 14)
TORCH_REQUIREMENT = "torch>={}.{},<{}.{}".format(*TORCH_FIRST, *TORCH_BEYOND)
_RELEASE = re.compile(r"(\d+)\.(\d+)")


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


def torch_refusal(torch_version: str) -> Optional[str]:
    """None when the trainer supports this torch (`torch.__version__`, e.g. "2.11.0+cu130"); else why not, one line."""
    release = _RELEASE.match(torch_version)
    if release is not None and TORCH_FIRST <= (int(release.group(1)), int(release.group(2))) < TORCH_BEYOND:
        return None
    return (f"torch {torch_version} is not supported: brain-train {__version__} needs {TORCH_REQUIREMENT} "
            "(the trainer image's torch: spec.image)")


__version__ = project_version()
