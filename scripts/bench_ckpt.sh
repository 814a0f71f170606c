#!/usr/bin/env bash
# Checkpoint benchmark (make bench): d12 (124M parameters, 1.5 GB of fp32 master weights and AdamW
# moments) on one rank and on 2 ranks (DP 2, ZeRO-1: two shards written at once), a checkpoint after
# every step. Per checkpoint: the bytes, the write time (the slowest rank's shard, fsync included), the
# bandwidth, and how long the step stalled for it (the copy into the staging buffer, and waiting for a
# checkpoint still being written). Then medians, against two comparators measured here: dd writing
# the same bytes with fsync into the same directory, and the median step time.
source "$(dirname "$0")/bench_common.sh"
ARGS=(--model d12 --seq-len 64 --micro-batch 1 --steps 5 --train "$W/data/train.bin" --ckpt-every 1 --keep 1)
col() { grep -o "\"$2\":[0-9.e+-]*" "$1" | cut -d: -f2; }
median() { sort -g | awk '{ a[NR] = $1 } END { if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
for launch in "" "--nproc 2 --zero 1 --batch-tokens 128"; do
    read -ra L <<<"$launch"
    rm -rf "$W/ckpt"
    ./train "${L[@]}" "${ARGS[@]}" --ckpt-dir "$W/ckpt" --log "$W/c.jsonl" >/dev/null
    echo "d12, ${launch:-one rank}: one checkpoint per step (--keep 1)"
    printf '  %-5s %10s %10s %10s %12s\n' step MiB write_s MiB/s stall_ms
    grep '"ckpt_ok":true' "$W/c.jsonl" | while read -r line; do
        printf '  %-5s %10.1f %10.3f %10.1f %12.1f\n' "$(col <(echo "$line") step)" \
            "$(awk -v b="$(col <(echo "$line") ckpt_bytes)" 'BEGIN { print b / 1048576 }')" \
            "$(col <(echo "$line") ckpt_write_s)" "$(col <(echo "$line") ckpt_MiB_per_s)" "$(col <(echo "$line") ckpt_stall_ms)"
    done
    bytes=$(grep '"ckpt_ok":true' "$W/c.jsonl" | head -1 | grep -o '"ckpt_bytes":[0-9]*' | cut -d: -f2)
    bw=$(grep '"ckpt_ok":true' "$W/c.jsonl" | grep -o '"ckpt_MiB_per_s":[0-9.]*' | cut -d: -f2 | median)
    stall=$(grep '"ckpt_ok":true' "$W/c.jsonl" | grep -o '"ckpt_stall_ms":[0-9.]*' | cut -d: -f2 | median)
    step=$(grep '"loss"' "$W/c.jsonl" | grep -o '"ms":[0-9.]*' | cut -d: -f2 | median)
    dd_bw=$(for i in 1 2 3; do
        s=$(date +%s.%N)
        dd if=/dev/zero of="$W/dd.bin" bs=1M count=$((bytes / 1048576)) conv=fsync status=none
        awk -v s="$s" -v e="$(date +%s.%N)" -v b="$bytes" 'BEGIN { print b / 1048576 / (e - s) }'
        rm -f "$W/dd.bin"
    done | median)
    printf '  median: %.0f MiB/s written = %.2f x dd+fsync of the same bytes here (%.0f MiB/s); stall %.1f ms = %.3f x the median step (%.0f ms)\n' \
        "$bw" "$(awk -v a="$bw" -v b="$dd_bw" 'BEGIN { print a / b }')" "$dd_bw" "$stall" \
        "$(awk -v a="$stall" -v b="$step" 'BEGIN { print a / b }')" "$step"
done
