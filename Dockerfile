# syntax=docker/dockerfile:1
# Two images from one file (`make images` builds both; BuildKit required):
#   docker build --target trainer  -t brain-train/trainer:dev  .   (CPU torch by default)
#   docker build --target operator -t brain-train/operator:dev .   (kopf operator, no torch)
# CUDA trainer: --build-arg BASE_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04@sha256:<digest>
#               --build-arg TORCH_FLAVOUR=cu128   (needs a hashed requirements/torch-cu128.lock: `make lock`)
# Every download is checked against a hash in a lock under requirements/ (`make lock`).

# Pinned by digest (the multi-platform index Docker's official-images repo-info lists for this tag, August 2026):
# a tag moves, a digest does not. Override with --build-arg PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:<newer>.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:fe556eaffd0d96abd8685b83bb8a69addd0dc730fa193669a7df0d49ddcfac02
ARG BASE_IMAGE=${PYTHON_IMAGE}

# ---- wheel: the project as one pure-Python wheel; sources never reach a runtime image.
FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY trainer/ trainer/
COPY operator/ operator/
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

# ---- trainer: torchrun + brain_trainer, started by the operator as each worker pod.
FROM ${BASE_IMAGE} AS trainer
# torch's build: requirements/torch-${TORCH_FLAVOUR}.lock pins it, from the index of that flavour (or a mirror).
ARG TORCH_FLAVOUR=cpu
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/${TORCH_FLAVOUR}
ENV PATH=/opt/venv/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# CUDA bases ship no Python; the default Python base already has one. Package
# versions come from whichever base is chosen, so they cannot be pinned here.
# UID 1000 is the one the operator's pods run as; Ubuntu bases already have it.
# hadolint ignore=DL3008
RUN if ! command -v python3 >/dev/null; then \
        apt-get update \
        && apt-get install -y --no-install-recommends python3 python3-venv \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
    && python3 -m venv /opt/venv \
    && { getent passwd 1000 >/dev/null \
         || useradd --uid 1000 --user-group --no-create-home --home-dir /tmp --shell /usr/sbin/nologin brain; }
# torch (its flavour's lock) and every other runtime dependency (trainer.lock) in one resolve, each file
# checked against its hash: pip refuses a version that is not pinned, a dependency that is not locked, or
# a file whose hash differs. A flavour whose lock carries no hash yet is refused before pip runs.
RUN --mount=type=bind,source=requirements,target=/tmp/requirements \
    lock="/tmp/requirements/torch-${TORCH_FLAVOUR}.lock" \
    && if ! grep -qs -- "--hash=sha256:" "$lock"; then \
        echo "requirements/torch-${TORCH_FLAVOUR}.lock is missing or carries no hashes: run" \
             "'make lock TORCH_FLAVOUR=${TORCH_FLAVOUR}' where ${TORCH_INDEX_URL} is reachable" >&2; \
        exit 1; \
    fi \
    && pip install --no-cache-dir --require-hashes --extra-index-url "${TORCH_INDEX_URL}" \
        -r "$lock" -r /tmp/requirements/trainer.lock
# The project's own wheel, a local file (hadolint cannot see that it is pinned);
# its dependencies are all installed above, so nothing unhashed comes with it.
# hadolint ignore=DL3013
RUN --mount=type=bind,from=wheel,source=/wheels,target=/wheels \
    set -- /wheels/*.whl \
    && pip install --no-cache-dir --no-deps "$1"
WORKDIR /tmp
USER 1000:1000
ENTRYPOINT ["torchrun"]
CMD ["-m", "brain_trainer", "--config", "/etc/brain/trainer.yaml"]

# ---- operator: the kopf operator; no torch.
FROM ${PYTHON_IMAGE} AS operator
ENV PATH=/opt/venv/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3 -m venv /opt/venv \
    && useradd --uid 1000 --user-group --no-create-home --home-dir /tmp --shell /usr/sbin/nologin brain
# The operator's dependencies from their hashed lock, then the project's wheel, as in the trainer.
RUN --mount=type=bind,source=requirements/operator.lock,target=/tmp/operator.lock \
    pip install --no-cache-dir --require-hashes -r /tmp/operator.lock
# hadolint ignore=DL3013
RUN --mount=type=bind,from=wheel,source=/wheels,target=/wheels \
    set -- /wheels/*.whl \
    && pip install --no-cache-dir --no-deps "$1"
WORKDIR /tmp
USER 1000:1000
ENTRYPOINT ["braintrain"]
CMD ["operator", "--all-namespaces"]
