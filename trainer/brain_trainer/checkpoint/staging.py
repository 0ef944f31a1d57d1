"""Staging for asynchronous saves: the state copied into this process's own CPU buffers, in a background thread.

DCP's DefaultStager is not used, for two reasons. On torch 2.11.0 it closes its
StateDictStager after every stage (pytorch/pytorch#183413), so the second
asynchronous save of a process fails with `KeyError: <class 'type'>`. And it
allocates its (pinned) buffers during the first save, which the training loop
then waits for: 5.8-7.5 s for the 1b preset on one H200. Here the buffers are
allocated once, in the staging thread, as soon as the state's layout is known
(`allocate`, after the first optimizer step); every save, the final blocking
one included, copies into them.

One save at a time (the manager waits for the previous save before the next):
a save's buffers are not written again until DCP has written them out.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch.distributed.checkpoint.staging import AsyncStager
from torch.distributed.tensor import DTensor

log = logging.getLogger(__name__)

Where = tuple[Any, ...]  # where a tensor lies in the state dict: its keys and list indices from the root


@dataclass
class Counts:
    """What the buffers cost: allocated ahead of the saves (`allocate`), or by a save itself (a layout it had not seen)."""

    ahead: int = 0
    ahead_bytes: int = 0
    in_saves: int = 0


class Stager(AsyncStager):
    """An AsyncStager that copies into buffers it keeps: DCP's `async_stager`, and `stage_now` for blocking saves.

    `pin`: page-locked buffers, for asynchronous copies from the GPU (CUDA only);
    `announce`: log what `allocate` allocated (one rank's line is enough).
    """

    # DCP's AsyncStager protocol: staging is awaited through the returned future, never after the save is queued.
    _synchronize_after_execute = False

    def __init__(self, pin: bool, announce: bool = False):
        self.pin = pin
        self.announce = announce
        self.counts = Counts()
        self._buffers: dict[Where, torch.Tensor] = {}
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-staging")
        # Copies from the GPU run on their own stream, after what the loop queued before the save (stage()).
        self._stream = torch.cuda.Stream() if pin else None
        self._pin_failed = False
        self.allocated: Optional[Future] = None  # `allocate`'s work, done once the buffers exist

    # -- DCP's AsyncStager --

    def stage(self, state_dict: dict[str, Any]) -> Future:  # type: ignore[override]
        """Copy `state_dict` into the buffers in the staging thread; the future holds the staged state dict."""
        return self._thread.submit(self._stage, state_dict, self._queued())

    def synchronize_staging(self) -> None:
        """Nothing to do: the future `stage` returns completes once the copy has."""

    def close(self) -> None:
        self._thread.shutdown(wait=True)
        self._buffers.clear()

    # -- the project's --

    def allocate(self, state_dict: dict[str, Any]) -> Future:
        """Allocate the buffers for a state dict of this layout, in the staging thread (ahead of the first save)."""
        layout = [(path, tuple(_local(tensor).shape), tensor.dtype) for path, tensor in _tensors(state_dict)]
        self.allocated = self._thread.submit(self._allocate_all, layout)
        return self.allocated

    def stage_now(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """`stage`, waited for: a blocking save's copy, into the same buffers."""
        return self.stage(state_dict).result()

    # -- in the staging thread --

    def _queued(self) -> Optional[torch.cuda.Event]:
        if self._stream is None:
            return None
        event = torch.cuda.Event()
        event.record()  # on the loop's stream: the copies wait for the optimizer step before them
        return event

    def _allocate_all(self, layout: list[tuple[Where, tuple[int, ...], torch.dtype]]) -> None:
        began = time.perf_counter()
        for path, shape, dtype in layout:
            self._buffer(path, shape, dtype, ahead=True)
        if self.announce:
            log.info("checkpoint staging: %d buffers, %.1f MB%s, allocated ahead of the first save in %.2f s",
                     self.counts.ahead, self.counts.ahead_bytes / 1e6, " page-locked" if self.pin else "",
                     time.perf_counter() - began)

    def _buffer(self, path: Where, shape: tuple[int, ...], dtype: torch.dtype, ahead: bool) -> torch.Tensor:
        buffer = self._buffers.get(path)
        if buffer is not None and tuple(buffer.shape) == shape and buffer.dtype == dtype:
            return buffer
        buffer = torch.empty(shape, dtype=dtype)
        if self.pin and buffer.nbytes and not self._pin_failed:
            self._page_lock(buffer)
        self._buffers[path] = buffer
        if ahead:
            self.counts.ahead += 1
            self.counts.ahead_bytes += buffer.nbytes
        else:
            self.counts.in_saves += 1
        return buffer

    def _page_lock(self, buffer: torch.Tensor) -> None:
        # cudaHostRegister, as DCP's own stager pins: torch's pinned allocator would round each buffer up to a
        # power of two (up to twice the state's size in page-locked memory).
        from torch.cuda import _pin_memory_utils

        try:
            _pin_memory_utils.pin_memory(buffer.data_ptr(), buffer.nbytes)
        except RuntimeError as exc:
            self._pin_failed = True
            log.warning("checkpoint staging: page-locking failed (%s); staging into pageable memory", exc)
            return
        # Unlocked when the storage is freed; not at exit, when CUDA may already be gone.
        weakref.finalize(buffer.untyped_storage(), _pin_memory_utils.unpin_memory, buffer.data_ptr()).atexit = False

    @torch.no_grad()
    def _stage(self, state_dict: dict[str, Any], queued: Optional[torch.cuda.Event]) -> dict[str, Any]:
        used: set[Where] = set()
        if self._stream is not None and queued is not None:
            self._stream.wait_event(queued)
        with torch.cuda.stream(self._stream) if self._stream is not None else contextlib.nullcontext():
            staged = self._copy(state_dict, (), used)
        if self._stream is not None:
            self._stream.synchronize()
        for path in set(self._buffers) - used:  # the layout changed: what no key uses any more is freed
            del self._buffers[path]
        return staged

    def _copy(self, value: Any, path: Where, used: set[Where]) -> Any:
        if isinstance(value, torch.Tensor):
            used.add(path)
            local = _local(value)
            buffer = self._buffer(path, tuple(local.shape), local.dtype, ahead=False)
            if local.is_cuda and self._stream is not None:
                local.record_stream(self._stream)  # a temporary's memory is not reused before the copy ran
            buffer.copy_(local, non_blocking=local.is_cuda)
            return _like(value, buffer)
        if isinstance(value, dict):
            return {key: self._copy(item, (*path, key), used) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(self._copy(item, (*path, index), used) for index, item in enumerate(value))
        return copy.deepcopy(value)  # numbers, strings: what DCP pickles, as it was at the save


def _tensors(value: Any, path: Where = ()) -> list[tuple[Where, torch.Tensor]]:
    if isinstance(value, torch.Tensor):
        return [(path, value)]
    if isinstance(value, dict):
        return [found for key, item in value.items() for found in _tensors(item, (*path, key))]
    if isinstance(value, (list, tuple)):
        return [found for index, item in enumerate(value) for found in _tensors(item, (*path, index))]
    return []


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """What this rank holds of a tensor: a DTensor's local shard, else the tensor."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _like(original: torch.Tensor, buffer: torch.Tensor) -> torch.Tensor:
    """The staged value: the buffer, as a DTensor of the original's mesh and placements where that was one."""
    if not isinstance(original, DTensor):
        return buffer
    # Rebuilt with the original's own (version-specific) spec: only the local tensor differs.
    names, spec = original.__tensor_flatten__()
    inner = {name: getattr(original, name) for name in names}
    inner["_local_tensor"] = buffer
    return DTensor.__tensor_unflatten__(inner, spec, original.size(), original.stride())
