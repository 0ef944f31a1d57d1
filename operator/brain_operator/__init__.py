"""brain_operator: the BrainTrainingJob control plane and the local runner.

Never imports torch: the operator image carries none. The CRD generator is
`python -m brain_operator.crd` (brain_operator.crd.build_crd).
"""

from brain_trainer.schema import ConfigError
from brain_trainer.version import __version__

from .backends import render
from .spec import Job, OperatorDefaults, parse_job, trainer_config

__all__ = ["__version__", "ConfigError", "Job", "OperatorDefaults", "parse_job", "render", "trainer_config"]
