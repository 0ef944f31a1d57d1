"""What the operator owns in every worker pod: volume names, mount paths, ports, containers, label prefixes.

backends/shared/workers.py builds the pods from these names, and the pod overlay
(spec/overlay.py) may not set or shadow any of them.
"""

from __future__ import annotations

from brain_trainer.contract import METRICS_PORT, METRICS_PORT_NAME

from ..objects.names import MANAGED_BY
from ..objects.resource import GROUP
from ..objects.schedulers import FOREIGN_PREFIXES

CONFIG_DIR = "/etc/brain"
SHM_DIR = "/dev/shm"
CONFIG_VOLUME = "config"
SHM_VOLUME = "dshm"
CHECKPOINT_VOLUME = "checkpoints"
DATA_VOLUME = "training-data"  # spec.data.volume's claim
VOLUMES = (CONFIG_VOLUME, SHM_VOLUME, CHECKPOINT_VOLUME, DATA_VOLUME)
RDZV_PORT = 29400
RDZV_PORT_NAME = "rdzv"
PORTS = {RDZV_PORT_NAME: RDZV_PORT, METRICS_PORT_NAME: METRICS_PORT}
# The trainer container of an elastic pod; an overlay's container of this name adds to the trainer on both backends.
TRAINER_CONTAINER = "trainer"
# The Kubeflow training operator injects its environment into the container of this name.
PYTORCHJOB_CONTAINER = "pytorch"
# Labels and annotations the operator and the schedulers it talks to set on worker pods.
OWNED_PREFIXES = (f"{GROUP}/", "prometheus.io/", *FOREIGN_PREFIXES)
OWNED_KEYS = tuple(MANAGED_BY)


def owned_key(key: str) -> bool:
    """A label or annotation key the operator (or Kueue, a gang scheduler, Prometheus' annotations) owns."""
    return key in OWNED_KEYS or key.startswith(OWNED_PREFIXES)
