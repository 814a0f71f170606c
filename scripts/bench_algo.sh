#!/usr/bin/env bash
# scripts/bench_algo.sh: the collectives' algorithms (--algo fanin, ring, hier) against one another and
# against OpenMPI's all-reduce, busbw from MIN_BYTES to MAX_BYTES (1M-64M): per size the median busbw
# over RUNS runs (3), and the median of the ratios to each comparator (fanin, mpi) measured within
# each run (a run's programs go back to back, so a ratio compares like load with like):
#   one node: 2 and 4 ranks over shared memory (hier on one node is the fan-in reduce-scatter into
#             accumulators, then the fan-in all-gather); OpenMPI over vader (shared memory);
#   two simulated nodes (network namespaces joined by a veth pair, as test/two_nodes.sh; root only):
#             4 and 8 ranks, half on each, shared memory inside and TCP across: hier against fanin and
#             OpenMPI (vader inside, btl tcp across; mpirun in the first namespace starts an orted in
#             each through an rsh agent that is `ip netns exec`).
#   soft-RoCE: the QEMU guest of test/verbs_vm.sh, ranks on two named nodes (test/fake_nodes.sh):
#             4 and 8 ranks, shared memory inside and RDMA verbs (rxe) across: hier against fanin.
#             The guest emulates its CPU (TCG), so only the ratio means anything; sizes VERBS_MIN_BYTES
#             to VERBS_MAX_BYTES (256K-4M), VERBS_NPROCS ("4 8"; empty: no guest), VERBS_ITERS (3).
# A figure, never pass/fail. The load average is printed at the start and after each table (the
# machine may be shared). What cannot run is skipped, saying why: OpenMPI not installed (no MPI
# columns), network namespaces unavailable (no two-node tables). Namespaces are removed on exit.
# Environment: ALGOS (one node's, "fanin ring hier"), RUNS, MIN_BYTES, MAX_BYTES, NPROCS ("2 4"),
# NODE_NPROCS ("4 8"; empty: no simulated nodes; NPROCS empty: no one-node tables), OP (allreduce), ITERS (bench-comm's --iters per
# size; unset: its own choice), WARMUP (5), MPI (0: leave OpenMPI out), QUICK (1: RUNS 3, 1M-16M,
# 4 ranks one node, 8 ranks across: the configurations the goals name).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x ./train ] || make train >/dev/null
if [ "${QUICK:-0}" = 1 ]; then
    : "${RUNS:=3}" "${MAX_BYTES:=16M}" "${NPROCS:=4}" "${NODE_NPROCS=8}"
fi
ALGOS=${ALGOS:-fanin ring hier}
RUNS=${RUNS:-3} MIN=${MIN_BYTES:-1M} MAX=${MAX_BYTES:-64M} OP=${OP:-allreduce}
BENCH=(--op "$OP" --min-bytes "$MIN" --max-bytes "$MAX" --warmup "${WARMUP:-5}" ${ITERS:+--iters "$ITERS"})
source scripts/bench/mpi_common.sh
if [ "${MPI:-1}" = 0 ]; then echo "OpenMPI left out (MPI=0)"; else mpi_build; fi
W=$(mktemp -d /tmp/llm4d-algo.XXXXXX)
NS=()
cleanup() {
    for ns in "${NS[@]}"; do ip netns delete "$ns" 2>/dev/null || true; done
    rm -rf "$W"
}
trap cleanup EXIT
load() { cut -d' ' -f1-3 /proc/loadavg; }

# table FILES...: per program (file name NAME.RUN) the median busbw per size, then each algorithm's
# ratios to fanin and to mpi (where measured), each the median of the ratios within one run
table() {
    awk -v runs="$RUNS" '
        function median(a, k,    i, j, t) {
            for (i = 2; i <= k; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
            return k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
        }
        FNR == 1 { np = split(FILENAME, p, "/"); split(p[np], q, "."); name = q[1]; run = q[2]; row = 0; if (!(name in seen)) { seen[name] = 1; order[++na] = name } }
        /^#/ || NF < 8 { next }
        { row++; bytes[row] = $2; bw[name, row, run] = $7; if ($8 != "ok") bad = bad " " name; if (row > rows) rows = row }
        END {
            nb = 0
            for (i = 1; i <= na; i++) if (order[i] == "fanin" || order[i] == "mpi") base[++nb] = order[i]
            printf "%12s", "bytes"; for (i = 1; i <= na; i++) printf " %10s", order[i] " GB/s"
            for (b = 1; b <= nb; b++) for (i = 1; i <= na; i++) if (order[i] != base[b] && order[i] != "mpi") printf " %11s", order[i] "/" base[b]
            printf "\n"
            for (r = 1; r <= rows; r++) {
                printf "%12d", bytes[r]
                for (i = 1; i <= na; i++) { for (k = 1; k <= runs; k++) v[k] = bw[order[i], r, k]; printf " %10.3f", median(v, runs) }
                for (b = 1; b <= nb; b++) for (i = 1; i <= na; i++) {
                    if (order[i] == base[b] || order[i] == "mpi") continue
                    for (k = 1; k <= runs; k++) v[k] = bw[base[b], r, k] > 0 ? bw[order[i], r, k] / bw[base[b], r, k] : 0
                    printf " %11.2f", median(v, runs)
                }
                printf "\n"
            }
            if (bad) print "warning: a run reported a wrong result:" bad
        }' "$@"
}

echo "algorithms: $OP busbw (bench-comm ${BENCH[*]}), $(nproc) cores, load average $(load) at start; median of $RUNS runs"
[ $HAVE_MPI = 1 ] && echo "MPI: $(mpirun --version 2>/dev/null | head -1)"
MPIB=(build/mpi_bench --op "$OP" --min-bytes "$MIN" --max-bytes "$MAX" --warmup "${WARMUP:-5}" ${ITERS:+--iters "$ITERS"})
for n in ${NPROCS-2 4}; do
    rm -f "$W"/*.[0-9]*
    for run in $(seq "$RUNS"); do
        for a in $ALGOS; do
            ./train bench-comm --nproc "$n" "${BENCH[@]}" --algo "$a" >"$W/$a.$run"
        done
        if [ $HAVE_MPI = 1 ]; then
            "${MPIRUN[@]}" -np "$n" "${MPIB[@]}" >"$W/mpi.$run" 2>"$W/err.mpi" ||
                { cat "$W/err.mpi" >&2; echo "error: mpirun failed (above)" >&2; exit 1; }
        fi
    done
    echo
    echo "== one node, $n ranks (shared memory; OpenMPI over vader) =="
    table $(for a in $ALGOS; do echo "$W/$a".[0-9]*; done; [ $HAVE_MPI = 1 ] && echo "$W"/mpi.[0-9]*)
    echo "load average: $(load)"
done

# soft-RoCE in the guest: one boot runs every configuration; rank 0's lines are the table's
verbs_nodes() {
    if [ -n "${VERBS_NPROCS+set}" ] && [ -z "$VERBS_NPROCS" ]; then echo; echo "soft-RoCE: skipped (VERBS_NPROCS is empty)"; return; fi
    [ -x build/train-portable ] || make build/train-portable >/dev/null 2>&1 ||
        { echo; echo "soft-RoCE: skipped (no build/train-portable: built without <infiniband/verbs.h>)"; return; }
    mkdir -p "$W/verbs"
    local rc=0 vb="--op $OP --min-bytes ${VERBS_MIN_BYTES:-256K} --max-bytes ${VERBS_MAX_BYTES:-4M} --warmup 1 --iters ${VERBS_ITERS:-3}"
    bash test/verbs_vm.sh --timeout 1800 --share "$W" --bin build/train-portable -- sh -c '
        V=$0 export FAKE_NODES_PORT=29400 OMP_WAIT_POLICY=passive
        for n in '"${VERBS_NPROCS:-4 8}"'; do
            half=$((n / 2)) nodes=""
            for i in $(seq $n); do [ $i -le $half ] && nodes="$nodes n0" || nodes="$nodes n1"; done
            for run in $(seq '"$RUNS"'); do
                for a in fanin hier; do
                    FAKE_NODES_PORT=$((FAKE_NODES_PORT + 1))
                    sh test/fake_nodes.sh $nodes -- build/train-portable bench-comm '"$vb"' --algo $a --comm-timeout 600 >$V/out 2>&1 ||
                        { cat $V/out; exit 1; }
                    grep "^\[0\] " $V/out | sed "s/^\[0\] //" >$V/$n-$a.$run
                done
            done
        done' "$W/verbs" >"$W/verbs.log" 2>&1 || rc=$?
    if [ $rc -eq 77 ]; then echo; echo "soft-RoCE: skipped ($(tail -n 1 "$W/verbs.log"))"; return; fi
    [ $rc -eq 0 ] || { tail -n 30 "$W/verbs.log" >&2; echo "error: the soft-RoCE guest failed (status $rc)" >&2; exit 1; }
    for n in ${VERBS_NPROCS:-4 8}; do
        echo
        echo "== soft-RoCE guest (TCG), $n ranks on two named nodes ($((n / 2)) each; shared memory inside, verbs across; bench-comm $vb) =="
        mkdir -p "$W/verbs/t$n"
        for f in "$W/verbs/$n"-*; do cp "$f" "$W/verbs/t$n/${f##*/$n-}"; done
        table "$W/verbs/t$n"/fanin.[0-9]* "$W/verbs/t$n"/hier.[0-9]*
    done
}
verbs_nodes

if [ -n "${NODE_NPROCS+set}" ] && [ -z "$NODE_NPROCS" ]; then
    echo; echo "two simulated nodes: skipped (NODE_NPROCS is empty)"; exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null || ! command -v nsenter >/dev/null || ! command -v unshare >/dev/null; then
    echo; echo "two simulated nodes: skipped (network namespaces need root, ip, nsenter and unshare)"; exit 0
fi
# two namespaces joined by a veth pair (names carry this pid: parallel runs never clash); each is a
# node, and its name is that node's host name
ns0=llm4d-algo-$$-0 ns1=llm4d-algo-$$-1 v0=l4da$$a v1=l4da$$b
if ! { ip netns add "$ns0" && NS+=("$ns0") && ip netns add "$ns1" && NS+=("$ns1"); } 2>"$W/ns.err"; then
    echo; echo "two simulated nodes: skipped (cannot make network namespaces: $(head -1 "$W/ns.err"))"; exit 0
fi
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
# OpenMPI across the namespaces: mpirun runs in the first; for each host (a namespace's name) it
# starts an orted through this rsh agent, which runs the orted's command line in that namespace under
# that host name. vader inside a node, TCP over the veth pair across; out-of-band traffic on it too.
cat >"$W/ns_agent.sh" <<'AGENT'
#!/bin/sh
# mpirun's rsh agent: HOST COMMAND... runs COMMAND (a shell command line) in network namespace HOST
host=$1
shift
exec ip netns exec "$host" unshare --uts sh -c 'hostname "$0" && eval "$1"' "$host" "$*"
AGENT
chmod +x "$W/ns_agent.sh"
run_mpi_nodes() {
    local n=$1 out=$2 half=$(($1 / 2))
    timeout 900 ip netns exec "$ns0" "${MPIRUN[@]/self,vader/self,vader,tcp}" -np "$n" --host "$ns0:$half,$ns1:$half" \
        --mca plm_rsh_agent "$W/ns_agent.sh" --mca btl_tcp_if_include 10.201.0.0/24 --mca oob_tcp_if_include 10.201.0.0/24 \
        "${MPIB[@]}" >"$out" 2>"$W/err.mpi" || { cat "$W/err.mpi" >&2; echo "error: mpirun across the namespaces failed (above)" >&2; return 1; }
}
for n in ${NODE_NPROCS:-4 8}; do
    rm -f "$W"/*.[0-9]*
    for run in $(seq "$RUNS"); do
        for a in fanin hier; do run_nodes "$n" "$a" "$W/$a.$run"; done
        if [ $HAVE_MPI = 1 ]; then run_mpi_nodes "$n" "$W/mpi.$run"; fi
    done
    echo
    echo "== two nodes, $n ranks ($((n / 2)) per node; shared memory inside, TCP across; OpenMPI vader + tcp) =="
    table "$W"/fanin.[0-9]* "$W"/hier.[0-9]* $([ $HAVE_MPI = 1 ] && echo "$W"/mpi.[0-9]*)
    echo "load average: $(load)"
done
