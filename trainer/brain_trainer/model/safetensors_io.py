"""The safetensors layout Hugging Face writes and reads, for export (streamed) and initFrom (read per shard).

From the upstream sources (huggingface/safetensors `safetensors/src/tensor.rs`
and `index.rs`, huggingface_hub `serialization/_base.py`):

- a file is an 8-byte little-endian header length N, N bytes of JSON padded
  with spaces to a multiple of 8, then the tensors' bytes (C order, little
  endian) back to back. The JSON maps each name to `{"dtype", "shape",
  "data_offsets": [begin, end]}` (relative to the data, contiguous from 0, the
  last end is the end of the file), plus an optional `__metadata__`
  string-to-string map; writers order tensors by descending dtype, then name;
- one file is `model.safetensors`; shards are `model-00001-of-00003.safetensors`
  filled greedily in order, a new one started when the next tensor would pass
  the limit (a tensor over the limit gets a shard of its own), listed by
  `model.safetensors.index.json`: `{"metadata": {"total_size": BYTES},
  "weight_map": {name: file}}`, written with indent 2 and sorted keys.

Reading is as strict as the upstream reader, whose header types make the
same refusals (shapes and offsets are `usize`): a negative or fractional
dimension or offset is malformed. Two more bounds keep hostile files from
escaping as something other than SafetensorsError: JSON nested deeper than
MAX_JSON_DEPTH (a header is three levels: the object, an entry, its shape)
is refused before Python's recursive JSON parser meets it, and an index may
only name shard files inside its own folder.

Writing goes header first (shapes are known before any tensor is read), then
one tensor at a time, so a writer holds no more than the tensor it is given.
"""

from __future__ import annotations

import json
import math
import posixpath
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Iterable, Optional

import torch

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
SUFFIX = ".safetensors"
MAX_HEADER_BYTES = 100_000_000  # what the upstream reader accepts
HEADER_ALIGN = 8
# The nesting a header or an index may have; theirs is 3, and Python's JSON parser recurses once per level.
MAX_JSON_DEPTH = 8
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")

# The upstream Dtype enum, in its (alignment) order.
DTYPE_ORDER = ("BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "F64",
               "I64", "U64")
TORCH_DTYPES = {
    torch.bool: "BOOL", torch.uint8: "U8", torch.int8: "I8", torch.float8_e5m2: "F8_E5M2",
    torch.float8_e4m3fn: "F8_E4M3", torch.int16: "I16", torch.uint16: "U16", torch.float16: "F16",
    torch.bfloat16: "BF16", torch.int32: "I32", torch.uint32: "U32", torch.float32: "F32", torch.float64: "F64",
    torch.int64: "I64", torch.uint64: "U64",
}
ELEMENT_BYTES = {name: torch.empty((), dtype=dtype).element_size() for dtype, name in TORCH_DTYPES.items()}


class SafetensorsError(ValueError):
    """A file or folder that is not valid safetensors; the message names the file."""


@dataclass(frozen=True)
class Entry:
    """One tensor of a safetensors file, as its header describes it."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    file: Path


def shard_name(index: int, count: int) -> str:
    return f"model-{index:05d}-of-{count:05d}{SUFFIX}"


def plan_shards(sizes: Iterable[tuple[str, int]], max_shard_bytes: Optional[int]) -> list[list[str]]:
    """Names grouped into files in order: a new file when the next tensor would pass the limit (None: one file)."""
    shards: list[list[str]] = [[]]
    filled = 0
    for name, size in sizes:
        if max_shard_bytes is not None and shards[-1] and filled + size > max_shard_bytes:
            shards.append([])
            filled = 0
        shards[-1].append(name)
        filled += size
    return shards


def file_order(entries: Iterable[tuple[str, str]]) -> list[str]:
    """Names as the upstream writer lays them out in a file: descending dtype, then name."""
    return [name for name, _ in sorted(entries, key=lambda e: (-DTYPE_ORDER.index(e[1]), e[0]))]


def header_bytes(entries: list[tuple[str, str, tuple[int, ...]]], metadata: Optional[dict[str, str]] = None) -> bytes:
    """The length prefix and the padded JSON header for (name, dtype, shape) laid out in this order."""
    header: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for name, dtype, shape in entries:
        size = math.prod(shape) * ELEMENT_BYTES[dtype]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % HEADER_ALIGN)
    return struct.pack("<Q", len(text)) + text


def write_tensor(f: BinaryIO, tensor: torch.Tensor) -> None:
    """The tensor's bytes, C order, little endian (this host's order: x86 and arm64 alike)."""
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    f.write(memoryview(flat.view(torch.uint8).numpy()))


def _parse_json(raw: bytes, path: Path, what: str) -> Any:
    """JSON of a header or an index, its nesting checked first: strings dropped, then only the brackets walked."""
    depth = 0
    for bracket in _JSON_STRING.sub(b"", raw).translate(None, _NOT_BRACKETS):
        depth += 1 if bracket in b"[{" else -1
        if depth > MAX_JSON_DEPTH:
            raise SafetensorsError(f"{path}: {what} nests deeper than {MAX_JSON_DEPTH} levels")
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise SafetensorsError(f"{path}: {what} is not valid JSON") from None


def _count(value: Any) -> int:
    """A shape dimension or a data offset: a usize upstream, so a non-negative integer (not a bool, not 2.5)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(value)
    return value


def read_header(path: Path) -> tuple[dict[str, Entry], dict[str, str]]:
    """The tensors a safetensors file holds and its metadata, checked as the upstream reader checks them."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            prefix = f.read(8)
            if len(prefix) < 8:
                raise SafetensorsError(f"{path}: {size} bytes, shorter than the 8-byte header length (truncated)")
            (length,) = struct.unpack("<Q", prefix)
            if length > MAX_HEADER_BYTES or 8 + length > size:
                raise SafetensorsError(f"{path}: header length {length} does not fit the file's {size} bytes")
            raw = f.read(length)
    except OSError as exc:
        raise SafetensorsError(f"{path}: {exc.strerror or exc}") from None
    header = _parse_json(raw, path, "the header")
    if not isinstance(header, dict):
        raise SafetensorsError(f"{path}: the header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    entries: dict[str, Entry] = {}
    spans = []
    for name, info in header.items():
        try:
            dtype, shape, (begin, end) = info["dtype"], tuple(map(_count, info["shape"])), map(_count, info["data_offsets"])
            nbytes = math.prod(shape) * ELEMENT_BYTES[dtype]
        except (KeyError, TypeError, ValueError):
            raise SafetensorsError(f"{path}: tensor {name!r} has a malformed header entry") from None
        if end - begin != nbytes:
            raise SafetensorsError(f"{path}: tensor {name!r} spans {end - begin} bytes, its shape and dtype need {nbytes}")
        entries[name] = Entry(name, dtype, shape, nbytes, path)
        spans.append((begin, end, name))
    position = 0
    for begin, end, name in sorted(spans):
        if begin != position:
            raise SafetensorsError(f"{path}: tensor {name!r} starts at byte {begin}, expected {position}")
        position = end
    if 8 + length + position != size:
        kind = "truncated" if 8 + length + position > size else "trailing bytes"
        raise SafetensorsError(f"{path}: {size} bytes, the header describes {8 + length + position} ({kind})")
    return entries, metadata


def read_weights(path: Path) -> tuple[dict[str, Entry], dict[str, str]]:
    """Every tensor of a safetensors file, or of a folder holding model.safetensors or an index with its shards."""
    if path.is_file():
        return read_header(path)
    index = path / INDEX_FILE
    if not index.is_file():
        return read_header(path / SINGLE_FILE)
    try:
        weight_map = _parse_json(index.read_bytes(), index, "the index")["weight_map"]
        files = sorted(set(weight_map.values()))
        if not all(isinstance(file, str) for file in files):
            raise TypeError(files)
    except (OSError, KeyError, TypeError, AttributeError):
        raise SafetensorsError(f"{index}: not an index (a JSON object with a weight_map)") from None
    for file in files:
        # Checked by name, not resolved: a Hugging Face cache's shards are symlinks into its blobs folder.
        if posixpath.isabs(file) or posixpath.normpath(file).split("/")[0] == "..":
            raise SafetensorsError(f"{index}: shard {file!r} lies outside the folder {path}")
    entries: dict[str, Entry] = {}
    metadata: dict[str, str] = {}
    for file in files:
        found, metadata = read_header(path / file)
        entries.update(found)
    for name, file in weight_map.items():
        if entries.get(name) is None or entries[name].file.name != file:
            raise SafetensorsError(f"{index}: tensor {name!r} is not in {file}")
    return {name: entries[name] for name in weight_map}, metadata
