"""`model.init_from`: start a job from existing weights, loaded straight into this rank's shards.

The path names a committed checkpoint folder (its model weights only: the
optimizer, schedule and data position start fresh), a checkpoint.dir (its
newest committed checkpoint), or safetensors: a `.safetensors` file, or a
folder holding `model.safetensors` or `model.safetensors.index.json` with its
shards (what `braintrain export` writes). An `s3://bucket/prefix` names a
committed checkpoint step on a bucket, or a bucket's checkpoint.dir (its
newest); safetensors are read from a volume only. `open_source` checks it against the
model built on the meta device, before anything is materialised or trained:
one line naming the field, the file and the first tensor that does not match.
Loading then reads only what each rank holds (DCP reshards a checkpoint;
safetensors rows are read per shard), so no rank builds the whole model.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Optional, Protocol

import torch
from safetensors import safe_open
from torch import nn
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

from ..checkpoint import bucket, compat, location, shards, store
from ..checkpoint.compat import first_difference
from ..checkpoint.manager import load_model
from ..checkpoint.state import MODEL_PREFIX
from ..config import TrainerConfig
from ..schema import ConfigError, FieldError, to_dict
from ..uris import is_uri, place_problem
from .safetensors_io import INDEX_FILE, SINGLE_FILE, SUFFIX, SafetensorsError, read_weights
from .seeded_init import local_box

FIELD = "model.init_from"
# What export writes into each safetensors file's metadata, so that a run started from it knows its origin.
SOURCE_STEP_KEY = "brain_train.step"
SOURCE_HASH_KEY = "brain_train.config_hash"


def init_from_error(path: Any, problem: str) -> ConfigError:
    return ConfigError([FieldError(FIELD, f"{path}: {problem}")])


def first_mismatch(expected: dict[str, tuple[int, ...]], found: dict[str, tuple[int, ...]]) -> Optional[str]:
    """The first tensor (in the model's order) whose name or shape differs; None when all match."""
    difference = first_difference(expected, found)
    if difference is None:
        return None
    name, shape, theirs = difference
    if shape is None:
        return f"tensor {name!r} is not in the model"
    if theirs is None:
        return f"has no tensor {name!r} (the model's is {list(shape)})"
    return f"tensor {name!r} has shape {list(theirs)}, the model's is {list(shape)}"


class WeightSource(Protocol):
    def load_into(self, model: nn.Module) -> None: ...

    def provenance(self) -> dict[str, Any]: ...


class CheckpointSource:
    """The model weights of a committed checkpoint (any world size wrote it)."""

    def __init__(self, folder: location.Root, expected: dict[str, tuple[int, ...]]):
        self.folder = folder
        try:
            self.manifest = location.store_for(folder).read_manifest(folder)
            saved = shards.saved_shapes(folder)
        except store.ManifestError as exc:
            raise ConfigError([FieldError(FIELD, str(exc))]) from None
        except shards.RefusedCheckpoint as exc:  # a user's folder: named, never moved
            raise init_from_error(exc.path, exc.reason) from None
        except Exception as exc:  # DCP's .metadata missing or unreadable
            raise init_from_error(folder / ".metadata", f"unreadable ({type(exc).__name__}: {exc}): damaged") from None
        problem = first_mismatch(expected, shards.tensor_shapes(saved, MODEL_PREFIX))
        if problem:
            raise init_from_error(folder, problem)

    def load_into(self, model: nn.Module) -> None:
        try:
            load_model(self.folder, model)  # verifies every file against the manifest first
        except store.ManifestError as exc:
            raise ConfigError([FieldError(FIELD, str(exc))]) from None
        except shards.RefusedCheckpoint as exc:
            raise init_from_error(exc.path, exc.reason) from None

    def provenance(self) -> dict[str, Any]:
        return {"path": str(self.folder), "step": self.manifest.get("step"),
                "config_hash": self.manifest.get("config_hash")}


class SafetensorsSource:
    """Tensors of safetensors files, read per rank: only the part (box) of each parameter this rank holds."""

    def __init__(self, path: Path, expected: dict[str, tuple[int, ...]]):
        self.path = path
        try:
            self.entries, self.metadata = read_weights(path)
        except SafetensorsError as exc:
            raise ConfigError([FieldError(FIELD, str(exc))]) from None
        problem = first_mismatch(expected, {name: e.shape for name, e in self.entries.items()})
        if problem:
            files = sorted({str(e.file) for e in self.entries.values()})
            raise init_from_error(files[0] if len(files) == 1 else path, problem)

    def load_into(self, model: nn.Module) -> None:
        state = get_model_state_dict(model)
        with contextlib.ExitStack() as stack, torch.no_grad():
            opened: dict[Path, Any] = {}
            for name, target in state.items():
                entry = self.entries[name]
                if entry.file not in opened:
                    opened[entry.file] = stack.enter_context(safe_open(str(entry.file), framework="pt"))
                local, offsets = local_box(target)
                if local.numel() == 0:
                    continue
                if local.dim() == 0:
                    local.copy_(opened[entry.file].get_tensor(name))
                    continue
                box = tuple(slice(o, o + size) for o, size in zip(offsets, local.shape))
                local.copy_(opened[entry.file].get_slice(name)[box])
        set_model_state_dict(model, state)

    def provenance(self) -> dict[str, Any]:
        step = self.metadata.get(SOURCE_STEP_KEY)
        return {"path": str(self.path), "step": int(step) if step and step.isdigit() else None,
                "config_hash": self.metadata.get(SOURCE_HASH_KEY)}


def open_source(path_text: str, model: nn.Module) -> WeightSource:
    """The weights `path_text` names, checked against `model` (built on the meta device is enough).

    Raises ConfigError on model.init_from: a path that does not exist, a
    checkpoint that is not committed, a damaged file, names or shapes that
    differ from the model's.
    """
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    if is_uri(path_text):
        return _bucket_source(path_text, expected)
    path = Path(path_text)
    if not path.exists():
        raise init_from_error(path, "does not exist (the pods must see it: the checkpoint volume or a data volume)")
    if path.is_file():
        if path.suffix != SUFFIX:
            raise init_from_error(path, f"a file, but not {SUFFIX}")
        source: WeightSource = SafetensorsSource(path, expected)
    elif (path / store.MANIFEST).is_file():
        source = CheckpointSource(path, expected)
    elif (path / INDEX_FILE).is_file() or (path / SINGLE_FILE).is_file():
        source = SafetensorsSource(path, expected)
    elif (latest := store.latest_checkpoint(path)) is not None:
        source = CheckpointSource(latest, expected)
    elif (path / ".metadata").is_file():
        raise init_from_error(path, f"not committed (no {store.MANIFEST}): a checkpoint still being written, or interrupted")
    else:
        raise init_from_error(
            path, f"holds neither a committed checkpoint ({store.MANIFEST}) nor safetensors ({SINGLE_FILE} or {INDEX_FILE})"
        )
    return source


def _bucket_source(uri: str, expected: dict[str, tuple[int, ...]]) -> WeightSource:
    """A committed checkpoint step on a bucket, or the newest of a bucket's checkpoint.dir."""
    problem = place_problem(uri)
    if problem is not None:
        raise ConfigError([FieldError(FIELD, problem)])
    path = location.root_of(uri)
    try:
        found = location.committed(path)
    except Exception as exc:  # boto's errors, each named (no bucket, denied, unreachable, no credentials)
        raise init_from_error(path, bucket.explain(exc, path)) from None
    if found is None:
        raise init_from_error(path, f"holds no committed checkpoint ({store.MANIFEST}) and no step-XXXXXXXX/ with one "
                                    "(safetensors are read from a volume only)")
    return CheckpointSource(found, expected)


def manifest_fields(cfg: TrainerConfig, source: Optional[WeightSource]) -> dict[str, Any]:
    """What every checkpoint of this run records about its model and settings (the model section, the others
    flattened, so that a resume can name what changed: checkpoint/compat.py), and where its weights started."""
    fields: dict[str, Any] = {compat.MODEL: to_dict(cfg.model), compat.SETTINGS: compat.recorded(cfg)}
    if source is not None:
        fields["init_from"] = source.provenance()
    return fields
