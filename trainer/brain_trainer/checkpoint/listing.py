"""`braintrain checkpoints LOCATION`: the committed steps of a checkpoint folder or an s3://bucket/prefix.

    read(root)      the steps there, as the trainer sees them (location.py: a volume's or a bucket's functions)
    lines(found)    what the command prints (pure): one row per committed step, newest first, the latest marked;
                    then what is not committed (never loaded), quarantined or set aside, by name

Torch-free: the operator's CLI runs it (boto3 is imported when a bucket is first read).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..contract import CHECKPOINT_PREFIX, TMP_SUFFIX
from ..uris import place_problem
from . import bucket, location
from .compat import SETTINGS
from .store import CORRUPT_SUFFIX, Candidate

HEADER = ("STEP", "COMMITTED", "SIZE", "WORLD", "LAYOUT")


class ListingError(Exception):
    """LOCATION names no place, or its store cannot be reached; the message says which and why."""


@dataclass(frozen=True)
class Found:
    """What lies at a checkpoint location, each list newest (or oldest, for set-aside) first."""

    root: str
    committed: list[Candidate]
    uncommitted: list[tuple[str, str]]  # (folder name, why it is not loaded)
    quarantined: list[str]
    set_aside: list[str]


def layout(manifest: dict[str, Any]) -> str:
    """The strategy and model-parallel degrees the step was trained with, as its manifest recorded them."""
    settings = manifest.get(SETTINGS) or {}
    parts = [str(settings.get("distributed.strategy") or "-")]
    for key, mark in (("distributed.tensor_parallel", "tp"), ("distributed.pipeline_parallel", "pp")):
        degree = settings.get(key)
        if isinstance(degree, int) and degree > 1:
            parts.append(f"{mark}{degree}")
    return " ".join(parts)


def size_text(size: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


def row(candidate: Candidate, latest: bool) -> tuple[str, ...]:
    manifest = candidate.manifest or {}
    size = sum(int(entry.get("size", 0)) for entry in manifest.get("files", {}).values())
    world = manifest.get("world_size")
    return (str(candidate.step), str(manifest.get("time", "-")), size_text(size), str(world or "-"),
            layout(manifest) + ("  latest" if latest else ""))


def lines(found: Found) -> list[str]:
    """The command's output: a table of the committed steps, then a line for each kind of step not listed."""
    count = len(found.committed)
    out = [f"{found.root}: {count} committed checkpoint{'s' if count != 1 else ''}"
           + (", newest first" if count > 1 else "")]
    if found.committed:
        table = [HEADER, *(row(c, latest=i == 0) for i, c in enumerate(found.committed))]
        widths = [max(len(r[i]) for r in table) for i in range(len(HEADER) - 1)]
        for cells in table:
            out.append("  ".join([cells[0].rjust(widths[0]), *(c.ljust(w) for c, w in zip(cells[1:-1], widths[1:])),
                                  cells[-1]]).rstrip())
    if found.uncommitted:
        out.append("not committed (never loaded): " + "; ".join(f"{name} ({why})" for name, why in found.uncommitted))
    if found.quarantined:
        out.append("quarantined (refused or damaged at load): " + ", ".join(found.quarantined))
    if found.set_aside:
        out.append("set aside (by checkpoint.resumeFrom): " + ", ".join(found.set_aside))
    return out


def _why(candidate: Candidate) -> str:
    """Why a step is not loaded, without the path its error starts with."""
    error = candidate.error or "no manifest"
    return error.removeprefix(f"{candidate.path}: ")


def read(root: location.Root) -> Found:
    """The steps at `root` (store or bucket functions: location.py). Raises what the store raises."""
    files = location.store_for(root)
    candidates = files.list_checkpoints(root)
    uncommitted = [(c.path.name, _why(c)) for c in candidates if c.manifest is None]
    if not location.is_bucket(root):  # a volume's save in progress is a .tmp folder (a bucket's: a step without manifest)
        uncommitted += [(p.name, "being written, or interrupted") for p in root.glob(CHECKPOINT_PREFIX + "*" + TMP_SUFFIX)]
    return Found(
        root=str(root),
        committed=[c for c in candidates if c.manifest is not None],
        uncommitted=uncommitted,
        quarantined=[path.name for _, path in reversed(files.lineage(root)) if path.name.endswith(CORRUPT_SUFFIX)],
        set_aside=[path.name for path in files.set_aside_folders(root)],
    )


def list_location(text: str) -> list[str]:
    """`braintrain checkpoints LOCATION`'s output; ListingError for a bad URI, a missing folder, an unreachable store."""
    problem = place_problem(text)
    if problem is not None:
        raise ListingError(f"LOCATION: {problem}")
    root = location.root_of(text)
    if not location.is_bucket(root) and not root.is_dir():
        raise ListingError(f"{root}: no such folder")
    try:
        return lines(read(root))
    except ImportError as exc:  # boto3 and s3fs: the trainer's extra
        raise ListingError(f"{root}: reading a bucket needs the trainer extra (pip install 'brain-train[trainer]'): "
                           f"{exc}") from None
    except Exception as exc:
        if not location.is_bucket(root):
            raise
        raise ListingError(f"{root}: {bucket.explain(exc, root)}") from None

