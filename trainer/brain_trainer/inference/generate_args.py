"""`braintrain generate`'s arguments, torch-free so that `braintrain` parses them without loading torch."""

from __future__ import annotations

import argparse
from pathlib import Path

from .eval_args import positive


def non_negative(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def probability(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="CHECKPOINT_OR_EXPORT",
                        help="a committed checkpoint (or checkpoint.dir: its newest), or a braintrain export folder")
    prompts = parser.add_mutually_exclusive_group(required=True)
    prompts.add_argument("--prompt", metavar="TEXT", help="the text to continue")
    prompts.add_argument("--prompts", type=Path, metavar="FILE", help="texts to continue, one per line")
    parser.add_argument("--max-new-tokens", type=positive, default=128, metavar="N",
                        help="tokens to write at most (default 128; fewer where max_seq_len ends)")
    parser.add_argument("--greedy", action="store_true", help="always the likeliest token (as --temperature 0)")
    parser.add_argument("--temperature", type=non_negative, default=1.0, help="sampling temperature; 0: greedy")
    parser.add_argument("--top-k", type=positive, metavar="K", help="sample among the K likeliest tokens")
    parser.add_argument("--top-p", type=probability, metavar="P", help="sample among the likeliest tokens holding P")
    parser.add_argument("--seed", type=int, default=0, help="the sampling's random seed (default 0)")
    parser.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda when there is one, else cpu)")
    parser.add_argument("--tokenizer", type=Path, metavar="DIR",
                        help="a prepared dataset or a folder with tokenizer.json (default: the export's, or the "
                        "checkpoint's dataset)")
