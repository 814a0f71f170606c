#!/usr/bin/env bash
# Data-parallel benchmark (make bench): step time, time in DP collectives (comm_ms), time the ranks
# waited for them after the backward (exposed_comm_ms) and tokens/s, medians over steps 2-6, for
# DP 1, 2 and 4 at each ZeRO stage, with buckets on (2 MiB) and off (one bucket after the backward).
# Each rank runs one thread, so DP 2 fills this machine's 2 cores and DP 4 oversubscribes them.
source "$(dirname "$0")/bench_common.sh"
SHAPE=(--layers 4 --channels 256 --heads 4 --vocab 256 --seq-len 128 --micro-batch 2 --threads 1 --steps 6)
printf '%-4s %-6s %-8s %10s %10s %12s %10s %8s\n' DP ZeRO buckets step_ms comm_ms exposed_ms tokens/s exp/comm
run() { # dp zero bucket_mb
    local dp=$1 z=$2 mb=$3
    local launch=()
    [ "$dp" -gt 1 ] && launch=(--nproc "$dp")
    ./train "${launch[@]}" "${SHAPE[@]}" --train "$W/data/train.bin" --batch-tokens $((dp * 256)) --zero "$z" \
        --bucket-mb "$mb" --log "$W/r.jsonl" >/dev/null
    local ms comm exp tps
    ms=$(med "$W/r.jsonl" ms); comm=$(med "$W/r.jsonl" comm_ms); exp=$(med "$W/r.jsonl" exposed_comm_ms)
    tps=$(med "$W/r.jsonl" tokens_per_s)
    printf '%-4s %-6s %-8s %10.1f %10.1f %12.1f %10.0f %8s\n' "$dp" "$z" "$([ "$mb" = 0 ] && echo off || echo "${mb}MiB")" \
        "$ms" "$comm" "$exp" "$tps" "$(awk -v a="$exp" -v b="$comm" 'BEGIN { if (b > 0) printf "%.0f%%", 100 * a / b; else print "-" }')"
}
run 1 0 2
for dp in 2 4; do
    for z in 0 1 2 3; do
        run "$dp" "$z" 2
        run "$dp" "$z" 0
    done
done
