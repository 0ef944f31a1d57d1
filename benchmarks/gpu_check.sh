#!/usr/bin/env bash
# One prepared check of the trainer on a GPU machine, in at most 8 minutes, with only the machine's own python and
# torch (nothing installed, no network); the project goes on PYTHONPATH from this checkout:
#
#   bash benchmarks/gpu_check.sh            # PYTHON=python3 by default; LOGS=DIR keeps each step's output there
#
# 0. with IMAGE=<the trainer's -cuda image> (and docker with NVIDIA's container toolkit): that image's torch sees
#    the GPU;
# 1. imports: the trainer and `braintrain run` import (and kopf, the operator's, is not needed);
# 2. run + resume: `braintrain run` end to end with NCCL on benchmarks/gpu_check.yaml (checkpoints at steps 20
#    and 40), then the same job with 80 steps, which must resume from step 40;
# 3. throughput: benchmarks/gpu_throughput.py, eager and compiled, with the plain loop's ratio;
# 4. async saves: benchmarks/async_save.py, the 1b preset's async saves' stall and save/raw-write ratio.
#
# Prints one table. Exit 0 when every step ran, 1 when one failed (its output's end is shown) or torch is missing,
# 2 without CUDA.
# docs/performance.md explains the figures and keeps the measured tables.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
export PYTHONPATH="$ROOT/trainer:$ROOT/operator${PYTHONPATH:+:$PYTHONPATH}"
cd "$ROOT"

if ! "$PYTHON" -c 'import torch' 2>/dev/null; then
    echo "gpu_check: $PYTHON cannot import torch; set PYTHON to the python that has it" >&2
    exit 1
fi
if ! "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 2)' 2>/dev/null; then
    echo "gpu_check: no CUDA device for $PYTHON's torch here; run it on a GPU machine" >&2
    exit 2
fi
LOGS="${LOGS:-$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")}"
mkdir -p "$LOGS"

ROWS=()
FAILED=0
LAST_SECONDS=0

# step NAME SECONDS COMMAND...: runs COMMAND within SECONDS, its output in $LOGS/NAME.log; a failure makes its row.
step() {
    local name="$1" limit="$2"
    shift 2
    local began=$SECONDS code=0 why
    timeout "$limit" "$@" >"$LOGS/$name.log" 2>&1 || code=$?
    LAST_SECONDS=$((SECONDS - began))
    if [[ $code -ne 0 ]]; then
        FAILED=1
        why="exit $code"
        if [[ $code -eq 124 ]]; then
            why="over its ${limit} s"
        fi
        ROWS+=("$(printf '%-12s %-8s %5s s  %s' "$name" "FAILED" "$LAST_SECONDS" "$why; see $LOGS/$name.log")")
        {
            echo "== $name failed ($why); the end of its output:"
            tail -n 20 "$LOGS/$name.log"
        } >&2
        return 1
    fi
}

# row NAME FIGURES: the row of a step that ran.
row() {
    ROWS+=("$(printf '%-12s %-8s %5s s  %s' "$1" "ok" "$LAST_SECONDS" "$2")")
}

# 0. The CUDA trainer image: its torch (PyPI's CUDA 13.0 build) on this machine's GPU.
if [[ -n "${IMAGE:-}" ]] && step image 300 docker run --rm --gpus all --entrypoint python "$IMAGE" -c 'import torch; assert torch.cuda.is_available(), "torch sees no GPU"; print(f"{torch.__version__} on {torch.cuda.get_device_name()}")'; then
    row image "$IMAGE: $(tail -n 1 "$LOGS/image.log")"
fi

# 1. Imports: what `braintrain run` and the trainer load, without kopf.
if step imports 20 "$PYTHON" -c '
import sys
import brain_operator.cli, brain_operator.local, brain_trainer.loop.train, brain_trainer.__main__
assert "kopf" not in sys.modules, "kopf was imported"
import torch
print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")'; then
    row imports "$(tail -n 1 "$LOGS/imports.log")"
fi

# 2. braintrain run with NCCL, checkpoints, and a resume from the last one with more steps.
export PYTHON RUN_DIR="$LOGS/run"
rm -rf "$RUN_DIR"
mkdir -p "$RUN_DIR"
sed 's/^    steps: 40$/    steps: 80/' benchmarks/gpu_check.yaml >"$RUN_DIR/resume.yaml"
# shellcheck disable=SC2016  # expanded by the inner bash
if step run 130 bash -c '
    set -euo pipefail
    braintrain=("$PYTHON" -c "import sys; from brain_operator.cli import main; sys.exit(main())")
    "${braintrain[@]}" run benchmarks/gpu_check.yaml --workdir "$RUN_DIR/work" --claims "$RUN_DIR/claims" 2>&1
    "${braintrain[@]}" run "$RUN_DIR/resume.yaml" --workdir "$RUN_DIR/work" --claims "$RUN_DIR/claims" 2>&1 |
        tee "$RUN_DIR/resume.log"
    grep -q "resumed from .*step-00000040: step 40" "$RUN_DIR/resume.log" || {
        echo "the second run did not resume from the checkpoint of step 40"
        exit 1
    }'; then
    row run "nccl, 40 steps then 80 resumed from step 40; $(grep -c '^status: *Succeeded' "$LOGS/run.log") of 2 Succeeded"
fi

# 3. Throughput of the 1b preset, eager and compiled, beside a plain loop.
if step throughput 180 "$PYTHON" benchmarks/gpu_throughput.py --steps 20 --warmup 5 --json "$LOGS/throughput.json"; then
    row throughput "$("$PYTHON" - "$LOGS/throughput.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
parts = [f"{r['preset']} {r['micro_batch']}x{r['seq_len']}, {r['flops_per_token_counted']:.3g} FLOPs/token"]
for m in r["modes"]:
    mfu = "n/a" if m["mfu"] is None else f"{m['mfu']:.1%}"
    parts.append(f"{m['mode']} {m['step_s'] * 1e3:.1f} ms, {m['tokens_per_s']:,.0f} tok/s, MFU {mfu}, "
                 f"{m['peak_memory_bytes'] / 2**30:.1f} GiB, trainer/plain {m['trainer_over_plain']:.3f}")
print("; ".join(parts))
EOF
)"
fi

# 4. The 1b preset's asynchronous saves: the stall each causes, and their speed against a raw fsync'd write.
if step async-save 150 "$PYTHON" benchmarks/async_save.py --saves 2 --dir "$LOGS" --json "$LOGS/async_save.json"; then
    row async-save "$("$PYTHON" - "$LOGS/async_save.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
saves = r["saves"]
stalls = ", ".join(f"{s['stall_s']:.2f}" for s in saves if s["kind"] == "async")
ratios = ", ".join(f"{s['over_raw']:.2f}" for s in saves)
print(f"{saves[0]['bytes'] / 1e9:.2f} GB; async stalls {stalls} s; save/raw {ratios} "
      f"(raw {r['raw_gb_per_s']:.2f} GB/s; the last is the final blocking save)")
EOF
)"
fi

echo
printf '%-12s %-8s %7s  %s\n' "check" "result" "time" "figures"
printf '%s\n' "${ROWS[@]}"
exit "$FAILED"
