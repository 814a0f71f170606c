#!/usr/bin/env bash
# Two nodes on one machine: two network namespaces joined by a veth pair (10.200.0.1/24 and
# 10.200.0.2/24), each rank started in its namespace with its own hostname (a UTS namespace), so that
# ranks on one "node" talk through shared memory and ranks on different "nodes" through TCP. Runs
# build/test_comm under a torchrun-style environment for several layouts (ranks per node) and prints
# "ok LAYOUT" or "FAIL LAYOUT" for each; exits 0 only when every layout passed, 77 (skipped) when
# network namespaces are not available (not root, no CAP_NET_ADMIN / CAP_SYS_ADMIN).
#
# Run from the repository root after `make build/test_comm`:  bash test/two_nodes.sh
# Environment: TEST_COMM (default build/test_comm), TWO_NODES_TIMEOUT (seconds per layout, default 300).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

BIN=${TEST_COMM:-./build/test_comm}
LAYOUT_TIMEOUT=${TWO_NODES_TIMEOUT:-300}
COMM_TIMEOUT=60 # test_comm's --comm-timeout: a rank that stops answering fails the layout, never hangs it
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}

skip() { echo "skipped: two simulated nodes: $*"; exit 77; }

if [ ! -x "$BIN" ]; then
    echo "FAIL: $BIN is missing (run 'make build/test_comm' first)"
    exit 1
fi
[ "$(id -u)" -eq 0 ] || skip "network namespaces need root (CAP_NET_ADMIN and CAP_SYS_ADMIN); running as uid $(id -u)"
for tool in ip nsenter unshare timeout; do
    command -v "$tool" >/dev/null 2>&1 || skip "'$tool' is not installed"
done

# Everything this run creates carries its pid, so that parallel runs never clash: layout L gets the
# namespaces llm4d-PID-L-node0 and llm4d-PID-L-node1 joined by the veth pair l4dPIDLa / l4dPIDLb
# (interface names are limited to 15 characters: "l4d" + pid of at most 7 digits + 2).
ADDR0=10.200.0.1
ADDR1=10.200.0.2
ns_name() { echo "llm4d-$$-$1-node$2"; } # LAYOUT NODE
veth_name() { if [ "$2" -eq 0 ]; then echo "l4d$$${1}a"; else echo "l4d$$${1}b"; fi; } # LAYOUT NODE
WORK=$(mktemp -d "/tmp/llm4d-two-nodes.XXXXXX") || exit 1
PIDS=()      # every rank started (the pid of its `timeout`, which leads the rank's process group)
TOKENS=()    # every job token used: their shared-memory names are checked and removed at the end
NS_MADE=()   # namespaces created
VETH_MADE=() # veth ends that may still sit in this namespace when setup failed half way

cleanup() {
    local pid t ns v
    trap - EXIT INT TERM
    for pid in "${PIDS[@]}"; do
        if kill -0 "$pid" 2>/dev/null; then
            kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null
        fi
    done
    for pid in "${PIDS[@]}"; do
        # give each leftover rank up to 2 s to go, then kill it
        for _ in $(seq 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    done
    for t in "${TOKENS[@]}"; do rm -f /dev/shm/llm4d-"${t:0:16}"-* 2>/dev/null; done
    for ns in "${NS_MADE[@]}"; do ip netns delete "$ns" 2>/dev/null; done
    for v in "${VETH_MADE[@]}"; do ip link delete "$v" 2>/dev/null; done
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'echo "interrupted: cleaning up"; cleanup; exit 130' INT
trap 'echo "terminated: cleaning up"; cleanup; exit 143' TERM

# ---------------------------------------------------------------------------------------------
# the two nodes of one layout: make_nodes L

make_nodes() {
    local l=$1 ns0 ns1 v0 v1
    ns0=$(ns_name "$l" 0) ns1=$(ns_name "$l" 1) v0=$(veth_name "$l" 0) v1=$(veth_name "$l" 1)
    # a name carrying our pid can only be left over from a run that was killed outright: reclaim it
    ip netns delete "$ns0" 2>/dev/null
    ip netns delete "$ns1" 2>/dev/null
    ip link delete "$v0" 2>/dev/null
    ip netns add "$ns0" || return 1
    NS_MADE+=("$ns0")
    ip netns add "$ns1" || return 1
    NS_MADE+=("$ns1")
    VETH_MADE+=("$v0" "$v1")
    ip link add "$v0" netns "$ns0" type veth peer name "$v1" netns "$ns1" || return 1
    ip -n "$ns0" link set lo up && ip -n "$ns1" link set lo up || return 1
    ip -n "$ns0" addr add "$ADDR0/24" dev "$v0" && ip -n "$ns1" addr add "$ADDR1/24" dev "$v1" || return 1
    ip -n "$ns0" link set "$v0" up && ip -n "$ns1" link set "$v1" up || return 1
    # usable once both ends report the link up (the ranks' connects retry until their deadline anyway)
    for _ in $(seq 100); do
        if ip -n "$ns0" link show "$v0" | grep -q 'state UP' && ip -n "$ns1" link show "$v1" | grep -q 'state UP'; then
            return 0
        fi
        sleep 0.05
    done
    echo "veth pair $v0/$v1 did not come up"
    return 1
}

# permission probe: a namespace, a veth pair inside it, and a UTS namespace; failing any is a skip
PROBE=llm4d-$$-probe
ip netns delete "$PROBE" 2>/dev/null # left over from a killed run with the same pid
if ! ip netns add "$PROBE" 2>"$WORK/probe.err"; then
    skip "'ip netns add' failed (no CAP_NET_ADMIN/CAP_SYS_ADMIN?): $(head -n 1 "$WORK/probe.err")"
fi
NS_MADE+=("$PROBE")
if ! ip -n "$PROBE" link add probe0 type veth peer name probe1 2>"$WORK/probe.err" ||
    ! ip -n "$PROBE" link set lo up 2>"$WORK/probe.err"; then
    skip "cannot configure links in a network namespace (no CAP_NET_ADMIN?): $(head -n 1 "$WORK/probe.err")"
fi
if ! nsenter --net="/run/netns/$PROBE" unshare --uts sh -c 'hostname llm4d-probe' 2>"$WORK/probe.err"; then
    skip "cannot give a namespace its own hostname with 'unshare --uts' (no CAP_SYS_ADMIN?): $(head -n 1 "$WORK/probe.err")"
fi
ip netns delete "$PROBE"

# bytes that left node1 of layout L through its end of the veth pair, and node0's loopback traffic
tx_bytes() { ip netns exec "$(ns_name "$1" 1)" cat "/sys/class/net/$(veth_name "$1" 1)/statistics/tx_bytes" 2>/dev/null || echo 0; }
lo_bytes() { ip netns exec "$(ns_name "$1" 0)" cat /sys/class/net/lo/statistics/tx_bytes 2>/dev/null || echo 0; }

new_token() { od -An -tx1 -N16 /dev/urandom | tr -d ' \n'; }

# ---------------------------------------------------------------------------------------------
# layouts: start_layout L NAME RANKS_ON_NODE0 RANKS_ON_NODE1 starts the ranks of layout L in its own
# pair of namespaces; finish_layout L waits for them and judges. The layouts run at the same time.

declare -A NAME WORLD N0 TX0 LO0 LPIDS LTOKEN

start_layout() {
    local l=$1 name=$2 n0=$3 n1=$4
    local world=$((n0 + n1)) token node rank=0 local_rank local_world ns pid
    NAME[$l]=$name WORLD[$l]=$world N0[$l]=$n0 LPIDS[$l]=""
    if ! make_nodes "$l" >"$WORK/$l.setup.log" 2>&1; then
        echo "FAIL $name: could not set up the two namespaces"
        sed 's/^/    /' "$WORK/$l.setup.log"
        return 1
    fi
    token=$(new_token)
    TOKENS+=("$token")
    LTOKEN[$l]=$token
    TX0[$l]=$(tx_bytes "$l")
    LO0[$l]=$(lo_bytes "$l")
    for node in 0 1; do
        ns=$(ns_name "$l" "$node")
        if [ "$node" -eq 0 ]; then local_world=$n0; else local_world=$n1; fi
        for ((local_rank = 0; local_rank < local_world; local_rank++)); do
            # exec all the way down (nsenter, unshare, env and sh fork nothing): the rank is the child of
            # `timeout`, which leads its own process group, so killing -pid stops the rank
            timeout -k 5 "$LAYOUT_TIMEOUT" \
                nsenter --net="/run/netns/$ns" \
                unshare --uts \
                env -u LLM4D_NODE_ID -u SLURM_PROCID -u SLURM_NTASKS \
                RANK=$rank WORLD_SIZE=$world LOCAL_RANK=$local_rank LOCAL_WORLD_SIZE=$local_world NODE_RANK=$node \
                MASTER_ADDR=$ADDR0 MASTER_PORT=29500 LLM4D_JOB_TOKEN=$token \
                sh -c 'hostname "$0" && exec "$@"' "llm4d-node$node" "$BIN" --comm-timeout "$COMM_TIMEOUT" \
                >"$WORK/$l.rank$rank.log" 2>&1 &
            pid=$!
            LPIDS[$l]+="$pid "
            PIDS+=("$pid")
            rank=$((rank + 1))
        done
    done
}

finish_layout() {
    local l=$1 name=${NAME[$1]} world=${WORLD[$1]} token=${LTOKEN[$1]:-} rank=0 pid rc failed=0 sent onlo left
    [ -n "$token" ] || return 1 # setup failed, already reported
    for pid in ${LPIDS[$l]}; do
        wait "$pid"
        rc=$?
        if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
            echo "    rank $rank: did not finish within ${LAYOUT_TIMEOUT} s" >>"$WORK/$l.verdict"
            failed=1
        elif [ $rc -ne 0 ]; then
            echo "    rank $rank: exit status $rc" >>"$WORK/$l.verdict"
            failed=1
        fi
        rank=$((rank + 1))
    done
    sent=$(($(tx_bytes "$l") - TX0[$l]))
    onlo=$(($(lo_bytes "$l") - LO0[$l]))
    # rank 0 prints the verdict over all ranks
    if ! grep -q "^collectives on $world rank(s): ok" "$WORK/$l.rank0.log"; then
        echo "    rank 0 did not report 'collectives on $world rank(s): ok'" >>"$WORK/$l.verdict"
        failed=1
    fi
    # node1's ranks must have sent their share across the veth pair (the bootstrap alone is a few kB):
    # ranks on different nodes really talked over TCP, not through the /dev/shm both nodes can see
    if [ "$sent" -lt 1000000 ]; then
        echo "    only $sent bytes crossed from node1 to node0: the nodes did not talk over TCP" >>"$WORK/$l.verdict"
        failed=1
    fi
    # ranks 0 and 1 on node0 share memory: their loopback carries the bootstrap only (its store is on
    # 10.200.0.1, local to node0), not the hundreds of MB the suite moves
    if [ "${N0[$l]}" -gt 1 ] && [ "$onlo" -gt 1000000 ]; then
        echo "    $onlo bytes went over node0's loopback: ranks of one node talked over TCP, not shared memory" >>"$WORK/$l.verdict"
        failed=1
    fi
    left=$(compgen -G "/dev/shm/llm4d-${token:0:16}-*")
    if [ -n "$left" ]; then
        echo "    left behind in /dev/shm: $left" >>"$WORK/$l.verdict"
        failed=1
    fi
    if [ $failed -eq 0 ]; then
        echo "ok $name ($((sent / 1000000)) MB from node1 to node0 over TCP, $((onlo / 1000)) kB on node0's loopback)"
        return 0
    fi
    echo "FAIL $name"
    cat "$WORK/$l.verdict"
    for ((rank = 0; rank < world; rank++)); do
        echo "    --- rank $rank:"
        tail -n 15 "$WORK/$l.rank$rank.log" | sed 's/^/    /'
    done
    return 1
}

status=0
start_layout 1 "two nodes x 2 ranks (world 4: shared memory inside a node, TCP across)" 2 2 || status=1
start_layout 2 "two nodes, 2 + 1 ranks (world 3)" 2 1 || status=1
start_layout 3 "two nodes x 1 rank (world 2, TCP only)" 1 1 || status=1
for l in 1 2 3; do finish_layout "$l" || status=1; done

cleanup
left=$(ip netns list 2>/dev/null | grep -F "llm4d-$$-")
if [ -n "$left" ]; then
    echo "FAIL: namespaces left behind: $left"
    status=1
fi
exit $status
