"""Fixtures for the chart tests: the value sets every chart test renders."""

from __future__ import annotations

from typing import Any

import pytest
from chart_render import MONITORING_VALUES, NAMESPACED_VALUES, load_values


@pytest.fixture(scope="session")
def namespaced_values() -> dict[str, Any]:
    return load_values(NAMESPACED_VALUES)


@pytest.fixture(scope="session")
def monitoring_values() -> dict[str, Any]:
    return load_values(MONITORING_VALUES)


@pytest.fixture(scope="session")
def value_sets(namespaced_values, monitoring_values) -> dict[str, dict[str, Any] | None]:
    """The chart's defaults, a values file that flips every switch, and a subchart with both monitors."""
    return {"defaults": None, "namespaced": namespaced_values, "monitoring": monitoring_values}
