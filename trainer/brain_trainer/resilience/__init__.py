"""Staying alive and dying well: failures classified into the contract's reasons, the hang watchdog (its limits in
the pure `stall`), and preemption (SIGTERM, checkpoint requests and the ranks' vote at step boundaries).

Importing this package is torch-free; each name loads its module on first use.
"""

from ..lazy import lazy_exports
from .failures import Fatal, classify, report

_LAZY = {
    "Watchdog": "watchdog",
    "Preemption": "preemption",
}

__all__ = ["Fatal", "classify", "report", *_LAZY]

__getattr__ = lazy_exports(__name__, _LAZY, globals())
