#!/usr/bin/env bash
# scripts/bench_algo.sh: the collectives' algorithms (--algo fanin, ring, hier) against one another,
# all-reduce busbw from MIN_BYTES to MAX_BYTES (1M-64M), the median of RUNS runs (3) per size, and the
# median of the ratios to fanin measured within each run (its algorithms run back to back):
#   one node: 2 and 4 ranks over shared memory (hier on one node is the fan-in reduce-scatter into
#             accumulators, then the fan-in all-gather);
#   two simulated nodes (network namespaces joined by a veth pair, as test/two_nodes.sh; root only):
#             4 and 8 ranks, half on each, TCP across: hier against fanin.
# A figure, never pass/fail; the load average is printed (the machine may be shared). Environment:
# ALGOS (one node's, "fanin ring hier"; the first is the ratios' base), RUNS, MIN_BYTES, MAX_BYTES,
# NPROCS ("2 4"), NODE_NPROCS ("4 8"; empty: no simulated nodes), OP (allreduce), ITERS (bench-comm's
# --iters per size; unset: its own choice) and WARMUP (5).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x ./train ] || make train >/dev/null
ALGOS=${ALGOS:-fanin ring hier}
RUNS=${RUNS:-3} MIN=${MIN_BYTES:-1M} MAX=${MAX_BYTES:-64M} OP=${OP:-allreduce}
BENCH=(--op "$OP" --min-bytes "$MIN" --max-bytes "$MAX" --warmup "${WARMUP:-5}" ${ITERS:+--iters "$ITERS"})
W=$(mktemp -d /tmp/llm4d-algo.XXXXXX)
NS=()
cleanup() {
    for ns in "${NS[@]}"; do ip netns delete "$ns" 2>/dev/null || true; done
    rm -rf "$W"
}
trap cleanup EXIT

# table FILES...: per algorithm (file name ALGO.RUN), the median busbw per size and ratios to fanin
table() {
    awk -v runs="$RUNS" '
        function median(a, k,    i, j, t) {
            for (i = 2; i <= k; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
            return k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
        }
        FNR == 1 { np = split(FILENAME, p, "/"); split(p[np], q, "."); algo = q[1]; run = q[2]; row = 0; if (!(algo in seen)) { seen[algo] = 1; order[++na] = algo } }
        /^#/ || NF < 8 { next }
        { row++; bytes[row] = $2; bw[algo, row, run] = $7; if ($8 != "ok") bad = 1; if (row > rows) rows = row }
        END {
            printf "%12s", "bytes"; for (i = 1; i <= na; i++) printf " %11s", order[i] " GB/s"
            for (i = 2; i <= na; i++) printf " %12s", order[i] "/" order[1]; printf "\n"
            for (r = 1; r <= rows; r++) {
                printf "%12d", bytes[r]
                for (i = 1; i <= na; i++) { for (k = 1; k <= runs; k++) v[k] = bw[order[i], r, k]; printf " %11.3f", median(v, runs) }
                # each ratio within one run (the algorithms of a run measured back to back), then their median
                for (i = 2; i <= na; i++) {
                    for (k = 1; k <= runs; k++) v[k] = bw[order[1], r, k] > 0 ? bw[order[i], r, k] / bw[order[1], r, k] : 0
                    printf " %12.2f", median(v, runs)
                }
                printf "\n"
            }
            if (bad) print "warning: a run reported a wrong result"
        }' "$@"
}

echo "algorithms: $OP busbw (bench-comm ${BENCH[*]}), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) at start; median of $RUNS runs"
for n in ${NPROCS:-2 4}; do
    rm -f "$W"/*.[0-9]*
    for run in $(seq "$RUNS"); do
        for a in $ALGOS; do
            ./train bench-comm --nproc "$n" "${BENCH[@]}" --algo "$a" >"$W/$a.$run"
        done
    done
    echo
    echo "== one node, $n ranks (shared memory) =="
    table $(for a in $ALGOS; do echo "$W/$a".*; done)
done

if [ -n "${NODE_NPROCS+set}" ] && [ -z "$NODE_NPROCS" ]; then
    echo; echo "two simulated nodes: skipped (NODE_NPROCS is empty)"; echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"; exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null || ! command -v nsenter >/dev/null; then
    echo; echo "two simulated nodes: skipped (network namespaces need root, ip, nsenter)"; exit 0
fi
# two namespaces joined by a veth pair (names carry this pid: parallel runs never clash)
ns0=llm4d-algo-$$-0 ns1=llm4d-algo-$$-1 v0=l4da$$a v1=l4da$$b
ip netns add "$ns0" && NS+=("$ns0") && ip netns add "$ns1" && NS+=("$ns1")
ip link add "$v0" netns "$ns0" type veth peer name "$v1" netns "$ns1"
ip -n "$ns0" link set lo up && ip -n "$ns1" link set lo up
ip -n "$ns0" addr add 10.201.0.1/24 dev "$v0" && ip -n "$ns1" addr add 10.201.0.2/24 dev "$v1"
ip -n "$ns0" link set "$v0" up && ip -n "$ns1" link set "$v1" up
for _ in $(seq 100); do ip -n "$ns1" link show "$v1" | grep -q 'state UP' && break; sleep 0.05; done
port=$((20000 + RANDOM % 12000))
# run_nodes N ALGO OUT: N ranks, half in each namespace (its own hostname: a node)
run_nodes() {
    local n=$1 a=$2 out=$3 half=$(($1 / 2)) pids=() rank node
    for ((rank = 0; rank < n; rank++)); do
        node=$((rank / half))
        nsenter --net="/run/netns/llm4d-algo-$$-$node" unshare --uts \
            env -u LLM4D_NODE_ID RANK=$rank WORLD_SIZE=$n LOCAL_RANK=$((rank % half)) LOCAL_WORLD_SIZE=$half NODE_RANK=$node \
            MASTER_ADDR=10.201.0.1 MASTER_PORT=$port LLM4D_JOB_TOKEN=algo$$ \
            sh -c 'hostname "$0" && exec "$@"' "llm4d-algo-node$node" ./train bench-comm "${BENCH[@]}" \
            --algo "$a" --comm-timeout 120 >"$out.rank$rank" 2>&1 &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || { cat "$out".rank*; return 1; }; done
    mv "$out.rank0" "$out"
    rm -f "$out".rank*
    port=$((port + 1))
}
for n in ${NODE_NPROCS:-4 8}; do
    rm -f "$W"/*.[0-9]*
    for run in $(seq "$RUNS"); do
        for a in fanin hier; do run_nodes "$n" "$a" "$W/$a.$run"; done
    done
    echo
    echo "== two nodes, $n ranks ($((n / 2)) per node; shared memory inside, TCP across) =="
    table "$W"/fanin.* "$W"/hier.*
done
echo
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
