#!/usr/bin/env bash
# Activation recompute benchmark (make bench): step time and peak activation memory (activations plus
# recompute scratch, from the run's memory_peak record) for --recompute none, selective and full, as
# ratios against none. The small shape runs on one thread, five interleaved rounds, medians over the
# rounds: the wall-clock step (median of steps 2-7) and the CPU time per step ((user time of a 7-step
# run - that of a 2-step run) / 5), which a busy machine inflates far less than the wall clock. d12 at
# T 1024, B 4 is measured for memory only (one step each), beside ./train plan --exact's prediction.
source "$(dirname "$0")/bench_common.sh"
peak() { # LOG: activations + recompute scratch of rank 0, bytes
    python3 -c 'import json, sys
r = [json.loads(l)["memory_peak"] for l in open(sys.argv[1]) if "memory_peak" in l][0]
print(r["activations"] + r["recompute"])' "$1"
}
median() { printf '%s\n' "$@" | sort -g | sed -n "$((($# + 1) / 2))p"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
user_s() { # ARGS...: user CPU seconds of ./train ARGS
    local TIMEFORMAT=%U
    { time ./train "$@" >/dev/null 2>&1; } 2>&1
}

SMALL=(--layers 4 --channels 256 --heads 4 --vocab 256 --seq-len 256 --micro-batch 4 --threads 1 --train "$W/data/train.bin")
declare -A ms cpu mem
for round in 1 2 3 4 5; do
    for r in none selective full; do
        u7=$(user_s "${SMALL[@]}" --recompute $r --steps 7 --log "$W/$r.jsonl")
        u2=$(user_s "${SMALL[@]}" --recompute $r --steps 2)
        ms[$r]="${ms[$r]:-} $(grep '"loss"' "$W/$r.jsonl" | sed -n '2,7p' | grep -o '"ms":[0-9.]*' | cut -d: -f2 | sort -g | sed -n 3p)"
        cpu[$r]="${cpu[$r]:-} $(awk -v a="$u7" -v b="$u2" 'BEGIN { print (a - b) / 5 * 1000 }')"
        mem[$r]=$(peak "$W/$r.jsonl")
    done
done
echo "L4 C256 H4 T256 B4 fp32, 1 thread, medians of 5 rounds; load average $(cut -d' ' -f1-3 /proc/loadavg):"
printf '  %-10s %12s %7s %12s %7s %16s %7s\n' recompute wall_ms/step ratio cpu_ms/step ratio activations_MiB ratio
for r in none selective full; do
    w=$(median ${ms[$r]}) c=$(median ${cpu[$r]})
    printf '  %-10s %12.1f %6sx %12.1f %6sx %16.2f %6sx\n' $r "$w" "$(ratio "$w" "$(median ${ms[none]})")" "$c" \
        "$(ratio "$c" "$(median ${cpu[none]})")" "$(awk -v a="${mem[$r]}" 'BEGIN { print a / 1048576 }')" \
        "$(ratio "${mem[$r]}" "${mem[none]}")"
done

echo "d12 (124M) T1024 B4 fp32, one step: peak activations + recompute scratch of the rank, and plan --exact's figure:"
printf '  %-10s %16s %7s %16s\n' recompute measured_MiB ratio plan_exact_MiB
for r in none selective full; do
    ./train --model d12 --seq-len 1024 --micro-batch 4 --recompute $r --steps 1 --train "$W/data/train.bin" \
        --log "$W/d12-$r.jsonl" >/dev/null
    mem[$r]=$(peak "$W/d12-$r.jsonl")
    want=$(./train plan --model d12 --gpus 1 --batch-tokens 4096 --micro-batches 1 --dtype fp32 --recompute $r --exact \
        --device cpu --json | python3 -c 'import json, sys
b = json.load(sys.stdin)["layouts"][0]["exact"]["bytes"]
print(b["activations"] + b["recompute"])')
    printf '  %-10s %16.1f %6sx %16.1f\n' $r "$(awk -v a="${mem[$r]}" 'BEGIN { print a / 1048576 }')" \
        "$(ratio "${mem[$r]}" "${mem[none]}")" "$(awk -v a="$want" 'BEGIN { print a / 1048576 }')"
done
