#!/usr/bin/env bash
# An equivalent of the Dockerfile's Python base (python:3.11-slim-bookworm) made here with Debian's debootstrap,
# for machines that cannot reach its registry (Docker Hub) but reach Debian's mirror: Debian 12 (bookworm) with its
# Python 3.11, venv (ensurepip) and CA certificates, committed as an image in buildah's store.
#
#   deploy/images/debian-base.sh NAME     # e.g. localhost/brain-train/python-base:bookworm; kept when it exists
#
# MIRROR overrides the Debian mirror; BUILDAH_ARGS the store options (make image-check passes vfs).
set -euo pipefail

NAME="${1:?usage: debian-base.sh IMAGE-NAME}"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"
read -r -a store <<<"${BUILDAH_ARGS:-}"

if buildah "${store[@]}" inspect --type image "$NAME" >/dev/null 2>&1; then
    echo "debian-base: $NAME exists; reusing it"
    exit 0
fi
began=$SECONDS
container="$(buildah "${store[@]}" from scratch)"
trap 'buildah "${store[@]}" rm "$container" >/dev/null' EXIT
root="$(buildah "${store[@]}" mount "$container")"
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$root" "$MIRROR"
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb
buildah "${store[@]}" config --env LANG=C.UTF-8 --cmd python3 "$container"
buildah "${store[@]}" commit --quiet "$container" "$NAME" >/dev/null
echo "debian-base: built $NAME with debootstrap (Debian bookworm, $MIRROR) in $((SECONDS - began)) s"
