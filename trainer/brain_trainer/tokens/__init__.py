"""Kept for `python -m brain_trainer.tokens.prepare`, the documented alias of `braintrain prepare`; token
datasets live in data/tokens/."""
