#!/usr/bin/env bash
# Pipeline benchmark (make bench): measured bubble (max and mean over stages, median over steps 2-6)
# against the formula (P-1)/(V*M+P-1), for 4 stages of equal cost and M = 4, 16, 64 micro-batches,
# plain 1F1B (V = 1) and interleaved (V = 2).
# One thread per rank; the 4 ranks share this machine's cores, which inflates waits.
source "$(dirname "$0")/bench_common.sh"
printf '%-4s %-4s %-4s %10s %12s %12s %10s\n' PP V M step_ms bubble_max bubble_mean formula
for v in 1 2; do for m in 4 16 64; do
    ./train --nproc 4 --pp 4 --pp-virtual $v --layers 8 --channels 64 --heads 4 --vocab 256 --seq-len 64 --micro-batch 1 --threads 1 \
        --batch-tokens $((m * 64)) --steps 6 --train "$W/data/train.bin" --log "$W/r.jsonl" >/dev/null
    printf '%-4s %-4s %-4s %10.1f %11.1f%% %11.1f%% %9.1f%%\n' 4 "$v" "$m" "$(med "$W/r.jsonl" ms)" \
        "$(awk -v x="$(med "$W/r.jsonl" bubble_max)" 'BEGIN { print 100 * x }')" \
        "$(awk -v x="$(med "$W/r.jsonl" bubble_mean)" 'BEGIN { print 100 * x }')" \
        "$(awk -v x="$(med "$W/r.jsonl" bubble_formula)" 'BEGIN { print 100 * x }')"
done; done
