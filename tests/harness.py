"""Run a function on N real gloo ranks (separate processes) and collect results.

    def body(rank, world_size, x):      # top-level, so spawn can import it
        ...
        return something_picklable
    results = run_ranks(body, 2, 3.0)   # [result of rank 0, result of rank 1]

Each rank gets RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT in its
environment and a gloo default process group already initialised; the group is
destroyed afterwards. A rank's exception fails the call with its traceback.
"""

from __future__ import annotations

import os
import socket
import traceback
from typing import Any, Callable

import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, world_size: int, port: int, fn: Callable, args: tuple, queue) -> None:
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        try:
            queue.put((rank, True, fn(rank, world_size, *args)))
        finally:
            dist.destroy_process_group()
    except BaseException:
        queue.put((rank, False, traceback.format_exc()))
        raise


def run_ranks(fn: Callable, world_size: int, *args: Any, timeout: float = 180.0) -> list[Any]:
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(_entry, args=(world_size, free_port(), fn, args, queue), nprocs=world_size,
                       join=True, start_method="spawn")
    results: dict[int, Any] = {}
    while not queue.empty():
        rank, ok, value = queue.get()
        if not ok:
            raise AssertionError(f"rank {rank} failed:\n{value}")
        results[rank] = value
    assert sorted(results) == list(range(world_size)), f"missing results: {sorted(results)}"
    return [results[r] for r in range(world_size)]
