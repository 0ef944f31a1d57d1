"""The export command's arguments, torch-free so that `braintrain` parses them without loading torch."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

EXPORT_DTYPES = ("bf16", "fp32")
DEFAULT_SHARD = 50 * 10**9  # transformers' save_pretrained writes shards of at most 50GB
_SIZE = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)?", re.IGNORECASE)
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_size(text: str) -> int:
    """`5GB` (decimal, as Hugging Face counts), `2GiB`, `500MB` or plain bytes."""
    match = _SIZE.fullmatch(text.strip())
    if not match or float(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"not a size such as 5GB, 500MB or 2GiB: {text!r}")
    return int(float(match.group(1)) * _UNITS[(match.group(2) or "b").lower()])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="step-XXXXXXXX folder, or checkpoint.dir for its newest committed one")
    parser.add_argument("out", help="output folder: the safetensors (one file, or shards with an index), config.json and what transformers loads")
    parser.add_argument("--dtype", choices=EXPORT_DTYPES, default=None,
                        help="cast floating-point tensors (default: as saved, fp32)")
    parser.add_argument("--max-shard-size", type=parse_size, default=DEFAULT_SHARD, metavar="SIZE",
                        help="split into files of at most SIZE (5GB, 500MB, 2GiB; default 50GB, as transformers' "
                        "save_pretrained: a large model gets shards and an index)")
    parser.add_argument("--force", action="store_true", help="replace OUT when it exists and is not empty")
    parser.add_argument("--tokenizer", type=Path, metavar="DIR",
                        help="the tokenizer to ship: a prepared dataset, or a folder with tokenizer.json (default: the "
                        "checkpoint's dataset, data.path as recorded, or bytes for a byte-level model)")
    parser.add_argument("--eval-data", type=Path, metavar="DIR",
                        help="measure the held-out loss on this prepared dataset's validation split and record it in "
                        "config.json and the model card (braintrain eval, at the job's sequence length)")
