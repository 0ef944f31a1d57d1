#!/usr/bin/env bash
# `make images`: both images from the Dockerfile, with Docker where its engine answers, else buildah, else podman
# (neither needs a daemon). Prints each build's time and the image's size.
#
#   TRAINER_IMAGE, OPERATOR_IMAGE   the tags (default brain-train/{trainer,operator}:dev)
#   TORCH_FLAVOUR                   the trainer's torch: cpu (default) or cu130 (requirements/lock.sh)
#   PYTHON_IMAGE, TORCH_INDEX_URL   build arguments passed on when set (the Dockerfile says what they are)
#   CA_CERT                         a PEM bundle trusted for downloads (a proxy's authority), a build secret
#   TARGETS                         which to build (default "trainer operator")
#   ENGINE                          docker, buildah or podman instead of the first found
#   STORAGE                         buildah/podman store options, e.g. "--storage-driver vfs"
set -euo pipefail
cd "$(dirname "$0")/../.."

TRAINER_IMAGE="${TRAINER_IMAGE:-brain-train/trainer:dev}"
OPERATOR_IMAGE="${OPERATOR_IMAGE:-brain-train/operator:dev}"
TORCH_FLAVOUR="${TORCH_FLAVOUR:-cpu}"
read -r -a store <<<"${STORAGE:-}"

pick_engine() {
    if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
        echo docker
    elif command -v buildah >/dev/null; then
        echo buildah
    elif command -v podman >/dev/null; then
        echo podman
    else
        echo "images: no docker engine, buildah or podman here; install one (Debian: apt-get install buildah)" >&2
        return 1
    fi
}

ENGINE="${ENGINE:-$(pick_engine)}"
case "$ENGINE" in
    docker) build=(docker build) size=(docker image ls --format '{{.Size}}') ;;
    buildah) build=(buildah "${store[@]}" build --isolation chroot) size=(buildah "${store[@]}" images --format '{{.Size}}') ;;
    podman) build=(podman "${store[@]}" build) size=(podman "${store[@]}" images --format '{{.Size}}') ;;
    *) echo "images: ENGINE must be docker, buildah or podman, got '$ENGINE'" >&2; exit 2 ;;
esac

args=()
[[ -z "${PYTHON_IMAGE:-}" ]] || args+=(--build-arg "PYTHON_IMAGE=$PYTHON_IMAGE")
[[ -z "${TORCH_INDEX_URL:-}" ]] || args+=(--build-arg "TORCH_INDEX_URL=$TORCH_INDEX_URL")
[[ -z "${CA_CERT:-}" ]] || args+=(--secret "id=ca,src=$CA_CERT")

# build TARGET TAG [ARG...]: one image, timed.
build() {
    local target="$1" tag="$2" began=$SECONDS
    shift 2
    echo "images: building $tag (target $target) with $ENGINE"
    "${build[@]}" --target "$target" --tag "$tag" "${args[@]}" "$@" .
    echo "images: $tag built in $((SECONDS - began)) s, $("${size[@]}" "$tag")"
}

for target in ${TARGETS:-trainer operator}; do
    case "$target" in
        trainer) build trainer "$TRAINER_IMAGE" --build-arg "TORCH_FLAVOUR=$TORCH_FLAVOUR" ;;
        operator) build operator "$OPERATOR_IMAGE" ;;
        *) echo "images: TARGETS names trainer and operator, got '$target'" >&2; exit 2 ;;
    esac
done
