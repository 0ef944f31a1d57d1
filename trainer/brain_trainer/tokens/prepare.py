"""`python -m brain_trainer.tokens.prepare`: the documented alias of `braintrain prepare` (data/tokens/prepare.py)."""

import sys

from ..data.tokens.prepare import main

if __name__ == "__main__":
    sys.exit(main())
