#!/usr/bin/env bash
# Context-parallel benchmark (make bench): step time, attention time and the CP ring's communication
# (cp_comm_ms: time the CP communicators' progress threads were busy; cp_exposed_ms: time rank 0 waited
# for ring transfers) at a sequence length where attention is about 90% of the step (T 2048, C 64).
# CP 1 runs with one thread and with two (the same cores as CP 2); CP 2 and CP 4 run one thread per rank,
# so CP 4 oversubscribes a 2-core machine. Each figure is the median of three interleaved rounds, each
# round's the median of steps 2-6; ratios are against CP 1 measured in the same rounds.
source "$(dirname "$0")/bench_common.sh"
SHAPE=(--layers 2 --channels 64 --heads 4 --vocab 256 --seq-len 2048 --micro-batch 1 --steps 6 --profile --threads 1)
CONFIGS=("1 1" "1 2" "2 1" "4 1") # CP, threads per rank
for round in 1 2 3; do
    for cfg in "${CONFIGS[@]}"; do
        read -r cp th <<<"$cfg"
        launch=()
        [ "$cp" -gt 1 ] && launch=(--nproc "$cp" --cp "$cp")
        ./train "${launch[@]}" "${SHAPE[@]}" --threads "$th" --train "$W/data/train.bin" --log "$W/r.jsonl" >/dev/null
        for f in ms attention_ms cp_comm_ms cp_exposed_ms; do echo "$(med "$W/r.jsonl" $f)" >>"$W/cp$cp-t$th.$f"; done
    done
done
m3() { sort -g "$1" | sed -n 2p; } # the median of the three rounds
base1=$(m3 "$W/cp1-t1.ms")
base2=$(m3 "$W/cp1-t2.ms")
printf '%-3s %-14s %9s %12s %12s %13s %11s %12s %9s\n' CP "ranks x thr" step_ms "vs CP1 x1" "vs CP1 x2" attention_ms \
    cp_comm_ms cp_exposed_ms exposed
for cfg in "${CONFIGS[@]}"; do
    read -r cp th <<<"$cfg"
    p=$W/cp$cp-t$th
    ms=$(m3 "$p.ms")
    printf '%-3s %-14s %9.1f %11.2fx %11.2fx %13.1f %11.1f %12.1f %8.1f%%\n' "$cp" "$cp x $th" "$ms" \
        "$(awk -v a="$base1" -v b="$ms" 'BEGIN { print a / b }')" "$(awk -v a="$base2" -v b="$ms" 'BEGIN { print a / b }')" \
        "$(m3 "$p.attention_ms")" "$(m3 "$p.cp_comm_ms")" "$(m3 "$p.cp_exposed_ms")" \
        "$(awk -v a="$(m3 "$p.cp_exposed_ms")" -v b="$ms" 'BEGIN { print 100 * a / b }')"
done
