"""Rules the API server itself enforces on `spec` (CEL `x-kubernetes-validations` in the CRD).

The elastic bounds live here too, so an out-of-range `kubectl scale` (the
scale subresource writes spec.nodes) is refused before the operator sees it.
The parser enforces the same bounds (JobSpec.check); a test keeps them in agreement.
TRANSITION_RULES (spec/edits.py) refuse edits to fields that cannot change in flight.
"""

from __future__ import annotations

from .edits import transition_rules
from .model import JobSpec

_NODES = f"(has(self.nodes) ? self.nodes : {JobSpec().nodes})"
API_SERVER_RULES = (
    (
        "!has(self.elastic) || !has(self.elastic.minNodes) || !has(self.elastic.maxNodes)"
        " || self.elastic.minNodes <= self.elastic.maxNodes",
        "elastic.minNodes must be <= elastic.maxNodes",
    ),
    (
        f"!has(self.elastic) || !has(self.elastic.minNodes) || {_NODES} >= self.elastic.minNodes",
        "nodes must be >= elastic.minNodes",
    ),
    (
        f"!has(self.elastic) || !has(self.elastic.maxNodes) || {_NODES} <= self.elastic.maxNodes",
        "nodes must be <= elastic.maxNodes",
    ),
)

TRANSITION_RULES = transition_rules()
