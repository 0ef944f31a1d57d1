"""Writing and reading one checkpoint folder with torch.distributed.checkpoint (collective).

Every rank writes only the shards it owns (DCP deduplicates replicated
tensors, e.g. under DDP, and spreads their writes over the ranks) and records
their sizes and checksums; rank 0 then commits the folder (store.commit).

The project's own non-tensor state (JsonText items: the step, the LR
schedule, the grad scaler, RNG states) is written as UTF-8 JSON bytes, where
DCP would torch.save (pickle) it, and read back with json alone.

Reading is the project's one way into a checkpoint, and it runs no code from
it: DCP's `.metadata` is a pickle, unpickled here admitting only the classes
DCP's metadata is made of; a JsonText item must be JSON (a pickle there is
never unpickled); other non-tensor items (the optimizer's param groups, a
module's extra state, the training state of older checkpoints) are torch.save
pickles, loaded here with torch's weights-only unpickler (DCP's own planner
loads them with weights_only=False). Anything else raises RefusedCheckpoint,
naming the file and what it holds.
"""

from __future__ import annotations

import dataclasses
import enum
import io
import json
import math
import os
import pickle
import re
import sys
import warnings
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path, PosixPath, PurePosixPath
from typing import IO, Any, Iterator, Optional

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.filesystem import FileSystem, _StorageInfo
from torch.distributed.checkpoint.metadata import (
    _MEM_FORMAT_ENCODING,
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem, WriteItem, WriteItemType
from torch.distributed.checkpoint.staging import AsyncStager
from torch.futures import Future as TorchFuture
from torch.serialization import _get_layout
from torch.utils.serialization import config as serialization_config

from ..resilience.failures import causes
from . import location, store
from .bucket import open_read
from .bucket_files import UPLOAD_THREADS, ObjectFiles

METADATA_FILE = ".metadata"  # DCP's name for it
ONLY_DATA = "a checkpoint holds only data; see docs/security.md"


class RefusedCheckpoint(Exception):
    """A checkpoint file holds something other than data, so it is not loaded: `path` is the file, `problem` what."""

    def __init__(self, path: Path, problem: str):
        super().__init__(path, problem)
        self.path = path
        self.problem = problem

    @property
    def reason(self) -> str:
        return f"{self.problem} ({ONLY_DATA})"

    def __str__(self) -> str:
        return f"{self.path.parent.name}/{self.path.name}: {self.reason}"


# What DCP's .metadata is made of (found by logging find_class over plain, DDP and FSDP2 checkpoints with
# optimizer state): its dataclasses, torch.Size, the path in StorageMeta, and layouts by name
# (_get_layout returns only a torch.layout). Dtypes are admitted by value below.
_METADATA_GLOBALS = {
    (obj.__module__, obj.__qualname__): obj
    for obj in (Metadata, MetadataIndex, StorageMeta, TensorProperties, TensorStorageMetadata, BytesStorageMetadata,
                ChunkStorageMetadata, _MEM_FORMAT_ENCODING, _StorageInfo, torch.Size, PosixPath, PurePosixPath,
                _get_layout)
}


class _MetadataUnpickler(pickle.Unpickler):
    """pickle's Unpickler admitting only DCP metadata's globals: no other callable can be reached, so no code runs."""

    def __init__(self, file: IO[bytes], path: Path):
        super().__init__(file)
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        found = _METADATA_GLOBALS.get((module, name))
        if found is None and module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            found = getattr(torch, name)  # a dtype pickles as the global torch.<name>
        if found is None and (module, name) == ("builtins", "getattr"):
            found = self._enum_member
        if found is None:
            raise RefusedCheckpoint(self.path, f"refuses to unpickle {module}.{name}")
        return found

    def _enum_member(self, cls: Any, name: Any) -> enum.Enum:
        """What `getattr(cls, name)` gives, for an admitted Enum's member only: Python 3.11.0-3.11.4 pickle an enum
        member as that call (Debian 12's 3.11.2 among them), later ones by value."""
        if cls in _METADATA_GLOBALS.values() and isinstance(cls, enum.EnumMeta) and name in cls.__members__:
            return cls[name]
        raise RefusedCheckpoint(self.path, f"refuses to unpickle getattr({getattr(cls, '__name__', cls)!r}, {name!r})")


def read_metadata(path: location.Root) -> Metadata:
    """DCP's .metadata at `path`, unpickled admitting only its own classes; its files must lie in its folder."""
    with open_read(path) if location.is_bucket(path) else open(path, "rb") as file:
        metadata = _MetadataUnpickler(file, path).load()
    if not isinstance(metadata, Metadata):
        raise RefusedCheckpoint(path, f"holds a {type(metadata).__name__}, not DCP's Metadata")
    for info in (metadata.storage_data or {}).values():
        name = getattr(info, "relative_path", None)
        if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
            # DCP would open whatever path is written here: a shard is a file of this folder, nothing else.
            raise RefusedCheckpoint(path, f"names {name!r} as a shard, not a file of its folder")
    return metadata


_GLOBAL = re.compile(r"GLOBAL (\S+)")


def _refusal(message: str) -> str:
    """What torch's weights-only unpickler refused, named as the .metadata check names it."""
    found = _GLOBAL.search(message)
    if found is None:
        return "is not plain data"
    name = found.group(1)  # torch's message drops the module of builtins
    return f"refuses to unpickle {name if '.' in name else 'builtins.' + name}"


class JsonText(str):
    """A state-dict item that is JSON text: saved as its UTF-8 bytes, loaded as the parsed JSON value.

    In a load's template it says that the item must be JSON: whatever else the file holds there is refused.
    """


# What a pickle begins with where JSON was expected: torch.save's zip archive, or a bare pickle's PROTO opcode.
_PICKLE_STARTS = (b"PK\x03\x04", b"\x80")


def _parse_json(raw: bytes) -> Any:
    """The JSON value of an item's bytes; ValueError naming what they are instead."""
    if raw.startswith(_PICKLE_STARTS):
        raise ValueError("holds a pickle where JSON belongs (not unpickled)")
    try:
        return json.loads(raw.decode("utf-8"))
    except RecursionError:  # nesting deeper than Python's parser recurses: no state of ours is near it
        raise ValueError("holds JSON nested too deep") from None
    except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError alike
        raise ValueError(f"holds no valid JSON ({exc})") from None


class _JsonSavePlanner(DefaultSavePlanner):
    """DCP's save planner, writing a JsonText item as its UTF-8 bytes where DCP would torch.save (pickle) it."""

    def transform_object(self, write_item: WriteItem, object: Any) -> Any:
        if write_item.type == WriteItemType.BYTE_IO and isinstance(object, JsonText):
            return io.BytesIO(object.encode("utf-8"))
        return super().transform_object(write_item, object)


class _DataOnlyPlanner(DefaultLoadPlanner):
    """DCP's load planner, loading a JsonText item with json, and other non-tensor items with torch's
    weights-only unpickler (DCP's: weights_only=False)."""

    def __init__(self, folder: Path):
        super().__init__()
        self.folder = folder

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        fqn = read_item.dest_index.fqn
        if isinstance(self.state_dict.get(fqn), JsonText):
            try:
                loaded = _parse_json(value.getvalue())
            except ValueError as exc:
                raise self._refused(read_item, str(exc)) from None
        else:
            try:
                loaded = torch.load(value, weights_only=True)
            except pickle.UnpicklingError as exc:
                raise self._refused(read_item, _refusal(str(exc))) from None
        if self.flatten_state_dict:  # as DefaultLoadPlanner.load_bytes puts it
            set_element(self.original_state_dict, self.mappings[fqn], loaded)
        else:
            self.state_dict[fqn] = loaded

    def _refused(self, read_item: ReadItem, problem: str) -> RefusedCheckpoint:
        file = self.folder / self.metadata.storage_data[read_item.storage_index].relative_path
        return RefusedCheckpoint(file, f"{read_item.storage_index.fqn}: {problem}")


class _Checksumming:
    """A DCP file system that checksums each file it writes as the bytes go out (`checksummer` wraps the stream)."""

    checksummer: type[store.ChecksummingWriter]

    def __init__(self) -> None:
        super().__init__()
        self.digests: dict[str, dict[str, Any]] = {}

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator[Any]:
        if mode != "wb":
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        # The file's own CRC-32 covers every byte and is verified at load, and
        # torch.load never checks the one torch.save computes per tensor: skip
        # that second pass over the data. The patch holds in this thread only.
        with super().create_stream(path, mode) as raw, serialization_config.patch({"save.compute_crc32": False}):
            stream = self.checksummer(raw)
            yield stream
        self.digests[Path(path).name] = stream.checksum.digest()


class _ChecksummedFiles(_Checksumming, FileSystem):
    """DCP's local file system, checksumming."""

    checksummer = store.ChecksummingWriter


class _ChecksummedObjects(_Checksumming, ObjectFiles):
    """DCP's file system on a bucket, checksumming (bucket_files.py)."""


class ShardWriter(dcp.FileSystemWriter):
    """DCP's file writer, plus a size-and-checksum sidecar for every shard file it wrote.

    On a volume, files are fsynced; on a bucket, a file is durable once its upload completes (at close), and
    each rank writes through several threads (bucket_files.py).
    """

    def __init__(self, path: location.Root):
        on_bucket = location.is_bucket(path)
        options = {"sync_files": False, "thread_count": UPLOAD_THREADS} if on_bucket else {"sync_files": True}
        super().__init__(str(path) if on_bucket else path, **options)
        self.folder = path
        self.fs = _ChecksummedObjects() if on_bucket else _ChecksummedFiles()
        self.path = str(path) if on_bucket else path

    def write_data(self, plan, planner) -> TorchFuture:
        done = super().write_data(plan, planner)
        written = sorted({result.storage_data.relative_path for result in done.wait()})
        location.store_for(self.folder).write_shard_sums(self.folder, {name: self.fs.digests[name] for name in written})
        return done


# Without a process group DCP warns that it assumes one process: here that is the intent.
# (Process-wide: async saves run in other threads, where a local filter would not apply.)
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")


def _dist_kwargs(group: dist.ProcessGroup | None) -> dict[str, Any]:
    if dist.is_initialized():
        return {"process_group": group}
    return {"no_dist": True}


def save(state_dict: dict[str, Any], folder: Path, group: dist.ProcessGroup | None) -> None:
    dcp.save(state_dict, storage_writer=ShardWriter(folder), planner=_JsonSavePlanner(), **_dist_kwargs(group))


def async_save(state_dict: dict[str, Any], folder: Path, group: dist.ProcessGroup | None,
               stager: AsyncStager) -> tuple[Future, Future]:
    """Start a save; returns (staged, written) futures.

    Until `staged` is done the tensors in state_dict are being copied and must
    not change; `written` completes once DCP wrote every rank's shards.
    """
    response = dcp.async_save(state_dict, storage_writer=ShardWriter(folder), planner=_JsonSavePlanner(),
                              async_stager=stager, **_dist_kwargs(group))
    return response.staging_completion, response.upload_completion


def _row_range(saved: torch.Tensor, item: ReadItem) -> tuple[int, int] | None:
    """(offset, size) in bytes of what `item` reads of the saved tensor, when those bytes are one run."""
    if not saved.is_contiguous() or saved.storage_offset() != 0:
        return None
    if any(item.storage_offsets[1:]) or tuple(item.lengths[1:]) != tuple(saved.shape[1:]):
        return None  # not whole rows: the bytes are scattered
    row = math.prod(saved.shape[1:]) * saved.element_size()
    if saved.dim() == 0:
        return 0, row
    return item.storage_offsets[0] * row, item.lengths[0] * row


class ShardReader(dcp.FileSystemReader):
    """DCP's file reader, reading a tensor straight into its destination where the layout allows.

    DCP unpickles each saved tensor into new memory and then copies it into
    place. When the destination is a plain contiguous CPU tensor and what it
    takes of the saved one is whole rows (all of it when resuming at the same
    world size, a range of rows after resharding dim-0 shards), one read from
    the file fills it instead. Everything else takes DCP's own path.
    Its metadata is read by read_metadata, which runs no code from the file.
    """

    def __init__(self, path: location.Root):
        on_bucket = location.is_bucket(path)
        super().__init__(str(path) if on_bucket else path)
        self.folder = path
        if on_bucket:
            self.fs, self.path = ObjectFiles(), str(path)

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        metadata = read_metadata(self.folder / os.path.basename(self._get_metadata_path(kwargs.get("rank"))))
        # As FileSystemReader.read_metadata finishes it: DCP's load reads this id.
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> TorchFuture:
        by_file: dict[str, list[ReadItem]] = {}
        rest = []
        for item in plan.items:
            info = self.storage_data[item.storage_index]
            if item.type == LoadItemType.TENSOR and not info.transform_descriptors:
                by_file.setdefault(info.relative_path, []).append(item)
            else:
                rest.append(item)
        for relative_path, items in by_file.items():
            with self.fs.create_stream(self.fs.concat_path(self.path, relative_path), "rb") as stream:
                for item in sorted(items, key=lambda item: self.storage_data[item.storage_index].offset):
                    if not self._read_in_place(stream, item, planner):
                        rest.append(item)
        return super().read_data(dataclasses.replace(plan, items=rest), planner)

    def _read_in_place(self, stream: Any, item: ReadItem, planner: LoadPlanner) -> bool:
        info = self.storage_data[item.storage_index]
        target = planner.resolve_tensor(item).detach()
        if type(target) is not torch.Tensor or target.device.type != "cpu" or not target.is_contiguous():
            return False
        blob = self._slice_file(stream, info)
        record = torch._C.PyTorchFileReader(blob)
        if not record.has_record("byteorder") or record.get_record("byteorder").decode() != sys.byteorder:
            return False
        blob.seek(0)
        saved = torch.load(blob, map_location="meta", weights_only=True)  # shape, strides, dtype; no data read
        rows = _row_range(saved, item)
        if rows is None or saved.dtype != target.dtype or rows[1] != target.nbytes:
            return False
        stream.seek(info.offset + saved.untyped_storage()._checkpoint_offset + rows[0])
        if stream.readinto(target.view(-1).view(torch.uint8).numpy()) != rows[1]:
            raise OSError(f"{info.relative_path}: ends inside {item.storage_index.fqn}")
        planner.commit_tensor(item, target)
        return True


def saved_shapes(folder: Path) -> dict[str, Optional[tuple[int, ...]]]:
    """Every key of a checkpoint with its tensor's global shape (None: not a tensor), from DCP's .metadata."""
    metadata = read_metadata(folder / METADATA_FILE).state_dict_metadata
    return {key: tuple(meta.size) if isinstance(meta, TensorStorageMetadata) else None for key, meta in metadata.items()}


def item_file(folder: Path, key: str) -> Path:
    """The file of `folder` that holds the item `key` (or the items below it), by DCP's .metadata."""
    metadata = read_metadata(folder / METADATA_FILE)
    names = (info.relative_path for index, info in metadata.storage_data.items()
             if index.fqn == key or index.fqn.startswith(key + "."))
    return folder / next(names, METADATA_FILE)


def tensor_shapes(entries: dict[str, Any], prefix: str = "") -> dict[str, tuple[int, ...]]:
    """{name: shape} of the tensors whose key starts with `prefix` (dropped): of saved_shapes, or of a state dict.

    A state dict's DTensors give their global shapes, as DCP records them.
    """
    shapes = {}
    for key, entry in entries.items():
        shape = tuple(entry.shape) if isinstance(entry, torch.Tensor) else entry
        if key.startswith(prefix) and isinstance(shape, tuple):  # not bytes, nor a module's extra state
            shapes[key[len(prefix) :]] = shape
    return shapes


# What a failed `load` raises: DCP gathers every rank's error into a CheckpointException, a BaseException.
LOAD_ERRORS = (Exception, CheckpointException)


@contextmanager
def _refusals_named() -> Iterator[None]:
    """A refusal on any rank is raised as itself on every rank (DCP hands each rank every rank's errors)."""
    try:
        yield
    except CheckpointException as exc:
        refused = next((cause for cause in causes(exc) if isinstance(cause, RefusedCheckpoint)), None)
        if refused is None:
            raise
        raise refused from exc


def _load(state_dict: dict[str, Any], folder: Path, **where: Any) -> None:
    with _refusals_named():
        dcp.load(state_dict, storage_reader=ShardReader(folder), planner=_DataOnlyPlanner(folder), **where)


def load(state_dict: dict[str, Any], folder: Path, group: dist.ProcessGroup | None) -> None:
    """Fill state_dict in place from folder, resharding to this run's layout as needed.

    Raises RefusedCheckpoint, on every rank, when a file holds more than data.
    """
    _load(state_dict, folder, **_dist_kwargs(group))


def load_local(state_dict: dict[str, Any], folder: Path) -> None:
    """`load` in this process alone, with no process group (export, tests)."""
    _load(state_dict, folder, no_dist=True)


def load_prefix(folder: Path, prefix: str) -> dict[str, Any]:
    """The entries under `prefix.` as full, unsharded values, read in this process alone."""
    metadata = read_metadata(folder / METADATA_FILE).state_dict_metadata
    template: dict[str, Any] = {}
    for key, meta in metadata.items():
        if not key.startswith(prefix + "."):
            continue
        if isinstance(meta, TensorStorageMetadata):
            template[key] = torch.empty(meta.size, dtype=meta.properties.dtype)
        elif isinstance(meta, BytesStorageMetadata):
            template[key] = None
    load_local(template, folder)
    return {key[len(prefix) + 1 :]: value for key, value in template.items()}
