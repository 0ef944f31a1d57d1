"""`braintrain doctor FILE`: what a distributed-training debugging session asks for first, on this machine.

The environment variables torchrun and NCCL read, the backend the job would
use here, the devices, and the job's own preflight (preflight.py: one
all-reduce and a barrier, timed) among local processes over loopback.
"""

from __future__ import annotations

import os
import tempfile
from datetime import timedelta
from typing import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..config import DistributedConfig
from ..contract import LAUNCH_ENV_KEYS, LAUNCH_ENV_PREFIXES
from .preflight import NetworkError, preflight

# Prefixes of the variables NCCL, gloo, CUDA and torch's distributed layer read besides torchrun's.
READ_PREFIXES = (*LAUNCH_ENV_PREFIXES, "NCCL_", "GLOO_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_", "CUDA_VISIBLE_DEVICES")


def environment() -> list[str]:
    """`NAME=value` of every variable set here that torchrun, NCCL, gloo or CUDA read."""
    return [f"{name}={value}" for name, value in sorted(os.environ.items())
            if name in LAUNCH_ENV_KEYS or name.startswith(READ_PREFIXES)]


def devices() -> list[str]:
    if not torch.cuda.is_available():
        return [f"cpu ({os.cpu_count()} cores): no CUDA device"]
    return [f"cuda:{i} {torch.cuda.get_device_name(i)}" for i in range(torch.cuda.device_count())]


def doctor(config: DistributedConfig, nproc: int, say: Callable[[str], None] = print) -> int:
    """Print the report; 0 when the preflight passed, 1 when it did not (its line says why)."""
    cuda = torch.cuda.is_available()
    backend = config.resolved_backend(cuda)
    if backend == "nccl":
        nproc = min(nproc, torch.cuda.device_count())
    say("environment (torchrun, NCCL, gloo, CUDA):")
    for line in environment() or ["(none set)"]:
        say(f"  {line}")
    say(f"backend: {backend} (distributed.backend: {config.backend})")
    say("devices:")
    for line in devices():
        say(f"  {line}")
    if nproc < 2:
        say(f"preflight: skipped, {nproc} process(es) here: an all-reduce needs two")
        return 0
    seconds = config.preflight_seconds or 60.0
    with tempfile.TemporaryDirectory(prefix="braintrain-doctor-") as folder:
        answers = mp.get_context("spawn").SimpleQueue()
        mp.start_processes(_rank, args=(nproc, backend, seconds, os.path.join(folder, "store"), answers),
                           nprocs=nproc, join=True, start_method="spawn")
        answer = answers.get()
    say(f"preflight ({nproc} processes, {backend}, within {seconds:g} s): {answer}")
    return 0 if answer.startswith("all-reduce") else 1


def _rank(rank: int, world_size: int, backend: str, seconds: float, store_path: str, answers) -> None:
    device = torch.device(f"cuda:{rank}") if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    store = dist.FileStore(store_path, world_size)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=seconds))
    try:
        # every rank is a process of this machine: one node
        done = preflight(seconds, rank, world_size, device, store=store, ranks_per_node=world_size)
        answer = f"all-reduce {done.all_reduce_seconds * 1000:.1f} ms, barrier {done.barrier_seconds * 1000:.1f} ms"
    except NetworkError as err:
        answer = str(err)
    if rank == 0:
        answers.put(answer)
    dist.destroy_process_group()
