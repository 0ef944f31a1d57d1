"""What Kubernetes accepts: name and label patterns, quantities, access modes, pull policies.

The patterns match whole values (`re.fullmatch`); the CRD generator anchors them.
"""

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
