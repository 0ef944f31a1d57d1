"""Start training under torchrun, SLURM, a manual multi-node launch, or alone.

`detect_environment` and `torch_environment` are pure: they read a mapping of
environment variables (and the config's world layout) and say which launcher
started us and which torch variables (RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) follow from it.
`DistributedLauncher.launch` applies that to `os.environ` and calls the
training function in this process, where `init_process_group("env://")`
then finds everything it needs.

A manual launch starts one process per rank by hand: `distributed.num_nodes`,
`node_rank`, `master_addr` and `master_port` give the layout, and each
process's LOCAL_RANK (default 0) and LOCAL_WORLD_SIZE (default 1) place it on
its node; NODE_RANK, RANK, WORLD_SIZE, MASTER_ADDR or MASTER_PORT set in the
environment win over the config.
"""

from __future__ import annotations

import os
import re
import socket
from contextlib import contextmanager
from typing import Callable, Iterator, Mapping, MutableMapping, Optional, TypeVar

from ..config import DistributedConfig
from ..contract import RUN_ID_ENV, TORCH_RANK_VARIABLES
from ..schema import ConfigError, FieldError

ENVIRONMENTS = ("torchrun", "slurm", "manual", "single")
A = TypeVar("A")
T = TypeVar("T")

_BRACKET = re.compile(r"\[([^\]]*)\]")


def detect_environment(env: Mapping[str, str], config: Optional[DistributedConfig] = None) -> str:
    """Which launcher started this process: torchrun, slurm, manual or single.

    Manual: the environment names the rank and rendezvous, or the config a
    layout of several nodes.
    """
    if RUN_ID_ENV in env or "GROUP_RANK" in env:
        return "torchrun"
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        return "slurm"
    if all(key in env for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR")):
        return "manual"
    if config is not None and config.num_nodes > 1:
        return "manual"
    return "single"


def expand_nodelist(nodelist: str) -> list[str]:
    """SLURM's compressed host list, e.g. `node[01-03,07],gpu1` -> node01, node02, node03, node07, gpu1."""
    hosts: list[str] = []
    for pattern in _split_top_level(nodelist):
        hosts.extend(_expand_pattern(pattern, nodelist))
    if not hosts:
        raise _error("SLURM_JOB_NODELIST", f"names no host, got {nodelist!r}")
    return hosts


def _split_top_level(nodelist: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in nodelist:
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [part.strip() for part in parts if part.strip()]


def _expand_pattern(pattern: str, nodelist: str) -> list[str]:
    match = _BRACKET.search(pattern)
    if match is None:
        if "[" in pattern or "]" in pattern:
            raise _error("SLURM_JOB_NODELIST", f"unbalanced brackets in {nodelist!r}")
        return [pattern]
    head, tail = pattern[: match.start()], pattern[match.end() :]
    expanded = []
    for suffix in _expand_ranges(match.group(1), nodelist):
        expanded.extend(_expand_pattern(head + suffix + tail, nodelist))
    return expanded


def _expand_ranges(ranges: str, nodelist: str) -> list[str]:
    """`01-03,07` -> 01, 02, 03, 07 (zero padding kept from the lower bound)."""
    values = []
    for item in ranges.split(","):
        low, _, high = item.strip().partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise _error("SLURM_JOB_NODELIST", f"bad range {item!r} in {nodelist!r}")
        if not high:
            values.append(low)
            continue
        if int(high) < int(low):
            raise _error("SLURM_JOB_NODELIST", f"descending range {item!r} in {nodelist!r}")
        values.extend(str(n).zfill(len(low)) for n in range(int(low), int(high) + 1))
    return values


def tasks_on_node(tasks_per_node: str, node_id: int) -> int:
    """Entry `node_id` of SLURM_TASKS_PER_NODE, whose runs are written `2(x3),1`."""
    counts: list[int] = []
    for item in tasks_per_node.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", item)
        if match is None:
            raise _error("SLURM_TASKS_PER_NODE", f"cannot parse {tasks_per_node!r}")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    if node_id >= len(counts):
        raise _error("SLURM_NODEID", f"must be < the {len(counts)} nodes of SLURM_TASKS_PER_NODE, got {node_id}")
    return counts[node_id]


@contextmanager
def held_port() -> Iterator[int]:
    """A loopback port, kept from everyone else until the block ends, for a child process to listen on.

    Choosing a free port and binding it later races: in between, anyone may take
    it. The socket that chose this one stays bound, with SO_REUSEADDR and without
    listening, until the block ends: the kernel hands it to no other bind of port 0,
    and refuses a bind of its number without SO_REUSEADDR; the child's server (an
    HTTPServer, torch's TCPStore), which sets SO_REUSEADDR, may still bind and
    listen on it. Only a process that chose the same number earlier, in the same
    racy way, could take it first.
    """
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def torch_environment(
    env: Mapping[str, str],
    config: DistributedConfig,
    *,
    kind: Optional[str] = None,
) -> dict[str, str]:
    """The torch.distributed variables for this process, derived from `env`.

    Variables the environment already sets explicitly win over derived ones
    (an sbatch script exporting MASTER_ADDR keeps it). Raises ConfigError
    naming the variable when one is missing or malformed.
    """
    kind = kind or detect_environment(env, config)
    if kind == "torchrun":
        # torchrun sets every variable itself; check them rather than guess.
        out = {key: _require(env, key) for key in TORCH_RANK_VARIABLES}
    elif kind == "slurm":
        out = _from_slurm(env, config)
    elif kind == "manual":
        out = _from_manual(env, config)
    elif kind == "single":
        # Port 0: the process group's store binds whatever port the kernel gives it, which nobody can take first.
        out = dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT="0")
    else:
        raise _error("environment", f"must be one of {', '.join(ENVIRONMENTS)}; got {kind!r}")
    _check_ranks(out)
    return out


def _from_slurm(env: Mapping[str, str], config: DistributedConfig) -> dict[str, str]:
    world_size = env_int(env, "SLURM_NTASKS", minimum=1)
    if "SLURM_NTASKS_PER_NODE" in env and env["SLURM_NTASKS_PER_NODE"].isdigit():
        local_world_size = env_int(env, "SLURM_NTASKS_PER_NODE", minimum=1)
    elif "SLURM_TASKS_PER_NODE" in env:
        local_world_size = tasks_on_node(env["SLURM_TASKS_PER_NODE"], env_int(env, "SLURM_NODEID", default=0))
    else:
        local_world_size = world_size
    if "MASTER_ADDR" in env:
        master_addr = env["MASTER_ADDR"]
    elif "SLURM_JOB_NODELIST" in env:
        master_addr = expand_nodelist(env["SLURM_JOB_NODELIST"])[0]
    else:
        master_addr = config.master_addr
    return dict(
        RANK=str(env_int(env, "SLURM_PROCID")),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(env_int(env, "SLURM_LOCALID", default=0)),
        LOCAL_WORLD_SIZE=str(local_world_size),
        MASTER_ADDR=master_addr,
        MASTER_PORT=str(env_int(env, "MASTER_PORT", default=config.master_port)),
    )


def _from_manual(env: Mapping[str, str], config: DistributedConfig) -> dict[str, str]:
    nodes = config.num_nodes
    if "WORLD_SIZE" in env:
        world_size = env_int(env, "WORLD_SIZE", minimum=1)
        if world_size % nodes:
            raise _error("WORLD_SIZE", f"must be a multiple of distributed.num_nodes ({nodes}), got {world_size}")
        local_world_size = env_int(env, "LOCAL_WORLD_SIZE", default=world_size // nodes, minimum=1)
    else:
        local_world_size = env_int(env, "LOCAL_WORLD_SIZE", default=1, minimum=1)
        world_size = nodes * local_world_size
    if "RANK" in env:
        rank = env_int(env, "RANK")
        local_rank = env_int(env, "LOCAL_RANK", default=rank % local_world_size)
    else:
        node_rank = env_int(env, "NODE_RANK", default=config.node_rank)
        if node_rank >= nodes:
            raise _error("NODE_RANK", f"must be < distributed.num_nodes ({nodes}), got {node_rank}")
        local_rank = env_int(env, "LOCAL_RANK", default=0)
        rank = node_rank * local_world_size + local_rank
    return dict(
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(local_rank),
        LOCAL_WORLD_SIZE=str(local_world_size),
        MASTER_ADDR=env.get("MASTER_ADDR") or config.master_addr,
        MASTER_PORT=str(env_int(env, "MASTER_PORT", default=config.master_port)),
    )


def _require(env: Mapping[str, str], key: str) -> str:
    value = env.get(key, "")
    if not value:
        raise _error(key, "must be set in the environment")
    return value


def env_int(
    env: Mapping[str, str], key: str, *, default: Optional[int] = None, minimum: int = 0, maximum: Optional[int] = None
) -> int:
    """The integer variable `key` of `env` (`default` when unset); ConfigError naming it when malformed."""
    if key not in env and default is not None:
        return default
    raw = _require(env, key)
    try:
        value = int(raw)
    except ValueError:
        raise _error(key, f"must be an integer, got {raw!r}") from None
    if value < minimum:
        raise _error(key, f"must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise _error(key, f"must be <= {maximum}, got {value}")
    return value


def _error(variable: str, message: str) -> ConfigError:
    return ConfigError([FieldError(variable, message)])


def _check_ranks(out: Mapping[str, str]) -> None:
    """Cross-variable rules; values are integers by now except for torchrun's, checked here too."""
    # Port 0 lets rank 0 bind any port, which no other rank could find: only a world of one may use it.
    env_int(out, "MASTER_PORT", minimum=0 if env_int(out, "WORLD_SIZE", minimum=1) == 1 else 1, maximum=65535)
    for rank_key, size_key in (("RANK", "WORLD_SIZE"), ("LOCAL_RANK", "LOCAL_WORLD_SIZE")):
        rank, size = env_int(out, rank_key), env_int(out, size_key)
        if rank >= size:
            raise _error(rank_key, f"must be < {size_key} ({size}), got {rank}")


class DistributedLauncher:
    """Sets up the torch.distributed environment for whichever launcher started us."""

    def __init__(self, config: DistributedConfig, *, environ: Optional[MutableMapping[str, str]] = None):
        self.config = config
        self.environ = os.environ if environ is None else environ

    def detect_environment(self) -> str:
        return detect_environment(self.environ, self.config)

    def torch_environment(self) -> dict[str, str]:
        return torch_environment(self.environ, self.config)

    def launch(self, train_fn: Callable[[A], T], args: A) -> T:
        """Export the torch variables, then run `train_fn(args)` in this process; returns what it returns.

        `args` is whatever `train_fn` takes: the seed's argparse Namespace, or the loop's typed `Run`.
        """
        self.environ.update(self.torch_environment())
        return train_fn(args)
