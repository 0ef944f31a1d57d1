# Two images from one file (`make images` builds both, with docker, buildah or podman; RUN --mount needs BuildKit
# or buildah >= 1.24). No `# syntax=` line: the builder's own frontend parses it, so no frontend image is pulled.
#   docker build --target trainer  -t brain-train/trainer:dev  .   (CPU torch by default)
#   docker build --target operator -t brain-train/operator:dev .   (kopf operator, no torch)
# CUDA trainer: --build-arg TORCH_FLAVOUR=cu130 (PyPI's torch for CUDA 13.0; its wheels carry the CUDA libraries,
# so the base stays the slim Python one). Every download is checked against a hash in a lock under requirements/
# (`make lock`); the trainer's lock is its flavour's for the target architecture (requirements/lock.sh).
# Behind a proxy with its own certificate authority: --secret id=ca,src=proxy-ca.pem (pip trusts that bundle).

# Pinned by digest (the multi-platform index Docker's official-images repo-info lists for this tag, August 2026):
# a tag moves, a digest does not. Override with --build-arg PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:<newer>
# (make image-check builds an equivalent with debootstrap where Docker Hub is unreachable).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:fe556eaffd0d96abd8685b83bb8a69addd0dc730fa193669a7df0d49ddcfac02

# ---- wheel: the project as one pure-Python wheel; sources never reach a runtime image. The build backend comes
# from its hashed lock and the build runs without isolation, which would fetch setuptools and wheel unhashed.
FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY trainer/ trainer/
COPY operator/ operator/
RUN --mount=type=bind,source=requirements/build.lock,target=/tmp/build.lock \
    --mount=type=secret,id=ca \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
    && python3 -m venv /opt/build \
    && /opt/build/bin/pip install --no-cache-dir --require-hashes -r /tmp/build.lock \
    && /opt/build/bin/pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /wheels .

# ---- trainer: tini (PID 1: reaps orphans, forwards SIGTERM) starting torchrun's quiet agent, which starts
# brain_trainer; the operator's pods run the same command (operator/brain_operator/backends/shared/workers.py COMMAND).
FROM ${PYTHON_IMAGE} AS trainer
# torch's build: requirements/trainer-${TORCH_FLAVOUR}-${TARGETARCH}.lock pins it with the rest; the cpu flavour's
# x86_64 torch is on PyTorch's CPU index (or a mirror), cu130's on PyPI. TARGETARCH: set by the builder.
ARG TORCH_FLAVOUR=cpu
ARG TARGETARCH=amd64
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PATH=/opt/venv/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# UID 1000 is the one the operator's pods run as. tini's version is Debian 12's.
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini=0.19.0-1+b3 \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv \
    && useradd --uid 1000 --user-group --no-create-home --home-dir /tmp --shell /usr/sbin/nologin brain
# torch and every other runtime dependency in one install from this flavour's lock (only that file is mounted, so
# another lock's change keeps this layer), each file checked against its hash: pip refuses a version that is not
# pinned, a dependency that is not locked, or a file whose hash differs.
RUN --mount=type=bind,source=requirements/trainer-${TORCH_FLAVOUR}-${TARGETARCH}.lock,target=/tmp/trainer.lock \
    --mount=type=secret,id=ca \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
    && pip install --no-cache-dir --require-hashes --extra-index-url "${TORCH_INDEX_URL}" -r /tmp/trainer.lock
# The project's own wheel, a local file (hadolint cannot see that it is pinned); its dependencies are all
# installed above, so nothing unhashed comes with it. A cached wheel stage can be mounted empty (buildah --layers):
# say so rather than let pip fail on the pattern.
# hadolint ignore=DL3013
RUN --mount=type=bind,from=wheel,source=/wheels,target=/wheels \
    set -- /wheels/*.whl \
    && if [ ! -f "$1" ]; then echo "the wheel stage produced no wheel in /wheels (a stale layer cache? build it" \
        "again without the cache)" >&2; exit 1; fi \
    && pip install --no-cache-dir --no-deps "$1"
WORKDIR /tmp
USER 1000:1000
ENTRYPOINT ["tini", "--", "python", "-m", "brain_trainer.agent"]
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
    --mount=type=secret,id=ca \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
    && pip install --no-cache-dir --require-hashes -r /tmp/operator.lock
# hadolint ignore=DL3013
RUN --mount=type=bind,from=wheel,source=/wheels,target=/wheels \
    set -- /wheels/*.whl \
    && if [ ! -f "$1" ]; then echo "the wheel stage produced no wheel in /wheels (a stale layer cache? build it" \
        "again without the cache)" >&2; exit 1; fi \
    && pip install --no-cache-dir --no-deps "$1"
WORKDIR /tmp
USER 1000:1000
ENTRYPOINT ["braintrain"]
CMD ["operator", "--all-namespaces"]
