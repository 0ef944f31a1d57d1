"""Corpora for the token dataset tests, made from the Python standard library's sources (text every machine has)."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import numpy as np

from brain_trainer.data.tokens.format import Manifest, in_validation, read_manifest
from brain_trainer.data.tokens.prepare import main

STDLIB = Path(sysconfig.get_paths()["stdlib"])
PROG = "python -m brain_trainer.tokens.prepare"
PROGRESS = ("tokenizing:", "training tokenizer:")


def stdlib_globs(*packages: str) -> list[str]:
    return [str(STDLIB / package / "*.py") for package in packages]


def stdlib_texts(*packages: str) -> list[str]:
    """The non-empty documents those globs give, in prepare's order."""
    paths = [p for package in packages for p in sorted((STDLIB / package).glob("*.py"))]
    return [t for t in (p.read_text(encoding="utf-8") for p in paths) if t]


def prepare(capsys, *argv: str) -> tuple[int, str, list[str]]:
    """Run the command line: (exit code, stdout, stderr lines other than progress)."""
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, [line for line in err.splitlines() if not line.startswith(PROGRESS)]


def split_texts(texts: list[str], seed: int, fraction: float) -> tuple[list[str], list[str]]:
    train = [t for t in texts if not in_validation(t, seed, fraction)]
    return train, [t for t in texts if in_validation(t, seed, fraction)]


def stream(folder: Path, split: str, manifest: Manifest | None = None) -> np.ndarray:
    """A split's whole token stream, read from its shard files."""
    manifest = manifest or read_manifest(folder)
    shards = manifest.split(split).shards
    return np.concatenate([np.fromfile(folder / s.name, dtype=np.dtype(manifest.dtype).newbyteorder("<")) for s in shards])


def documents(ids: np.ndarray, eot_id: int) -> list[np.ndarray]:
    """The stream cut at its end-of-text ids (each document is followed by one)."""
    ends = np.flatnonzero(ids == eot_id)
    assert len(ends) and ends[-1] == len(ids) - 1
    return [d[:-1] for d in np.split(ids, ends + 1)[:-1]]
