"""The scalars rank 0 writes to TensorBoard and the experiment trackers, and the name each goes by there."""

# keyword of Scalars.write and Trackers.write -> the scalar's name
TAGS = {
    "loss": "train/loss",
    "eval_loss": "eval/loss",
    "eval_perplexity": "eval/perplexity",
    "learning_rate": "train/learning_rate",
    "tokens_per_second": "train/tokens_per_second",
    "grad_norm": "train/grad_norm",
    "mfu": "train/mfu",
    "goodput": "goodput/ratio",
}
