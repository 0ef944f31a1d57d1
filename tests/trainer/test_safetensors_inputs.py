"""Hostile safetensors files and indexes (issue 28, point 6): each refused as SafetensorsError naming the file.

The format (huggingface/safetensors, docs and safetensors/src/tensor.rs): an 8-byte little-endian header
length, a JSON header mapping each tensor to {dtype, shape, data_offsets} (usize values) with an optional
`__metadata__`, then the data; a sharded folder lists its files in model.safetensors.index.json.
"""

from __future__ import annotations

import json
import struct

import pytest

from brain_trainer.model.safetensors_io import (
    INDEX_FILE,
    MAX_JSON_DEPTH,
    SafetensorsError,
    header_bytes,
    read_header,
    read_weights,
)


def write(path, header: dict, data: bytes = b"") -> None:
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def test_a_negative_dimension_is_malformed_though_the_byte_count_agrees(tmp_path):
    bad = tmp_path / "neg.safetensors"
    # (-2, -2) has the 4 elements of (2, 2): only the sign check stops it.
    write(bad, {"w": {"dtype": "F32", "shape": [-2, -2], "data_offsets": [0, 16]}}, bytes(16))
    with pytest.raises(SafetensorsError, match=rf"^{bad}: tensor 'w' has a malformed header entry$"):
        read_header(bad)
    write(bad, {"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [-16, 0]}}, bytes(16))
    with pytest.raises(SafetensorsError, match=rf"^{bad}: tensor 'w' has a malformed header entry$"):
        read_header(bad)
    good = tmp_path / "good.safetensors"
    good.write_bytes(header_bytes([("w", "F32", (2, 2))]) + bytes(16))
    assert read_header(good)[0]["w"].shape == (2, 2)


def test_a_deeply_nested_header_is_refused_before_the_json_parser_recurses(tmp_path):
    deep = tmp_path / "deep.safetensors"
    raw = b"[" * 100_000 + b"]" * 100_000
    deep.write_bytes(struct.pack("<Q", len(raw)) + raw)
    with pytest.raises(SafetensorsError, match=rf"^{deep}: the header nests deeper than {MAX_JSON_DEPTH} levels$"):
        read_header(deep)
    # Brackets inside strings are text, not nesting.
    named = tmp_path / "named.safetensors"
    named.write_bytes(header_bytes([("[[[[[[[[[[{{{{{{{{{{", "F32", (1,))], {"note": "]]]]]]]]]]\\\"[[[[[[[[[["}) + bytes(4))
    assert list(read_header(named)[0]) == ["[[[[[[[[[[{{{{{{{{{{"]


@pytest.mark.parametrize("shard", ["../outside.safetensors", "/etc/passwd", "sub/../../outside.safetensors"])
def test_an_index_naming_a_file_outside_its_folder_is_refused(tmp_path, shard):
    folder = tmp_path / "model"
    folder.mkdir()
    (tmp_path / "outside.safetensors").write_bytes(header_bytes([("w", "F32", (1,))]) + bytes(4))
    (folder / INDEX_FILE).write_text(json.dumps({"metadata": {}, "weight_map": {"w": shard}}))
    with pytest.raises(SafetensorsError, match=rf"^{folder / INDEX_FILE}: shard '{shard}' lies outside the folder {folder}$"):
        read_weights(folder)
    (folder / INDEX_FILE).write_text("[" * 50_000 + "]" * 50_000)
    with pytest.raises(SafetensorsError, match=rf"^{folder / INDEX_FILE}: the index nests deeper than"):
        read_weights(folder)
