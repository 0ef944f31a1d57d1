"""Writing a dataset folder: shards cut at a fixed size, then an atomic commit.

Everything is written into a hidden temporary folder beside the output; the
manifest goes in last, then one rename gives the folder its name. A crash at
any moment leaves either no dataset or a complete one under the output name.
"""

from __future__ import annotations

import os
import shutil
import uuid
import zlib
from pathlib import Path
from types import TracebackType
from typing import BinaryIO, Optional

import numpy as np

from ...files import fsync_dir
from .format import FORMAT, SPLITS, DataError, Manifest, Shard, Split, TokenizerInfo, read_manifest, shard_name, write_manifest


def sibling(out: Path, suffix: str) -> Path:
    """A new hidden folder beside `out` (same file system, so renames are atomic), with the usual permissions.

    Not tempfile.mkdtemp: its 0700 folder would keep workers running as another user out of the dataset.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    path = out.parent / f".{out.name}.{uuid.uuid4().hex[:12]}{suffix}"
    path.mkdir(mode=0o777)  # less the umask
    return path


def check_destination(out: Path, force: bool) -> None:
    """DataError unless `out` is absent, an empty folder, or (with force) a dataset prepared before."""
    if out.exists() and not (out.is_dir() and not any(out.iterdir())):
        if not force:
            raise DataError(f"{out}: already exists; --force replaces a dataset prepared before")
        try:
            read_manifest(out)
        except DataError:
            raise DataError(f"{out}: exists and is not a token dataset; not replacing it") from None


class ShardWriter:
    """One split's token stream, appended to files of `shard_tokens` ids each (the last one shorter)."""

    def __init__(self, folder: Path, split: str, dtype: str, shard_tokens: int):
        self.folder = folder
        self.split = split
        self.dtype = np.dtype(dtype).newbyteorder("<")  # the format is little-endian on every machine
        self.shard_tokens = shard_tokens
        self.shards: list[Shard] = []
        self.documents = 0
        self.tokens = 0
        self._file: Optional[BinaryIO] = None
        self._crc = 0
        self._in_file = 0

    def write(self, ids: np.ndarray, documents: int) -> None:
        """Append ids (whole documents, each already followed by end-of-text)."""
        ids = np.ascontiguousarray(ids, dtype=self.dtype)
        self.documents += documents
        self.tokens += len(ids)
        while len(ids):
            if self._file is None:
                self._file = open(self.folder / shard_name(self.split, len(self.shards)), "wb")
            piece, ids = ids[: self.shard_tokens - self._in_file], ids[self.shard_tokens - self._in_file :]
            self._file.write(piece.data)
            self._crc = zlib.crc32(piece.data, self._crc)
            self._in_file += len(piece)
            if self._in_file == self.shard_tokens:
                self._finish_file()

    def _finish_file(self) -> None:
        assert self._file is not None
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self.shards.append(Shard(name=shard_name(self.split, len(self.shards)), tokens=self._in_file, crc32=f"{self._crc:08x}"))
        self._file, self._crc, self._in_file = None, 0, 0

    def close(self) -> Split:
        if self._file is not None:
            self._finish_file()
        return Split(documents=self.documents, tokens=self.tokens, shards=self.shards)

    def abort(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class DatasetWriter:
    """A dataset folder under construction (a context manager: an exception removes what was written).

    An existing `out` is replaced only with `force`, and only if it is a token
    dataset itself: prepare never deletes a folder it did not make.
    """

    def __init__(self, out: Path, dtype: str, shard_tokens: int, *, force: bool = False):
        check_destination(out, force)
        self.out = out
        self.dtype = dtype
        self.tmp = sibling(out, ".tmp")
        self.splits = {name: ShardWriter(self.tmp, name, dtype, shard_tokens) for name in SPLITS}

    def __enter__(self) -> "DatasetWriter":
        return self

    def __exit__(self, kind: Optional[type], exc: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        if exc is not None:
            for writer in self.splits.values():
                writer.abort()
            shutil.rmtree(self.tmp, ignore_errors=True)

    def write(self, split: str, ids: np.ndarray, documents: int) -> None:
        self.splits[split].write(ids, documents)

    def tokens(self, split: str) -> int:
        return self.splits[split].tokens

    def documents(self, split: str) -> int:
        return self.splits[split].documents

    def add_file(self, name: str, text: str) -> None:
        with open(self.tmp / name, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())

    def commit(self, tokenizer: TokenizerInfo, val_fraction: float, seed: int, inputs: list[str], skipped: int) -> Manifest:
        """Close the shards, write the manifest last, and give the folder its name."""
        splits = {name: writer.close() for name, writer in self.splits.items()}
        manifest = Manifest(format=FORMAT, dtype=self.dtype, tokenizer=tokenizer, train=splits["train"],
                            validation=splits["validation"], val_fraction=val_fraction, seed=seed, inputs=inputs,
                            skipped=skipped)
        write_manifest(self.tmp, manifest)
        if self.out.exists() and any(self.out.iterdir()):
            # Move the old dataset aside (one rename), put the new one in place, then delete the old.
            old = sibling(self.out, ".old")
            os.rename(self.out, old / self.out.name)
            os.rename(self.tmp, self.out)
            shutil.rmtree(old)
        else:
            os.rename(self.tmp, self.out)  # onto nothing, or onto an empty folder
        fsync_dir(self.out.parent)
        return manifest
