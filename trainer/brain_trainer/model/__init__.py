"""The model, untouched by parallelism: BrainAI, its meta-device build and seeded initialisation, the weights it
starts from (`init_from`: checkpoints, safetensors) and `braintrain export`.

Importing this package is torch-free; each name loads its module on first use.
"""

from ..lazy import lazy_exports

_LAZY = {
    "BrainAI": "brain_ai",
    "build_model": "brain_ai",
    "Initializer": "materialize",
    "build": "materialize",
    "open_source": "init_from",
}

__all__ = list(_LAZY)

__getattr__ = lazy_exports(__name__, _LAZY, globals())
