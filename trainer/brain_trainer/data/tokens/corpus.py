"""Input files -> documents: a text file is one document, a JSON Lines record one, a Parquet row one.

gzip, bzip2 and Zstandard files are read as what they hold (compression.py).
Files are read in the order the inputs name them (each glob's matches
sorted), so the document sequence is deterministic. Problems are
CorpusError naming the file (and line, row or byte offset).
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator, Sequence

from .compression import DamagedInput, MissingDecompressor, compression_of, content_name, open_input

# `.json` too: exports often name JSON Lines so; a JSON array is refused at its first line.
JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
PARQUET_SUFFIXES = (".parquet",)
_PARQUET_BATCH = 1024


class CorpusError(ValueError):
    """Input that cannot become documents; the message names the file."""


def expand(patterns: Sequence[str]) -> list[Path]:
    """The files named by paths and globs (`**` recurses), in order, each once."""
    files: list[Path] = []
    seen: set[Path] = set()
    for pattern in patterns:
        expanded = os.path.expanduser(pattern)
        if glob.has_magic(expanded):
            matches = [Path(p) for p in sorted(glob.glob(expanded, recursive=True)) if os.path.isfile(p)]
            if not matches:
                raise CorpusError(f"{pattern}: matches no file")
        else:
            path = Path(expanded)
            if path.is_dir():
                raise CorpusError(f"{pattern}: is a folder; name files or a glob such as '{pattern}/**/*.txt'")
            if not path.is_file():
                raise CorpusError(f"{pattern}: no such file")
            matches = [path]
        for path in matches:
            if path.resolve() not in seen:
                seen.add(path.resolve())
                files.append(path)
    return files


def _utf8_error(where: str, offset: int, exc: UnicodeDecodeError) -> CorpusError:
    return CorpusError(f"{where}: not UTF-8 at byte {offset + exc.start} ({exc.reason}); --skip-bad skips such documents")


@dataclass
class Corpus:
    """Documents of `files`; `skipped` counts non-UTF-8 documents passed over when skip_bad is set."""

    files: list[Path]
    text_field: str = "text"
    skip_bad: bool = False
    skipped: int = 0

    def total_bytes(self) -> int:
        return sum(path.stat().st_size for path in self.files)

    def documents(self) -> Iterator[tuple[str, int]]:
        """(text, input bytes consumed since the previous document) for every non-empty document.

        Input bytes are the file's own: compressed bytes for a compressed file.
        """
        self.skipped = 0
        for path in self.files:
            try:
                compression = compression_of(path)
                name = content_name(path)
                if name.endswith(PARQUET_SUFFIXES):
                    if compression:
                        raise CorpusError(f"{path}: {compression}-compressed Parquet; Parquet compresses its own "
                                          "columns, so decompress the file first")
                    yield from self._parquet(path)
                    continue
                with open_input(path, compression) as (content, raw):
                    if name.endswith(JSONL_SUFFIXES):
                        yield from self._records(path, content, raw)
                    else:
                        yield from self._text(path, content)
            except OSError as exc:
                raise CorpusError(f"{path}: cannot read: {exc.strerror or exc}") from None
            except (DamagedInput, MissingDecompressor) as exc:
                raise CorpusError(f"{path}: {exc}") from None

    def _text(self, path: Path, content: BinaryIO) -> Iterator[tuple[str, int]]:
        data = content.read()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            if not self.skip_bad:
                raise _utf8_error(str(path), 0, exc) from None
            self.skipped += 1
            return
        if text:
            yield text, path.stat().st_size

    def _records(self, path: Path, lines: Iterable[bytes], file: BinaryIO) -> Iterator[tuple[str, int]]:
        """Streamed (a JSON Lines file may be larger than memory); `file`'s position counts the input bytes read."""
        offset = 0
        read = 0
        first = True
        for lineno, raw in enumerate(lines, start=1):
            start, offset = offset, offset + len(raw)
            if not raw.strip():
                continue
            where = f"{path}:{lineno}"
            if first and raw.lstrip().startswith(b"["):
                raise CorpusError(f"{where}: a JSON array; prepare reads JSON Lines, one JSON object per line "
                                  f"(jq -c '.[]' writes an array's objects so)")
            first = False
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                if not self.skip_bad:
                    raise _utf8_error(where, start, exc) from None
                self.skipped += 1
                continue
            try:
                record = json.loads(line)
            except ValueError as exc:
                raise CorpusError(f"{where}: not JSON: {exc}") from None
            if not isinstance(record, dict):
                raise CorpusError(f"{where}: a JSON Lines record must be an object, got {type(record).__name__}")
            if self.text_field not in record:
                known = ", ".join(record) or "none"
                raise CorpusError(f"{where}: no field {self.text_field!r} (fields: {known}); --text-field names it")
            text = record[self.text_field]
            if not isinstance(text, str):
                raise CorpusError(f"{where}: field {self.text_field!r} must be a string, got {type(text).__name__}")
            if text:
                now = file.tell()
                yield text, now - read
                read = now

    def _parquet(self, path: Path) -> Iterator[tuple[str, int]]:
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            raise CorpusError(f"{path}: reading Parquet needs pyarrow: pip install 'brain-train[parquet]'") from None
        try:
            parquet = pq.ParquetFile(path)
        except (OSError, pa.ArrowException) as exc:
            raise CorpusError(f"{path}: not a Parquet file: {exc}") from None
        schema = parquet.schema_arrow
        if self.text_field not in schema.names:
            raise CorpusError(f"{path}: no column {self.text_field!r} (columns: {', '.join(schema.names)}); --text-field names it")
        column_type = schema.field(self.text_field).type
        if not (pa.types.is_string(column_type) or pa.types.is_large_string(column_type)):
            raise CorpusError(f"{path}: column {self.text_field!r} holds {column_type}, not strings")
        rows = max(parquet.metadata.num_rows, 1)
        size = path.stat().st_size
        row = done = 0
        try:
            for batch in parquet.iter_batches(columns=[self.text_field], batch_size=_PARQUET_BATCH):
                for text in batch.column(0).to_pylist():
                    if text is None:
                        raise CorpusError(f"{path}: row {row}: {self.text_field!r} is null")
                    row += 1
                    if text:
                        now = size * row // rows  # progress: the file's bytes in proportion to rows read
                        yield text, now - done
                        done = now
        except pa.ArrowException as exc:
            raise CorpusError(f"{path}: unreadable Parquet: {exc}") from None
