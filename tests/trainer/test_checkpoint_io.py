"""Checkpoint file I/O in one process: checksums computed while writing, tensors read straight into place.

- ChecksummingWriter's digest is the digest of the bytes that reach the disk, whatever the
  pieces written (small, multi-dimensional, larger than its chunk);
- a save's manifest, built from those streamed checksums (no read-back), matches the files, and a
  byte flipped inside a tensor's data (which torch.load itself does not notice) is caught at load;
- the reader fills destinations of every layout exactly: the ones it reads in place and the ones
  it leaves to DCP (a tensor saved transposed, another dtype, a non-contiguous destination).
"""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from brain_trainer.checkpoint import load_model, save_model, shards, store


def test_checksumming_writer_digest_is_the_digest_of_the_file(tmp_path):
    pieces = [
        b"header",
        np.arange(12, dtype=np.float32).reshape(3, 4),  # a 2-D float buffer, not bytes
        np.random.default_rng(0).integers(0, 256, (20 << 20) + 3, dtype=np.uint8),  # over two chunks
        memoryview(b"tail"),
    ]
    path = tmp_path / "f.bin"
    with open(path, "wb") as raw:
        writer = store.ChecksummingWriter(raw)
        for piece in pieces:
            assert writer.write(piece) == memoryview(piece).nbytes
        assert writer.tell() == sum(memoryview(p).nbytes for p in pieces)
        writer.flush()
    data = path.read_bytes()
    assert writer.checksum.digest() == {"size": len(data), "crc32": f"{zlib.crc32(data):08x}"}
    assert store.file_digest(path) == writer.checksum.digest()


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 48), nn.Linear(48, 8))


def test_streamed_checksums_match_the_files_and_catch_a_flipped_byte(tmp_path):
    model = _model()
    folder = tmp_path / "ckpt"
    save_model(folder, model)
    assert torch.serialization.get_crc32_options()  # torch.save's own CRC is off only inside the shard writer
    manifest = store.read_manifest(folder)
    assert sorted(manifest["files"]) == sorted(p.name for p in folder.iterdir() if p.name != store.MANIFEST)
    for name, digest in manifest["files"].items():
        assert store.file_digest(folder / name) == digest, name

    shard = folder / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    weight = model[0].weight.detach().numpy().tobytes()
    at = data.find(weight) + len(weight) // 2  # a byte inside the tensor's data, not a header
    assert at > len(weight) // 2
    data[at] ^= 0x01
    shard.write_bytes(bytes(data))
    with pytest.raises(store.ManifestError, match=r"__0_0\.distcp: checksum .* \(corrupted\)"):
        load_model(folder, _model())


def test_reads_in_place_and_through_dcp_give_the_saved_values(tmp_path):
    gen = torch.Generator().manual_seed(1)
    saved = {
        "plain": torch.randn(33, 17, generator=gen),
        "transposed": torch.randn(9, 5, generator=gen).t(),  # saved with its strides: not one run of rows
        "bf16": torch.randn(40, generator=gen).bfloat16(),
        "scalar": torch.tensor(7.5),
        "ints": torch.arange(-5, 6),
        "widened": torch.randn(6, 3, generator=gen),  # loaded into float64: DCP converts
        "into_view": torch.randn(4, 6, generator=gen),  # loaded into a non-contiguous destination
        "extra": {"note": "kept", "n": [1, 2, 3]},
    }
    shards.save(saved, tmp_path / "c", None)
    holder = torch.zeros(6, 4)
    loaded = {
        "plain": torch.zeros(33, 17),
        "transposed": torch.zeros(5, 9),
        "bf16": torch.zeros(40, dtype=torch.bfloat16),
        "scalar": torch.tensor(0.0),
        "ints": torch.zeros(11, dtype=torch.int64),
        "widened": torch.zeros(6, 3, dtype=torch.float64),
        "into_view": holder.t(),
        "extra": {"note": None, "n": None},
    }
    shards.load(loaded, tmp_path / "c", None)
    for key in ("plain", "transposed", "bf16", "scalar", "ints", "into_view"):
        assert loaded[key].dtype == saved[key].dtype and torch.equal(loaded[key], saved[key]), key
    assert torch.equal(loaded["widened"], saved["widened"].double())
    assert torch.equal(holder, saved["into_view"].t())
    assert loaded["extra"] == saved["extra"]
    assert shards.load_prefix(tmp_path / "c", "extra") == saved["extra"]
