"""TrainState: everything a resume needs, as a torch.distributed.checkpoint Stateful."""

from __future__ import annotations

import base64
import json
import logging
import random
from dataclasses import dataclass
from typing import Any, Collection, Optional

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful

from .shards import JsonText, tensor_shapes

log = logging.getLogger(__name__)

MODEL_PREFIX = "model."  # the flattened checkpoint keys of the model's state dict (TrainState.state_dict)
PROGRESS = "progress"  # one JSON item; older checkpoints hold progress.step and progress.sample_index instead


def rng_key(rank: int) -> str:
    """The flattened checkpoint key of one rank's RNG states."""
    return f"rng.rank{rank}"


def _bytes_text(state: torch.Tensor) -> str:
    return base64.b64encode(state.numpy().tobytes()).decode("ascii")


def _text_bytes(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)


def _capture_rng() -> JsonText:
    """This process's RNG states as JSON text: a checkpoint holds data, never a pickle (docs/security.md)."""
    version, words, gauss = random.getstate()
    kind, keys, position, has_gauss, cached = np.random.get_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []
    return JsonText(json.dumps({
        "python": [version, list(words), gauss],
        "numpy": [kind, keys.tolist(), position, has_gauss, cached],
        "torch": _bytes_text(torch.get_rng_state()),
        "cuda": [_bytes_text(state) for state in cuda],
    }))


def _restore_rng(states: dict[str, Any]) -> None:
    version, words, gauss = states["python"]
    random.setstate((version, tuple(words), gauss))
    kind, keys, position, has_gauss, cached = states["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), position, has_gauss, cached))
    torch.set_rng_state(_text_bytes(states["torch"]))
    cuda = [_text_bytes(state) for state in states["cuda"]]
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


class UnexpectedState(ValueError):
    """A training-state item that is data, but not what TrainState writes (forged or damaged): `key` names it."""

    def __init__(self, key: str, problem: str):
        super().__init__(f"{key}: {problem}")
        self.key = key


def _kind(value: Any) -> str:
    return "list" if isinstance(value, (list, tuple)) else type(value).__name__  # JSON reads a tuple as a list


def _check_like(key: str, saved: Any, written: dict[str, Any]) -> None:
    """`saved` has only keys `written` has, each of its kind: loading it sets no other attribute nor type."""
    if not isinstance(saved, dict):
        raise UnexpectedState(key, f"holds a {_kind(saved)}, not a mapping")
    for name, value in saved.items():
        if name not in written:
            raise UnexpectedState(key, f"names {name!r}, which brain-train does not write")
        if _kind(value) != _kind(written[name]):
            raise UnexpectedState(key, f"{name} is a {_kind(value)}, not a {_kind(written[name])}")


def _progress(saved: Any) -> tuple[int, int]:
    if not isinstance(saved, dict) or any(type(saved.get(name)) is not int for name in ("step", "sample_index")):
        raise UnexpectedState(PROGRESS, "holds no integer step and sample_index")
    return saved["step"], saved["sample_index"]


@dataclass(frozen=True)
class WholeModel:
    """The whole model, for a rank that holds only part of it (a pipeline rank: its stages' blocks): what the
    checkpoint all the ranks write together holds, and what a rank of any other layout loads."""

    shapes: dict[str, tuple[int, ...]]  # every tensor of the model's state dict: its name and global shape
    optimizer_groups: tuple[tuple[str, ...], ...]  # the names of each optimizer parameter group's parameters


class TrainState(Stateful):
    """Model, optimizer, LR scheduler, grad scaler, progress and RNG of one rank.

    `model` may be plain, DDP-wrapped or FSDP2-sharded: `get_state_dict` yields
    each rank's own shards (DTensors under FSDP2), so saving never gathers a
    full state dict. `step` counts optimizer steps; `sample_index` is the
    global sample index (samples consumed by all ranks together), which does
    not depend on the world size. RNG states are per rank, stored under
    `rng.rank<N>`; a rank with no saved state (more ranks than at save time)
    keeps its own. Progress, schedule, scaler and RNG states are JSON items
    (shards.JsonText): a checkpoint holds no pickle of ours. `whole`: set when
    `model` is part of the model (pipeline parallelism); each rank then writes
    and reads its part's tensors only, and the optimizer's parameter groups
    name the whole model's parameters, as every other layout's do.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any = None, scaler: Any = None,
                 whole: Optional[WholeModel] = None):
        self.model = model
        self.whole = whole
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.scaler = scaler
        self.step = 0
        self.sample_index = 0

    @property
    def rank(self) -> int:
        return dist.get_rank() if dist.is_initialized() else 0

    def state_dict(self) -> dict[str, Any]:
        """What a save writes: the model's and optimizer's state as DCP takes it, and ours as JSON items."""
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        if self.whole is not None:
            # One item every rank writes alike (DCP keeps one copy): the groups by the whole model's names, which
            # set_state_dict then matches against this rank's parameters, here or at any other layout.
            for group, names in zip(optim_sd["param_groups"], self.whole.optimizer_groups, strict=True):
                group["params"] = list(names)
        sd: dict[str, Any] = {
            "model": model_sd,
            "optim": optim_sd,
            PROGRESS: JsonText(json.dumps({"step": self.step, "sample_index": self.sample_index})),
            "rng": {f"rank{self.rank}": _capture_rng()},
        }
        if self.scheduler is not None:
            sd["scheduler"] = JsonText(json.dumps(self.scheduler.state_dict()))
        if self.scaler is not None:
            sd["scaler"] = JsonText(json.dumps(self.scaler.state_dict()))
        return sd

    def model_shapes(self, template: dict[str, Any]) -> dict[str, tuple[int, ...]]:
        """{name: global shape} of every tensor of the whole model (a checkpoint holds them all), this rank's
        `template` giving them when it holds the whole model."""
        return dict(self.whole.shapes) if self.whole is not None else tensor_shapes(template["model"])

    def template(self, saved: Collection[str]) -> dict[str, Any]:
        """What this rank loads of a checkpoint holding the (flattened) keys `saved`: load it, then load_state_dict.

        A checkpoint written before the training state was JSON holds it as torch.save'd plain values under
        the nested keys of each state_dict (`progress.step`, `scheduler.last_epoch`, ...), which the load
        reads with torch's weights-only unpickler; its RNG states are read as they are and never unpickled.
        """
        sd = self.state_dict()
        if rng_key(self.rank) not in saved:
            sd.pop("rng")  # more ranks than at save time: this one keeps its own RNG
        if PROGRESS not in saved:
            sd[PROGRESS] = {"step": self.step, "sample_index": self.sample_index}
            if self.scheduler is not None:
                sd["scheduler"] = self.scheduler.state_dict()
            if self.scaler is not None:
                sd["scaler"] = self.scaler.state_dict()
            if "rng" in sd:
                sd["rng"] = {f"rank{self.rank}": str(sd["rng"][f"rank{self.rank}"])}
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Apply a loaded checkpoint; UnexpectedState when one of our items is not what state_dict writes
        (its model and optimizer may be set by then: the caller loads another checkpoint or none)."""
        step, sample_index = _progress(state_dict[PROGRESS])
        # torch's load_state_dict sets every key it is given as an attribute: only those it writes, each of its kind.
        if self.scheduler is not None:
            _check_like("scheduler", state_dict["scheduler"], self.scheduler.state_dict())
        if self.scaler is not None and state_dict.get("scaler"):
            _check_like("scaler", state_dict["scaler"], self.scaler.state_dict())
        set_state_dict(self.model, self.optimizer, model_state_dict=state_dict["model"], optim_state_dict=state_dict["optim"])
        if self.scheduler is not None:
            self.scheduler.load_state_dict(state_dict["scheduler"])
        if self.scaler is not None and state_dict.get("scaler"):
            self.scaler.load_state_dict(state_dict["scaler"])
        self.step, self.sample_index = step, sample_index
        saved = state_dict.get("rng", {}).get(f"rank{self.rank}")
        if isinstance(saved, bytes):
            # The oldest checkpoints' RNG states: a pickle, which would run whatever it names. Never unpickled.
            log.warning("%s is a pickle (an older checkpoint): not unpickled; rank %d keeps its own RNG states",
                        rng_key(self.rank), self.rank)
            return
        try:
            if isinstance(saved, str):
                _restore_rng(json.loads(saved))  # an older checkpoint's JSON text, torch.save'd
            elif saved:
                _restore_rng(saved)
        except (KeyError, IndexError, TypeError, ValueError, RuntimeError) as exc:
            raise UnexpectedState(rng_key(self.rank), f"holds no RNG states ({type(exc).__name__}: {exc})") from None
