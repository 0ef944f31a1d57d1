"""Fixtures for the chart tests: the value sets every chart test renders."""

from __future__ import annotations

from typing import Any

import pytest
from chart_render import NAMESPACED_VALUES, load_values


@pytest.fixture(scope="session")
def namespaced_values() -> dict[str, Any]:
    return load_values(NAMESPACED_VALUES)


@pytest.fixture(scope="session")
def value_sets(namespaced_values) -> dict[str, dict[str, Any] | None]:
    """The chart's defaults and a values file that flips every switch."""
    return {"defaults": None, "namespaced": namespaced_values}
