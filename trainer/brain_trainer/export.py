"""`python -m brain_trainer.export`: the documented alias of `braintrain export` (hf/export.py)."""

import sys

from .hf.export import main

if __name__ == "__main__":
    sys.exit(main())
