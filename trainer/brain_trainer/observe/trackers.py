"""Rank 0's experiment trackers (`metrics.trackers`): MLflow and Weights & Biases runs beside TensorBoard.

A tracker's client is imported only when a job names it. A tracker that fails
(no network, a bad key, the server down) warns once and is dropped: training
never waits on it again nor stops for it. Each run's id is kept beside the
checkpoints (trackers.json), so a restarted or resumed job continues the same
tracker run rather than starting one per attempt.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Protocol

from ..config import TrackerConfig
from ..files import write_atomic
from .scalar_tags import TAGS

log = logging.getLogger(__name__)

RUNS_FILE = "trackers.json"  # {tracker key: its run's id}, beside the checkpoints


@dataclass(frozen=True)
class Identity:
    """Who logs: the job's name and uid and the run's restarts so far, the tags of every tracker run."""

    job: str
    uid: str
    restarts: int

    def tags(self) -> dict[str, str]:
        return {"brain.job": self.job, "brain.uid": self.uid, "brain.restarts": str(self.restarts)}


class Run(Protocol):
    """One tracker's run; any method may raise, Trackers contains it."""

    def log(self, step: int, metrics: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Start:
    """What opening a tracker's run takes."""

    config: TrackerConfig
    run_id: Optional[str]  # the run to continue; None: a new one
    params: Mapping[str, str]  # the resolved config, flat
    tags: Mapping[str, str]
    name: str
    folder: Optional[Path]  # the checkpoint folder, where a tracker's own files may go


Opener = Callable[[Start], tuple[Run, str]]  # the run and its id


def tracker_key(config: TrackerConfig) -> str:
    """What tells two trackers apart in trackers.json: the type and where it logs."""
    if config.type == "mlflow":
        return f"mlflow {config.tracking_uri or ''} {config.experiment or ''}"
    return f"wandb {config.entity or ''}/{config.project or ''}"


def flat_params(tree: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """A nested config as dotted keys and text values: what both trackers take as a run's parameters."""
    out: dict[str, str] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flat_params(value, f"{name}."))
        else:
            out[name] = json.dumps(value) if isinstance(value, (list, dict)) else str(value)
    return out


def metric_values(values: Mapping[str, Optional[float]]) -> dict[str, float]:
    """The scalars a tracker logs, named as in TensorBoard; a missing or NaN value is left out."""
    return {TAGS[k]: float(v) for k, v in values.items() if v is not None and not math.isnan(v)}


def _opener(kind: str) -> Opener:
    if kind == "mlflow":
        from .mlflow_run import open_mlflow  # imports mlflow: only for runs that log to it

        return open_mlflow
    from .wandb_run import open_wandb  # imports wandb: likewise

    return open_wandb


class Trackers:
    """The runs of `configs`; `folder`: where their ids are kept (the checkpoint folder; None: not kept)."""

    def __init__(self, configs: list[TrackerConfig], folder: Optional[Path], params: Mapping[str, str],
                 identity: Identity, opener: Callable[[str], Opener] = _opener):
        self._path = folder / RUNS_FILE if folder is not None else None
        ids = self._read()
        self._runs: dict[str, Run] = {}
        for config in configs:
            key = tracker_key(config)
            tags = {**identity.tags(), **config.tags}
            start = Start(config, ids.get(key), params, tags, config.run_name or identity.job, folder)
            opened = self._guard(key, lambda: opener(config.type)(start))
            if opened is not None:
                self._runs[key], ids[key] = opened
        self._write(ids)

    def write(self, step: int, **values: Optional[float]) -> None:
        metrics = metric_values(values)
        for key, run in list(self._runs.items()):
            if self._guard(key, lambda: run.log(step, metrics)) is None:
                self._runs.pop(key, None)

    def close(self) -> None:
        for key, run in self._runs.items():
            self._guard(key, run.close)
        self._runs = {}

    def _guard(self, key: str, call: Callable[[], Any]) -> Any:
        """`call`'s result; None after one warning line if it raised, and the tracker is dropped."""
        try:
            result = call()
        except Exception as exc:  # any failure of a tracker's client: training goes on without it
            log.warning("tracker %s failed, no more metrics go to it: %s: %s", key.split()[0], type(exc).__name__,
                        str(exc).splitlines()[0] if str(exc) else "")
            self._runs.pop(key, None)
            return None
        return True if result is None else result

    def _read(self) -> dict[str, str]:
        try:
            data = json.loads(self._path.read_text()) if self._path is not None else {}
        except (OSError, ValueError):
            return {}
        return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}

    def _write(self, ids: dict[str, str]) -> None:
        if self._path is None or not ids:
            return
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(str(self._path), json.dumps(ids, indent=1, sort_keys=True) + "\n")
        except OSError as exc:  # a restart then starts new tracker runs; training goes on
            log.warning("cannot keep the tracker runs' ids in %s: %s", self._path, exc.strerror or exc)
