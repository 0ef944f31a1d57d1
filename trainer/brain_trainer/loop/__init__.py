"""The training loop and what only it uses: gradient accumulation, the learning-rate schedule, evaluation.

Importing this package is torch-free; each name loads its module on first use.
"""

from ..lazy import lazy_exports

_LAZY = {
    "train": "train",
    "TrainResult": "train",
    "GradientAccumulator": "accumulation",
    "Evaluator": "evaluation",
}

__all__ = list(_LAZY)

__getattr__ = lazy_exports(__name__, _LAZY, globals())
