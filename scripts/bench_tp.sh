#!/usr/bin/env bash
# Tensor-parallel benchmark (make bench): step time and the share of it spent in tensor-parallel
# collectives (tp_comm_ms: time the TP communicator's progress thread was busy), medians over steps
# 2-6, for TP 1, 2 and 4 on this node, with and without sequence parallelism. One thread per rank.
source "$(dirname "$0")/bench_common.sh"
SHAPE=(--layers 4 --channels 256 --heads 8 --vocab 256 --seq-len 128 --micro-batch 4 --threads 1 --steps 6)
printf '%-4s %-4s %10s %12s %8s %10s\n' TP SP step_ms tp_comm_ms share tokens/s
for tp in 1 2 4; do
    for sp in "" --sp; do
        [ "$tp" = 1 ] && [ -n "$sp" ] && continue
        launch=()
        [ "$tp" -gt 1 ] && launch=(--nproc "$tp" --tp "$tp")
        ./train "${launch[@]}" $sp "${SHAPE[@]}" --train "$W/data/train.bin" --log "$W/r.jsonl" >/dev/null
        ms=$(med "$W/r.jsonl" ms); c=$(med "$W/r.jsonl" tp_comm_ms); tps=$(med "$W/r.jsonl" tokens_per_s)
        printf '%-4s %-4s %10.1f %12.1f %7.0f%% %10.0f\n' "$tp" "$([ -n "$sp" ] && echo yes || echo no)" "$ms" "$c" \
            "$(awk -v a="$c" -v b="$ms" 'BEGIN { print 100 * a / b }')" "$tps"
    done
done
