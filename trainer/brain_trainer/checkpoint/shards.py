"""Writing and reading one checkpoint folder with torch.distributed.checkpoint (collective).

Every rank writes only the shards it owns (DCP deduplicates replicated
tensors, e.g. under DDP, and spreads their writes over the ranks) and records
their sizes and checksums; rank 0 then commits the folder (store.commit).
"""

from __future__ import annotations

import warnings
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.futures import Future as TorchFuture

from . import store


class ShardWriter(dcp.FileSystemWriter):
    """DCP's file writer, plus a size-and-checksum sidecar for every shard file it wrote."""

    def __init__(self, path: Path):
        super().__init__(path, sync_files=True)

    def write_data(self, plan, planner) -> TorchFuture:
        done = super().write_data(plan, planner)
        written = {result.storage_data.relative_path for result in done.wait()}
        store.write_shard_sums(Path(self.path), sorted(written))
        return done


# Without a process group DCP warns that it assumes one process: here that is the intent.
# (Process-wide: async saves run in other threads, where a local filter would not apply.)
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")


def _dist_kwargs(group: dist.ProcessGroup | None) -> dict[str, Any]:
    if dist.is_initialized():
        return {"process_group": group}
    return {"no_dist": True}


def save(state_dict: dict[str, Any], folder: Path, group: dist.ProcessGroup | None) -> None:
    dcp.save(state_dict, storage_writer=ShardWriter(folder), **_dist_kwargs(group))


def background_stager() -> DefaultStager:
    """Copies state to CPU memory in a background thread, reusing its buffers from one save to the next."""
    cuda = torch.cuda.is_available()
    return DefaultStager(StagingOptions(use_pinned_memory=cuda, use_shared_memory=False, use_async_staging=True,
                                        use_non_blocking_copy=cuda))


def async_save(state_dict: dict[str, Any], folder: Path, group: dist.ProcessGroup | None,
               stager: DefaultStager) -> tuple[Future, Future]:
    """Start a save; returns (staged, written) futures.

    Until `staged` is done the tensors in state_dict are being copied and must
    not change; `written` completes once DCP wrote every rank's shards.
    """
    response = dcp.async_save(state_dict, storage_writer=ShardWriter(folder), async_stager=stager,
                              **_dist_kwargs(group))
    return response.staging_completion, response.upload_completion


def saved_keys(folder: Path) -> set[str]:
    return set(dcp.FileSystemReader(folder).read_metadata().state_dict_metadata)


def load(state_dict: dict[str, Any], folder: Path, group: dist.ProcessGroup | None) -> None:
    """Fill state_dict in place from folder, resharding to this run's layout as needed."""
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
    dcp.load(template, storage_reader=dcp.FileSystemReader(folder), no_dist=True)
    return {key[len(prefix) + 1 :]: value for key, value in template.items()}
