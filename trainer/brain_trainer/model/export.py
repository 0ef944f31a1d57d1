"""The weights of `braintrain export CHECKPOINT OUT` (hf/export.py adds the files transformers needs): safetensors.

CHECKPOINT is a committed checkpoint folder (step-XXXXXXXX/, or one written by
save_model) or a checkpoint.dir, meaning its newest committed checkpoint. Its
files are verified against the manifest; the model's tensors (whatever world
size wrote them) are read whole, a few at a time, and streamed into OUT:

    OUT/model.safetensors                                   one file, or with --max-shard-size
    OUT/model-00001-of-0000N.safetensors ...                shards of at most that size
    OUT/model.safetensors.index.json                        {"metadata": {"total_size"}, "weight_map"}
    OUT/config.json                                         the preset or entrypoint and its dimensions

Memory: each shard's header is written first (the checkpoint's metadata gives
every shape), then its tensors in batches of at most the shard size (and
LOAD_BUDGET), so the peak is one batch plus one converted tensor. OUT is
assembled in OUT.tmp and renamed into place: a failed export leaves no folder
that looks complete. An existing, non-empty OUT is replaced only with --force.
Optimizer state is not read.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from ..checkpoint import location, shards, store
from ..config.presets import preset_config
from ..parallel.fsdp import DTYPES
from ..schema import to_dict
from . import safetensors_io as st
from .init_from import MODEL_PREFIX, SOURCE_HASH_KEY, SOURCE_STEP_KEY

LOAD_BUDGET = 256 << 20  # bytes read from the checkpoint at once, whatever the shard size
CONFIG_FILE = "config.json"
DELETING_SUFFIX = ".deleting"


class ExportError(Exception):
    pass


def resolve(checkpoint: str | os.PathLike) -> location.Root:
    """The committed checkpoint folder (or a bucket's prefix: s3://...) that CHECKPOINT names."""
    path = location.root_of(checkpoint)
    found = location.committed(path)
    if found is None:
        raise ExportError(f"{path}: neither a committed checkpoint (no {store.MANIFEST}) nor a folder holding one")
    return found


@dataclass(frozen=True)
class Tensor:
    """One model tensor in the checkpoint and how it is written."""

    name: str  # without the "model." prefix
    shape: tuple[int, ...]
    source: torch.dtype  # as saved
    target: torch.dtype  # as exported

    @property
    def source_bytes(self) -> int:
        return math.prod(self.shape) * torch.empty((), dtype=self.source).element_size()

    @property
    def target_bytes(self) -> int:
        return math.prod(self.shape) * torch.empty((), dtype=self.target).element_size()

    @property
    def st_dtype(self) -> str:
        return st.TORCH_DTYPES[self.target]


def model_tensors(folder: Path, dtype: Optional[str]) -> list[Tensor]:
    """The checkpoint's model tensors in saved order; floating-point ones cast to `dtype` when given."""
    metadata = shards.read_metadata(folder / shards.METADATA_FILE).state_dict_metadata
    tensors = []
    for key, meta in metadata.items():
        if not key.startswith(MODEL_PREFIX) or not isinstance(meta, TensorStorageMetadata):
            continue
        source = meta.properties.dtype
        target = DTYPES[dtype] if dtype is not None and source.is_floating_point else source
        tensors.append(Tensor(key[len(MODEL_PREFIX) :], tuple(meta.size), source, target))
    return tensors


def read_tensors(folder: Path, batch: list[Tensor]) -> dict[str, torch.Tensor]:
    """Whole tensors of one batch, read in this process (no process group), from any world size's shards."""
    template = {MODEL_PREFIX + t.name: torch.empty(t.shape, dtype=t.source) for t in batch}
    shards.load_local(template, folder)
    return {key[len(MODEL_PREFIX) :]: value for key, value in template.items()}


def batches(tensors: list[Tensor], budget: int) -> list[list[Tensor]]:
    """Consecutive runs of tensors of at most `budget` bytes as saved (a bigger tensor alone)."""
    groups = st.plan_shards(((t.name, t.source_bytes) for t in tensors), budget)
    by_name = {t.name: t for t in tensors}
    return [[by_name[name] for name in group] for group in groups]


def write_shard(folder: Path, path: Path, tensors: list[Tensor], metadata: dict[str, str]) -> None:
    """One safetensors file: the header, then the tensors streamed in batches."""
    order = {name: i for i, name in enumerate(st.file_order((t.name, t.st_dtype) for t in tensors))}
    laid_out = sorted(tensors, key=lambda t: order[t.name])
    with open(path, "wb") as f:
        f.write(st.header_bytes([(t.name, t.st_dtype, t.shape) for t in laid_out], metadata))
        for batch in batches(laid_out, LOAD_BUDGET):  # a shard is read whole when it is within the budget
            values = read_tensors(folder, batch)
            for t in batch:
                st.write_tensor(f, values.pop(t.name).to(t.target))
        f.flush()
        os.fsync(f.fileno())


def model_description(manifest: dict[str, Any], tensors: list[Tensor], dtype: torch.dtype) -> dict[str, Any]:
    """config.json: what model this is (preset and dimensions, or entrypoint) and where it came from."""
    model = manifest.get("model") or {}
    described: dict[str, Any] = {
        "format": "brain-train",
        "preset": None if model.get("entrypoint") else model.get("preset"),
        "entrypoint": model.get("entrypoint"),
        "parameters": sum(math.prod(t.shape) for t in tensors),
        "torch_dtype": str(dtype).removeprefix("torch."),
        "source": {"step": manifest.get("step"), "config_hash": manifest.get("config_hash"),
                   "world_size": manifest.get("world_size")},
    }
    if described["preset"] is not None:
        described["architecture"] = "BrainAI"
        resized = {"vocab_size": model["vocab_size"]} if model.get("vocab_size") else {}
        described["dimensions"] = to_dict(preset_config(described["preset"], **resized))
    return described


def _write_all(folder: Path, manifest: dict[str, Any], tensors: list[Tensor], work: Path, dtype: Optional[str],
               max_shard_size: Optional[int]) -> int:
    if not tensors:
        raise ExportError(f"{folder} holds no model state")
    groups = st.plan_shards(((t.name, t.target_bytes) for t in tensors), max_shard_size)
    by_name = {t.name: t for t in tensors}
    metadata = {"format": "pt", SOURCE_STEP_KEY: str(manifest.get("step")),
                SOURCE_HASH_KEY: str(manifest.get("config_hash"))}
    names = [st.SINGLE_FILE] if len(groups) == 1 else [st.shard_name(i + 1, len(groups)) for i in range(len(groups))]
    for name, group in zip(names, groups):
        write_shard(folder, work / name, [by_name[n] for n in group], metadata)
    if len(groups) > 1:
        index = {"metadata": {"total_size": sum(t.target_bytes for t in tensors)},
                 "weight_map": {n: name for name, group in zip(names, groups) for n in group}}
        (work / st.INDEX_FILE).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    written = tensors[0].target if dtype is None else DTYPES[dtype]
    (work / CONFIG_FILE).write_text(json.dumps(model_description(manifest, tensors, written), indent=2) + "\n")
    return len(groups)


# What else goes into OUT, written into its work folder before it is renamed into place: (work, checkpoint, manifest).
Finish = Callable[[Path, Path, dict[str, Any]], None]


def export(checkpoint: str | os.PathLike, out: str | os.PathLike, dtype: Optional[str] = None,
           max_shard_size: Optional[int] = None, force: bool = False,
           finish: Optional[Finish] = None) -> tuple[Path, int]:
    """Write CHECKPOINT's model to OUT as safetensors (and what `finish` adds); returns (the checkpoint folder
    read, safetensors files written)."""
    out = Path(out)
    if out.exists() and not (out.is_dir() and not any(out.iterdir())) and not force:
        raise ExportError(f"{out} exists and is not empty; pass --force to replace it")
    folder = resolve(checkpoint)
    try:
        manifest = location.store_for(folder).read_manifest(folder)
    except store.ManifestError as exc:
        raise ExportError(str(exc)) from None
    problems = location.store_for(folder).verify_files(folder, manifest["files"], sorted(manifest["files"]))
    if problems:
        raise ExportError(f"{folder} is damaged: {'; '.join(problems)}")
    try:
        tensors = model_tensors(folder, dtype)  # the only pickle export reads: tensors load weights-only
    except shards.RefusedCheckpoint as exc:
        raise ExportError(f"{exc.path}: {exc.reason}") from None
    work = out.with_name(out.name + store.TMP_SUFFIX)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        files = _write_all(folder, manifest, tensors, work, dtype, max_shard_size)
        if finish is not None:
            finish(work, folder, manifest)
        if out.exists():  # replaced only now that the new export is complete
            doomed = out.with_name(out.name + DELETING_SUFFIX)
            os.rename(out, doomed)
            os.rename(work, out)
            if doomed.is_dir():
                shutil.rmtree(doomed)
            else:
                doomed.unlink()
        else:
            os.rename(work, out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return folder, files
