"""`make setup`'s torch source: pip arguments (printed) that prefer PyTorch's CPU index on a machine without an
NVIDIA GPU, and why (stderr). PyPI's x86_64 torch is a CUDA build with 2.5 GiB of NVIDIA wheels; a CPU-only
machine needs none of them. Where the CPU index does not answer within seconds (no internet, a local mirror),
pip's configured index serves torch as before. Standard library only: it runs before anything is installed."""

import os
import shutil
import sys
import urllib.request

CPU_INDEX = os.environ.get("TORCH_CPU_INDEX", "https://download.pytorch.org/whl/cpu")
TIMEOUT_S = 5


def has_nvidia_gpu() -> bool:
    return os.path.exists("/proc/driver/nvidia/version") or shutil.which("nvidia-smi") is not None


def reachable(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S):
            return True
    except (OSError, ValueError):
        return False


def main() -> int:
    if has_nvidia_gpu():
        print("make setup: an NVIDIA GPU is present: torch from pip's index (PyPI's is a CUDA build)", file=sys.stderr)
    elif reachable(f"{CPU_INDEX}/torch/"):
        print(f"make setup: no NVIDIA GPU: torch's CPU build from {CPU_INDEX}", file=sys.stderr)
        print(f"--extra-index-url {CPU_INDEX}")
    else:
        print(f"make setup: no NVIDIA GPU, but {CPU_INDEX} is unreachable: torch from pip's index", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
