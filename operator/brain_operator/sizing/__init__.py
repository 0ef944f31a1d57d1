"""What a job needs (pure but for reading files passed in): bytes per rank, checkpoint room, the grace to save.

    storage     a checkpoint's size, and whether the checkpoint volume holds keepLast + 1 of them
    grace       how long a stopped worker gets to commit a checkpoint
    vocabulary  the vocabulary a preset is planned with
    estimate    `braintrain estimate`'s figures: memory per rank, the strategy ladder, host memory, storage
"""
