#!/usr/bin/env bash
# llm4d under a real Slurm: starts a two-node cluster on this machine (test/slurm_cluster.sh: each
# node a network namespace with its own hostname), then, with 2 nodes x 2 tasks from srun:
#   - build/test_comm, the collective suite (ranks on a node share memory, the nodes talk TCP);
#   - data-parallel training (ZeRO-1) that must equal the single-rank run (losses and parameters
#     within 1e-5; test/compare_runs.py);
#   - the same training submitted with scripts/train.sbatch (local cluster only), and again with a
#     rank killed mid-run, which the script's restart resumes from its checkpoint, and with SIGUSR1 to
#     the script, which requeues the job after the ranks checkpointed.
# Prints "ok ..." or "FAIL ..." per case; exits 0 when all passed, 77 (skipped) when the cluster
# cannot be started here (not root, no network namespaces, Slurm not installable). The cluster is
# always torn down, also on failure and on Ctrl-C.
#
# Inside a real allocation of at least two nodes (SLURM_JOB_ID set, SLURM_JOB_NUM_NODES >= 2, e.g.
# `salloc -N2` then `bash test/slurm_tests.sh`) it starts no cluster and runs the srun cases in that
# allocation; its files then go under build/ (which the nodes must share).
#
# Run from the repository root after `make train build/test_comm`.
# Environment: SLURM_TESTS_TIMEOUT (seconds per srun or sbatch, default 300).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
TRAIN=$ROOT/train
TEST_COMM=$ROOT/build/test_comm
PY=/usr/bin/python3
CORPUS=/usr/share/common-licenses/GPL-3
STEP_TIMEOUT=${SLURM_TESTS_TIMEOUT:-300}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
# torchrun-style variables take precedence over Slurm's in ./train: none may leak into the ranks
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE NODE_RANK MASTER_ADDR MASTER_PORT LLM4D_JOB_TOKEN LLM4D_NODE_ID

for f in "$TRAIN" "$TEST_COMM"; do
    if [ ! -x "$f" ]; then
        echo "FAIL: $f is missing (run 'make train build/test_comm' first)"
        exit 1
    fi
done

MODE=local
if [ -n "${SLURM_JOB_ID:-}" ] && [ "${SLURM_JOB_NUM_NODES:-1}" -ge 2 ] 2>/dev/null; then
    MODE=allocation
else
    # a one-node allocation, or stray variables: nothing of it may reach the local cluster's clients
    # shellcheck disable=SC2046 # variable names do not need quoting
    unset $(compgen -e | grep '^SLURM_')
fi

BG=""  # the srun/sbatch now running (its `timeout`, which passes a SIGTERM on)
WORK=""
IN_CLUSTER=() # command prefix: run in the local cluster's network (with its SLURM_CONF)
finish() {
    trap - EXIT
    trap '' INT TERM # the teardown runs to its end
    if [ -n "$BG" ]; then kill -TERM "$BG" 2>/dev/null; wait "$BG" 2>/dev/null; fi
    if [ "$MODE" = local ] && declare -F slurm_down >/dev/null; then slurm_down; fi
    [ -z "$WORK" ] || rm -rf "$WORK"
}
trap finish EXIT
trap 'echo "interrupted: cleaning up"; exit 130' INT
trap 'echo "terminated: cleaning up"; exit 143' TERM

if [ "$MODE" = local ]; then
    # shellcheck source=test/slurm_cluster.sh
    source "$ROOT/test/slurm_cluster.sh"
    slurm_up
    rc=$?
    if [ $rc -ne 0 ]; then
        [ $rc -eq 77 ] && exit 77
        echo "FAIL: the local Slurm cluster did not start"
        exit 1
    fi
    WORK=$(mktemp -d /tmp/llm4d-slurm-tests.XXXXXX) || exit 1
    IN_CLUSTER=("${SLURM_CLUSTER_EXEC[@]}")
    echo "# local Slurm cluster up in $SECONDS s: ${SLURM_CLUSTER_NODE_NAMES[*]}"
else
    mkdir -p "$ROOT/build"
    WORK=$(mktemp -d "$ROOT/build/slurm-tests.XXXXXX") || exit 1
    IN_CLUSTER=()
    echo "# inside allocation $SLURM_JOB_ID ($SLURM_JOB_NUM_NODES nodes: ${SLURM_JOB_NODELIST:-?})"
fi

# Runs "$@" (in the cluster's network) in the background under a timeout, output to log file $1, and
# waits: a signal then runs the trap at once instead of after the command.
bounded() { # LOG CMD...
    local log=$1 rc
    shift
    "${IN_CLUSTER[@]}" timeout -k 10 "$STEP_TIMEOUT" "$@" </dev/null >"$log" 2>&1 &
    BG=$!
    wait "$BG"
    rc=$?
    BG=""
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then echo "    (timed out after $STEP_TIMEOUT s)" >>"$log"; fi
    return $rc
}

# A single process outside any job step: without this, a batch script's SLURM_PROCID=0 and
# SLURM_NTASKS would make ./train wait for the other ranks.
plain() { env -u SLURM_PROCID -u SLURM_NTASKS "$@"; }

# bytes that left the last node through its interface (local mode), to prove the nodes talked TCP
tx_bytes() {
    [ "$MODE" = local ] || { echo 0; return; }
    local ns=${SLURM_CLUSTER_NODE_NAMES[${#SLURM_CLUSTER_NODE_NAMES[@]} - 1]}
    ip -n "$ns" -s link show eth0 2>/dev/null | awk '/TX:/ { getline; print $1; exit }'
}

passed=0 failed=0 T0=$SECONDS
verdict() { # STATUS NAME LOG
    local took=$((SECONDS - T0))
    T0=$SECONDS
    if [ "$1" -eq 0 ]; then
        echo "ok $2 (${took} s)"
        passed=$((passed + 1))
    else
        echo "FAIL $2 (${took} s)"
        [ -f "$3" ] && tail -n 30 "$3" | sed 's/^/    /'
        failed=$((failed + 1))
    fi
}

SRUN=(srun -N2 --ntasks-per-node=2 --kill-on-bad-exit=1)

# --- the collective suite on 2 nodes x 2 ranks
t_comm() {
    local log=$WORK/comm.log tx0 sent
    tx0=$(tx_bytes)
    bounded "$log" "${SRUN[@]}" "$TEST_COMM" --comm-timeout 60 || return 1
    grep -q '^collectives on 4 rank(s): ok' "$log" || { echo "    no 'collectives on 4 rank(s): ok'" >>"$log"; return 1; }
    if [ "$MODE" = local ]; then
        sent=$(($(tx_bytes) - tx0))
        echo "    $sent bytes left the second node" >>"$log"
        [ "$sent" -ge 1000000 ] || { echo "    too few bytes crossed between the nodes: not over TCP?" >>"$log"; return 1; }
    fi
}

# --- data parallel across the nodes equals one rank
MODEL=(--layers 2 --channels 32 --heads 4 --vocab 256 --seq-len 32 --micro-batch 2 --batch-tokens 256 --steps 10 --lr 1e-3)
t_prepare() {
    plain "$TRAIN" prepare "$CORPUS" "$WORK/data" >"$WORK/prepare.log" 2>&1 &&
        plain "$TRAIN" "${MODEL[@]}" --train "$WORK/data/train.bin" --log "$WORK/ref.jsonl" --save-model "$WORK/ref.bin" \
            >"$WORK/ref.log" 2>&1
}
t_dp() {
    local log=$WORK/dp.log
    bounded "$log" "${SRUN[@]}" "$TRAIN" "${MODEL[@]}" --zero 1 --threads 1 --comm-timeout 60 \
        --train "$WORK/data/train.bin" --log "$WORK/dp.jsonl" --save-model "$WORK/dp.bin" || return 1
    $PY "$ROOT/test/compare_runs.py" 1e-5 "$WORK/ref" "$WORK/dp" >>"$log" 2>&1
}

# --- a 3D layout: tensor parallel inside each node, pipeline across the two (rank = pp*TP + tp, and
# srun puts ranks 0-1 on the first node, 2-3 on the second), equals one rank
t_3d() {
    local log=$WORK/3d.log
    bounded "$log" "${SRUN[@]}" "$TRAIN" "${MODEL[@]}" --tp 2 --pp 2 --threads 1 --comm-timeout 60 \
        --train "$WORK/data/train.bin" --log "$WORK/3d.jsonl" --save-model "$WORK/3d.bin" || return 1
    $PY "$ROOT/test/compare_runs.py" 1e-5 "$WORK/ref" "$WORK/3d" >>"$log" 2>&1
}

# --- the same through scripts/train.sbatch (no GPUs here: --gpus-per-node=0 overrides the script's).
# Polls the job instead of `sbatch --wait`, which looks only every 10 s.
# shellcheck disable=SC2016 # expanded by the inner bash
SBATCH_WAIT='id=$(sbatch --parsable "$@") || exit 1
echo "submitted batch job $id"
while :; do
    info=$(timeout 10 scontrol -o show job "$id") || exit 1
    case $info in
    *JobState=COMPLETED*) exit 0 ;;
    *JobState=PENDING* | *JobState=CONFIGURING* | *JobState=RUNNING* | *JobState=COMPLETING*) sleep 0.2 ;;
    *) echo "$info"; exit 1 ;;
    esac
done'
t_sbatch() {
    local log=$WORK/sbatch.log rc
    bounded "$log" bash -c "$SBATCH_WAIT" sbatch-wait --nodes=2 --ntasks-per-node=2 --gpus-per-node=0 --time=5 \
        --output="$WORK/sbatch-%j.out" "$ROOT/scripts/train.sbatch" "${MODEL[@]}" --zero 1 --threads 1 --comm-timeout 60 \
        --train "$WORK/data/train.bin" --log "$WORK/sb.jsonl" --save-model "$WORK/sb.bin"
    rc=$?
    cat "$WORK"/sbatch-*.out >>"$log" 2>/dev/null
    [ $rc -eq 0 ] || return 1
    $PY "$ROOT/test/compare_runs.py" 1e-5 "$WORK/ref" "$WORK/sb" >>"$log" 2>&1
}

# --- rank 1 killed as step 5 begins, under scripts/train.sbatch with checkpoints: the script runs the job
# step again from the newest complete checkpoint, and the model equals the uninterrupted sbatch run's,
# byte for byte
t_sbatch_restart() {
    local log=$WORK/sbatch-restart.log rc
    LLM4D_FAULT="rank=1,step=5" bounded "$log" bash -c "$SBATCH_WAIT" sbatch-wait --nodes=2 --ntasks-per-node=2 \
        --gpus-per-node=0 --time=5 --output="$WORK/sbr-%j.out" "$ROOT/scripts/train.sbatch" "${MODEL[@]}" --zero 1 --threads 1 \
        --comm-timeout 60 --train "$WORK/data/train.bin" --ckpt-dir "$WORK/sbr-ckpt" --ckpt-every 1 --log "$WORK/sbr.jsonl" \
        --save-model "$WORK/sbr.bin"
    rc=$?
    cat "$WORK"/sbr-*.out >>"$log" 2>/dev/null
    [ $rc -eq 0 ] || return 1
    grep -q "restart 1 of 3 from the newest complete checkpoint" "$log" || { echo "    no restart" >>"$log"; return 1; }
    grep -q "^resumed from $WORK/sbr-ckpt/ckpt_" "$log" || { echo "    did not resume" >>"$log"; return 1; }
    cmp "$WORK/sb.bin" "$WORK/sbr.bin" >>"$log" 2>&1
}

# --- SIGUSR1 to the batch script (Slurm's warning before the time limit, --signal=B:USR1@120): the ranks
# checkpoint and stop, the script requeues the job, and the job, run again, resumes and ends with the
# model an uninterrupted job of the same layout writes, byte for byte
t_sbatch_usr1() {
    local log=$WORK/sbatch-usr1.log rc id i info released="" at
    local RUN=(--nodes=2 --ntasks-per-node=2 --gpus-per-node=0 --time=5 "$ROOT/scripts/train.sbatch" "${MODEL[@]}"
        --steps 600 --schedule constant --threads 1 --comm-timeout 60 --train "$WORK/data/train.bin")
    bounded "$log" bash -c "$SBATCH_WAIT" sbatch-wait --output="$WORK/sbu-ref-%j.out" "${RUN[@]}" --save-model "$WORK/sbu-ref.bin" ||
        return 1
    # Slurm takes its time to pass the signal on (seconds on a busy machine) while the 600 steps take 3 s
    # here: each step of the signalled job sleeps 25 ms (LLM4D_FAULT at=slow; the arithmetic is the same),
    # so that it is still training when the signal arrives
    id=$(LLM4D_FAULT="rank=0,step=1,at=slow,ms=25" "${IN_CLUSTER[@]}" sbatch --parsable --output="$WORK/sbu-%j.out" "${RUN[@]}" \
        --ckpt-dir "$WORK/sbu-ckpt" --log "$WORK/sbu.jsonl" --save-model "$WORK/sbu.bin") || return 1
    for i in $(seq 1 600); do # until the job trains (bounded: 60 s)
        grep -q '"step":10,' "$WORK/sbu.jsonl" 2>/dev/null && break
        sleep 0.1
    done
    "${IN_CLUSTER[@]}" scancel --signal=USR1 --batch "$id" || return 1
    rc=1
    for i in $(seq 1 1200); do # until the requeued job completes (bounded: 120 s)
        [ "$i" -eq 1200 ] && echo "    still not complete: $info" >>"$log"
        # a busy controller may not answer one query: it is asked again next time round, within the bound
        info=$("${IN_CLUSTER[@]}" scontrol -o show job "$id") &&
        case $info in
        *JobState=COMPLETED*) rc=0; break ;;
        *JobState=FAILED* | *JobState=TIMEOUT*) echo "    $info" >>"$log"; break ;; # (CANCELLED passes by: the requeue)
        *JobState=PENDING*Reason=BeginTime*)
            # Slurm holds a requeued job a while: a node refuses to launch it with a credential issued
            # in the same second as (or before) the old run's revocation, which happened before the job
            # showed PENDING. StartTime=now could fall in that second: the run then fails at once
            # (FAILED, RunTime 0). The next second is surely after it.
            if [ -z "$released" ]; then
                at=$(date -d "@$(($(date +%s) + 1))" +%Y-%m-%dT%H:%M:%S)
                "${IN_CLUSTER[@]}" scontrol update JobId="$id" StartTime="$at" && released=1
            fi ;;
        esac
        sleep 0.1
    done
    cat "$WORK"/sbu-[0-9]*.out >>"$log" 2>/dev/null
    [ $rc -eq 0 ] || return 1
    # the ranks stopped at the signal (not at the end of the 600 steps) and the requeued run resumed there
    grep -q "^received SIGUSR1 (the job's time limit is near): stopping cleanly" "$log" ||
        { echo "    the ranks did not stop at SIGUSR1" >>"$log"; return 1; }
    grep -q "^llm4d: requeueing job $id" "$log" || { echo "    not requeued" >>"$log"; return 1; }
    grep "^resumed from $WORK/sbu-ckpt/ckpt_" "$log" | grep -qv "/ckpt_00000600:" ||
        { echo "    did not resume from the checkpoint written at the signal" >>"$log"; return 1; }
    cmp "$WORK/sbu-ref.bin" "$WORK/sbu.bin" >>"$log" 2>&1
}

t_comm
verdict $? "collectives (build/test_comm) under srun, 2 nodes x 2 ranks" "$WORK/comm.log"
if t_prepare; then
    t_dp
    verdict $? "data parallel ZeRO-1 under srun, 2 nodes x 2 ranks, equals one rank" "$WORK/dp.log"
    t_3d
    verdict $? "TP 2 inside each node x PP 2 across the nodes under srun equals one rank" "$WORK/3d.log"
    if [ "$MODE" = local ]; then
        t_sbatch
        verdict $? "scripts/train.sbatch, 2 nodes x 2 ranks, equals one rank" "$WORK/sbatch.log"
        t_sbatch_restart
        verdict $? "scripts/train.sbatch relaunches a failed job step from its checkpoint; the model is bitwise the same" \
            "$WORK/sbatch-restart.log"
        t_sbatch_usr1
        verdict $? "scripts/train.sbatch: SIGUSR1 checkpoints, requeues and resumes; the model is bitwise the same" \
            "$WORK/sbatch-usr1.log"
    fi
else
    verdict 1 "single-rank reference run" "$WORK/ref.log"
fi

# nothing may be left behind
if [ "$MODE" = local ]; then
    tag=$_SC_TAG first=$SLURM_CLUSTER_FIRST_JOB daemons=("${_SC_PIDS[@]}") nets=()
    for ns in "${_SC_NS[@]}"; do nets+=("net:[$(stat -L -c %i "/run/netns/$ns" 2>/dev/null)]"); done
    finish
    left=""
    for pid in "${daemons[@]}"; do kill -0 "$pid" 2>/dev/null && left+=" process $pid"; done
    for p in /proc/[0-9]*; do
        n=$(readlink "$p/ns/net" 2>/dev/null) || continue
        for ns in "${nets[@]}"; do [ "$n" = "$ns" ] && left+=" process ${p#/proc/}"; done
    done
    ip netns list 2>/dev/null | grep -qF "llm4d-$$-" && left+=" namespaces"
    grep -qF "# $tag" /etc/hosts && left+=" /etc/hosts lines"
    for f in /dev/shm/llm4d-*; do
        [ -e "$f" ] || continue
        j=${f#/dev/shm/llm4d-}
        j=${j%%-*}
        [[ $j =~ ^[0-9]+$ ]] && [ "$j" -ge "$first" ] && [ "$j" -lt $((first + 1000)) ] && left+=" $f"
    done
    if [ -n "$left" ]; then
        echo "FAIL the cluster left behind:$left"
        failed=$((failed + 1))
    else
        echo "ok the cluster is gone (processes, namespaces, /etc/hosts lines, /dev/shm segments)"
        passed=$((passed + 1))
    fi
fi
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
