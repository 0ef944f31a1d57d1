"""DCP's file system on a bucket (shards.py's writer and reader use it for an s3:// checkpoint).

Writing streams: each shard file is an s3fs file whose buffer is uploaded as a multipart part whenever it
fills (s3.PART_BYTES), while DCP goes on serialising; nothing is staged on local disk. Every rank writes its
own files, each with `UPLOAD_THREADS` of DCP's writer threads (one file per thread), so a save uploads
ranks x threads parts at once. An upload is complete when its file closes; a crash leaves an unfinished
multipart upload, which the next holder aborts (bucket.remove_stale).

Reading is ranged: DCP opens a shard and seeks to each tensor; s3fs fetches the bytes asked for (read ahead
by one block), so a rank reads only its part of each file, every rank at once.
"""

from __future__ import annotations

import os
from typing import Any

from torch.distributed.checkpoint._fsspec_filesystem import FileSystem as FsspecFileSystem

from ..s3 import filesystem
from .store import ChecksummingWriter

UPLOAD_THREADS = 4  # DCP's writer threads per rank on a bucket: parallel multipart uploads


class StreamChecksummer(ChecksummingWriter):
    """ChecksummingWriter over an upload stream: no kernel writeback to start, s3fs uploads as its buffer fills."""

    def _start_writeback(self) -> None:
        self._flushed = self.checksum.size


class ObjectFiles(FsspecFileSystem):
    """DCP's fsspec file system, on this process's s3fs client (s3.py: endpoint and credentials from the
    environment, no listing cache)."""

    checksummer = StreamChecksummer

    def __init__(self) -> None:
        super().__init__()
        self.fs = filesystem()

    def init_path(self, path: str | os.PathLike, **kwargs: Any) -> str | os.PathLike:
        return path

    def mkdir(self, path: str | os.PathLike) -> None:
        pass  # a bucket has no folders (s3fs would create a missing bucket here; the probe has checked it exists)
