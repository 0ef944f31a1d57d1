#!/usr/bin/env bash
# `make lock`: every image lock from requirements/*.in, each pin with the hashes of all its files, read from the
# indexes (uv pip compile --generate-hashes); no wheel is downloaded, so the CUDA locks take seconds, not 2.5 GiB.
#
#   build.lock                  the wheel stage's build backend (setuptools, wheel): build isolation is off
#   operator.lock               the operator image (every platform)
#   trainer-<flavour>-<arch>.lock   the trainer image: trainer.in with torch-<flavour>.in, for Linux <arch>
#                               (amd64: x86_64, arm64: aarch64), Python 3.11 (the base image's)
#
# Flavours: cpu (torch's CPU build from PyTorch's CPU index; on arm64, where that is unreachable, PyPI's aarch64
# torch, a CUDA build that runs on CPU: torch-cpu.in) and
# cu130 (PyPI's torch, built for CUDA 13.0, with its nvidia-*-cu13 wheels). UV=path/to/uv; PYTHON=python that
# pip config is read with.
set -euo pipefail
cd "$(dirname "$0")"

UV="${UV:-uv}"
PYTHON="${PYTHON:-python3}"
PYPI="https://pypi.org/simple"
TORCH_CPU_INDEX="${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"
ARCHS=(amd64:x86_64 arm64:aarch64)

compile() {
    local out="$1"
    shift
    "$UV" pip compile --quiet --no-config --generate-hashes --python-version 3.11 --no-strip-extras \
        --index-url "$PYPI" --output-file "$out" "$@"
}

# Where torch's CPU build comes from: PyTorch's CPU index, or, where that cannot be reached (a machine with
# a local mirror and no internet), the wheels in pip's configured find-links folders, said so (pip's other
# indexes are not asked: every other pin keeps PyPI's hashes).
cpu_sources() {
    if curl --silent --fail --max-time 5 --output /dev/null "$TORCH_CPU_INDEX/torch/"; then
        printf '%s\n' --extra-index-url "$TORCH_CPU_INDEX"
        return
    fi
    echo "lock: $TORCH_CPU_INDEX is unreachable; torch's CPU build is taken from pip's find-links" >&2
    local source
    for source in $("$PYTHON" -m pip config list | sed -n "s/^[^=]*\.find-links='\(.*\)'\$/\1/p" | head -n 1); do
        printf '%s\n' --find-links "$source"
    done
}

compile build.lock build.in
compile operator.lock --universal operator.in
mapfile -t cpu < <(cpu_sources)
for pair in "${ARCHS[@]}"; do
    arch="${pair%%:*}" platform="${pair##*:}-manylinux_2_28"
    compile "trainer-cu130-$arch.lock" --python-platform "$platform" trainer.in torch-cu130.in
    compile "trainer-cpu-$arch.lock" --python-platform "$platform" --index-strategy unsafe-best-match \
        "${cpu[@]}" trainer.in torch-cpu.in
done
echo "lock: wrote" ./*.lock
