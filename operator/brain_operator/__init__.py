"""brain_operator: the BrainTrainingJob control plane and the local runner.

Never imports torch: the operator image carries none.
"""

__version__ = "0.1.0"
