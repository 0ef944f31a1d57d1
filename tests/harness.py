"""Run a function on N real gloo ranks (separate processes) and collect results.

    def body(rank, world_size, x):      # top-level, so a rank can import it
        ...
        return something_picklable
    results = run_ranks(body, 2, 3.0)   # [result of rank 0, result of rank 1]

Each rank is forked from a server process that imported torch and the trainer
once (forkserver; a spawned rank would import them again, for seconds), and
runs in the caller's environment and folder, as a spawned one would. It gets
RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT in its
environment, one intra-op thread (two ranks on two cores must not fight over
threads), and a gloo default process group already initialised; the group is
destroyed afterwards. A rank's exception fails the call with its traceback.

The ranks meet in a TCPStore that the calling process hosts for the call:
created on port 0, it listens on the port the kernel gives it at bind time and
holds it until the ranks are gone, so no port is ever chosen first and bound
later (another test's ranks could take it in between), and each call's ranks
see only their own store, never another run's keys. MASTER_PORT names that
store's port; the ranks join it as clients.

Return plain values (numbers, lists, dicts; `tensor.tolist()`), not tensors:
a tensor travels as shared memory that vanishes when its rank exits.
"""

from __future__ import annotations

import logging
import os
import queue as queue_module
import time
import traceback
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["run_ranks"]

HOST = "127.0.0.1"
# Ranks fork from a server that imported torch and the trainer once, instead of each importing them anew (a
# spawned rank spends seconds on it); the server itself starts clean, as spawn's children do, without the
# test process's threads.
START_METHOD = "forkserver"
PRELOAD = ["torch", "torch.distributed", "brain_trainer.loop.train", "brain_trainer.parallel.pipeline"]


def _entry(rank: int, world_size: int, port: int, env: dict[str, str], cwd: str, fn: Callable, args: tuple,
           results) -> None:
    # A forked child starts with the fork server's environment and folder: take the caller's, as spawn would.
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR=HOST,
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)
    try:
        store = dist.TCPStore(HOST, port, is_master=False)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
        try:
            results.put((rank, True, fn(rank, world_size, *args)))
        finally:
            dist.destroy_process_group()
    except BaseException:
        results.put((rank, False, traceback.format_exc()))
        raise
    # The result is delivered; leave without the interpreter's teardown, where libtorch's static
    # destructors now and then abort ("terminate called without an active exception") after a clean run.
    results.close()
    results.join_thread()
    os._exit(0)


def run_ranks(fn: Callable, world_size: int, *args: Any, timeout: float = 300.0) -> list[Any]:
    context = mp.get_context(START_METHOD)
    context.set_forkserver_preload(PRELOAD)
    results = context.Queue()
    store = dist.TCPStore(HOST, 0, is_master=True, wait_for_workers=False)
    procs = mp.start_processes(
        _entry, args=(world_size, store.port, dict(os.environ), os.getcwd(), fn, args, results), nprocs=world_size,
        join=False, start_method=START_METHOD,
    )
    collected: dict[int, tuple[bool, Any]] = {}
    deadline = time.monotonic() + timeout
    try:
        # Drain while the ranks run: a result larger than the pipe's buffer
        # keeps its rank alive until somebody reads it.
        while len(collected) < world_size:
            try:
                rank, ok, value = results.get(timeout=1.0)
                collected[rank] = (ok, value)
                if not ok:
                    break
            except queue_module.Empty:
                if procs.join(timeout=0):  # every rank exited; a crash raises here
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"ranks did not finish within {timeout:.0f} s")
        for rank, (ok, value) in sorted(collected.items()):
            if not ok:
                raise AssertionError(f"rank {rank} failed:\n{value}")
        while not procs.join(timeout=max(1.0, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                raise TimeoutError(f"ranks did not exit within {timeout:.0f} s")
    finally:
        for process in procs.processes:
            if process.is_alive():
                process.kill()
    assert sorted(collected) == list(range(world_size)), f"missing results: {sorted(collected)}"
    return [collected[r][1] for r in range(world_size)]


class LogLines(logging.Handler):
    """Keeps the messages logged at INFO and above: what a rank saw, for its result (caplog cannot reach a rank)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
