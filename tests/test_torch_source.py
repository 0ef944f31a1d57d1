"""`make setup`'s torch source (requirements/torch_source.py): PyTorch's CPU index on a machine without an NVIDIA
GPU where that index answers, pip's own index where it does not; each said on stderr. The index is a real HTTP
server on loopback; an unreachable one a loopback port nothing listens on."""

from __future__ import annotations

import http.server
import os
import socket
import sys
import threading
from pathlib import Path

import pytest

from processes import run

SCRIPT = Path(__file__).resolve().parents[1] / "requirements" / "torch_source.py"
NO_GPU = not os.path.exists("/proc/driver/nvidia/version")


def source(index: str, path: str) -> tuple[str, str]:
    result = run([sys.executable, SCRIPT], env={"PATH": path, "TORCH_CPU_INDEX": index}, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip(), result.stderr.strip()


@pytest.fixture
def cpu_index(tmp_path):
    (tmp_path / "whl" / "cpu" / "torch").mkdir(parents=True)
    (tmp_path / "whl" / "cpu" / "torch" / "index.html").write_text("<a href='torch-2.13.0+cpu.whl'>torch</a>")
    handler = lambda *a: http.server.SimpleHTTPRequestHandler(*a, directory=str(tmp_path))  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/whl/cpu"
    server.shutdown()
    server.server_close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(not NO_GPU, reason="this machine has an NVIDIA GPU")
def test_without_a_gpu_the_cpu_index_is_preferred_and_pips_index_serves_when_it_is_unreachable(cpu_index, tmp_path):
    assert source(cpu_index, "/usr/bin:/bin") == (f"--extra-index-url {cpu_index}",
                                                   f"make setup: no NVIDIA GPU: torch's CPU build from {cpu_index}")
    gone = f"http://127.0.0.1:{_closed_port()}/whl/cpu"
    assert source(gone, "/usr/bin:/bin") == ("", f"make setup: no NVIDIA GPU, but {gone} is unreachable: torch from pip's index")


def test_with_a_gpu_pips_index_serves_the_cuda_build(cpu_index, tmp_path):
    # A machine whose driver tools are on PATH: nvidia-smi is how the script sees the GPU there.
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nvidia-smi").write_text("#!/bin/sh\n")
    (tmp_path / "bin" / "nvidia-smi").chmod(0o755)
    out, said = source(cpu_index, f"{tmp_path / 'bin'}:/usr/bin:/bin")
    assert out == "" and said.startswith("make setup: an NVIDIA GPU is present")
