#!/usr/bin/env bash
# Pipeline benchmark (make bench): for each schedule (--pp-schedule 1f1b, interleaved with V = 2, zb-h1, zb-v),
# the measured bubble (max and mean over stages; each run's median over steps 2-6, then the median of 3
# runs) beside the schedule's formula with equal F, B and W: (P-1)/(M+P-1), (P-1)/(V*M+P-1) and
# (P-1)/(3M+P-1) and (P-1)/(6M+P-1), for M = 8, 16, 64 micro-batches, one thread per rank; and for zb-h1
# and zb-v the measured time of one W pass (the filling). The formulas assume stages of equal cost, so the shape makes them equal:
# with C = 64 and T = 64 the LM head and loss over 1280 words cost about one block, and 5P - 1 blocks
# (the first stages, or chunks, one block longer) give every stage five blocks' work, plain or
# interleaved. What the measurement adds to the formula is the pipeline's own overhead: hand-offs and
# waking up. zb-v's 2P chunks end with the head on the first stage: 6P - 1 blocks give each chunk three
# blocks' work (the last one two and the head), so its model is deeper than the others'.
# PP P needs P cores to measure the pipeline: with more ranks than cores, a stage that waits is a
# stage the kernel has not scheduled, and the "bubble" measures the scheduler. So PP 2 always, and
# PP 4 only on a machine with at least 4 cores (this says so when it skips it). The load average is
# printed first: on a loaded machine the bubble measures the other processes too.
source "$(dirname "$0")/bench_common.sh"
CORES=$(nproc)
RUNS=${RUNS:-3}
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg) on $CORES cores; $RUNS runs per row"
printf '%-4s %-12s %-4s %10s %12s %12s %10s %10s\n' PP schedule M step_ms bubble_max bubble_mean formula W_ms
median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
pct() { awk -v x="$1" 'BEGIN { printf "%.1f%%", 100 * x }'; }
for pp in 2 4; do
    if [ "$pp" -gt "$CORES" ]; then
        echo "(PP $pp skipped: $pp ranks on $CORES cores would measure the scheduler, not the pipeline)"
        continue
    fi
    for sch in 1f1b interleaved zb-h1 zb-v; do
        v=1 layers=$((5 * pp - 1))
        [ $sch = interleaved ] && v=2
        [ $sch = zb-v ] && v=2 layers=$((6 * pp - 1))
        for m in 8 16 64; do
            passes=$m
            [ $sch = zb-v ] && passes=$((2 * m))
            : >"$W/runs.txt"
            for run in $(seq "$RUNS"); do
                ./train --nproc $pp --pp $pp --pp-schedule $sch --pp-virtual $v --layers $layers --channels 64 --heads 4 \
                    --vocab 1280 --seq-len 64 --micro-batch 1 --threads 1 --batch-tokens $((m * 64)) --steps 6 \
                    --train "$W/data/train.bin" --log "$W/r.jsonl" >/dev/null
                # W per pass: the slowest rank's W-fill time over the step's m passes (zb-v: 2m chunk passes)
                wms=$(grep '"loss"' "$W/r.jsonl" | sed -n '2,6p' | grep -o '"pp_wfill_ms":\[[^]]*\]' | sed 's/.*\[//; s/\]//' |
                    awk -F, -v m=$passes '{ x = 0; for (i = 1; i <= NF; i++) if ($i > x) x = $i; print x / m }' | median)
                echo "$(med "$W/r.jsonl" ms) $(med "$W/r.jsonl" bubble_max) $(med "$W/r.jsonl" bubble_mean) $(med "$W/r.jsonl" bubble_formula) $wms" >>"$W/runs.txt"
            done
            col() { cut -d' ' -f"$1" "$W/runs.txt" | median; }
            printf '%-4s %-12s %-4s %10.1f %12s %12s %10s %10.2f\n' $pp $sch $m "$(col 1)" "$(pct "$(col 2)")" "$(pct "$(col 3)")" \
                "$(pct "$(col 4)")" "$(col 5)"
        done
    done
done
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
