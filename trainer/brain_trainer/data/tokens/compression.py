"""Compressed inputs: gzip, bzip2 and Zstandard files read as the bytes they hold.

The format is known by the file's first bytes, so a compressed file is read
as such whatever its name; the name, less a compression suffix, says what
kind of file it holds (`corpus.jsonl.gz` holds JSON Lines).
"""

from __future__ import annotations

import bz2
import io
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator, Optional

from isal import igzip  # ISA-L's gzip (the trainer extra): the same format, several times as fast to read

GZIP, BZIP2, ZSTD = "gzip", "bzip2", "Zstandard"
# Each format's magic number (RFC 1952; bzip2's "BZh" and block size digit; RFC 8878).
MAGIC = ((b"\x1f\x8b", GZIP), (b"BZh", BZIP2), (b"\x28\xb5\x2f\xfd", ZSTD))
SUFFIXES = (".gz", ".gzip", ".bz2", ".zst", ".zstd")
# What the readers raise on damaged or truncated data.
DAMAGED: tuple[type[BaseException], ...] = (OSError, EOFError, zlib.error)


class MissingDecompressor(RuntimeError):
    """The format needs a package that is not installed."""


class DamagedInput(ValueError):
    """Compressed data that does not decompress: damaged or cut short."""


def compression_of(path: Path) -> Optional[str]:
    """GZIP, BZIP2 or ZSTD when the file starts with that format's magic number, else None."""
    with open(path, "rb") as f:
        head = f.read(4)
    return next((name for magic, name in MAGIC if head.startswith(magic)), None)


def content_name(path: Path) -> str:
    """The file's name in lower case without a compression suffix: what says the kind of its content."""
    name = path.name.lower()
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _decompressing(compression: str, raw: BinaryIO) -> tuple[BinaryIO, tuple[type[BaseException], ...]]:
    """A reader of `raw`'s content, and what it raises on damaged data."""
    if compression == GZIP:
        return igzip.GzipFile(fileobj=raw, mode="rb"), DAMAGED
    if compression == BZIP2:
        return bz2.BZ2File(raw, "rb"), DAMAGED
    try:
        import zstandard
    except ImportError:
        raise MissingDecompressor("reading Zstandard needs the zstandard package: pip install 'brain-train[trainer]'") from None
    # every frame: zstd -T and pzstd write a file as several frames one after another
    reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
    return io.BufferedReader(reader), (*DAMAGED, zstandard.ZstdError)


@contextmanager
def open_input(path: Path, compression: Optional[str]) -> Iterator[tuple[BinaryIO, BinaryIO]]:
    """(the content as a buffered byte stream, the file itself, whose position counts the input bytes read).

    Data that does not decompress, read inside the block, raises DamagedInput.
    """
    with open(path, "rb") as raw:
        if compression is None:
            yield raw, raw
            return
        content, damaged = _decompressing(compression, raw)
        try:
            with content:
                yield content, raw
        except damaged as exc:
            raise DamagedInput(f"damaged {compression} data: {exc}") from None
