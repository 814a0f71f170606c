#!/usr/bin/env bash
# Pipeline benchmark (make bench): for each schedule (--pp-schedule 1f1b, interleaved with V = 2, zb-h1,
# zb-v), the measured bubble (max and mean over stages; each run's median over steps 2-6, then the median
# of 3 runs) beside the schedule's formula, for M = 8, 16, 64 micro-batches, one thread per rank. Two
# formulas: with equal F, B and W (the planner's: (P-1)/(M+P-1), (P-1)/(V*M+P-1), (P-1)/(3M+P-1) and
# (P-1)/(6M+P-1)), and with the F, B and W times this run measured (F_ms, B_ms, W_ms, from
# --pp-schedule-dump of each run's last step: the median over every rank's passes, then over the runs;
# 1f1b and interleaved run B and W as one backward, so their B holds both and W is "-"; per stage, or per
# chunk with two chunks): 1f1b and interleaved are the same either way; zb-h1's is (P-1)(F+B-W) over
# M(F+B+W) plus that; zb-v's the first activation's walk down the ranks, (P-1)F over 2M(F+B+W) plus that.
# Then the last step's mean bubble twice, from its dump (scripts/plot.py --replay): as measured, and
# replayed, the same passes with their measured durations in the same order but hand-offs that cost
# nothing; their difference is what the hand-offs and waking up cost, and the replayed one's distance
# from the formula is the passes' own durations (stages of unequal cost, or cores of unequal speed).
# Beside them what each hand-off cost, counted, not timed (the step record's pp_copies_per_handoff and
# pp_wakeups_per_handoff: copies of the bytes and progress-thread wake-ups; the design is 1 and 0).
# The formulas assume stages of equal cost, so the shape makes them equal: with C = 64 and T = 64 the LM
# head and loss over 1280 words cost about one block, and 5P - 1 blocks (the first stages, or chunks,
# one block longer) give every stage five blocks' work, plain or interleaved. What the measurement adds
# to the formula is the pipeline's own overhead: hand-offs and waking up. zb-v's 2P chunks end with the
# head on the first stage: 6P - 1 blocks give each chunk three blocks' work (the last one two and the
# head), so its model is deeper than the others'. A schedule the trainer refuses gets its reason in one
# line instead of a row.
# PP P needs P cores to measure the pipeline: with more ranks than cores, a stage that waits is a
# stage the kernel has not scheduled, and the "bubble" measures the scheduler. So PP 2 always, and
# PP 4 only on a machine with at least 4 cores (this says so when it skips it). The load average is
# printed first: on a loaded machine the bubble measures the other processes too.
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
SCHEDULES=${SCHEDULES:-1f1b interleaved zb-h1 zb-v}
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg) on $CORES cores; $RUNS run(s) per row, $STEPS steps each"
printf '%-4s %-12s %-4s %10s %11s %11s %8s %9s %7s %7s %7s %9s %11s %7s %7s\n' PP schedule M step_ms bubble_max bubble_mean formula formula_t \
    F_ms B_ms W_ms last_mean replay_mean copies wakeups
median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
pct() { [ -n "$1" ] && awk -v x="$1" 'BEGIN { printf "%.1f%%", 100 * x }' || printf -- -; }
for pp in 2 4; do
    if [ "$pp" -gt "$CORES" ]; then
        echo "(PP $pp skipped: $pp ranks on $CORES cores would measure the scheduler, not the pipeline)"
        continue
    fi
    for sch in $SCHEDULES; do
        v=1 layers=$((5 * pp - 1))
        [ $sch = interleaved ] && v=2
        [ $sch = zb-v ] && v=2 layers=$((6 * pp - 1))
        for m in $MS; do
            : >"$W/runs.txt"
            for run in $(seq "$RUNS"); do
                if ! ./train --nproc $pp --pp $pp --pp-schedule $sch --pp-virtual $v --layers $layers --channels 64 --heads 4 \
                    --vocab 1280 --seq-len 64 --micro-batch 1 --threads 1 --batch-tokens $((m * 64)) --steps "$STEPS" \
                    --train "$W/data/train.bin" --log "$W/r.jsonl" --pp-schedule-dump "$W/d.tsv" >/dev/null 2>"$W/err.txt"; then
                    echo "$pp    $sch: not run: $(tail -1 "$W/err.txt")"
                    continue 3
                fi
                # one pass of each kind: the median duration over the dump's F, B, W actions
                pass() { # (split 0: the W is inside its B)
                    awk -F'\t' -v k="$1" 'NR == 2 { split0 = $0 ~ / split 0 / } NR > 3 && $3 == k && !(k == "W" && split0) { print $8 - $7 }' \
                        "$W/d.tsv" | median
                }
                # the last step's mean bubble, measured and replayed with free hand-offs
                rep=$($PY scripts/plot.py --replay "$W/d.tsv" | awk '{ for (i = 1; i < NF; i++) if ($i == "mean") m[++k] = $(i + 1) + 0 } END { print m[1] / 100, m[2] / 100 }')
                echo "$(med "$W/r.jsonl" ms) $(med "$W/r.jsonl" bubble_max) $(med "$W/r.jsonl" bubble_mean) $(med "$W/r.jsonl" bubble_formula) $(pass F) $(pass B) $(pass W) $(med "$W/r.jsonl" pp_copies_per_handoff) $(med "$W/r.jsonl" pp_wakeups_per_handoff) $rep" >>"$W/runs.txt"
            done
            col() { cut -d' ' -f"$1" "$W/runs.txt" | median; }
            ms() { [ -n "$1" ] && printf '%.3f' "$1" || printf -- -; }
            F=$(col 5) B=$(col 6) Wt=$(col 7)
            # the formula with the measured times (W "-": inside B)
            ft=$(awk -v s=$sch -v p=$pp -v m=$m -v v=$v -v F="$F" -v B="$B" -v W="${Wt:-0}" 'BEGIN {
                if (s == "1f1b") b = (p - 1) / (m + p - 1)
                else if (s == "interleaved") b = (p - 1) / (v * m + p - 1)
                else if (s == "zb-h1") { i = (p - 1) * (F + B - W); b = i / (m * (F + B + W) + i) }
                else { i = (p - 1) * F; b = i / (2 * m * (F + B + W) + i) }
                print b }')
            printf '%-4s %-12s %-4s %10.1f %11s %11s %8s %9s %7s %7s %7s %9s %11s %7s %7s\n' $pp $sch $m "$(col 1)" "$(pct "$(col 2)")" \
                "$(pct "$(col 3)")" "$(pct "$(col 4)")" "$(pct "$ft")" "$(ms "$F")" "$(ms "$B")" "$(ms "$Wt")" "$(pct "$(col 10)")" \
                "$(pct "$(col 11)")" "$(col 8)" "$(col 9)"
        done
    done
done
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
