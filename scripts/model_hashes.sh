#!/usr/bin/env bash
# The final-model hashes (sha256 of --save-model) of a fixed set of runs, one "NAME HASH" line each.
# A refactoring that claims "behaviour unchanged" runs this before and after and diffs the two lists:
#   bash scripts/model_hashes.sh > before.txt; ...change...; bash scripts/model_hashes.sh > after.txt
# Usage: scripts/model_hashes.sh [TRAIN_BINARY]   (default ./train; needs a built ./train only)
set -euo pipefail
cd "$(dirname "$0")/.."
TRAIN=${1:-./train}
W=$(mktemp -d /tmp/llm4d-hashes.XXXXXX)
trap 'rm -rf "$W"' EXIT
$TRAIN prepare /usr/share/common-licenses/GPL-3 "$W/data" >/dev/null
S=(--layers 4 --channels 32 --heads 4 --vocab 256 --seq-len 32 --micro-batch 2 --batch-tokens 256 --steps 6
   --lr 1e-3 --warmup 2 --weight-decay 0.1 --clip 1.0 --bucket-mb 0.02 --train "$W/data/train.bin" --comm-timeout 120)
run() { # name args...
    local name=$1; shift
    $TRAIN "$@" "${S[@]}" --save-model "$W/$name.bin" >"$W/$name.out" 2>&1 || { echo "$name: run failed" >&2; tail -5 "$W/$name.out" >&2; exit 1; }
    echo "$name $(sha256sum "$W/$name.bin" | cut -d' ' -f1)"
}
run one-rank-fp32
run one-rank-bf16 --dtype bf16
run dp2-zero1 --nproc 2 --zero 1
run dp2-zero3 --nproc 2 --zero 3
run tp2-sp --nproc 2 --tp 2 --sp
run pp2-interleaved --nproc 2 --pp 2 --pp-virtual 2 --micro-batch 1
run cp2 --nproc 2 --cp 2
run tp2-pp2-dp2 --nproc 8 --tp 2 --pp 2 --zero 1 --micro-batch 1
# a resume: 6 steps checkpointed every 2, then resumed from step 4 into a fresh directory
$TRAIN "${S[@]}" --nproc 2 --zero 1 --ckpt-dir "$W/c1" --ckpt-every 2 >"$W/c1.out" 2>&1 || { echo "resume: first run failed" >&2; exit 1; }
run resume-dp2-zero1 --nproc 2 --zero 1 --resume "$W/c1/ckpt_00000004" --ckpt-dir "$W/c2"
