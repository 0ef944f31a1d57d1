"""A split of a token dataset in a bucket (`data.path: s3://bucket/prefix`), read window by window with ranged GETs.

Why ranges and not a local cache of shards: each epoch is one permutation of
all the windows (data/loader.py), so from its first step a rank reads from
every shard at once. A bounded cache of whole shards would hold one shard or a
few (512 MiB each by default) and fetch each again and again; a cache that
never refetches is a full copy of the dataset on every node. Ranges fetch
exactly the bytes a rank trains on, once: memory is the micro-batch in flight,
and each micro-batch costs one round trip, its windows fetched concurrently
(`__getitems__`, which the DataLoader calls with a batch's indices; one GET per
window, two where a window crosses a shard boundary). `data.numWorkers`
processes prefetch the next batches and hide that latency.

Items, sample order and resume are TokenDataset's (the same windows of the
same stream), so a run on the bucket trains exactly like one on a copy on disk.

Opening reads the manifest, checks that the split holds a window, and asks the
store for each shard's size and CRC-32 (one HEAD each, all at once; prepare
stores shards with the manifest's CRC-32): a missing, truncated or rewritten
shard is a DataError naming its URI before training. Reading it whole, as
TokenDataset does on disk, would cost every rank the whole dataset at start;
instead every fetched window is checked for length and for ids inside the
vocabulary.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch
from torch.utils.data import Dataset

from ..errors import DataError
from .bucket import BucketFolder
from .format import (MANIFEST, Manifest, check_seq_len, no_manifest, object_problems, parse_manifest, window_pieces,
                     windows)


class BucketTokenDataset(Dataset):
    """Windows of seq_len + 1 tokens over `split` of the dataset at `uri` (s3://bucket/prefix), as TokenDataset's."""

    def __init__(self, uri: str, seq_len: int, split: str = "train"):
        self.folder = BucketFolder(uri)
        self.path = self.folder.uri
        self.seq_len = seq_len
        self.split = split
        text = self.folder.read_text(MANIFEST)
        if text is None:
            raise no_manifest(self.path)
        self.manifest: Manifest = parse_manifest(text, self.folder.uri_of(MANIFEST))
        check_seq_len(self.manifest, seq_len, (split,), where=self.path)
        shards = self.manifest.split(split).shards
        problems = object_problems(self.manifest, split, self.folder.objects(s.name for s in shards))
        if problems:
            raise DataError("; ".join(f"{self.path}/{p}" for p in problems))
        self._names = [s.name for s in shards]
        self._starts = [0, *itertools.accumulate(s.tokens for s in shards)]
        self._dtype = np.dtype(self.manifest.dtype).newbyteorder("<")
        self._len = windows(self._starts[-1], seq_len)

    @property
    def vocab_size(self) -> int:
        return self.manifest.tokenizer.vocab_size

    @property
    def eot_id(self) -> int:
        return self.manifest.tokenizer.eot_id

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        size, itemsize = self.seq_len + 1, self._dtype.itemsize
        layout = []
        for index in indices:
            if not 0 <= index < self._len:
                raise IndexError(f"window {index} of {self._len}")
            layout.append(window_pieces(self._starts, index * size, size))
        requests = [(self._names[k], offset * itemsize, (offset + count) * itemsize)
                    for pieces in layout for k, offset, count in pieces]
        fetched = iter(self.folder.ranges(requests))
        items = []
        for pieces in layout:
            ids = [np.frombuffer(next(fetched), dtype=self._dtype) for _ in pieces]
            for (k, offset, _), part in zip(pieces, ids):
                self._check_ids(k, offset, part)
            window = torch.from_numpy(np.concatenate(ids).astype(np.int64))
            items.append((window[:-1], window[1:]))
        return items

    def _check_ids(self, k: int, offset: int, ids: np.ndarray) -> None:
        if len(ids) == 0 or int(ids.max()) < self.vocab_size:
            return
        position = int(np.argmax(ids >= self.vocab_size))
        raise DataError(
            f"{self.folder.uri_of(self._names[k])}: token id {int(ids[position])} at token {offset + position} is "
            f"outside the tokenizer's vocabulary of {self.vocab_size} ids (the object does not match "
            f"{self.folder.uri_of(MANIFEST)})"
        )
