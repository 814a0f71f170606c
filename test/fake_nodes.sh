#!/bin/sh
# Ranks of one job on "nodes" that are only names, on one machine:
#
#   sh test/fake_nodes.sh NODE... -- COMMAND [ARG...]
#
# starts one COMMAND per NODE, rank i with LLM4D_NODE_ID set to the i-th NODE and a torchrun-style
# environment (RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE among the ranks of its name,
# MASTER_ADDR=127.0.0.1, MASTER_PORT=$FAKE_NODES_PORT or 29400), so that ranks with different names
# pick the transports of different nodes (RDMA verbs or TCP) while sharing one machine. Waits for
# every rank, prints their output in rank order (each line of rank R after "[R] "), and exits with
# the first non-zero status of a rank, or 0. POSIX sh: it also runs under busybox in the QEMU guest.
nodes=""
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    nodes="$nodes $1"
    shift
done
[ "${1:-}" = "--" ] && [ $# -gt 1 ] || { echo "usage: test/fake_nodes.sh NODE... -- COMMAND [ARG...]" >&2; exit 2; }
shift
world=0
for n in $nodes; do world=$((world + 1)); done
out=$(mktemp -d "${TMPDIR:-/tmp}/fake-nodes.XXXXXX") || exit 1
rank=0 pids=""
for n in $nodes; do
    local_rank=0 local_world=0 i=0
    for m in $nodes; do
        if [ "$m" = "$n" ]; then
            [ $i -lt $rank ] && local_rank=$((local_rank + 1))
            local_world=$((local_world + 1))
        fi
        i=$((i + 1))
    done
    env RANK=$rank WORLD_SIZE=$world LOCAL_RANK=$local_rank LOCAL_WORLD_SIZE=$local_world NODE_RANK=0 \
        MASTER_ADDR=127.0.0.1 MASTER_PORT="${FAKE_NODES_PORT:-29400}" LLM4D_NODE_ID="$n" "$@" >"$out/$rank" 2>&1 &
    pids="$pids $!"
    rank=$((rank + 1))
done
status=0
for p in $pids; do
    wait "$p"
    rc=$?
    [ $status -eq 0 ] && status=$rc
done
rank=0
for p in $pids; do
    sed "s/^/[$rank] /" "$out/$rank"
    rank=$((rank + 1))
done
rm -rf "$out"
exit $status
