"""The one error of a dataset that cannot be used: missing, unreadable, damaged, or too small."""

from __future__ import annotations

from typing import Optional

from ..contract import DATA_ERROR


class DataError(ValueError):
    """The message names the folder or file; `field` (data.path) the setting that led there, when there is one."""

    reason = DATA_ERROR  # what failure classification (resilience.failures) reports

    def __init__(self, message: str, field: Optional[str] = None):
        super().__init__(f"{field}: {message}" if field else message)
