"""What a run tells: rank 0's reporter (the log line, the progress document, /metrics, TensorBoard), the goodput
ledger, MFU and the memory report. Nothing here changes training.

Importing this package is torch-free; each name loads its module on first use.
"""

from ..lazy import lazy_exports

_LAZY = {
    "Reporter": "reporter",
    "GoodputLog": "goodput_log",
}

__all__ = list(_LAZY)

__getattr__ = lazy_exports(__name__, _LAZY, globals())
