#!/usr/bin/env bash
# Activation recompute benchmark (make bench): step time and peak activation memory (activations plus
# recompute scratch, from the run's memory_peak record) for --recompute none, selective and full, as
# ratios against none. The small shape is timed on one thread (a busy machine stalls multi-threaded
# steps at every OpenMP barrier): five interleaved rounds, each the median of steps 2-6, then the median
# round. d12 at T 1024, B 4 is measured for memory only (one step each), beside
# ./train plan --exact's prediction.
source "$(dirname "$0")/bench_common.sh"
peak() { # LOG: activations + recompute scratch of rank 0, bytes
    python3 -c 'import json, sys
r = [json.loads(l)["memory_peak"] for l in open(sys.argv[1]) if "memory_peak" in l][0]
print(r["activations"] + r["recompute"])' "$1"
}
median() { printf '%s\n' "$@" | sort -g | sed -n "$((($# + 1) / 2))p"; }

SMALL=(--layers 4 --channels 256 --heads 4 --vocab 256 --seq-len 256 --micro-batch 4)
declare -A ms mem
for round in 1 2 3 4 5; do
    for r in none selective full; do
        ./train "${SMALL[@]}" --threads 1 --recompute $r --steps 6 --train "$W/data/train.bin" --log "$W/$r.jsonl" >/dev/null
        ms[$r]="${ms[$r]:-} $(med "$W/$r.jsonl" ms)"
        mem[$r]=$(peak "$W/$r.jsonl")
    done
done
echo "L4 C256 H4 T256 B4 fp32, 1 thread (median of 5 rounds of the median of steps 2-6); load average $(cut -d' ' -f1-3 /proc/loadavg):"
printf '  %-10s %10s %8s %16s %8s\n' recompute step_ms ratio activations_MiB ratio
base_ms=$(median ${ms[none]})
for r in none selective full; do
    m=$(median ${ms[$r]})
    printf '  %-10s %10.1f %7.2fx %16.2f %7.2fx\n' $r "$m" "$(awk -v a="$m" -v b="$base_ms" 'BEGIN { print a / b }')" \
        "$(awk -v a="${mem[$r]}" 'BEGIN { print a / 1048576 }')" "$(awk -v a="${mem[$r]}" -v b="${mem[none]}" 'BEGIN { print a / b }')"
done

echo "d12 (124M) T1024 B4 fp32, one step: peak activations + recompute scratch of the rank, and plan --exact's figure:"
printf '  %-10s %16s %8s %16s\n' recompute measured_MiB ratio plan_exact_MiB
for r in none selective full; do
    ./train --model d12 --seq-len 1024 --micro-batch 4 --recompute $r --steps 1 --train "$W/data/train.bin" \
        --log "$W/d12-$r.jsonl" >/dev/null
    mem[$r]=$(peak "$W/d12-$r.jsonl")
    want=$(./train plan --model d12 --gpus 1 --batch-tokens 4096 --micro-batches 1 --dtype fp32 --recompute $r --exact \
        --device cpu --json | python3 -c 'import json, sys
b = json.load(sys.stdin)["layouts"][0]["exact"]["bytes"]
print(b["activations"] + b["recompute"])')
    printf '  %-10s %16.1f %7.2fx %16.1f\n' $r "$(awk -v a="${mem[$r]}" 'BEGIN { print a / 1048576 }')" \
        "$(awk -v a="${mem[$r]}" -v b="${mem[none]}" 'BEGIN { print a / b }')" "$(awk -v a="$want" 'BEGIN { print a / 1048576 }')"
done
