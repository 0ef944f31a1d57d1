"""Render charts/brain-operator through the real Helm engine (helm-python-sdk)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "brain-operator"
NAMESPACED_VALUES = Path(__file__).with_name("values-namespaced.yaml")
MONITORING_VALUES = Path(__file__).with_name("values-monitoring.yaml")
RELEASE = "brain"
RELEASE_NAMESPACE = "brain-system"


def render_objects(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every Kubernetes object `helm install` would create from templates/, in order."""
    with helm.Chart.load(CHART) as chart:
        rendered = chart.render(values, name=RELEASE, namespace=RELEASE_NAMESPACE, is_install=True)
    objects = []
    for path in sorted(rendered):
        if path.endswith(".yaml"):
            objects.extend(doc for doc in yaml.safe_load_all(rendered[path]) if doc)
    return objects


def load_values(path: Path) -> dict[str, Any]:
    """A values file parsed by Helm itself, as `helm install -f` would."""
    return helm.values_from_yaml(path.read_text())


def only(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    matches = [obj for obj in objects if obj["kind"] == kind]
    assert len(matches) == 1, f"expected one {kind}, got {len(matches)}"
    return matches[0]
