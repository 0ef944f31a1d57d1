"""`braintrain prepare INPUT... --out DIR`: a corpus becomes a token dataset folder (docs/data.md).

    python -m brain_trainer.tokens.prepare 'corpus/**/*.txt' --out data/corpus --train-tokenizer --vocab-size 4096

Passes: (1, with --train-tokenizer) train a byte-level BPE on the training
split; (2) tokenize every document, follow it with the end-of-text id, and
append it to its split's shards. Tokenizing runs in this process or in
--workers processes; batches come back in input order, so the output is the
same for any number of workers.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import sys
import tempfile
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Optional, Sequence, TextIO

import numpy as np

from ...schema import ConfigError
from ...uris import is_uri
from .bucket import BucketFolder
from .corpus import Corpus, CorpusError, expand
from .format import TOKENIZER_FILE, DataError, Manifest, dtype_for, in_validation
from .options import DESCRIPTION, PrepareOptions, add_arguments, options_from
from .publish import check_bucket_destination, publish
from .report import PassProgress
from .tokenizer import ByteTokenizer, HFTokenizer, TokenizerError, parse_tokenizer, train_bpe
from .writer import DatasetWriter, check_destination

BATCH_CHARS = 1 << 20  # text per tokenizing task: enough to amortise handing it to a worker
TASKS_PER_WORKER = 2  # tasks in flight per worker: keeps workers busy while bounding memory

Tokenizer = ByteTokenizer | HFTokenizer


@dataclass
class Encoded:
    """One batch of documents as token ids, each followed by end-of-text, grouped by split."""

    train: np.ndarray
    train_documents: int
    validation: np.ndarray
    validation_documents: int


def encode_documents(tokenizer: Tokenizer, texts: Sequence[str], dtype: str, seed: int, val_fraction: float) -> Encoded:
    eot = np.array([tokenizer.eot_id], dtype=dtype)
    parts: dict[bool, list[np.ndarray]] = {False: [], True: []}
    for text, ids in zip(texts, tokenizer.encode(texts, dtype)):
        parts[in_validation(text, seed, val_fraction)] += [ids, eot]

    def joined(arrays: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(arrays) if arrays else np.empty(0, dtype=dtype)

    return Encoded(joined(parts[False]), len(parts[False]) // 2, joined(parts[True]), len(parts[True]) // 2)


def batches(documents: Iterable[tuple[str, int]], batch_chars: int) -> Iterator[tuple[list[str], int]]:
    """Documents grouped into tokenizing tasks: (texts, input bytes they consumed)."""
    texts: list[str] = []
    chars = consumed = 0
    for text, n in documents:
        texts.append(text)
        chars += len(text)
        consumed += n
        if chars >= batch_chars:
            yield texts, consumed
            texts, chars, consumed = [], 0, 0
    if texts:
        yield texts, consumed


_job: tuple = ()  # a worker's (tokenizer, dtype, seed, val_fraction), set once by _start_worker


def _start_worker(*job: object) -> None:
    global _job
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per worker: the processes are the parallelism
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle: it stops the pool
    _job = job


def _encode_task(texts: list[str]) -> Encoded:
    tokenizer, dtype, seed, val_fraction = _job
    return encode_documents(tokenizer, texts, dtype, seed, val_fraction)


def encoded_batches(
    tokenizer: Tokenizer, tasks: Iterable[tuple[list[str], int]], dtype: str, seed: int, val_fraction: float, workers: int
) -> Iterator[tuple[Encoded, int]]:
    """(Encoded, input bytes) per task, in task order, from this process or from `workers` processes."""
    if workers == 1:
        for texts, consumed in tasks:
            yield encode_documents(tokenizer, texts, dtype, seed, val_fraction), consumed
        return
    # spawn, never fork: forking after the tokenizers library started its threads can deadlock
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_start_worker,
                             initargs=(tokenizer, dtype, seed, val_fraction)) as pool:
        pending: deque = deque()
        try:
            for texts, consumed in tasks:
                pending.append((pool.submit(_encode_task, texts), consumed))
                if len(pending) >= TASKS_PER_WORKER * workers:
                    future, n = pending.popleft()
                    yield future.result(), n
            while pending:
                future, n = pending.popleft()
                yield future.result(), n
        finally:
            for future, _ in pending:
                future.cancel()


def check_documents(options: PrepareOptions, train: int, validation: int, skipped: int) -> None:
    """CorpusError unless both splits got documents (validation only when asked for)."""
    corpus = " ".join(options.inputs)
    if train + validation == 0:
        why = f"; {skipped} skipped as not UTF-8" if skipped else ""
        raise CorpusError(f"{corpus}: no text (every document is empty{why})")
    if train == 0:
        raise CorpusError(f"{corpus}: all {validation} documents fell in the validation split; lower --val-fraction")
    if options.val_fraction > 0 and validation == 0:
        raise CorpusError(
            f"{corpus}: none of the {train} documents fell in the validation split (--val-fraction "
            f"{options.val_fraction}); raise it, add documents, or pass --val-fraction 0"
        )


def trained_tokenizer(options: PrepareOptions, corpus: Corpus, stream: TextIO) -> HFTokenizer:
    """Pass 1: a BPE trained on the training split's documents."""
    assert options.vocab_size is not None

    def training_texts() -> Iterator[str]:
        counts = {False: 0, True: 0}
        with PassProgress("training tokenizer", corpus.total_bytes(), stream) as progress:
            for text, n in corpus.documents():
                progress.advance(n)
                held_out = in_validation(text, options.seed, options.val_fraction)
                counts[held_out] += 1
                if not held_out:
                    yield text
        check_documents(options, counts[False], counts[True], corpus.skipped)  # before training on nothing

    return train_bpe(training_texts(), options.vocab_size)


def choose_tokenizer(options: PrepareOptions, corpus: Corpus, stream: TextIO) -> Tokenizer:
    if options.train_tokenizer:
        return trained_tokenizer(options, corpus, stream)
    if options.tokenizer == "bytes":
        return ByteTokenizer()
    return parse_tokenizer(Path(options.tokenizer), options.tokenizer, options.eot_token, options.add_eot_token)


def prepare(options: PrepareOptions, stream: Optional[TextIO] = None) -> Manifest:
    """Make the dataset folder (or s3://bucket/prefix) `options.out`; progress goes to `stream` (None: sys.stderr
    as it is when called). Returns its manifest."""
    stream = stream if stream is not None else sys.stderr
    corpus = Corpus(expand(options.inputs), options.text_field, options.skip_bad)
    if not is_uri(options.out):
        out = Path(options.out)
        check_destination(out, options.force)  # before a tokenizer is trained for nothing
        return write_dataset(options, corpus, out, stream)
    folder = BucketFolder(options.out)
    check_bucket_destination(folder, options.force)
    with tempfile.TemporaryDirectory(prefix="braintrain-prepare-") as tmp:
        local = Path(tmp) / "dataset"
        manifest = write_dataset(options, corpus, local, stream)
        publish(local, folder, manifest)
    return manifest


def write_dataset(options: PrepareOptions, corpus: Corpus, out: Path, stream: TextIO) -> Manifest:
    """Tokenize the corpus into the dataset folder `out` (the writer commits it atomically)."""
    tokenizer = choose_tokenizer(options, corpus, stream)
    dtype = dtype_for(tokenizer.vocab_size)
    with DatasetWriter(out, dtype, options.shard_tokens, force=options.force) as writer:
        tasks = batches(corpus.documents(), BATCH_CHARS)
        encoding = encoded_batches(tokenizer, tasks, dtype, options.seed, options.val_fraction, options.workers)
        with closing(encoding), PassProgress("tokenizing", corpus.total_bytes(), stream) as progress:
            for batch, consumed in encoding:
                writer.write("train", batch.train, batch.train_documents)
                writer.write("validation", batch.validation, batch.validation_documents)
                progress.advance(consumed)
        check_documents(options, writer.documents("train"), writer.documents("validation"), corpus.skipped)
        if isinstance(tokenizer, HFTokenizer):
            writer.add_file(TOKENIZER_FILE, tokenizer.json_text)
        return writer.commit(tokenizer.info(), options.val_fraction, options.seed, list(options.inputs), corpus.skipped)


def summary(out: str, manifest: Manifest) -> str:
    t, v, tok = manifest.train, manifest.validation, manifest.tokenizer
    line = (
        f"{out}: train {t.documents} documents, {t.tokens} tokens in {len(t.shards)} shards; "
        f"validation {v.documents} documents, {v.tokens} tokens; "
        f"vocabulary {tok.vocab_size} ({tok.kind}, {tok.source}), end-of-text id {tok.eot_id}, {manifest.dtype}"
    )
    return line + (f"; skipped {manifest.skipped} documents that are not UTF-8" if manifest.skipped else "")


def run(args: argparse.Namespace, prog: str) -> int:
    """Prepare as the parsed command line says: 0 on success, 1 with one line naming the problem, 2 for bad options."""
    try:
        options = options_from(args)
    except ConfigError as exc:
        for error in exc.errors:
            print(f"{prog}: {error}", file=sys.stderr)
        return 2
    try:
        manifest = prepare(options)
    except (CorpusError, TokenizerError, DataError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    except BrokenProcessPool:
        print(f"{prog}: a tokenizing worker process died (out of memory?); nothing was written to {options.out}",
              file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"{prog}: {exc.filename or options.out}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; nothing was written to {options.out}", file=sys.stderr)
        return 130
    print(summary(options.out, manifest))
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    prog = "python -m brain_trainer.tokens.prepare"
    parser = argparse.ArgumentParser(prog=prog, description=DESCRIPTION)
    add_arguments(parser)
    return run(parser.parse_args(argv), prog)

