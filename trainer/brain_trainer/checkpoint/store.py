"""The checkpoint folder on disk: names, manifests, atomic commit, verification, retention.

Torch-free and collective-free: plain file operations that one process runs.

    checkpoint.dir/
      step-00000040/          committed: shards + .metadata + manifest.json
      step-00000060.tmp/      being written (or left by a crash): never loaded
      step-00000050.corrupt/  failed verification at load; kept for inspection
      set-aside-20250101T120000Z-resume-from-none/
                              checkpoints checkpoint.resume_from moved out of the way (resume_from.py)

A checkpoint is committed when its manifest is in place and its folder carries
the final name; both happen on one rank after every rank finished writing, so a
crash at any moment leaves either the old or the new checkpoint, never a torn one.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import shutil
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable

from ..contract import CHECKPOINT_PREFIX, TMP_SUFFIX, format_time, step_dir_name, step_of
from ..contract import MANIFEST_FILE as MANIFEST
from ..files import fsync_dir, write_atomic

try:  # ISA-L (the trainer extra): zlib's CRC-32, the same values, about 3x as fast
    from isal.isal_zlib import crc32
except ImportError:  # the operator's image only lists checkpoints; it never checksums
    from zlib import crc32

log = logging.getLogger(__name__)

MANIFEST_FORMAT = 1
CORRUPT_SUFFIX = ".corrupt"
DELETING_SUFFIX = ".deleting"
SET_ASIDE_PREFIX = "set-aside-"
SUM_SUFFIX = ".sum"  # per-shard sidecar written by the shard's own rank, folded into the manifest
_CHUNK = 8 << 20


def tmp_dir(root: Path, step: int) -> Path:
    return root / (step_dir_name(step) + TMP_SUFFIX)


class Checksum:
    """Running size and CRC-32 of a byte stream (CRC-32: fast, and corruption is what we detect, not tampering)."""

    def __init__(self) -> None:
        self.size = 0
        self.crc = 0

    def update(self, data: memoryview) -> None:
        self.crc = crc32(data, self.crc)
        self.size += data.nbytes

    def digest(self) -> dict[str, Any]:
        return {"size": self.size, "crc32": f"{self.crc:08x}"}


def file_digest(path: Path) -> dict[str, Any]:
    """Size and CRC-32 of a file, checksummed where it lies in the page cache (mapped, not copied out).

    One `_CHUNK` window is mapped at a time: a whole-file mapping would count
    the entire shard in the process's resident memory (and its cgroup's) at once.
    """
    checksum = Checksum()
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        for offset in range(0, size, _CHUNK):  # _CHUNK is a multiple of mmap.ALLOCATIONGRANULARITY
            length = min(_CHUNK, size - offset)
            with mmap.mmap(f.fileno(), length, offset=offset, access=mmap.ACCESS_READ) as mapped, \
                    memoryview(mapped) as view:
                checksum.update(view)
    return checksum.digest()


class ChecksummingWriter:
    """A binary file being written, checksummed on the way out: its digest needs no read-back.

    Every `_CHUNK` bytes it also starts the kernel's writeback of what came
    before, so the disk works while the writer serialises and checksums (the
    final fsync only waits for the tail). Writing is sequential only: with no
    seek, every byte written is every byte checksummed.
    """

    def __init__(self, raw: BinaryIO):
        self._raw = raw
        self.checksum = Checksum()
        self._flushed = 0  # bytes whose writeback has been started

    def write(self, data: Any) -> int:
        with memoryview(data) as whole:
            flat = whole.cast("B")
            for start in range(0, flat.nbytes, _CHUNK):
                piece = flat[start : start + _CHUNK]
                self._raw.write(piece)
                self.checksum.update(piece)
                if self.checksum.size - self._flushed >= _CHUNK:
                    self._start_writeback()
            return flat.nbytes

    def _start_writeback(self) -> None:
        self._raw.flush()
        end = self.checksum.size
        # DONTNEED starts asynchronous writeback of the range's dirty pages (and drops only clean ones).
        os.posix_fadvise(self._raw.fileno(), self._flushed, end - self._flushed, os.POSIX_FADV_DONTNEED)
        self._flushed = end

    def tell(self) -> int:
        return self._raw.tell()

    def flush(self) -> None:
        self._raw.flush()

    def fileno(self) -> int:
        return self._raw.fileno()

    def close(self) -> None:
        self._raw.close()


def write_shard_sums(folder: Path, digests: dict[str, dict[str, Any]]) -> None:
    """Record size and checksum of shards this rank wrote, next to them (read back at commit)."""
    for name, digest in digests.items():
        write_atomic(folder / (name + SUM_SUFFIX), json.dumps(digest))


def commit(folder: Path, final: Path, fields: dict[str, Any],
           before_rename: Callable[[], None] = lambda: None) -> dict[str, Any]:
    """Write the manifest into a fully written folder and rename it to its final name.

    `fields` are the caller's facts (step, world size, ...). Every file in the
    folder is listed with its size and checksum: shards from their ranks'
    sidecars, the rest (DCP's .metadata) digested here. `before_rename` may
    still refuse the commit by raising (the lease's fencing check, lease.py).
    """
    files: dict[str, Any] = {}
    for path in sorted(folder.iterdir()):
        if path.name.endswith(SUM_SUFFIX):
            continue
        sidecar = folder / (path.name + SUM_SUFFIX)
        files[path.name] = json.loads(sidecar.read_text()) if sidecar.exists() else file_digest(path)
    for sidecar in folder.glob("*" + SUM_SUFFIX):
        sidecar.unlink()
    manifest = {"format": MANIFEST_FORMAT, **fields, "time": format_time(), "files": files}
    write_atomic(folder / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))
    before_rename()
    if final.exists():  # only an unloadable one (no valid manifest): a valid one would have been resumed
        shutil.rmtree(final)
    os.rename(folder, final)
    fsync_dir(final.parent)
    return manifest


def is_file(path: Path) -> bool:
    return path.is_file()


def read_text(path: Path) -> str:
    return path.read_text()


def write_text(path: Path, text: str) -> None:
    """A small file of the checkpoint folder (resume_from's record), replaced atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text)


class ManifestError(ValueError):
    """A checkpoint folder whose manifest is missing, unreadable or disagrees with its files."""


def read_manifest(folder: Path) -> dict[str, Any]:
    try:
        text = (folder / MANIFEST).read_text()
    except FileNotFoundError:
        raise ManifestError(f"{folder}: no {MANIFEST} (not committed)") from None
    except (OSError, ValueError) as exc:
        raise ManifestError(f"{folder}: unreadable {MANIFEST}: {exc}") from None
    return parse_manifest(folder, text)


def parse_manifest(folder: Any, text: str) -> dict[str, Any]:
    """The manifest of `folder` (a volume's or a bucket's) from its text; ManifestError when it is not one."""
    try:
        manifest = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ManifestError(f"{folder}: unreadable {MANIFEST}: {exc}") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict) or "step" not in manifest:
        raise ManifestError(f"{folder}: {MANIFEST} lacks 'step' or 'files'")
    if manifest.get("format") != MANIFEST_FORMAT:
        raise ManifestError(f"{folder}: {MANIFEST} format {manifest.get('format')!r}, expected {MANIFEST_FORMAT}")
    return manifest


def verify_files(folder: Path, files: dict[str, Any], names: Iterable[str]) -> list[str]:
    """Problems with the named files against their manifest entries; [] when all match."""
    problems = []
    for name in names:
        want = files[name]
        path = folder / name
        try:
            size = path.stat().st_size
            if size != want["size"]:
                kind = "truncated" if size < want["size"] else "grown"
                problems.append(f"{name}: {size} bytes, manifest says {want['size']} ({kind})")
                continue
            got = file_digest(path)
        except OSError as exc:
            problems.append(f"{name}: {exc.strerror or exc}")
            continue
        if got["crc32"] != want["crc32"]:
            problems.append(f"{name}: checksum {got['crc32']}, manifest says {want['crc32']} (corrupted)")
    return problems


@dataclass(frozen=True)
class Candidate:
    """A committed-looking folder, newest first when listed; `error` says why it is unusable."""

    step: int
    path: Path
    manifest: dict[str, Any] | None
    error: str | None = None


def list_checkpoints(root: Path) -> list[Candidate]:
    """Folders named step-XXXXXXXX in root, newest first, with their parsed manifests."""
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        step = step_of(path.name)
        if step is None or not path.is_dir():
            continue
        try:
            found.append(Candidate(step, path, read_manifest(path)))
        except ManifestError as exc:
            found.append(Candidate(step, path, None, str(exc)))
    return sorted(found, key=lambda c: c.step, reverse=True)


def latest_checkpoint(root: str | os.PathLike) -> Path | None:
    """The newest committed checkpoint in root (manifest present; shards not verified)."""
    for candidate in list_checkpoints(Path(root)):
        if candidate.manifest is not None:
            return candidate.path
    return None


def _delete(path: Path) -> None:
    # Rename first: a crash mid-delete leaves a .deleting folder, never a committed-looking torso.
    doomed = path.with_name(path.name + DELETING_SUFFIX)
    os.rename(path, doomed)
    shutil.rmtree(doomed)


def remove_stale(root: Path) -> None:
    """Delete leftovers of saves and deletions that never finished (only while no save is in flight)."""
    if not root.is_dir():
        return
    for path in root.glob(CHECKPOINT_PREFIX + "*" + TMP_SUFFIX):
        log.warning("removing uncommitted checkpoint %s (its save was interrupted)", path)
        shutil.rmtree(path, ignore_errors=True)
    for path in root.glob(CHECKPOINT_PREFIX + "*" + DELETING_SUFFIX):
        shutil.rmtree(path, ignore_errors=True)


def quarantine(path: Path) -> Path:
    """Move a corrupt checkpoint out of the way, keeping it for inspection."""
    target = path.with_name(path.name + CORRUPT_SUFFIX)
    if target.exists():
        shutil.rmtree(target)
    os.rename(path, target)
    fsync_dir(path.parent)
    return target


def apply_retention(root: Path, keep_last: int) -> list[Path]:
    """Delete all but the newest keep_last committed checkpoints; returns what was deleted.

    Folders being written (.tmp) are not committed and never counted or touched.
    """
    committed = [c.path for c in list_checkpoints(root) if c.manifest is not None]
    doomed = committed[keep_last:]
    for path in doomed:
        _delete(path)
    return doomed


def lineage(root: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every checkpoint folder a run left, oldest first: committed or not (step-XXXXXXXX) and
    quarantined (.corrupt). Saves in progress and deletions (.tmp, .deleting) are remove_stale's."""
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        step = step_of(path.name.removesuffix(CORRUPT_SUFFIX))
        if step is not None and path.is_dir():
            found.append((step, path))
    return sorted(found)


def set_aside(root: Path, folders: list[Path], reason: str) -> Path:
    """Move folders of root into a new root/set-aside-<UTC time>-<reason>/ and return it.

    Renames on the same volume: nothing is copied or deleted. The name matches
    no checkpoint, so listing, resuming and retention never see what is inside.
    """
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    target = root / f"{SET_ASIDE_PREFIX}{stamp}-{reason}"
    for n in range(1, 1000):  # two in the same second (a test, a quick restart) get their own folders
        if not target.exists():
            break
        target = root / f"{SET_ASIDE_PREFIX}{stamp}-{reason}-{n}"
    target.mkdir()
    for folder in folders:
        os.rename(folder, target / folder.name)
    fsync_dir(target)
    fsync_dir(root)
    return target


def set_aside_folders(root: Path) -> list[Path]:
    """The set-aside folders in root, oldest first (their names start with the UTC time)."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob(SET_ASIDE_PREFIX + "*") if p.is_dir())
