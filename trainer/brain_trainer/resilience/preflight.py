"""The preflight: one small all-reduce and a barrier before the first step, under a short timeout.

A rank that never joins, or a network the collectives cannot cross (the
wrong NCCL_SOCKET_IFNAME, a firewall between nodes), would otherwise hang
the first step until the hang watchdog reports `stalled` many minutes
later. Here it is `network-error` within `distributed.preflightSeconds`,
naming the ranks missing and the variables that choose the network.

Which ranks are missing is read from the process group's own store, which
every rank reached at rendezvous: each rank writes its key there before the
collectives, so the ranks that wait can tell who never arrived. torchrun
numbers ranks node by node (rank // ranks per node is the node's group
rank), so a missing rank is named with the host of a rank on its node that
did arrive (in a pod, the host name is the pod's).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from ..contract import EXIT_CODES, NETWORK_ERROR, RESTART_COUNT_ENV
from .failures import write_termination

log = logging.getLogger(__name__)

# The variables that choose the network the collectives use, named in the failure and by `braintrain doctor`.
NETWORK_VARIABLES = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_DISABLE", "NCCL_NET")
# How often a rank looks whether its collective finished (is_completed: the one wait gloo and NCCL both honour
# from the CPU without blocking it past the deadline).
POLL_SECONDS = 0.01
KEY_PREFIX = "brain/preflight"


@dataclass(frozen=True)
class Preflight:
    """What one preflight measured: the all-reduce's and the barrier's seconds."""

    all_reduce_seconds: float
    barrier_seconds: float


class NetworkError(RuntimeError):
    """The preflight did not complete; the message names who is missing and what chose the network."""


def preflight(seconds: float, rank: int, world_size: int, device: torch.device, store: Any = None, *,
              ranks_per_node: int) -> Preflight:
    """Run the preflight on every rank; raises NetworkError when a step of it does not complete in `seconds`.
    `ranks_per_node` (the run's LOCAL_WORLD_SIZE) finds a missing rank's node."""
    store = store if store is not None else dist.distributed_c10d._get_default_store()
    attempt = os.environ.get(RESTART_COUNT_ENV, "0")
    store.set(_key(attempt, rank), socket.gethostname())
    data = torch.ones(1, device=device)
    group = _Group(world_size, ranks_per_node, store, attempt)
    reduce_s = _timed("all-reduce", lambda: dist.all_reduce(data, async_op=True), seconds, group)
    if int(data.item()) != world_size:
        raise NetworkError(f"network-error: the preflight all-reduce summed {int(data.item())}, not {world_size}")
    barrier_s = _timed("barrier", lambda: dist.barrier(async_op=True), seconds, group)
    return Preflight(reduce_s, barrier_s)


def run_preflight(seconds: float, rank: int, world_size: int, device: torch.device, *,
                  ranks_per_node: int) -> Optional[Preflight]:
    """The loop's preflight: skipped when off or alone; a failure writes the termination message and ends the process
    with network-error's code (its collective may still be pending, which a clean exit would wait on)."""
    if seconds <= 0 or world_size < 2:
        return None
    try:
        done = preflight(seconds, rank, world_size, device, ranks_per_node=ranks_per_node)
    except NetworkError as err:
        line = str(err).removeprefix(f"{NETWORK_ERROR}: ")
        log.error("rank %d: %s: %s", rank, NETWORK_ERROR, line)
        write_termination(NETWORK_ERROR, line)
        os._exit(EXIT_CODES[NETWORK_ERROR])
    if rank == 0:  # one line for the job, as every other progress line is rank 0's
        log.info("preflight: all-reduce %.3f s, barrier %.3f s over %d ranks", done.all_reduce_seconds,
                 done.barrier_seconds, world_size)
    return done


def network_settings() -> str:
    """The variables that chose the network, as set here ("unset" when not)."""
    return ", ".join(f"{name}={os.environ.get(name, 'unset')}" for name in NETWORK_VARIABLES)


def _key(attempt: str, rank: int) -> str:
    return f"{KEY_PREFIX}/{attempt}/{rank}"


@dataclass(frozen=True)
class _Group:
    """Who takes part in a preflight, and where each rank says it arrived."""

    world_size: int
    ranks_per_node: int
    store: Any  # the process group's store: each rank's key, its host as value
    attempt: str  # torchrun's restart count: each attempt's keys apart


def _timed(what: str, start: Callable[[], Any], seconds: float, group: _Group) -> float:
    began = time.monotonic()
    try:
        work = start()
        while not work.is_completed():
            if time.monotonic() - began > seconds:
                raise TimeoutError(what)
            time.sleep(POLL_SECONDS)
        work.wait()
    except (RuntimeError, TimeoutError, ConnectionError) as exc:
        raise NetworkError(_explain(what, seconds, group, exc)) from exc
    return time.monotonic() - began


def _explain(what: str, seconds: float, group: _Group, exc: BaseException) -> str:
    arrived = {r: _host(group.store, group.attempt, r) for r in range(group.world_size)}
    missing = [r for r, host in arrived.items() if host is None]
    if missing:
        named = "; ".join(f"rank {r}{_where(r, group.ranks_per_node, arrived)}" for r in missing)
        why = f"{named} did not join the {what} within {seconds:g} s"
    else:
        why = (f"every rank joined, but the {what} did not complete within {seconds:g} s "
               f"({type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else 'no message'})")
    return f"{NETWORK_ERROR}: {why}; {network_settings()}"


def _where(rank: int, per_node: int, arrived: dict[int, Optional[str]]) -> str:
    node = rank // per_node
    hosts = {host for r, host in arrived.items() if host is not None and r // per_node == node}
    return f" (pod {hosts.pop()})" if len(hosts) == 1 else f" (node rank {node})"


def _host(store: Any, attempt: str, rank: int) -> Optional[str]:
    key = _key(attempt, rank)
    try:
        return store.get(key).decode() if store.check([key]) else None
    except (RuntimeError, ConnectionError):
        return None
