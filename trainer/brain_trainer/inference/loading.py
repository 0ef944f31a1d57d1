"""A trained model and its tokenizer, from a committed checkpoint (or a checkpoint.dir), on a volume or a bucket
(s3://bucket/prefix), or a `braintrain export`.

The model is built on the meta device and materialised only to be loaded
(`model.init_from`'s readers: any world size's checkpoint, or the safetensors).
The tokenizer is the export's own, the one named (`--tokenizer`: a prepared
dataset or a folder holding tokenizer.json), the checkpoint's dataset
(`data.path` as recorded, when this machine sees it), or the built-in bytes of
a byte-level model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch
from tokenizers import Tokenizer
from torch import nn

from ..checkpoint import bucket, location, store
from ..checkpoint.compat import MODEL, SETTINGS
from ..config import ModelConfig
from ..config.presets import VOCAB_SIZE, BrainAIConfig
from ..data.tokens.format import MANIFEST, TOKENIZER_FILE
from ..model.brain_ai import BrainAI, build_model
from ..model.init_from import open_source
from ..schema import ConfigError, from_dict
from .tokenizer_files import CONFIG_FILE as TOKENIZER_CONFIG, ExportTokenizer, byte_tokenizer, dataset_tokenizer

EXPORT_CONFIG = "config.json"


class LoadError(Exception):
    """A path that holds no model or tokenizer this can load; the message names it."""


@dataclass(frozen=True)
class Origin:
    """What PATH is: an export (its config.json) or a committed checkpoint (its manifest)."""

    path: location.Root
    export_config: Optional[dict[str, Any]]
    manifest: Optional[dict[str, Any]]

    @property
    def settings(self) -> dict[str, Any]:
        return (self.manifest or {}).get(SETTINGS) or {}


def origin(path: str | Path) -> Origin:
    try:
        root = location.root_of(path)
    except ConfigError as exc:  # a URI of another scheme: named as the command's argument, not checkpoint.dir
        raise LoadError(f"{path}: {exc.errors[0].message}") from None
    config = None if location.is_bucket(root) else root / EXPORT_CONFIG
    if config is not None and config.is_file() and not (root / store.MANIFEST).is_file():
        return Origin(root, json.loads(config.read_text()), None)
    try:
        folder = location.committed(root)
        manifest = None if folder is None else location.store_for(folder).read_manifest(folder)
    except store.ManifestError as exc:
        raise LoadError(str(exc)) from None
    except Exception as exc:  # a bucket's: boto's errors, named (no bucket, denied, unreachable, no credentials)
        if not location.is_bucket(root):
            raise
        raise LoadError(f"{root}: {bucket.explain(exc, root)}") from None
    if folder is None:
        raise LoadError(f"{root}: neither an export (no {EXPORT_CONFIG}) nor a committed checkpoint or a folder "
                        "of them")
    return Origin(folder, None, manifest)


def meta_model(found: Origin) -> nn.Module:
    """The model PATH holds, built on the meta device (no storage)."""
    try:
        with torch.device("meta"):
            if found.export_config is not None:
                dimensions = found.export_config.get("dimensions")
                if not isinstance(dimensions, dict):
                    raise LoadError(f"{found.path / EXPORT_CONFIG}: no BrainAI dimensions (a user model's export)")
                return BrainAI(from_dict(BrainAIConfig, dimensions, path="dimensions"))
            return build_model(from_dict(ModelConfig, found.manifest.get(MODEL) or {}, path="model"))
    except ConfigError as exc:
        raise LoadError(f"{found.path}: {exc}") from None


def load_model(found: Origin, device: torch.device) -> nn.Module:
    """The model with its trained weights on `device`, in eval mode."""
    model = meta_model(found)
    try:
        source = open_source(str(found.path), model)
    except ConfigError as exc:
        raise LoadError(str(exc)) from None
    model.to_empty(device=device)
    source.load_into(model)
    return model.eval()


def _folder_tokenizer(folder: Path) -> ExportTokenizer:
    if (folder / MANIFEST).is_file():
        return dataset_tokenizer(folder)
    if not (folder / TOKENIZER_FILE).is_file():
        raise LoadError(f"{folder}: neither a prepared dataset ({MANIFEST}) nor a folder with {TOKENIZER_FILE}")
    config_path = folder / TOKENIZER_CONFIG
    eot = json.loads(config_path.read_text()).get("eos_token") if config_path.is_file() else None
    text = (folder / TOKENIZER_FILE).read_text(encoding="utf-8")
    try:
        eot_id = Tokenizer.from_str(text).token_to_id(eot) if eot else None
    except Exception as exc:  # the library raises plain Exception for every parse problem
        raise LoadError(f"{folder / TOKENIZER_FILE}: not a Hugging Face tokenizers file: {exc}") from None
    return ExportTokenizer(text, eot, eot_id, str(folder / TOKENIZER_FILE))


def find_tokenizer(found: Origin, named: Optional[Path] = None) -> ExportTokenizer:
    """The tokenizer of the model at `found` (see the module's docstring for the order)."""
    if named is not None:
        return _folder_tokenizer(named)
    if found.export_config is not None:
        return _folder_tokenizer(found.path)
    settings = found.settings
    data_path = settings.get("data.path")
    if settings.get("data.source") == "tokens" and data_path and (Path(data_path) / MANIFEST).is_file():
        return dataset_tokenizer(Path(data_path))
    vocab = (found.manifest.get(MODEL) or {}).get("vocab_size") or VOCAB_SIZE
    if settings.get("data.source") != "tokens" and vocab == VOCAB_SIZE:
        return byte_tokenizer(vocab)
    raise LoadError(f"{found.path}: its dataset's tokenizer ({data_path}) is not on this machine; name the dataset "
                    "(or a folder with tokenizer.json) with --tokenizer")
