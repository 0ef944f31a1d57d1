"""What a run needs before it starts, torch-free: bytes per rank, the strategy `auto` picks, the parallel layout,
the pipeline's stage cut and the bytes each rank sends per step (the trainer and the operator ask alike)."""
