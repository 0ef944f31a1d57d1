"""brain_operator: the BrainTrainingJob control plane and the local runner.

Never imports torch: the operator image carries none.
"""

from brain_trainer.schema import ConfigError

from .crd import build_crd
from .render import render
from .spec import Job, OperatorDefaults, parse_job, trainer_config

__version__ = "0.1.0"

__all__ = ["ConfigError", "Job", "OperatorDefaults", "build_crd", "parse_job", "render", "trainer_config"]
