"""Writing and reading one checkpoint folder with torch.distributed.checkpoint (collective).

Every rank writes only the shards it owns (DCP deduplicates replicated
tensors, e.g. under DDP, and spreads their writes over the ranks) and records
their sizes and checksums; rank 0 then commits the folder (store.commit).
"""

from __future__ import annotations

import contextlib
import warnings
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata
from torch.futures import Future as TorchFuture

from . import store


class ShardWriter(dcp.FileSystemWriter):
    """DCP's file writer, plus a size-and-checksum sidecar for every shard file it wrote."""

    def __init__(self, path: Path):
        # Pinned staging buffers are reused between async saves when there is a GPU to copy from.
        super().__init__(path, sync_files=True, cache_staged_state_dict=torch.cuda.is_available())

    def write_data(self, plan, planner) -> TorchFuture:
        done = super().write_data(plan, planner)
        written = {result.storage_data.relative_path for result in done.wait()}
        store.write_shard_sums(Path(self.path), sorted(written))
        return done


def _dist_kwargs(group: dist.ProcessGroup | None) -> dict[str, Any]:
    if dist.is_initialized():
        return {"process_group": group}
    return {"no_dist": True}


@contextlib.contextmanager
def _single_process_intended() -> Iterator[None]:
    # Without a process group DCP warns that it assumes one process: here that is the intent.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def save(state_dict: dict[str, Any], folder: Path, group: dist.ProcessGroup | None) -> None:
    with _single_process_intended():
        dcp.save(state_dict, storage_writer=ShardWriter(folder), **_dist_kwargs(group))


def async_save(state_dict: dict[str, Any], folder: Path, group: dist.ProcessGroup | None) -> Future:
    """Stage state_dict to CPU memory now (the caller's only stall), write it in a background thread."""
    with _single_process_intended():
        return dcp.async_save(state_dict, storage_writer=ShardWriter(folder), **_dist_kwargs(group))


def saved_keys(folder: Path) -> set[str]:
    return set(dcp.FileSystemReader(folder).read_metadata().state_dict_metadata)


def load(state_dict: dict[str, Any], folder: Path, group: dist.ProcessGroup | None) -> None:
    """Fill state_dict in place from folder, resharding to this run's layout as needed."""
    with _single_process_intended():
        dcp.load(state_dict, storage_reader=dcp.FileSystemReader(folder), **_dist_kwargs(group))


def load_prefix(folder: Path, prefix: str) -> dict[str, Any]:
    """The entries under `prefix.` as full, unsharded values, read in this process alone."""
    metadata = dcp.FileSystemReader(folder).read_metadata().state_dict_metadata
    template: dict[str, Any] = {}
    for key, meta in metadata.items():
        if not key.startswith(prefix + "."):
            continue
        if isinstance(meta, TensorStorageMetadata):
            template[key] = torch.empty(meta.size, dtype=meta.properties.dtype)
        elif isinstance(meta, BytesStorageMetadata):
            template[key] = None
    with _single_process_intended():
        dcp.load(template, storage_reader=dcp.FileSystemReader(folder), no_dist=True)
    return {key[len(prefix) + 1 :]: value for key, value in template.items()}
