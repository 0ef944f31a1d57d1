"""`python -m brain_trainer.export`: the documented alias of `braintrain export` (model/export.py)."""

import sys

from .model.export import main

if __name__ == "__main__":
    sys.exit(main())
