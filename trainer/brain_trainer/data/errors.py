"""The one error of a dataset that cannot be used: missing, unreadable, damaged, or too small."""

from __future__ import annotations

from typing import Optional

from ..contract import DATA_ERROR
from ..schema import ConfigError, FieldError


class DataError(ConfigError):
    """Reported like a config error (`field: message`, or the message alone where no setting led there); the
    message names the folder or file."""

    reason = DATA_ERROR  # what failure classification (resilience.failures) reports

    def __init__(self, message: str, field: Optional[str] = None):
        super().__init__([FieldError(field or "", message)])
