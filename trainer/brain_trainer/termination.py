"""The container's termination message: why this trainer exited, for the operator and `kubectl describe`."""

from __future__ import annotations

import os

from .contract import TERMINATION_LOG, TERMINATION_LOG_ENV


def write_termination_message(message: str) -> None:
    """Write `message` where Kubernetes reads it (TERMINATION_LOG, or the file TERMINATION_LOG_ENV names)."""
    path = os.environ.get(TERMINATION_LOG_ENV, TERMINATION_LOG)
    try:
        with open(path, "w") as f:
            f.write(message)
    except OSError:
        pass  # not in a container, or not writable: the exit code still says it
