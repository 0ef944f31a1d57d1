"""`braintrain export` for Hugging Face `transformers`: the model's code made into remote-code files, its
configuration, tokenizer, generation settings and model card beside the safetensors."""
