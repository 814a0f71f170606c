#!/usr/bin/env bash
# Pipeline benchmark (make bench): for each schedule (--pp-schedule 1f1b, interleaved with V = 2, zb-h1,
# zb-v with the paper's unit-time lists, zb-v as it runs by default), the measured bubble (max and mean over stages; each run's median over steps 2-6, then the median
# of 3 runs) beside the schedule's formula, for M = 8, 16, 64 micro-batches, one thread per rank. Two
# formulas: with equal F, B and W (the planner's: (P-1)/(M+P-1), (P-1)/(V*M+P-1), (P-1)/(3M+P-1) and
# (P-1)/(6M+P-1)), and with the F, B and W times this run measured (F_ms, B_ms, W_ms, from
# --pp-schedule-dump of each run's last step: the median over every rank's passes, then over the runs;
# 1f1b and interleaved run B and W as one backward, so their B holds both and W is "-"; per stage, or per
# chunk with two chunks): 1f1b and interleaved are the same either way; zb-h1's is (P-1)(F+B-W) over
# M(F+B+W) plus that; for the zb-v rows the action lists' own bubble under the zb-v-unit row's times
# (./train schedule --pp-times: the unit-time lists for zb-v-unit, auto:F,B,W for zb-v, F,B,W for
# zb-v-times), which the closed form of the first activation's walk down the ranks, (P-1)F over
# 2M(F+B+W) plus that, misses when F, B and W differ.
# Then the last step's mean bubble twice, from its dump (scripts/plot.py --replay): as measured, and
# replayed, the same passes with their measured durations in the same order but hand-offs that cost
# nothing; their difference is what the hand-offs and waking up cost, and the replayed one's distance
# from the formula is the passes' own durations (stages of unequal cost, or cores of unequal speed).
# Beside them what each hand-off cost, counted, not timed (the step record's pp_copies_per_handoff and
# pp_wakeups_per_handoff: copies of the bytes and progress-thread wake-ups; the design is 1 and 0).
# stages: how much longer the busiest rank computed in that step than the least busy one (the sum of
# its F, B and W passes in the dump): the formulas assume 0; the replayed bubble counts it with the
# rest of the passes' durations (when a slow pass falls matters as well as how much there is).
# The formulas assume stages of equal cost, so the shape makes them equal: with C = 256 and T = 64 the LM
# head and loss over 3456 words cost about one block, and 5P - 1 blocks (the first stages, or chunks,
# one block longer) give every stage five blocks' work, plain or interleaved. What the measurement adds
# to the formula is the pipeline's own overhead: hand-offs and waking up. zb-v's 2P chunks end with the
# head on the first stage: 6P - 1 blocks give each chunk three blocks' work (the last one two and the
# head), so its model is deeper than the others'. A schedule the trainer refuses gets its reason in one
# line instead of a row.
# PP P needs P cores to measure the pipeline: with more ranks than cores, a stage that waits is a
# stage the kernel has not scheduled, and the "bubble" measures the scheduler. So PP 2 always, and
# PP 4 only on a machine with at least 4 cores (this says so when it skips it). The load average is
# printed first: on a loaded machine the bubble measures the other processes too.
# zb-v-unit runs the paper's lists for equal F, B and W (--pp-times unit). zb-v is the default,
# --pp-times auto: its first step (left out of the median) runs the unit lists and measures the passes,
# and the later steps run lists built for those times within the memory allocated for the unit lists.
# zb-v-times has its action lists built for the F, B and W times the zb-v-unit row just measured at the
# same M (--pp-times F,B,W; schedule.h), with the memory those lists need: the list scheduler then
# fills the steady state for the passes as they are here, not as unit times assume.
# Then memory: each rank's measured peak (the run's memory_peak records, every category summed: what
# its "memory of rank R, peak" line calls the total; allocation is fixed before step 1, so one run
# gives it) and the ratio of the largest to 1f1b's largest on the same model and M (zb-v's deeper model
# gets a one-step 1f1b run of its own for that): the goal is at most 1 for zb-h1 and zb-v.
# CHANNELS and VOCAB (256 and 3456) change the shape, keeping the stages about equal where the head over
# VOCAB words costs about one block of CHANNELS: at C 256, 1f1b dumps' F + B summed per stage came within
# 1-2% of each other (stage 0 4% heavier at 3072 words, stage 1 2-3% at 3840); C 64 with 1280 and C 128
# with 2560 measured so once. C 256 is also where the matmuls are most of a pass, as on real models, so
# F : B : W is nearer the paper's equal times than at C 64, where attention and the element-wise passes
# make B three times W.
# Quick mode (--quick, or QUICK=1): one run per row, M = 8 only, 3 steps (the median of steps 2-3):
# a check that every row runs, not a measurement.
source "$(dirname "$0")/bench_common.sh"
PY=/usr/bin/python3
[ "${1:-}" = --quick ] && QUICK=1
CORES=$(nproc)
if [ "${QUICK:-0}" = 1 ]; then RUNS=${RUNS:-1} MS=${MS:-8} STEPS=${STEPS:-3}; fi
RUNS=${RUNS:-3}
MS=${MS:-8 16 64}                            # micro-batch counts (MS="8" for a quick look)
STEPS=${STEPS:-6}
SCHEDULES=${SCHEDULES:-1f1b interleaved zb-h1 zb-v-unit zb-v zb-v-times}
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg) on $CORES cores; $RUNS run(s) per row, $STEPS steps each"
printf '%-4s %-12s %-4s %10s %11s %11s %8s %9s %7s %7s %7s %8s %9s %11s %7s %7s %22s %8s\n' PP schedule M step_ms bubble_max bubble_mean formula formula_t \
    F_ms B_ms W_ms stages last_mean replay_mean copies wakeups "peak_MiB (rank 0/1/..)" "mem/1f1b"
median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
# each rank's peak in MiB, "r0/r1/..", from a run's memory_peak records
peaks() { $PY -c 'import json, sys
p = {r["rank"]: sum(r["memory_peak"].values()) for r in map(json.loads, open(sys.argv[1])) if "memory_peak" in r}
print("/".join("%.3f" % (p[k] / 1048576) for k in sorted(p)))' "$1"; }
peakmax() { tr / '\n' <<<"$1" | sort -g | tail -1; }
declare -A REF   # 1f1b's largest peak, by "layers M"
declare -A TIMES # the zb-v-unit row's measured F,B,W, by "PP M": what the zb-v and zb-v-times rows' formula_t, and zb-v-times' lists, are for
pct() { [ -n "$1" ] && awk -v x="$1" 'BEGIN { printf "%.1f%%", 100 * x }' || printf -- -; }
# run SCHEDULE V LAYERS STEPS [FLAGS]: one PP $pp run at $m micro-batches, logging to $W/r.jsonl
run() {
    ./train --nproc $pp --pp $pp --pp-schedule $1 --pp-virtual $2 --layers $3 --channels ${CHANNELS:-256} --heads 4 --vocab ${VOCAB:-3456} --seq-len 64 \
        --micro-batch 1 --threads 1 --batch-tokens $((m * 64)) --steps "$4" --train "$W/data/train.bin" --log "$W/r.jsonl" "${@:5}" \
        >/dev/null 2>"$W/err.txt"
}
for pp in 2 4; do
    if [ "$pp" -gt "$CORES" ]; then
        echo "(PP $pp skipped: $pp ranks on $CORES cores would measure the scheduler, not the pipeline)"
        continue
    fi
    for sch in $SCHEDULES; do
        v=1 layers=$((5 * pp - 1)) name=$sch
        [ $sch = interleaved ] && v=2
        case $sch in zb-v*) v=2 layers=$((6 * pp - 1)) name=zb-v ;; esac
        for m in $MS; do
            : >"$W/runs.txt"
            extra=()
            [ $sch = zb-v-unit ] && extra=(--pp-times unit)
            if [ $sch = zb-v-times ]; then
                [ -n "${TIMES["$pp $m"]:-}" ] || { echo "$pp    $sch $m: not run: it builds zb-v's lists for the zb-v-unit row's times (SCHEDULES needs zb-v-unit before it)"; continue; }
                extra=(--pp-times "${TIMES["$pp $m"]}")
            fi
            for run in $(seq "$RUNS"); do
                if ! run $name $v $layers "$STEPS" --pp-schedule-dump "$W/d.tsv" "${extra[@]}"; then
                    echo "$pp    $sch: not run: $(tail -1 "$W/err.txt")"
                    continue 3
                fi
                # one pass of each kind: the median duration over the dump's F, B, W actions
                pass() { # (split 0: the W is inside its B)
                    awk -F'\t' -v k="$1" 'NR == 2 { split0 = $0 ~ / split 0 / } NR > 3 && $3 == k && !(k == "W" && split0) { print $8 - $7 }' \
                        "$W/d.tsv" | median
                }
                # how much longer the busiest stage computed than the least busy (the sum of its F, B and
                # W in the dump's step): the formulas assume stages of equal cost
                spread() {
                    awk -F'\t' 'NR > 3 && ($3 == "F" || $3 == "B" || $3 == "W") { busy[$1] += $8 - $7 }
                        END { for (r in busy) { if (mx == "" || busy[r] > mx) mx = busy[r]; if (mn == "" || busy[r] < mn) mn = busy[r] }
                              if (mn > 0) print mx / mn - 1 }' "$W/d.tsv"
                }
                # the last step's mean bubble, measured and replayed with free hand-offs
                rep=$($PY scripts/plot.py --replay "$W/d.tsv" | awk '{ for (i = 1; i < NF; i++) if ($i == "mean") m[++k] = $(i + 1) + 0 } END { print m[1] / 100, m[2] / 100 }')
                echo "$(med "$W/r.jsonl" ms) $(med "$W/r.jsonl" bubble_max) $(med "$W/r.jsonl" bubble_mean) $(med "$W/r.jsonl" bubble_formula) $(pass F) $(pass B) $(pass W) $(med "$W/r.jsonl" pp_copies_per_handoff) $(med "$W/r.jsonl" pp_wakeups_per_handoff) $rep $(spread)" >>"$W/runs.txt"
            done
            pk=$(peaks "$W/r.jsonl") # the last run's (the same in every run)
            [ $sch = 1f1b ] && REF["$layers $m"]=$(peakmax "$pk")
            if [ -z "${REF["$layers $m"]:-}" ]; then # no 1f1b row on this model yet: one step of it
                run 1f1b 1 $layers 1 && REF["$layers $m"]=$(peakmax "$(peaks "$W/r.jsonl")")
            fi
            ratio=$(awk -v a="$(peakmax "$pk")" -v b="${REF["$layers $m"]:-}" 'BEGIN { if (b > 0) printf "%.3f", a / b; else printf "-" }')
            col() { cut -d' ' -f"$1" "$W/runs.txt" | median; }
            ms() { [ -n "$1" ] && printf '%.3f' "$1" || printf -- -; }
            F=$(col 5) B=$(col 6) Wt=$(col 7)
            [ $sch = zb-v-unit ] && [ -n "$F" ] && [ -n "$B" ] && [ -n "$Wt" ] && TIMES["$pp $m"]="$F,$B,$Wt"
            # the formula with the measured times (W "-": inside B)
            ft=$(awk -v s=$sch -v p=$pp -v m=$m -v v=$v -v F="$F" -v B="$B" -v W="${Wt:-0}" 'BEGIN {
                if (s == "1f1b") b = (p - 1) / (m + p - 1)
                else if (s == "interleaved") b = (p - 1) / (v * m + p - 1)
                else if (s == "zb-h1") { i = (p - 1) * (F + B - W); b = i / (m * (F + B + W) + i) }
                else { i = (p - 1) * F; b = i / (2 * m * (F + B + W) + i) }
                print b }')
            if [ $name = zb-v ]; then # zb-v: the action lists' own bubble under the zb-v-unit row's times, which
                # the closed form above (the warm-up walk alone) misses when F, B and W differ: the unit lists
                # for zb-v-unit, those --pp-times auto builds for zb-v, those built for the times for zb-v-times
                local_t=${TIMES["$pp $m"]:-}
                [ $sch = zb-v ] && local_t=auto:$local_t
                ft=$( (./train schedule --pp $pp --micro-batches $m --pp-schedule zb-v --pp-times "$local_t" 2>/dev/null || true) |
                    sed -nE "s/.*under those times bubble ([0-9.]+)%, the unit-time lists' ([0-9.]+)%.*/\1 \2/p" |
                    awk -v s=$sch '{ print (s == "zb-v-unit" ? $2 : $1) / 100 }')
            fi
            printf '%-4s %-12s %-4s %10.1f %11s %11s %8s %9s %7s %7s %7s %8s %9s %11s %7s %7s %22s %8s\n' $pp $sch $m "$(col 1)" "$(pct "$(col 2)")" \
                "$(pct "$(col 3)")" "$(pct "$(col 4)")" "$(pct "$ft")" "$(ms "$F")" "$(ms "$B")" "$(ms "$Wt")" "$(pct "$(col 12)")" "$(pct "$(col 10)")" \
                "$(pct "$(col 11)")" "$(col 8)" "$(col 9)" "$pk" "$ratio"
        done
    done
done
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
