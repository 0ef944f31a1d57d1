"""A token dataset's folder in an object store (`s3://bucket/prefix`), through s3fs: the only module that talks to it.

The endpoint and credentials are the environment's (s3.py, the process's one s3fs client, made anew in a
DataLoader worker). Errors are DataError naming the object's URI. Torch- and numpy-free.
"""

from __future__ import annotations

import asyncio
import base64
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, TypeVar

from ...s3 import filesystem
from ...uris import uri_problem
from ..errors import DataError
from .format import StoredObject

# S3's largest single PUT: a shard below it is stored whole, with the manifest's CRC-32 for the store to check on
# upload and to report on HEAD (a multipart object's checksum is of its parts, not of the file).
SINGLE_PUT_BYTES = 5 << 30
T = TypeVar("T")
_RAISE = object()  # _call's default: a missing object is an error


def crc32_base64(crc32_hex: str) -> str:
    """The manifest's CRC-32 (8 hex digits) as S3 writes it (base64 of the big-endian bytes)."""
    return base64.b64encode(bytes.fromhex(crc32_hex)).decode()


def crc32_hex(crc32_b64: str) -> str:
    return base64.b64decode(crc32_b64).hex()


@dataclass(frozen=True)
class BucketFolder:
    """The objects under `uri` (s3://bucket/prefix, or s3://bucket for its root), named as a folder's files."""

    uri: str

    def __post_init__(self) -> None:
        problem = uri_problem(self.uri.rstrip("/"))
        if problem is not None:
            raise DataError(problem)
        object.__setattr__(self, "uri", self.uri.rstrip("/"))

    @property
    def key_prefix(self) -> str:
        """bucket/prefix, as s3fs names it."""
        return self.uri[len("s3://"):]

    def path(self, name: str) -> str:
        return f"{self.key_prefix}/{name}"

    def uri_of(self, name: str) -> str:
        return f"{self.uri}/{name}"

    def _call(self, what: str, action: Callable[[], T], missing: Any = _RAISE) -> T:
        """action(), or `missing` where it finds nothing; DataError naming `what` for anything else."""
        try:
            return action()
        except FileNotFoundError as exc:
            if missing is not _RAISE:
                return missing
            raise DataError(f"{what}: not found: {exc}") from None
        except Exception as exc:  # s3fs and botocore raise many kinds (credentials, endpoint, permissions)
            raise DataError(f"{what}: {type(exc).__name__}: {exc}") from None

    def read_text(self, name: str) -> Optional[str]:
        """The object's text; None when it does not exist."""
        data = self._call(self.uri_of(name), lambda: filesystem().cat_file(self.path(name)), missing=None)
        if data is None:
            return None
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DataError(f"{self.uri_of(name)}: unreadable: {exc}") from None

    def names(self) -> list[str]:
        """The objects under the prefix (one listing)."""
        listed = self._call(self.uri, lambda: filesystem().ls(self.key_prefix, detail=False, refresh=True), missing=[])
        return [p[len(self.key_prefix) + 1:] for p in listed if p.startswith(self.key_prefix + "/")]

    def objects(self, names: Iterable[str]) -> dict[str, Optional[StoredObject]]:
        """Size and stored CRC-32 of each named object (None: missing), one HEAD each, all at once."""
        names = list(names)
        fs = filesystem()
        bucket = self.key_prefix.split("/", 1)[0]

        async def heads() -> list[Any]:
            return await asyncio.gather(*(
                fs._call_s3("head_object", Bucket=bucket, Key=self.path(n)[len(bucket) + 1:], ChecksumMode="ENABLED")
                for n in names), return_exceptions=True)

        from fsspec.asyn import sync

        found: dict[str, Optional[StoredObject]] = {}
        for name, head in zip(names, self._call(self.uri, lambda: sync(fs.loop, heads))):
            if isinstance(head, FileNotFoundError):
                found[name] = None
            elif isinstance(head, BaseException):
                raise DataError(f"{self.uri_of(name)}: {type(head).__name__}: {head}")
            else:
                crc = head.get("ChecksumCRC32")
                found[name] = StoredObject(int(head["ContentLength"]), crc32_hex(crc) if crc else None)
        return found

    def ranges(self, requests: list[tuple[str, int, int]]) -> list[bytes]:
        """The bytes [start, end) of each (name, start, end), fetched concurrently; DataError naming the first object
        that fails or comes back short."""
        fs = filesystem()
        paths = [self.path(name) for name, _, _ in requests]
        starts = [start for _, start, _ in requests]
        ends = [end for _, _, end in requests]
        got = self._call(self.uri, lambda: fs.cat_ranges(paths, starts, ends, on_error="return"))
        for (name, start, end), data in zip(requests, got):
            if isinstance(data, BaseException):
                raise DataError(f"{self.uri_of(name)}: {type(data).__name__}: {data} (reading bytes {start}-{end})")
            if len(data) != end - start:
                raise DataError(f"{self.uri_of(name)}: {len(data)} bytes at byte {start}, expected {end - start} "
                                "(the object changed since the dataset was opened)")
        return got

    def upload(self, local: Path, name: str, crc32: Optional[str] = None) -> None:
        """Store a file as `name`; with the manifest's crc32, the store checks the bytes it received against it."""
        checked = {}
        if crc32 is not None and local.stat().st_size < SINGLE_PUT_BYTES:
            checked = {"ChecksumAlgorithm": "CRC32", "ChecksumCRC32": crc32_base64(crc32)}
        self._call(self.uri_of(name), lambda: filesystem().put_file(str(local), self.path(name),
                                                                    chunksize=SINGLE_PUT_BYTES, **checked))

    def remove(self, names: Iterable[str]) -> None:
        paths = [self.path(n) for n in names]
        if paths:
            self._call(self.uri, lambda: filesystem().rm(paths))
