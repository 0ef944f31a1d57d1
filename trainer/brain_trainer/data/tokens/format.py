"""The token dataset folder: layout, manifest, split rule and verification.

    DIR/
      manifest.json           written last: a folder without a valid one is not a dataset
      tokenizer.json          the Hugging Face tokenizer (absent for the built-in bytes tokenizer)
      train-00000.bin ...     flat little-endian token ids; each document is followed by the end-of-text id
      validation-00000.bin ...

The shards of a split are one token stream cut at fixed sizes (a document may
span two shards). Torch-free and numpy-free: the operator may read manifests.
"""

from __future__ import annotations

import bisect
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Optional, Sequence

from ...checkpoint.store import verify_files
from ...files import write_atomic
from ...schema import ConfigError, Names, from_dict, setting, to_dict
from ..errors import DataError

FORMAT = 1
MANIFEST = "manifest.json"
TOKENIZER_FILE = "tokenizer.json"
SPLITS = ("train", "validation")
ITEMSIZE = {"uint16": 2, "uint32": 4}
TOKENIZER_KINDS = ("bytes", "huggingface")
_SHARD_NAME = r"(train|validation)-\d{5}\.bin"



def shard_name(split: str, index: int) -> str:
    return f"{split}-{index:05d}.bin"


def dtype_for(vocab_size: int) -> str:
    """The narrowest unsigned type holding every token id of the vocabulary."""
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def windows(tokens: int, seq_len: int) -> int:
    """Non-overlapping training sequences (seq_len inputs + 1 shifted target) in a stream of `tokens`."""
    return tokens // (seq_len + 1)


def in_validation(text: str, seed: int, fraction: float) -> bool:
    """The split rule: a keyed hash of the document's text against the validation fraction.

    It depends on the document alone (not its position or the worker that read
    it), and identical documents land in the same split.
    """
    if fraction <= 0:
        return False
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8, key=seed.to_bytes(8, "little")).digest()
    return int.from_bytes(digest, "little") < fraction * 2**64


@dataclass
class Shard:
    """One file of token ids."""

    name: str = setting(pattern=_SHARD_NAME, help="file name in the dataset folder")
    tokens: int = setting(minimum=1, help="token ids in the file")
    crc32: str = setting(pattern=r"[0-9a-f]{8}", help="CRC-32 of the file's bytes")


@dataclass
class Split:
    """A token stream: the documents of one split, in shard order."""

    documents: int = setting(0, minimum=0)
    tokens: int = setting(0, minimum=0, help="token ids over all shards, end-of-text ids included")
    shards: list[Shard] = setting(default_factory=list)

    def check(self, name: Names) -> Iterator[tuple[str, str]]:
        total = sum(s.tokens for s in self.shards)
        if total != self.tokens:
            yield "tokens", f"is {self.tokens}, but the shards hold {total}"


@dataclass
class TokenizerInfo:
    """The tokenizer that made the ids; a model trained on them needs its vocabulary."""

    kind: str = setting(choices=TOKENIZER_KINDS, help="bytes (built in) or huggingface (tokenizer.json)")
    vocab_size: int = setting(minimum=2)
    eot_id: int = setting(minimum=0, help="the end-of-text id that follows every document")
    eot_token: str = setting(help="the end-of-text token's text")
    source: str = setting(help="built-in, the tokenizer file given to prepare, or 'trained'")
    file: Optional[str] = setting(None, help="the tokenizer file in the dataset folder")
    sha256: Optional[str] = setting(None, pattern=r"[0-9a-f]{64}", help="SHA-256 of that file: the tokenizer's identity")

    def check(self, name: Names) -> Iterator[tuple[str, str]]:
        if self.eot_id >= self.vocab_size:
            yield "eot_id", f"must be < {name('vocab_size')} ({self.vocab_size}), got {self.eot_id}"
        if self.kind == "huggingface" and (self.file != TOKENIZER_FILE or not self.sha256):
            yield "file", f"a huggingface tokenizer needs file {TOKENIZER_FILE!r} and its sha256"


@dataclass
class Manifest:
    """manifest.json: what a prepared dataset holds."""

    format: int = setting(minimum=FORMAT, maximum=FORMAT)
    dtype: str = setting(choices=tuple(ITEMSIZE), help="uint16 when the vocabulary fits, else uint32")
    tokenizer: TokenizerInfo = setting()
    train: Split = setting()
    validation: Split = setting()
    val_fraction: float = setting(minimum=0, maximum=1, help="share of documents hashed into validation")
    seed: int = setting(minimum=0, maximum=2**64 - 1, help="key of the split hash")
    inputs: list[str] = setting(default_factory=list, help="the input patterns given to prepare")
    skipped: int = setting(0, minimum=0, help="documents skipped as not UTF-8 (--skip-bad)")

    def check(self, name: Names) -> Iterator[tuple[str, str]]:
        want = dtype_for(self.tokenizer.vocab_size)
        if self.dtype != want:
            yield "dtype", f"must be {want} for a vocabulary of {self.tokenizer.vocab_size}, got {self.dtype}"
        for split in SPLITS:
            for i, shard in enumerate(self.split(split).shards):
                if shard.name != shard_name(split, i):
                    yield f"{split}.shards", f"entry {i} must be named {shard_name(split, i)}, got {shard.name!r}"

    @property
    def itemsize(self) -> int:
        return ITEMSIZE[self.dtype]

    def split(self, name: str) -> Split:
        if name not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {name!r}")
        return getattr(self, name)


def manifest_json(manifest: Manifest) -> str:
    return json.dumps(to_dict(manifest), indent=1) + "\n"


def write_manifest(folder: Path, manifest: Manifest) -> None:
    write_atomic(folder / MANIFEST, manifest_json(manifest))


def no_manifest(where: str) -> DataError:
    return DataError(
        f"{where}: not a token dataset (no {MANIFEST}; `braintrain prepare` writes it last, "
        "so the folder is incomplete or was never prepared)"
    )


def read_manifest(folder: str | Path) -> Manifest:
    """The manifest of a prepared dataset, or DataError naming the folder or file."""
    folder = Path(folder)
    path = folder / MANIFEST
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        if not folder.is_dir():
            raise DataError(f"{folder}: no such folder") from None
        raise no_manifest(str(folder)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: unreadable: {exc}") from None
    return parse_manifest(text, str(path))


def parse_manifest(text: str, path: str) -> Manifest:
    """The manifest in `text`, read from `path` (a file or a URI, for the error); DataError naming it."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise DataError(f"{path}: not JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        got = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise DataError(f"{path}: format {got!r}; this brain-train reads format {FORMAT}")
    try:
        return from_dict(Manifest, data)
    except ConfigError as exc:
        raise DataError(f"{path}: {'; '.join(map(str, exc.errors))}") from None


def verify_split(folder: str | Path, manifest: Manifest, split: str) -> None:
    """Check every shard of a split against the manifest: size, then CRC-32; DataError names the shard."""
    shards = manifest.split(split).shards
    files = {s.name: {"size": s.tokens * manifest.itemsize, "crc32": s.crc32} for s in shards}
    problems = verify_files(Path(folder), files, files)
    if problems:
        raise DataError("; ".join(f"{Path(folder) / p}" for p in problems))


@dataclass(frozen=True)
class StoredObject:
    """What an object store says of a shard without reading it: its size and, where it keeps one, its CRC-32."""

    size: int
    crc32: Optional[str] = None


def object_problems(manifest: Manifest, split: str, found: Mapping[str, Optional[StoredObject]]) -> list[str]:
    """Problems of a split's shards as a store lists them (None: missing), in verify_split's words; [] when all
    match. A shard whose store keeps no CRC-32 is checked for size alone."""
    problems = []
    for shard in manifest.split(split).shards:
        stored, size = found.get(shard.name), shard.tokens * manifest.itemsize
        if stored is None:
            problems.append(f"{shard.name}: missing")
        elif stored.size != size:
            kind = "truncated" if stored.size < size else "grown"
            problems.append(f"{shard.name}: {stored.size} bytes, manifest says {size} ({kind})")
        elif stored.crc32 is not None and stored.crc32 != shard.crc32:
            problems.append(f"{shard.name}: checksum {stored.crc32}, manifest says {shard.crc32} (corrupted)")
    return problems


def window_pieces(starts: Sequence[int], start: int, size: int) -> list[tuple[int, int, int]]:
    """(shard, offset in it, tokens) of the `size` tokens from stream position `start`; `starts` are the shards'
    first positions followed by the stream's length. A window crossing a shard boundary has two pieces."""
    k = bisect.bisect_right(starts, start) - 1
    pieces = []
    while size:
        offset = start - starts[k]
        count = min(size, starts[k + 1] - start)
        pieces.append((k, offset, count))
        start, size, k = start + count, size - count, k + 1
    return pieces


def check_seq_len(manifest: Manifest, seq_len: int, splits: Iterable[str] = SPLITS, *, where: str = "") -> None:
    """DataError unless every named split holds at least one sequence of seq_len + 1 tokens."""
    for name in splits:
        tokens = manifest.split(name).tokens
        if windows(tokens, seq_len) == 0:
            prefix = f"{where}: " if where else ""
            raise DataError(
                f"{prefix}the {name} split holds {tokens} tokens, fewer than one sequence "
                f"(seq_len + 1 = {seq_len + 1}); lower training.seq_len or prepare more data"
            )
