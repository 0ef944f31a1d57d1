"""What the loop reads: the rank-aware loader over synthetic, file and token data (`tokens/`: prepared datasets),
and the one error of a dataset that cannot be used.

Importing this package is torch-free; each torch name loads its module on first use.
"""

from ..lazy import lazy_exports
from .errors import DataError

_LAZY = {
    "RankAwareDataLoader": "loader",
    "build_dataset": "loader",
}

__all__ = ["DataError", *_LAZY]

__getattr__ = lazy_exports(__name__, _LAZY, globals())
