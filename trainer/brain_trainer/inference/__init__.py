"""Using a trained model: loading it with its tokenizer, `braintrain generate` and `braintrain eval`."""
