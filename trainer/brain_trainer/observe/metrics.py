"""Rank 0's HTTP endpoint: Prometheus metrics at /metrics, the progress document at /progress.

The operator polls /progress for `status.progress`; Prometheus scrapes
/metrics (the rendered pod names the port `metrics` and carries the usual
`prometheus.io/*` annotations). Torch-free, and served from a daemon thread
so a slow scraper never stalls training.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import typing
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional, Sequence

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest

from ..contract import METRICS_PATH, PROGRESS_PATH, Goodput, Progress
from . import commits

log = logging.getLogger(__name__)

METRIC_PREFIX = "brain_trainer_"
_NUMBERS = (int, float, Optional[int], Optional[float])
# Fields of the progress document that only grow over the run: counters (`<name>_total`) rather than gauges.
_COUNTED = ("in_pod_restarts",)
_HELP = {f.name: f.metadata["help"] for f in dataclasses.fields(Progress)}
# keyword of publish() -> (gauge name, help)
_EXTRAS = {
    "learning_rate": ("brain_trainer_learning_rate", "Current learning rate"),
    "peak_memory_bytes": ("brain_trainer_peak_memory_bytes", "Peak accelerator (or host) memory of rank 0"),
    "grad_norm": ("brain_trainer_grad_norm", "Total gradient norm before clipping, at the last logged step"),
    "mfu": ("brain_trainer_mfu", "Model FLOPs utilisation: counted training FLOPs per token x tokens/s over the devices' peak FLOP/s"),
}
# Each other numeric field of the progress document is a gauge of the same name, with the field's help; one that
# is also an extra (mfu) is published as one, so its gauge appears only once it is known.
_FROM_PROGRESS = {
    f.name: (METRIC_PREFIX + f.name, f.metadata["help"])
    for f in dataclasses.fields(Progress)
    if typing.get_type_hints(Progress)[f.name] in _NUMBERS and f.name not in _EXTRAS and f.name not in _COUNTED
}
# From milliseconds (small models on GPUs) to minutes (large models, slow links).
STEP_TIME_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0, 120.0, 300.0)
# A checkpoint save, start to commit: seconds (small models, local disks) to an hour (large ones, network storage).
CHECKPOINT_SAVE_BUCKETS = (0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
# field of memory_report.InitMemory -> (metric name, help), one sample per rank
_INIT_MEMORY = {
    "parameter_bytes": ("brain_trainer_init_parameter_bytes", "Bytes of parameters (shards) each rank holds after init"),
    "peak_host_bytes": ("brain_trainer_init_peak_host_bytes", "Peak host resident memory of each rank at the end of init"),
    "device_bytes": ("brain_trainer_init_device_bytes", "Accelerator memory allocated by each rank at the end of init"),
}


class MetricsServer:
    """Serves the latest published progress and metrics until closed."""

    def __init__(self, port: int, host: str):
        self.registry = CollectorRegistry()
        self._gauges = {key: Gauge(name, doc, registry=self.registry) for key, (name, doc) in _FROM_PROGRESS.items()}
        self._steps = Counter(METRIC_PREFIX + "steps", "Optimizer steps this process ran", registry=self.registry)
        self._tokens = Counter(METRIC_PREFIX + "tokens", "Tokens trained on over all ranks by the steps this process ran",
                               registry=self.registry)
        self._step_time = Histogram(METRIC_PREFIX + "step_time_seconds", "Wall time of each optimizer step",
                                    buckets=STEP_TIME_BUCKETS, registry=self.registry)
        self._goodput_ratio = Gauge(METRIC_PREFIX + "goodput_ratio", "Productive seconds over the job's wall seconds",
                                    registry=self.registry)
        self._goodput_seconds = Counter(METRIC_PREFIX + "goodput_seconds",
                                        "The job's wall time by kind: productive, recomputed, checkpoint, initialization, "
                                        "evaluation, waiting", ["kind"], registry=self.registry)
        self._goodput_counted: dict[str, float] = {}
        self._counters = {key: Counter(METRIC_PREFIX + key, _HELP[key], registry=self.registry) for key in _COUNTED}
        self._counted: dict[str, float] = {}
        self._info = Info(METRIC_PREFIX.rstrip("_"), "The trainer's version and the run's model, strategy and world size",
                          registry=self.registry)
        self._init_gauges = {
            key: Gauge(name, doc, ["rank"], registry=self.registry) for key, (name, doc) in _INIT_MEMORY.items()
        }
        self._save_seconds = Histogram(METRIC_PREFIX + "checkpoint_save_seconds",
                                       "Time of each checkpoint save, from its start to its commit",
                                       buckets=CHECKPOINT_SAVE_BUCKETS, registry=self.registry)
        self._checkpoint_bytes = Gauge(METRIC_PREFIX + "checkpoint_bytes", "Size of the newest committed checkpoint",
                                       registry=self.registry)
        self._progress: Optional[Progress] = None
        self._lock = threading.Lock()
        self._unlisten = commits.listen(self.checkpoint_committed)
        self._server = ThreadingHTTPServer((host, port), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="brain-metrics", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    def describe(self, **labels: str) -> None:
        """brain_trainer_info: version, preset, strategy, world_size (set once the strategy is resolved)."""
        with self._lock:
            self._info.info(labels)

    def publish(self, progress: Progress, *, step_times: Sequence[float] = (), tokens: int = 0,
                **extras: Optional[float]) -> None:
        """Record a new progress document, the steps since the last one (their times, their tokens over all
        ranks) and the extras: learning_rate, peak_memory_bytes, grad_norm, mfu (None: not known)."""
        unknown = set(extras) - set(_EXTRAS)
        if unknown:
            raise TypeError(f"unknown metrics: {sorted(unknown)}")
        # Under the lock a scrape never sees the step of one update with the loss of another.
        with self._lock:
            self._progress = progress
            for key, value in vars(progress).items():
                if key in self._gauges and isinstance(value, (int, float)):
                    self._gauges[key].set(value)
            for key, value in extras.items():
                if value is None or math.isnan(value):
                    continue  # not known (MFU on CPU): no gauge rather than a misleading 0
                if key not in self._gauges:
                    self._gauges[key] = Gauge(*_EXTRAS[key], registry=self.registry)
                self._gauges[key].set(value)
            for key, counter in self._counters.items():
                total = getattr(progress, key)
                if total is not None:  # the run's total (the ledger's): the counter starts at it and follows it
                    counter.inc(max(0, total - self._counted.get(key, 0)))
                    self._counted[key] = max(total, self._counted.get(key, 0))
            if progress.goodput is not None:
                self._count_goodput(progress.goodput)
            for seconds in step_times:
                self._step_time.observe(seconds)
            self._steps.inc(len(step_times))
            self._tokens.inc(tokens)

    def _count_goodput(self, goodput: Goodput) -> None:
        self._goodput_ratio.set(goodput.ratio)
        # The ledger holds the job's totals; the counters start at them and follow their growth.
        for key, total in vars(goodput).items():
            if key.endswith("_seconds") and key != "wall_seconds":
                kind = key.removesuffix("_seconds")
                self._goodput_seconds.labels(kind=kind).inc(max(0.0, total - self._goodput_counted.get(kind, 0.0)))
                self._goodput_counted[kind] = max(total, self._goodput_counted.get(kind, 0.0))

    def publish_init_memory(self, ranks: list[dict[str, Any]]) -> None:
        """Each rank's memory after init (memory_report.InitMemory.as_dict()), labelled by rank."""
        with self._lock:
            for figures in ranks:
                for key, gauge in self._init_gauges.items():
                    if figures.get(key) is not None:
                        gauge.labels(rank=str(figures["rank"])).set(figures[key])

    def checkpoint_committed(self, commit: commits.Commit) -> None:
        with self._lock:
            self._save_seconds.observe(commit.seconds)
            self._checkpoint_bytes.set(commit.bytes)

    def progress_json(self) -> bytes:
        with self._lock:
            return (self._progress.to_json() if self._progress else "{}").encode()

    def metrics_text(self) -> bytes:
        with self._lock:
            return generate_latest(self.registry)

    def close(self) -> None:
        self._unlisten()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                path = self.path.split("?", 1)[0]
                if path == METRICS_PATH:
                    self._reply(200, CONTENT_TYPE_LATEST, server.metrics_text())
                elif path == PROGRESS_PATH:
                    self._reply(200, "application/json", server.progress_json())
                else:
                    self._reply(404, "text/plain", b"not found\n")

            def _reply(self, code: int, content_type: str, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:  # scrapes every few seconds: keep worker logs clean
                pass

        return Handler


def start_metrics_server(port: int, host: str) -> Optional[MetricsServer]:
    """The server on `host`:`port`, or None when disabled (0) or the port is taken: metrics never stop training."""
    if port == 0:
        return None
    try:
        return MetricsServer(port, host)
    except OSError as exc:
        log.warning("metrics endpoint disabled: cannot listen on %s port %d: %s", host, port, exc.strerror)
        return None
