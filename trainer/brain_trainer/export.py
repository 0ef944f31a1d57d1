"""`python -m brain_trainer.export CHECKPOINT OUT [--dtype bf16]`: one file, no process group.

CHECKPOINT is a committed checkpoint folder (step-XXXXXXXX/, or one written by
save_model) or a checkpoint.dir, meaning its newest committed checkpoint. Its
files are verified against the manifest, the model's shards (whatever world
size wrote them) are joined into full tensors, and OUT receives a plain
`torch.save` of the model state dict: `model.load_state_dict(torch.load(OUT))`.
Optimizer state is not read.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Optional, Sequence

import torch

from .checkpoint import shards, store
from .fsdp import DTYPES


class ExportError(Exception):
    pass


def resolve(checkpoint: str | os.PathLike) -> Path:
    """The committed checkpoint folder that CHECKPOINT names."""
    path = Path(checkpoint)
    if (path / store.MANIFEST).is_file():
        return path
    latest = store.latest_checkpoint(path)
    if latest is None:
        raise ExportError(f"{path}: neither a committed checkpoint (no {store.MANIFEST}) nor a folder holding one")
    return latest


def export(checkpoint: str | os.PathLike, out: str | os.PathLike, dtype: Optional[str] = None) -> Path:
    """Write the consolidated model state dict of CHECKPOINT to OUT; returns the folder read."""
    folder = resolve(checkpoint)
    try:
        manifest = store.read_manifest(folder)
    except store.ManifestError as exc:
        raise ExportError(str(exc)) from None
    problems = store.verify_files(folder, manifest["files"], sorted(manifest["files"]))
    if problems:
        raise ExportError(f"{folder} is damaged: {'; '.join(problems)}")
    state_dict = shards.load_prefix(folder, "model")
    if not state_dict:
        raise ExportError(f"{folder} holds no model state")
    if dtype is not None:
        target = DTYPES[dtype]
        state_dict = {k: v.to(target) if torch.is_tensor(v) and v.is_floating_point() else v for k, v in state_dict.items()}
    out = Path(out)
    tmp = out.with_name(out.name + store.TMP_SUFFIX)
    try:
        torch.save(state_dict, tmp)
        os.replace(tmp, out)  # never a half-written OUT
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return folder


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m brain_trainer.export", description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="step-XXXXXXXX folder, or checkpoint.dir for its newest committed one")
    parser.add_argument("out", help="output file (torch.save of the model state dict)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="cast floating-point tensors (default: as saved)")
    args = parser.parse_args(argv)
    try:
        folder = export(args.checkpoint, args.out, args.dtype)
    except ExportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"exported the model of {folder} to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
