"""The Kubeflow backend: one PyTorchJob, whose pods the training operator makes."""
