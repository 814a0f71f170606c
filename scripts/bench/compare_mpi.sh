#!/usr/bin/env bash
# scripts/bench/compare_mpi.sh: our collectives (./train bench-comm) against OpenMPI's on this node, for
# 2 and 4 ranks and all-reduce, reduce-scatter, all-gather. Each pair runs RUNS times (default 3),
# alternating ours and MPI's, and the table shows the median per size: busbw, the ratio ours/MPI
# (equal to MPI time / our time, since both move the same bytes), and for messages up to 1 KiB the
# latency ratio our time / MPI time. A figure, never pass/fail; skipped when mpicc is missing.
# Environment: RUNS, MIN_BYTES (8), MAX_BYTES (64M), NPROCS ("2 4"), OPS.
set -euo pipefail
cd "$(dirname "$0")/../.."
if ! command -v mpicc >/dev/null 2>&1 || ! command -v mpirun >/dev/null 2>&1; then
    echo "OpenMPI not installed: skipping the MPI comparison (apt-get install openmpi-bin libopenmpi-dev)"
    exit 0
fi
[ -x ./train ] || make train >/dev/null
mkdir -p build
mpicc -O3 -std=gnu11 -Wall -Wextra -Werror scripts/bench/mpi_bench.c -o build/mpi_bench

RUNS=${RUNS:-3}
MIN=${MIN_BYTES:-8}
MAX=${MAX_BYTES:-64M}
# --oversubscribe: more ranks than cores is allowed (and makes OpenMPI yield when idle instead of
# spinning); --bind-to none: no pinning of 4 ranks onto 2 cores; btl self,vader: shared memory only
# (no TCP, no InfiniBand probing), as our ranks use on one node.
MPIRUN=(mpirun --oversubscribe --bind-to none --mca btl self,vader)
if [ "$(id -u)" = 0 ]; then MPIRUN+=(--allow-run-as-root); fi
W=$(mktemp -d /tmp/llm4d-mpi.XXXXXX)
trap 'rm -rf "$W"' EXIT

echo "collectives against $(mpirun --version 2>/dev/null | head -1) on $(nproc) cores; median of $RUNS runs"
for n in ${NPROCS:-2 4}; do
    for op in ${OPS:-allreduce reduce_scatter all_gather}; do
        for run in $(seq "$RUNS"); do
            ./train bench-comm --nproc "$n" --op "$op" --min-bytes "$MIN" --max-bytes "$MAX" >"$W/ours.$run"
            "${MPIRUN[@]}" -np "$n" build/mpi_bench --op "$op" --min-bytes "$MIN" --max-bytes "$MAX" >"$W/mpi.$run" 2>"$W/mpi.err" ||
                { cat "$W/mpi.err" >&2; echo "error: mpirun failed (above)" >&2; exit 1; }
        done
        if grep -q WRONG "$W"/ours.* "$W"/mpi.*; then echo "warning: a run reported a WRONG result" >&2; fi
        echo
        echo "== $op, $n ranks =="
        # rows: op bytes count type time(us) algbw busbw check; both programs print the same sizes
        awk -v runs="$RUNS" '
            function median(a, k,    i, j, t, v) {
                for (i = 1; i <= k; i++) v[i] = a[i]
                for (i = 2; i <= k; i++) for (j = i; j > 1 && v[j - 1] > v[j]; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
                return k % 2 ? v[(k + 1) / 2] : (v[k / 2] + v[k / 2 + 1]) / 2
            }
            FNR == 1 { np = split(FILENAME, p, "/"); split(p[np], q, "."); kind = q[1] == "ours" ? "o" : "m"; run = q[2]; row = 0 }
            /^#/ { next }
            { row++; bytes[row] = $2; t[kind, row, run] = $5; bw[kind, row, run] = $7; if (row > rows) rows = row }
            END {
                printf "%12s %12s %12s %8s %11s %11s %8s\n", "bytes", "ours busbw", "MPI busbw", "ratio", "ours us", "MPI us", "lat.ratio"
                for (r = 1; r <= rows; r++) {
                    for (k = 1; k <= runs; k++) { ot[k] = t["o", r, k]; mt[k] = t["m", r, k]; ob[k] = bw["o", r, k]; mb[k] = bw["m", r, k] }
                    to = median(ot, runs); tm = median(mt, runs)
                    ratio = to > 0 ? tm / to : 0
                    lat = bytes[r] <= 1024 && tm > 0 ? sprintf("%8.2f", to / tm) : sprintf("%8s", "-")
                    printf "%12d %12.3f %12.3f %8.2f %11.2f %11.2f %s\n", bytes[r], median(ob, runs), median(mb, runs), ratio, to, tm, lat
                    if (bytes[r] >= 1048576 && ratio > 0) { lb += log(ratio); nb++ }
                    if (bytes[r] <= 1024 && tm > 0) { ll += log(to / tm); nl++ }
                }
                printf "geometric means: busbw ours/MPI for >= 1 MiB %s; latency ours/MPI for <= 1 KiB %s\n",
                    nb ? sprintf("%.2f", exp(lb / nb)) : "-", nl ? sprintf("%.2f", exp(ll / nl)) : "-"
            }' $(for run in $(seq "$RUNS"); do echo "$W/ours.$run" "$W/mpi.$run"; done)
    done
done
