"""The BrainTrainingJob resource's identity in the API server."""

GROUP = "brain.ai"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "BrainTrainingJob"
PLURAL = "braintrainingjobs"
SINGULAR = "braintrainingjob"
SHORT_NAME = "btj"
