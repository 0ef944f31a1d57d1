"""The default backend: one pod per node behind a headless Service, planned and replaced by the operator itself."""
