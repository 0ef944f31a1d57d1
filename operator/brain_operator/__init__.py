"""brain_operator: the BrainTrainingJob control plane and the local runner.

Never imports torch: the operator image carries none. The CRD generator is
`python -m brain_operator.crd` (brain_operator.crd.build_crd).
"""

from brain_trainer.schema import ConfigError

from .render import render
from .spec import Job, OperatorDefaults, parse_job, trainer_config

__version__ = "0.1.0"

__all__ = ["ConfigError", "Job", "OperatorDefaults", "parse_job", "render", "trainer_config"]
