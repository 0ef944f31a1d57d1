#!/usr/bin/env bash
# `make image-check`: build both images (deploy/images/build.sh) and run them.
#   operator: `braintrain --help` answers and `python -c "import torch"` fails (no torch in it);
#   trainer:  as uid 1000, through the image's own entrypoint (tini, torchrun's agent), trains the minimal preset a
#             few steps on CPU from the trainer.yaml the operator image renders for deploy/images/check-job.yaml,
#             then trains on and is stopped with SIGTERM to its first process: a new checkpoint, exit 75, no
#             traceback.
# Where Docker Hub is unreachable (and the engine is buildah or podman) the Python base is built here with Debian's
# debootstrap (deploy/images/debian-base.sh); where PyTorch's CPU index is unreachable, pip's configured find-links
# serve torch's CPU wheel on loopback (its hash is still checked against the lock). Each is said when done.
#
#   ENGINE, STORAGE (default "--storage-driver vfs" for buildah/podman), PYTHON_IMAGE, TORCH_INDEX_URL, CA_CERT:
#   as build.sh; BUILD=0 runs the images already built. CUDA=1 also builds the cu130 trainer (2.5 GiB of NVIDIA
#   wheels) as $TRAINER_IMAGE-cuda and checks that its torch, built for CUDA 13.0, imports and finds no GPU here.
set -euo pipefail
cd "$(dirname "$0")/../.."

export TRAINER_IMAGE="${TRAINER_IMAGE:-brain-train/trainer:dev}"
export OPERATOR_IMAGE="${OPERATOR_IMAGE:-brain-train/operator:dev}"
BASE_IMAGE="localhost/brain-train/python-base:bookworm"
JOB="deploy/images/check-job.yaml"
STEPS_AFTER_STOP=100000
WORK="$(mktemp -d "${TMPDIR:-/tmp}/image-check.XXXXXX")"
SERVER=""
began=$SECONDS

declare -A CONTAINERS=()  # buildah: one working container per image, for all of its runs (vfs copies each)
finish() {
    [[ -z "$SERVER" ]] || kill "$SERVER" 2>/dev/null || true
    local ctr
    for ctr in "${CONTAINERS[@]}"; do buildah "${store[@]}" rm "$ctr" >/dev/null || true; done
    rm -rf "$WORK"
}
trap finish EXIT

fail() {
    echo "image-check: FAILED: $*" >&2
    exit 1
}

if [[ -z "${ENGINE:-}" ]]; then
    if command -v docker >/dev/null && docker info >/dev/null 2>&1; then ENGINE=docker
    elif command -v buildah >/dev/null; then ENGINE=buildah
    elif command -v podman >/dev/null; then ENGINE=podman
    else fail "no docker engine, buildah or podman (Debian: apt-get install buildah debootstrap)"
    fi
fi
export ENGINE
if [[ "$ENGINE" != docker ]]; then
    export STORAGE="${STORAGE:---storage-driver vfs}"
fi
read -r -a store <<<"${STORAGE:-}"

reachable() { curl --silent --output /dev/null --max-time 5 "$1"; }
# A setting of this machine's pip (its configuration files or PIP_* variables): `pip_setting cert`.
pip_setting() { python3 -m pip config list 2>/dev/null | sed -n "s/^[^=]*\.$1='\(.*\)'\$/\1/p" | head -n 1; }

# The base: the Dockerfile's pinned Python image, or one made with debootstrap where its registry is unreachable.
if [[ -z "${PYTHON_IMAGE:-}" && "$ENGINE" != docker ]] && ! reachable https://registry-1.docker.io/v2/; then
    echo "image-check: Docker Hub is unreachable: building an equivalent Python base with debootstrap ($BASE_IMAGE)"
    BUILDAH_ARGS="${STORAGE}" bash deploy/images/debian-base.sh "$BASE_IMAGE"
    export PYTHON_IMAGE="$BASE_IMAGE"
fi

# torch's CPU wheel: PyTorch's index, or pip's find-links served as a one-package index on loopback.
serve_find_links() {
    mkdir -p "$WORK/simple/torch"
    local folder
    for folder in $(pip_setting find-links); do
        find "${folder#file://}" -maxdepth 1 -name 'torch-*.whl' -exec ln -s {} "$WORK/simple/torch/" \;
    done
    : >"$WORK/server.log"
    python3 -u -m http.server --bind 127.0.0.1 --directory "$WORK" 0 >>"$WORK/server.log" 2>&1 &
    SERVER=$!
    local port=""
    for _ in $(seq 100); do
        port="$(sed -n 's/.* port \([0-9]*\) .*/\1/p' "$WORK/server.log")"
        [[ -z "$port" ]] || break
        sleep 0.1
    done
    [[ -n "$port" ]] || fail "the loopback index did not start: $(cat "$WORK/server.log")"
    export TORCH_INDEX_URL="http://127.0.0.1:$port/simple"
    echo "image-check: https://download.pytorch.org/whl/cpu is unreachable: torch's CPU wheel from pip's find-links" \
        "at $TORCH_INDEX_URL"
}
if [[ -z "${TORCH_INDEX_URL:-}" && "$ENGINE" != docker ]] && ! reachable https://download.pytorch.org/whl/cpu/; then
    serve_find_links
fi

# Downloads trust what this machine's pip trusts (a proxy's certificate authority among them): a build secret.
if [[ -z "${CA_CERT:-}" ]] && CA_CERT="$(pip_setting cert)" && [[ -s "$CA_CERT" ]]; then
    export CA_CERT
    echo "image-check: the builds trust pip's certificate bundle $CA_CERT (build secret ca)"
fi

[[ "${BUILD:-1}" == 0 ]] || bash deploy/images/build.sh
built=$SECONDS

# run_in IMAGE LOG [--env K=V | --volume H:C]... -- ARGV...: ARGV as the first process (PID 1) of a container of
# IMAGE, as uid 1000, output to LOG; returns its exit code. buildah's chroot isolation makes no pid namespace: ARGV
# starts in one of its own (unshare, as root in the container, then setpriv to uid 1000), as in a pod.
run_in() {
    local image="$1" log="$2" opts=()
    shift 2
    while [[ "$1" != -- ]]; do opts+=("$1" "$2"); shift 2; done
    shift
    if [[ "$ENGINE" == buildah ]]; then
        buildah "${store[@]}" run --isolation chroot --user 0:0 --cap-add CAP_SYS_ADMIN "${opts[@]}" "${CONTAINERS[$image]}" \
            -- unshare --pid --fork --mount-proc --kill-child setpriv --reuid 1000 --regid 1000 --clear-groups "$@" \
            >"$log" 2>&1
        return
    fi
    "$ENGINE" "${store[@]}" run --rm --user 1000:1000 "${opts[@]}" --entrypoint "$1" "$image" "${@:2}" >"$log" 2>&1
}

# The image's own entrypoint and command, as its config says (buildah: OCIv1.config, docker/podman: Config).
entrypoint() {
    if [[ "$ENGINE" == buildah ]]; then
        buildah "${store[@]}" inspect --type image "$1"
    else
        "$ENGINE" "${store[@]}" image inspect "$1"
    fi | python3 -c '
import json, sys
info = json.load(sys.stdin)
config = info["OCIv1"]["config"] if isinstance(info, dict) else info[0]["Config"]
print("\n".join([*(config.get("Entrypoint") or []), *(config.get("Cmd") or [])]))'
}

if [[ "$ENGINE" == buildah ]]; then
    for image in "$OPERATOR_IMAGE" "$TRAINER_IMAGE"; do
        CONTAINERS[$image]="$(buildah "${store[@]}" from --quiet "$image")"
    done
fi

echo "image-check: operator image"
run_in "$OPERATOR_IMAGE" "$WORK/help.log" -- braintrain --help || fail "braintrain --help: $(cat "$WORK/help.log")"
grep -q "render" "$WORK/help.log" || fail "braintrain --help printed no commands: $(cat "$WORK/help.log")"
if run_in "$OPERATOR_IMAGE" "$WORK/torch.log" -- python -c "import torch"; then
    fail "the operator image imports torch"
fi
grep -q "No module named 'torch'" "$WORK/torch.log" || fail "import torch failed otherwise: $(cat "$WORK/torch.log")"
echo "image-check: ok: braintrain --help answers; import torch fails (No module named 'torch')"

# trainer.yaml as the operator renders it into the job's ConfigMap; the checkpoint claim a folder of uid 1000.
mkdir -p "$WORK/job" "$WORK/config" "$WORK/ckpt"
cp "$JOB" "$WORK/job/job.yaml"
render() {
    run_in "$OPERATOR_IMAGE" "$WORK/render.log" --volume "$WORK/job:/job:ro" -- python -c '
import subprocess, sys, yaml
out = subprocess.run(["braintrain", "render", "/job/job.yaml"], check=True, capture_output=True, text=True).stdout
[config] = [o for o in yaml.safe_load_all(out) if o and o["kind"] == "ConfigMap"]
print(config["data"]["trainer.yaml"], end="")' || fail "braintrain render: $(cat "$WORK/render.log")"
    cp "$WORK/render.log" "$WORK/config/trainer.yaml"
}
render
mount_path="$(sed -n 's/^ *dir: *//p' "$WORK/config/trainer.yaml" | head -n 1)"
[[ -n "$mount_path" ]] || fail "no checkpoint dir in the rendered trainer.yaml"
chown -R 1000:1000 "$WORK/ckpt"
chmod 0755 "$WORK"
mapfile -t trainer_argv < <(entrypoint "$TRAINER_IMAGE")
[[ "${trainer_argv[0]:-}" == tini ]] || fail "the trainer image's entrypoint is not tini: ${trainer_argv[*]}"
echo "image-check: trainer image: ${trainer_argv[*]}"
# One node of one process (torchrun --standalone) on loopback: a pod's hostname resolves, a build container's does
# not. /dev/termination-log is the kubelet's; here the trainers' termination message goes to /tmp.
trainer_opts=(--volume "$WORK/config:/etc/brain:ro" --volume "$WORK/ckpt:$mount_path" --env PET_STANDALONE=1
    --env PET_NPROC_PER_NODE=1 --env PET_LOCAL_ADDR=127.0.0.1 --env BRAIN_TERMINATION_LOG=/tmp/termination-log)

began_train=$SECONDS
run_in "$TRAINER_IMAGE" "$WORK/train.log" "${trainer_opts[@]}" -- "${trainer_argv[@]}" \
    || fail "the trainer exited $?: $(tail -n 30 "$WORK/train.log")"
steps="$(grep -c ' step [0-9]*/6 loss' "$WORK/train.log" || true)"
[[ "$steps" -ge 6 ]] || fail "6 logged steps expected, got $steps: $(tail -n 30 "$WORK/train.log")"
[[ -d "$WORK/ckpt/step-00000006" ]] || fail "no checkpoint of step 6 in $(ls "$WORK/ckpt")"
echo "image-check: ok: trained 6 steps as uid 1000 in $((SECONDS - began_train)) s, checkpoint step-00000006"

# Train on from step 6, then SIGTERM the container's first
# process once a step is logged: the trainers must commit a new checkpoint and the container exit 75.
sed -i "s/^    steps: 6$/    steps: $STEPS_AFTER_STOP/" "$WORK/job/job.yaml"
render
run_in "$TRAINER_IMAGE" "$WORK/stop.log" "${trainer_opts[@]}" -- "${trainer_argv[@]}" &
runner=$!
for _ in $(seq 1800); do
    grep -q " step [0-9]*/$STEPS_AFTER_STOP loss" "$WORK/stop.log" 2>/dev/null && break
    kill -0 "$runner" 2>/dev/null || fail "the trainer ended before training on: $(tail -n 30 "$WORK/stop.log")"
    sleep 0.2
done
if [[ "$ENGINE" == buildah ]]; then
    # The container's first process (tini, PID 1 in its namespace), found among buildah run's descendants.
    first="$(ps -e -o pid=,ppid=,comm= | awk -v root="$runner" '
        { parent[$1] = $2; name[$1] = $3 }
        END { for (p in name) if (name[p] == "tini") { q = p; while (q in parent && q != root) q = parent[q]; if (q == root) print p } }')"
else
    first="$("$ENGINE" "${store[@]}" ps --filter "ancestor=$TRAINER_IMAGE" --format '{{.ID}}' | head -n 1)"
fi
[[ -n "$first" ]] || fail "no first process of the trainer container found"
before="$(ls "$WORK/ckpt")"
if [[ "$ENGINE" == buildah ]]; then kill -TERM "$first"; else "$ENGINE" "${store[@]}" kill --signal TERM "$first"; fi
code=0
wait "$runner" || code=$?
[[ "$code" == 75 ]] || fail "exit $code after SIGTERM, 75 expected: $(tail -n 30 "$WORK/stop.log")"
saved="$(sed -n 's/.*SIGTERM: saving step \([0-9]*\) before exiting.*/\1/p' "$WORK/stop.log" | head -n 1)"
[[ -n "$saved" ]] || fail "no save on SIGTERM: $(tail -n 30 "$WORK/stop.log")"
checkpoint="step-$(printf '%08d' "$saved")"
if [[ ! -d "$WORK/ckpt/$checkpoint" ]] || grep -qx "$checkpoint" <<<"$before"; then
    fail "no new checkpoint $checkpoint: before the stop $before; after $(ls "$WORK/ckpt")"
fi
! grep -q Traceback "$WORK/stop.log" || fail "a traceback after SIGTERM: $(cat "$WORK/stop.log")"
echo "image-check: ok: SIGTERM to the first process: checkpoint step $saved, exit 75, no traceback"
if [[ "${CUDA:-0}" == 1 ]]; then
    [[ "${BUILD:-1}" == 0 ]] || TARGETS=trainer TORCH_FLAVOUR=cu130 TRAINER_IMAGE="$TRAINER_IMAGE-cuda" bash deploy/images/build.sh
    [[ "$ENGINE" != buildah ]] || CONTAINERS[$TRAINER_IMAGE-cuda]="$(buildah "${store[@]}" from --quiet "$TRAINER_IMAGE-cuda")"
    run_in "$TRAINER_IMAGE-cuda" "$WORK/cuda.log" -- python -c \
        'import torch; print(f"torch {torch.__version__} CUDA {torch.version.cuda} available {torch.cuda.is_available()}")' \
        || fail "the CUDA image's torch: $(tail -n 30 "$WORK/cuda.log")"
    grep -q "CUDA 13.0 available False" "$WORK/cuda.log" || fail "the CUDA image's torch: $(cat "$WORK/cuda.log")"
    echo "image-check: ok: CUDA image: $(tail -n 1 "$WORK/cuda.log")"
fi
echo "image-check: passed in $((SECONDS - began)) s (builds $((built - began)) s)"
