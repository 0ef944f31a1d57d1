"""An MLflow run for Trackers, through MLflow's client: the tracking server or a local store at `trackingUri`."""

from __future__ import annotations

import logging
import os
import time
from typing import Mapping, Optional

from ..config import TrackerConfig
from .trackers import Start

PARAMS_PER_BATCH = 100  # MLflow's limit on the parameters of one log_batch
# A server that does not answer fails the tracker after one try and this many seconds, where the client's own
# defaults retry for minutes; a tracker's `settings` (MLFLOW_* variables) may say otherwise.
CLIENT_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}


class MlflowRun:
    def __init__(self, client, run_id: str):
        self._client, self.run_id = client, run_id

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self._client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in metrics.items()])

    def close(self) -> None:
        self._client.set_terminated(self.run_id)


def open_mlflow(start: Start) -> tuple[MlflowRun, str]:
    """Continues `start.run_id` where the store still has it, else creates a run with the parameters."""
    _configure(start.config)
    from mlflow.entities import Param, RunTag
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=start.config.tracking_uri)
    tags = [RunTag(k, v) for k, v in start.tags.items()]
    run_id = _existing(client, start.run_id)
    if run_id is not None:  # parameters stay as the run began: MLflow refuses to change one
        client.update_run(run_id, status="RUNNING")
        client.log_batch(run_id, tags=tags)
        return MlflowRun(client, run_id), run_id
    run_id = client.create_run(_experiment(client, start.config.experiment), run_name=start.name).info.run_id
    params = [Param(k, v) for k, v in start.params.items()]
    for i in range(0, len(params), PARAMS_PER_BATCH):
        client.log_batch(run_id, params=params[i:i + PARAMS_PER_BATCH], tags=[] if i else tags)
    return MlflowRun(client, run_id), run_id


def _configure(config: TrackerConfig) -> None:
    """The client's settings, and its chatter (each retry's warning) kept out of the training log."""
    for key, value in CLIENT_DEFAULTS.items():
        os.environ.setdefault(key, value)
    os.environ.update(config.settings)
    logging.getLogger("mlflow").setLevel(logging.ERROR)
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)


def _existing(client, run_id: Optional[str]) -> Optional[str]:
    """`run_id` if the store has it, None if not (a new store, a deleted run)."""
    from mlflow.exceptions import MlflowException

    if run_id is None:
        return None
    try:
        client.get_run(run_id)
    except MlflowException as exc:
        if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
            return None
        raise
    return run_id


def _experiment(client, name: Optional[str]) -> str:
    """The id of the experiment `name`, created if new; MLflow's default experiment for None."""
    if name is None:
        return "0"
    found = client.get_experiment_by_name(name)
    return found.experiment_id if found is not None else client.create_experiment(name)
