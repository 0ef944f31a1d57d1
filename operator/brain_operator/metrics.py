"""The operator's own Prometheus metrics: jobs by phase, reconcile duration and errors."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator, Optional

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from .status.compute import PHASES


class OperatorMetrics:
    """One registry per operator process (tests make their own)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._jobs = Gauge("brain_operator_jobs", "BrainTrainingJobs by phase", ["phase"], registry=self.registry)
        self._duration = Histogram(
            "brain_operator_reconcile_duration_seconds", "Time spent in one reconcile", registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self._errors = Counter(
            "brain_operator_reconcile_errors", "Reconciles that raised", ["error"], registry=self.registry
        )
        self._phase_of: dict[tuple[str, str], str] = {}
        for phase in PHASES:
            self._jobs.labels(phase=phase).set(0)

    def observe_phase(self, namespace: str, name: str, phase: Optional[str]) -> None:
        """Record a job's current phase (None when the job was deleted)."""
        key = (namespace, name)
        old = self._phase_of.pop(key, None)
        if old is not None:
            self._jobs.labels(phase=old).dec()
        if phase is not None:
            self._phase_of[key] = phase
            self._jobs.labels(phase=phase).inc()

    @contextmanager
    def reconcile(self) -> Iterator[None]:
        """Time a reconcile and count it as an error when it raises."""
        start = time.perf_counter()
        try:
            yield
        except Exception as exc:
            self._errors.labels(error=type(exc).__name__).inc()
            raise
        finally:
            self._duration.observe(time.perf_counter() - start)

    def serve(self, port: int) -> None:
        start_http_server(port, registry=self.registry)
