"""`braintrain eval`'s arguments, torch-free so that `braintrain` parses them without loading torch."""

from __future__ import annotations

import argparse

from ..config.sections import STRATEGIES


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="step-XXXXXXXX folder, or checkpoint.dir for its newest committed one")
    parser.add_argument("--data", required=True, metavar="DIR",
                        help="a prepared token dataset (braintrain prepare), a folder or s3://bucket/prefix: its whole "
                             "validation split is evaluated")
    parser.add_argument("--seq-len", type=positive, metavar="N", help="window length (default: the job's seq_len)")
    parser.add_argument("--micro-batch-size", type=positive, metavar="N",
                        help="windows per forward pass (default: the job's; the figure does not depend on it)")
    parser.add_argument("--strategy", choices=STRATEGIES, default="auto", help="as distributed.strategy (default auto)")
    parser.add_argument("--tensor-parallel", type=positive, metavar="N", help="as distributed.tensorParallel")
    parser.add_argument("--pipeline-parallel", type=positive, metavar="N", help="as distributed.pipelineParallel")
