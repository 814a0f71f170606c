#!/usr/bin/env bash
# The collectives and data-parallel training over the RDMA verbs transport, in the soft-RoCE guest of
# test/verbs_vm.sh. The ranks run on two "nodes" that are names only (test/fake_nodes.sh sets a
# different LLM4D_NODE_ID per rank), so that `--transport auto` connects ranks of different names
# through verbs (queue pairs on the guest's one rxe device) and ranks of one name through shared
# memory. Checked:
#   - the collective test suite (test/test_comm.c --small: every op, type, placement, split
#     communicators, concurrent operations, point-to-point, communicators closed in opposite orders)
#     on 3 ranks, 2 + 1 per node, bitwise against its serial reference; again under --algo fanin on 3
#     nodes of one rank (every pair over verbs, a broadcast's non-root pairs never carrying a byte); again on 2 ranks with 3 staging slots of 4099 bytes
#     (LLM4D_VERBS_STAGING), which wraps the staging ring constantly and cuts elements at slot
#     boundaries; and on 2 ranks on device memory of the CPU stand-in (devmem.h: --device cpu), which
#     verbs stages through pinned host buffers as TCP does;
#   - DP 2 x ZeRO-1 (verbs) and DP 3 x ZeRO-3 (2 + 1 ranks per node: shared memory and verbs) training
#     against the single-rank run of the same binary (test/compare_runs.py at 1e-5), and rank 0's line
#     naming each pair's transport;
#   - a rank that exits before the first operation, named by the rank across (verbs opens its pairs on
#     first use, and its handshake never waits in the store);
#   - ./train bench-comm over verbs (its check column), --transport verbs with a device that does not
#     exist (one error line), and auto falling back to TCP with the reason in rank 0's line;
#   - on the host (no RDMA device): the same fallback and error, and ./train not linking libibverbs.
# Exit status 0 when everything held, 77 (skipped) with the reason when the guest cannot run.
# Run from the repository root after `make test-bins`.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
CORPUS=/usr/share/common-licenses/GPL-3
PY=/usr/bin/python3
TRAIN=build/train-portable
COMM=build/test_comm-portable

if ldd ./train | grep -q libibverbs; then echo "./train links libibverbs: it must open it at run time"; exit 1; fi
[ -x $TRAIN ] && [ -x $COMM ] || { echo "skipped: built without <infiniband/verbs.h> (scripts/deps.sh as root installs libibverbs-dev)"; exit 77; }
WORK=$(mktemp -d /tmp/llm4d-verbs.XXXXXX) || exit 1
trap 'rm -rf "$WORK"' EXIT
ok=0
fail() { echo "FAIL: $*"; ok=1; }

./train prepare "$CORPUS" "$WORK/data" >/dev/null || exit 1
# 6 micro-batches of 2 x 32 per step: 3 on each of 2 ranks, 2 on each of 3; one thread per rank (under
# emulation, OpenMP threads that spin for work cost more than the model)
FLAGS=(--layers 2 --channels 32 --heads 4 --vocab 256 --seq-len 32 --micro-batch 2 --batch-tokens 384 --steps 4
    --lr 1e-3 --warmup 2 --weight-decay 0.1 --clip 1.0 --bucket-mb 0.02 --threads 1 --train "$WORK/data/train.bin")
# the reference: one rank, the same binary the guest runs
$TRAIN "${FLAGS[@]}" --log "$WORK/ref.jsonl" --save-model "$WORK/ref.bin" >/dev/null || { echo "the single-rank run failed"; exit 1; }

# ---- the host: no RDMA device here, so auto falls back to TCP and --transport verbs refuses -------
if [ -z "$(ls /sys/class/infiniband 2>/dev/null)" ]; then
    port=$((20000 + $$ % 20000))
    out=$(FAKE_NODES_PORT=$port sh test/fake_nodes.sh a b -- ./train "${FLAGS[@]}" --steps 1 2>&1)
    grep -qE '^\[0\] collectives: 2 rank\(s\) on 2 node\(s\) .*RDMA verbs for 0 pair\(s\); TCP for 1 pair\(s\) \(rank 0 on a has no RDMA: ' <<<"$out" ||
        fail "host, auto: want rank 0's line with TCP for 1 pair and the reason; got: $(head -n 3 <<<"$out")"
    out=$(FAKE_NODES_PORT=$((port + 1)) sh test/fake_nodes.sh a b -- ./train "${FLAGS[@]}" --steps 1 --transport verbs 2>&1)
    rc=$?
    [ $rc -eq 1 ] && [ "$(grep -c . <<<"$out")" -eq 2 ] &&
        [ "$(grep -c '^\[[01]\] error: --transport verbs: rank 0 (node a) has no RDMA device: RDMA verbs' <<<"$out")" -eq 2 ] ||
        fail "host, --transport verbs without a device: want exit 1 and one error line per rank; got $rc: $out"
fi

# ---- the guest ----------------------------------------------------------------------------------
out=$(bash test/verbs_vm.sh --timeout 400 --share "$WORK" --bin $TRAIN --bin $COMM -- sh -c '
    W=$0
    run() { # NAME COMMAND...: its output between "== NAME" and "== rc STATUS", and the seconds it took
        name=$1 t0=$(cut -d" " -f1 /proc/uptime)
        shift
        echo "== $name"
        "$@" 2>&1
        echo "== rc $?"
        echo "-- $name: $t0 $(cut -d" " -f1 /proc/uptime)" | awk "{ printf \"-- %s %.1f s\n\", \$2, \$4 - \$3 }"
    }
    export FAKE_NODES_PORT=29400 OMP_WAIT_POLICY=passive
    run comm3 sh test/fake_nodes.sh n0 n0 n1 -- '$COMM' --small --comm-timeout 120
    run comm-fanin sh test/fake_nodes.sh n0 n1 n2 -- '$COMM' --small --algo fanin --comm-timeout 120
    LLM4D_VERBS_STAGING=3x4099 run comm-odd sh test/fake_nodes.sh n0 n1 -- '$COMM' --small --comm-timeout 120
    run comm-dev sh test/fake_nodes.sh n0 n1 -- '$COMM' --small --device cpu --comm-timeout 120
    run dp sh test/fake_nodes.sh n0 n1 -- '$TRAIN' "$@" --zero 1 --comm-timeout 120 --log $W/dp.jsonl --save-model $W/dp.bin
    run dp3 sh test/fake_nodes.sh n0 n0 n1 -- '$TRAIN' "$@" --zero 3 --comm-timeout 120 --log $W/dp3.jsonl --save-model $W/dp3.bin
    run gone sh test/fake_nodes.sh n0 n1 -- '$COMM' --quick --comm-timeout 5 --exit-before-use 1
    run bench sh test/fake_nodes.sh n0 n1 -- '$TRAIN' bench-comm --min-bytes 4 --max-bytes 1M --warmup 1 --iters 2
    run forced-bad-dev sh test/fake_nodes.sh n0 n1 -- '$TRAIN' bench-comm --transport verbs --ib-dev mlx5_0 --max-bytes 8
    run auto-bad-dev sh test/fake_nodes.sh n0 n1 -- '$TRAIN' "$@" --steps 1 --ib-dev mlx5_0
' "$WORK" "${FLAGS[@]}")
rc=$?
[ $rc -eq 77 ] && { echo "$out" | tail -n 1; exit 77; }
[ $rc -eq 0 ] || { echo "$out" | tail -n 30; echo "the guest failed (status $rc)"; exit 1; }
block() { awk -v h="== $1" '$0 == h { f = 1; next } f && /^== rc / { print; exit } f' <<<"$out"; }
expect() { # NAME STATUS PATTERN...: the block exited STATUS and has a line matching each PATTERN
    local name=$1 status=$2 b p
    b=$(block "$name")
    shift 2
    grep -qx "== rc $status" <<<"$b" || { fail "$name: want exit status $status"; echo "$b" | tail -n 20; return; }
    for p in "$@"; do grep -qE -- "$p" <<<"$b" || { fail "$name: want a line matching '$p'"; echo "$b" | tail -n 20; }; done
}
expect comm3 0 '^\[0\] collectives on 3 rank\(s\): ok '
expect comm-fanin 0 '^\[0\] collectives on 3 rank\(s\): ok '
expect comm-odd 0 '^\[0\] collectives on 2 rank\(s\): ok '
expect comm-dev 0 '^\[0\] collectives on 2 rank\(s\), device memory: ok '
expect dp 0 '^\[0\] collectives: 2 rank\(s\) on 2 node\(s\) \| .*RDMA verbs for 1 pair\(s\) \(rxe0 port 1, RoCE v2 GID index 1 .*; TCP for 0 pair'
expect dp3 0 '^\[0\] collectives: 3 rank\(s\) on 2 node\(s\) \| .*single-copy, for 1 pair\(s\); RDMA verbs for 2 pair\(s\) '
# verbs opens its pairs on first use too: rank 1 exits before any, and rank 0 names it in one line;
# rank 1's keys never come, so the handshake must not wait in the store for them (rank 0's status)
expect gone 1 '^\[0\] error: timeout: all_reduce on communicator world \(rank 0 of 2, world rank 0\): no progress with rank 1 for '
[ "$(block gone | grep -c '^\[0\] ')" -eq 1 ] || { fail "gone: want one line from rank 0"; block gone | tail -n 10; }
expect bench 0 '^\[0\] # bench-comm: allreduce, 2 rank\(s\), transport verbs,' '^\[0\] +allreduce +1048576 .* ok$'
if block bench | grep -q 'WRONG'; then fail "bench-comm over verbs: a wrong result"; fi
expect forced-bad-dev 1 '^\[[01]\] error: --transport verbs: rank 0 \(node n0\) has no RDMA device: --ib-dev mlx5_0: no such RDMA device \(found: rxe0\)$'
expect auto-bad-dev 0 'RDMA verbs for 0 pair\(s\); TCP for 1 pair\(s\) \(rank 0 on n0 has no RDMA: --ib-dev mlx5_0: no such RDMA device'
$PY test/compare_runs.py 1e-5 "$WORK/ref" "$WORK/dp" "$WORK/dp3" || ok=1
grep -E '^-- ' <<<"$out" | sed 's/^-- /guest: /'
exit $ok
