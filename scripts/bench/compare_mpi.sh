#!/usr/bin/env bash
# scripts/bench/compare_mpi.sh: our collectives (./train bench-comm) against OpenMPI's and PyTorch's
# gloo backend on this node, for 2 and 4 ranks and all-reduce, reduce-scatter, all-gather. Each
# program runs RUNS times (default 3), interleaved, and the table shows the median per size: busbw
# of each, the ratios ours/MPI and ours/gloo (equal to their time / our time, since all move the
# same bytes), and for messages up to 1 KiB the latency ratio our time / MPI time. A figure, never
# pass/fail; a comparator that is not installed is skipped, saying so. Ours runs --algo auto (the
# fan-in on one node); the algorithms against one another and against OpenMPI's all-reduce, on one node
# and across two simulated nodes, are scripts/bench_algo.sh's.
# Environment: RUNS, MIN_BYTES (8), MAX_BYTES (64M), NPROCS ("2 4"), OPS.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -x ./train ] || make train >/dev/null
source scripts/bench/mpi_common.sh
HAVE_GLOO=0
mpi_build
if /usr/bin/python3 -c 'import torch.distributed as d; assert d.is_gloo_available()' 2>/dev/null; then
    HAVE_GLOO=1
else
    echo "PyTorch with gloo not installed: no gloo columns (apt-get install python3-torch)"
fi

RUNS=${RUNS:-3}
MIN=${MIN_BYTES:-8}
MAX=${MAX_BYTES:-64M}
W=$(mktemp -d /tmp/llm4d-mpi.XXXXXX)
trap 'rm -rf "$W"' EXIT

echo "collectives on $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) at start; median of $RUNS runs"
[ $HAVE_MPI = 1 ] && echo "MPI: $(mpirun --version 2>/dev/null | head -1)"
[ $HAVE_GLOO = 1 ] && echo "gloo: torch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)')"
for n in ${NPROCS:-2 4}; do
    for op in ${OPS:-allreduce reduce_scatter all_gather}; do
        for run in $(seq "$RUNS"); do
            ./train bench-comm --nproc "$n" --op "$op" --min-bytes "$MIN" --max-bytes "$MAX" >"$W/ours.$run"
            if [ $HAVE_MPI = 1 ]; then
                "${MPIRUN[@]}" -np "$n" build/mpi_bench --op "$op" --min-bytes "$MIN" --max-bytes "$MAX" >"$W/mpi.$run" 2>"$W/mpi.err" ||
                    { cat "$W/mpi.err" >&2; echo "error: mpirun failed (above)" >&2; exit 1; }
            else
                : >"$W/mpi.$run"
            fi
            if [ $HAVE_GLOO = 1 ]; then
                /usr/bin/python3 scripts/bench/gloo_bench.py --nproc "$n" --op "$op" --min-bytes "$MIN" --max-bytes "$MAX" \
                    >"$W/gloo.$run" 2>"$W/gloo.err" || { cat "$W/gloo.err" >&2; echo "error: gloo_bench failed (above)" >&2; exit 1; }
            else
                : >"$W/gloo.$run"
            fi
        done
        if grep -q WRONG "$W"/ours.* "$W"/mpi.* "$W"/gloo.*; then echo "warning: a run reported a WRONG result" >&2; fi
        echo
        echo "== $op, $n ranks =="
        grep -h '^# gloo has no' "$W/gloo.1" 2>/dev/null || true
        # rows: op bytes count type time(us) algbw busbw check; every program prints the same sizes
        awk -v runs="$RUNS" '
            function median(a, k,    i, j, t, v) {
                for (i = 1; i <= k; i++) v[i] = a[i]
                for (i = 2; i <= k; i++) for (j = i; j > 1 && v[j - 1] > v[j]; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
                return k % 2 ? v[(k + 1) / 2] : (v[k / 2] + v[k / 2 + 1]) / 2
            }
            function med(kind, field, r,    k, a) { for (k = 1; k <= runs; k++) a[k] = val[kind, field, r, k]; return median(a, runs) }
            function fmt(x, f) { return x > 0 ? sprintf(f, x) : sprintf("%" (f ~ /8/ ? 8 : f ~ /11/ ? 11 : 10) "s", "-") }
            FNR == 1 { np = split(FILENAME, p, "/"); split(p[np], q, "."); kind = q[1]; run = q[2]; row = 0 }
            /^#/ { next }
            { row++; bytes[row] = $2; val[kind, "t", row, run] = $5; val[kind, "bw", row, run] = $7; have[kind, row] = 1; if (row > rows) rows = row }
            END {
                printf "%12s %10s %10s %10s %8s %8s %11s %11s %11s %9s\n", "bytes", "ours GB/s", "MPI GB/s", "gloo GB/s",
                    "/MPI", "/gloo", "ours us", "MPI us", "gloo us", "lat/MPI"
                for (r = 1; r <= rows; r++) {
                    to = med("ours", "t", r); tm = have["mpi", r] ? med("mpi", "t", r) : 0; tg = have["gloo", r] ? med("gloo", "t", r) : 0
                    rm = tm > 0 && to > 0 ? tm / to : 0; rg = tg > 0 && to > 0 ? tg / to : 0
                    lat = bytes[r] <= 1024 && tm > 0 ? sprintf("%9.2f", to / tm) : sprintf("%9s", "-")
                    printf "%12d %10.3f %10s %10s %8s %8s %11.2f %11s %11s %s\n", bytes[r], med("ours", "bw", r),
                        fmt(have["mpi", r] ? med("mpi", "bw", r) : 0, "%10.3f"), fmt(have["gloo", r] ? med("gloo", "bw", r) : 0, "%10.3f"),
                        fmt(rm, "%8.2f"), fmt(rg, "%8.2f"), to, fmt(tm, "%11.2f"), fmt(tg, "%11.2f"), lat
                    if (bytes[r] >= 1048576) {
                        if (rm > 0) { lm += log(rm); nm++; if (!minm || rm < minm) minm = rm }
                        if (rg > 0) { lg += log(rg); ng++; if (!ming || rg < ming) ming = rg }
                    }
                    if (bytes[r] <= 1024 && tm > 0) { ll += log(to / tm); nl++; if (to / tm > maxl) maxl = to / tm }
                }
                printf "1-64 MiB busbw ours/MPI: geometric mean %s, lowest %s; ours/gloo: geometric mean %s, lowest %s\n",
                    nm ? sprintf("%.2f", exp(lm / nm)) : "-", nm ? sprintf("%.2f", minm) : "-",
                    ng ? sprintf("%.2f", exp(lg / ng)) : "-", ng ? sprintf("%.2f", ming) : "-"
                printf "8 B-1 KiB latency ours/MPI: geometric mean %s, highest %s\n", nl ? sprintf("%.2f", exp(ll / nl)) : "-",
                    nl ? sprintf("%.2f", maxl) : "-"
            }' $(for run in $(seq "$RUNS"); do echo "$W/ours.$run" "$W/mpi.$run" "$W/gloo.$run"; done)
    done
done
echo
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
