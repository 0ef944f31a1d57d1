"""`data.source: tokens`: a prepared dataset's splits as the loop reads them, and the model vocabulary they set.

Both run before any rendezvous (train.train), so a damaged shard, a split
shorter than one sequence or a vocabulary that does not match stops every
rank with one line naming data.path or model.vocab_size, before training.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Optional

from ...config import TrainerConfig
from ...schema import ConfigError, FieldError
from ...uris import is_uri, uri_problem
from ..errors import DataError
from .dataset import TokenDataset

if TYPE_CHECKING:
    from .streamed import BucketTokenDataset


def token_split(path: str, seq_len: int, split: str) -> TokenDataset | BucketTokenDataset:
    """`split` of the dataset at `path`: a folder, or an s3://bucket/prefix read by ranges (streamed.py)."""
    if not is_uri(path):
        return TokenDataset(path, seq_len, split)
    problem = uri_problem(path)
    if problem is not None:
        raise DataError(problem)
    from .streamed import BucketTokenDataset  # only a bucket's dataset pays for its imports

    return BucketTokenDataset(path, seq_len, split)


def open_split(path: str, seq_len: int, split: str) -> TokenDataset | BucketTokenDataset:
    """`split` of the dataset at `path`, verified; DataError on data.path naming the file and the problem."""
    try:
        return token_split(path, seq_len, split)
    except DataError as exc:
        raise DataError(str(exc), field="data.path") from None  # the setting that led to the file


def follow_vocabulary(cfg: TrainerConfig, vocab_size: int) -> TrainerConfig:
    """The config with the preset resized to the dataset tokenizer's vocabulary; a hand-set other size is an error.

    A user model (model.entrypoint) keeps its own vocabulary.
    """
    model = cfg.model
    if model.entrypoint is not None or model.vocab_size == vocab_size:
        return cfg
    if model.vocab_size is None:
        return replace(cfg, model=replace(model, vocab_size=vocab_size))
    raise ConfigError(
        [
            FieldError(
                "model.vocab_size",
                f"must match the dataset's tokenizer ({vocab_size} ids in {cfg.data.path}), got {model.vocab_size}; "
                "leave it unset to follow the dataset",
            )
        ]
    )


def token_source(cfg: TrainerConfig, train_split: TokenDataset | BucketTokenDataset
                 ) -> tuple[TrainerConfig, Optional[TokenDataset | BucketTokenDataset]]:
    """(the config with the dataset's vocabulary, the validation split when training.eval_interval asks for it)."""
    cfg = follow_vocabulary(cfg, train_split.vocab_size)
    held_out = open_split(cfg.data.path, cfg.training.seq_len, "validation") if cfg.training.eval_interval else None
    return cfg, held_out
