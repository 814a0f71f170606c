#!/usr/bin/env bash
# Pipeline benchmark (make bench): measured bubble (max and mean over stages, median over steps 2-6)
# against the formula (P-1)/(V*M+P-1), for M = 4, 16, 64 micro-batches, plain 1F1B (V = 1) and
# interleaved (V = 2), one thread per rank. The formula assumes stages of equal cost, so the shape
# makes them equal: with C = 64 and T = 64 the LM head and loss over 1280 words cost about one block, and
# 5P - 1 blocks (the first stages, or chunks, one block longer) give every stage five blocks' work,
# plain or interleaved. What the measurement adds to the formula is then the pipeline's own
# overhead: hand-offs and waking up.
# PP P needs P cores to measure the pipeline: with more ranks than cores, a stage that waits is a
# stage the kernel has not scheduled, and the "bubble" measures the scheduler. So PP 2 always, and
# PP 4 only on a machine with at least 4 cores (this says so when it skips it).
source "$(dirname "$0")/bench_common.sh"
CORES=$(nproc)
printf '%-4s %-4s %-4s %10s %12s %12s %10s\n' PP V M step_ms bubble_max bubble_mean formula
for pp in 2 4; do
    if [ "$pp" -gt "$CORES" ]; then
        echo "(PP $pp skipped: $pp ranks on $CORES cores would measure the scheduler, not the pipeline)"
        continue
    fi
    for v in 1 2; do for m in 4 16 64; do
        ./train --nproc $pp --pp $pp --pp-virtual $v --layers $((5 * pp - 1)) --channels 64 --heads 4 --vocab 1280 --seq-len 64 --micro-batch 1 \
            --threads 1 --batch-tokens $((m * 64)) --steps 6 --train "$W/data/train.bin" --log "$W/r.jsonl" >/dev/null
        printf '%-4s %-4s %-4s %10.1f %11.1f%% %11.1f%% %9.1f%%\n' $pp "$v" "$m" "$(med "$W/r.jsonl" ms)" \
            "$(awk -v x="$(med "$W/r.jsonl" bubble_max)" 'BEGIN { print 100 * x }')" \
            "$(awk -v x="$(med "$W/r.jsonl" bubble_mean)" 'BEGIN { print 100 * x }')" \
            "$(awk -v x="$(med "$W/r.jsonl" bubble_formula)" 'BEGIN { print 100 * x }')"
    done; done
done
