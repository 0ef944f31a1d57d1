"""What Kubernetes accepts: name and label patterns, quantities, access modes, pull policies.

The patterns match whole values (`re.fullmatch`); the CRD generator anchors them.
"""

import re
from typing import Optional

# Service names are DNS-1035 labels, pod hostnames DNS-1123 labels (63 characters).
NAME_PATTERN = r"[a-z]([-a-z0-9]*[a-z0-9])?"
NAMESPACE_PATTERN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS_LABEL_MAX = 63
SUBDOMAIN_PATTERN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
LABEL_VALUE_PATTERN = r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
ENV_NAME_PATTERN = r"[A-Za-z_][A-Za-z0-9_]*"
RESOURCE_NAME_PATTERN = r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
QUANTITY_PATTERN = r"\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|[KMGTPE]i|[numkMGTPE])?"

PULL_POLICIES = ("Always", "IfNotPresent", "Never")
ACCESS_MODES = ("ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod")
# Modes that let pods on different nodes write the same volume.
SHARED_WRITE_MODES = ("ReadWriteMany",)
GPU_RESOURCE = "nvidia.com/gpu"


def is_namespace(name: str) -> bool:
    """A valid namespace name: a DNS label."""
    return len(name) <= DNS_LABEL_MAX and re.fullmatch(NAMESPACE_PATTERN, name) is not None


# Quantity suffixes (resource.Quantity): binary, decimal, and below one.
_SCALE = {"": 1, "n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
          "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


def quantity_value(value: "int | str") -> Optional[float]:
    """A Kubernetes quantity (`8Gi`, `1.5G`, `500m`, `1e3`, `2048`) as a number; None when it is not one."""
    match = re.fullmatch(QUANTITY_PATTERN, str(value))
    if match is None:
        return None
    number, suffix = float(match.group(1)), match.group(3) or ""
    if suffix[:1] in ("e", "E") and len(suffix) > 1:  # an exponent; a lone E is exa
        return number * 10 ** int(suffix[1:])
    return number * _SCALE[suffix]
