"""The options of `braintrain prepare`, declared once: the command line is generated from this dataclass.

Imports nothing heavy: the `braintrain` command line builds its parser from it.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from dataclasses import MISSING, dataclass
from typing import Any, Iterator, Optional

from ...schema import ConfigError, FieldError, Names, from_dict, setting
from ...uris import place_problem

MIN_TRAINED_VOCAB = 257  # the 256 byte symbols and the end-of-text token
DESCRIPTION = "Turn a corpus into a token dataset folder (docs/data.md)."


@dataclass
class PrepareOptions:
    """A corpus and what to make of it."""

    inputs: list[str] = setting(help="text files (one document each), JSON Lines (.jsonl, one record each), "
                                     "Parquet (.parquet, one row each), or quoted globs of them ('**' recurses); "
                                     "gzip, bzip2 and Zstandard files are read as what they hold")
    out: str = setting(help="the dataset folder to create, or s3://bucket/prefix (written locally, then uploaded; "
                            "the manifest last)")
    tokenizer: str = setting("bytes", help="bytes (built in: UTF-8 bytes and an end-of-text id), "
                                           "or the path of a Hugging Face tokenizer.json")
    train_tokenizer: bool = setting(False, help="train a byte-level BPE on the training split and store it")
    vocab_size: Optional[int] = setting(None, minimum=MIN_TRAINED_VOCAB, maximum=2**32,
                                        help="vocabulary of the tokenizer --train-tokenizer trains")
    eot_token: Optional[str] = setting(None, help="end-of-text token of a tokenizer file (default: the first of "
                                                  "<|endoftext|>, <|end_of_text|>, </s>, <eos> it has)")
    add_eot_token: bool = setting(False, help="add the end-of-text token (--eot-token, or <|endoftext|>) to a "
                                              "tokenizer file that lacks it, as a new, untrained id")
    text_field: str = setting("text", help="field of a JSON Lines record, or column of a Parquet file, holding the text")
    val_fraction: float = setting(0.05, minimum=0, maximum=0.5, help="share of documents in the validation split")
    seed: int = setting(0, minimum=0, maximum=2**64 - 1, help="key of the hash that assigns documents to splits")
    workers: int = setting(1, minimum=1, help="tokenizing processes; 1 tokenizes in this process")
    shard_tokens: int = setting(1 << 28, minimum=1, help="token ids per shard file")
    skip_bad: bool = setting(False, help="skip documents that are not UTF-8 (and count them) instead of stopping")
    force: bool = setting(False, help="replace OUT if it holds a dataset prepared before")

    def check(self, name: Names) -> Iterator[tuple[str, str]]:
        problem = place_problem(self.out)
        if problem is not None:
            yield "out", problem
        if self.train_tokenizer and self.vocab_size is None:
            yield "vocab_size", "required with --train-tokenizer"
        if self.vocab_size is not None and not self.train_tokenizer:
            yield "vocab_size", "only applies with --train-tokenizer"
        if self.train_tokenizer and self.tokenizer != "bytes":
            yield "tokenizer", "--train-tokenizer trains one; do not name another"
        if self.eot_token is not None and self.tokenizer == "bytes" and not self.train_tokenizer:
            yield "eot_token", "only applies to a tokenizer file"
        if self.add_eot_token and (self.tokenizer == "bytes" or self.train_tokenizer):
            yield "add_eot_token", "only applies to a tokenizer file"


_METAVARS: dict[Any, str] = {"out": "DIR", "tokenizer": "bytes|FILE", "eot_token": "TOKEN", "text_field": "NAME",
                              int: "N", float: "FRACTION"}


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _scalar(hint: Any) -> Any:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args else hint


def add_arguments(p: argparse.ArgumentParser) -> None:
    hints = typing.get_type_hints(PrepareOptions)
    for f in dataclasses.fields(PrepareOptions):
        kind, help = _scalar(hints[f.name]), f.metadata["help"]
        if f.name == "inputs":
            p.add_argument("inputs", nargs="+", metavar="INPUT", help=help)
        elif kind is bool:
            p.add_argument(flag(f.name), dest=f.name, action="store_true", help=help)
        else:
            default = None if f.default is MISSING else f.default
            shown = f" (default: {default})" if default is not None else ""
            p.add_argument(flag(f.name), dest=f.name, type=kind, default=default, required=f.default is MISSING,
                           metavar=_METAVARS.get(f.name) or _METAVARS[kind], help=help + shown)


def options_from(args: argparse.Namespace) -> PrepareOptions:
    """The options parsed by add_arguments' flags; ConfigError names the flags that break a rule."""
    names = {f.name for f in dataclasses.fields(PrepareOptions)}
    try:
        return from_dict(PrepareOptions, {k: v for k, v in vars(args).items() if k in names})
    except ConfigError as exc:
        raise ConfigError(FieldError("INPUT" if e.path == "inputs" else flag(e.path), e.message) for e in exc.errors) from None
