#!/usr/bin/env bash
# A real Slurm cluster on one machine, for tests: munged, slurmctld and one slurmd per node, each node
# in its own network namespace with its own hostname and address, so that the ranks srun starts on
# node N see node N's hostname and network (ranks on one node talk through shared memory, ranks on
# different nodes over TCP), exactly as on a real cluster.
#
#   bash test/slurm_cluster.sh run CMD...   start the cluster, run CMD (with SLURM_CONF set, in the
#                                           network the nodes share), stop; exits with CMD's status
#   source test/slurm_cluster.sh            defines the functions below; call from the repository root:
#       slurm_up || exit $?                 start (returns 77 with a "skipped: ..." line when it cannot:
#                                           not root, no network namespaces, Slurm not installable)
#       trap slurm_down EXIT                (slurm_up sets no trap: the caller owns its traps)
#       slurm_run srun -N2 --ntasks-per-node=2 CMD...
#       slurm_down                          stop; safe to call twice, and after a half-done slurm_up
#
# Layout: a hub namespace holds a bridge (10.202.0.1) and slurmctld; node i's namespace has one end of
# a veth pair on that bridge (10.202.0.(10+i)); srun, sinfo, ... must run in the hub namespace, which
# slurm_run does. munged runs in the host namespace with a private socket and key under the cluster's
# temporary directory (the nodes reach it through the file system). Nothing touches the host's network.
# Node names are llm4d-PID-nI; /etc/hosts gets one line per node, tagged "# llm4d-slurm-PID", removed
# by slurm_down, so that the ranks resolve the names in SLURM_JOB_NODELIST. Job ids start at
# (PID mod 16000 + 1) * 1000, unique per run, so that anything named after the job id (the trainer's
# default job token and its /dev/shm segments) cannot clash with another run.
#
# slurm_down stops, by pid, munged, slurmctld, the slurmds, and every process left in the cluster's
# namespaces (slurmstepd, ranks, srun), deletes the namespaces, restores /etc/hosts, removes the
# /dev/shm segments named after this cluster's job ids and the temporary directory.
#
# Slurm (slurm-wlm, munge) is installed with apt-get when slurmctld is missing; scripts/deps.sh should
# take this over. Environment: SLURM_CLUSTER_NODES (default 2), SLURM_CLUSTER_CPUS (CPUs declared per
# node, default 8: more than exist is fine), SLURM_CLUSTER_KEEP=1 keeps the temporary directory (logs).
#
# After slurm_up: SLURM_CLUSTER_DIR (logs: ctld/slurmctld.log, NODE/slurmd.log, munged.out),
# SLURM_CLUSTER_CONF, SLURM_CLUSTER_NODE_NAMES (array), SLURM_CLUSTER_FIRST_JOB, and
# SLURM_CLUSTER_EXEC, an array: "${SLURM_CLUSTER_EXEC[@]}" CMD... does what slurm_run does, but by
# exec alone, so that in `... CMD &` $! is CMD's own pid.

_SC_TAG="llm4d-slurm-$$"
_SC_HUB="llm4d-$$-hub"
_SC_PIDS=()    # processes started directly (munged, slurmctld, slurmds)
_SC_NS=()      # namespaces created
_SC_HOSTS=0    # 1 while /etc/hosts carries our lines
_SC_UP=0
SLURM_CLUSTER_DIR=""
SLURM_CLUSTER_CONF=""
SLURM_CLUSTER_NODE_NAMES=()
SLURM_CLUSTER_EXEC=()
# below 2^24: ./train (launch_env_read's env_int) rejects larger SLURM_JOB_ID values, though real
# clusters reach them
SLURM_CLUSTER_FIRST_JOB=$((($$ % 16000 + 1) * 1000))

_sc_skip() { echo "skipped: local Slurm cluster: $*"; return 77; }

# /etc/hosts may be a bind mount: rewrite it in place (never rename over it), under a lock shared with
# concurrent runs.
_SC_LOCK=/run/lock/llm4d-slurm-hosts.lock
[ -d /run/lock ] || _SC_LOCK=/tmp/llm4d-slurm-hosts.lock
_sc_hosts_add() { # lines...
    (
        flock -w 10 9 || exit 1
        printf '%s\n' "$@" >>/etc/hosts
    ) 9>"$_SC_LOCK"
}
_sc_hosts_remove() { # tags...
    (
        flock -w 10 9 || exit 1
        tmp=$(mktemp /tmp/llm4d-hosts.XXXXXX) || exit 1
        grep -v -F "$(printf '# %s\n' "$@")" /etc/hosts >"$tmp"
        cat "$tmp" >/etc/hosts
        rm -f "$tmp"
    ) 9>"$_SC_LOCK"
}

# What an earlier run killed by SIGKILL left (its pid no longer alive): its namespaces and the
# processes in them, its /etc/hosts lines, its munged and temporary directory.
# shellcheck disable=SC2207
_sc_reap_stale() {
    local ns pid pids tags=() f dir
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^llm4d-[0-9]+-(hub|n[0-9]+)$'); do
        pid=${ns#llm4d-} pid=${pid%%-*}
        kill -0 "$pid" 2>/dev/null && continue
        pids=($(ip netns pids "$ns" 2>/dev/null))
        [ ${#pids[@]} -eq 0 ] || kill -KILL "${pids[@]}" 2>/dev/null
        ip netns delete "$ns" 2>/dev/null && echo "slurm_cluster: removed namespace $ns left by a killed run"
    done
    while read -r pid; do
        kill -0 "$pid" 2>/dev/null || tags+=("llm4d-slurm-$pid")
    done < <(grep -o '# llm4d-slurm-[0-9]*$' /etc/hosts 2>/dev/null | sed 's/.*-//' | sort -u)
    [ ${#tags[@]} -eq 0 ] || { _sc_hosts_remove "${tags[@]}" && echo "slurm_cluster: removed /etc/hosts lines of killed runs"; }
    for f in /tmp/llm4d-slurm.*/slurm.conf; do
        [ -f "$f" ] || continue
        dir=${f%/slurm.conf}
        pid=$(sed -n '1s/.*(pid \([0-9]*\)).*/\1/p' "$f")
        if [ -z "$pid" ] || kill -0 "$pid" 2>/dev/null; then continue; fi
        pid=$(cat "$dir/munge-run/munged.pid" 2>/dev/null)
        [ -z "$pid" ] || ! grep -q "$dir" "/proc/$pid/cmdline" 2>/dev/null || kill -KILL "$pid"
        rm -rf "$dir" && echo "slurm_cluster: removed $dir left by a killed run"
    done
}

_sc_install() {
    echo "slurm_cluster: slurmctld/slurmd/srun/munged not found: installing slurm-wlm munge with apt-get" \
        "(scripts/deps.sh should do this)"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -qq --no-install-recommends slurm-wlm munge >/tmp/llm4d-slurm-apt.$$.log 2>&1; then
        apt-get update -qq >>/tmp/llm4d-slurm-apt.$$.log 2>&1
        apt-get install -y -qq --no-install-recommends slurm-wlm munge >>/tmp/llm4d-slurm-apt.$$.log 2>&1
    fi
    local rc=$?
    [ $rc -eq 0 ] || tail -n 5 /tmp/llm4d-slurm-apt.$$.log
    rm -f /tmp/llm4d-slurm-apt.$$.log
    return $rc
}

_sc_have_slurm() {
    local t
    for t in slurmctld slurmd srun sinfo scancel munged; do
        command -v "$t" >/dev/null 2>&1 || PATH=$PATH:/usr/sbin command -v "$t" >/dev/null 2>&1 || return 1
    done
}

# Run a command in the hub namespace, where slurmctld listens and every node is reachable.
slurm_run() {
    "${SLURM_CLUSTER_EXEC[@]}" "$@"
}

slurm_up() {
    local nodes=${SLURM_CLUSTER_NODES:-2} cpus=${SLURM_CLUSTER_CPUS:-8} d i ns name addr t
    [ "$_SC_UP" -eq 0 ] || { echo "slurm_up: already up"; return 1; }
    [ "$(id -u)" -eq 0 ] || { _sc_skip "needs root (network namespaces, hostnames, /etc/hosts); running as uid $(id -u)"; return 77; }
    for t in ip nsenter unshare setpriv flock timeout; do
        command -v "$t" >/dev/null 2>&1 || { _sc_skip "'$t' is not installed"; return 77; }
    done
    export PATH=$PATH:/usr/sbin:/sbin
    if ! _sc_have_slurm; then
        _sc_install || { _sc_skip "slurm-wlm/munge are not installed and apt-get could not install them"; return 77; }
        _sc_have_slurm || { _sc_skip "slurm-wlm/munge installed, but slurmctld/slurmd/srun/munged are still missing"; return 77; }
    fi
    id munge >/dev/null 2>&1 || { _sc_skip "there is no 'munge' user (is the munge package installed?)"; return 77; }
    _sc_reap_stale
    _SC_UP=1 # from here on slurm_down has something to undo

    SLURM_CLUSTER_DIR=$(mktemp -d /tmp/llm4d-slurm.XXXXXX) || return 1
    d=$SLURM_CLUSTER_DIR
    chmod 755 "$d" # munged insists that every directory above its socket be searchable by all
    SLURM_CLUSTER_CONF=$d/slurm.conf
    SLURM_CLUSTER_EXEC=(env "SLURM_CONF=$SLURM_CLUSTER_CONF" nsenter --net="/run/netns/$_SC_HUB")

    # network namespaces: the probe doubles as the hub
    if ! ip netns add "$_SC_HUB" 2>"$d/probe.err"; then
        _sc_skip "'ip netns add' failed (no CAP_NET_ADMIN/CAP_SYS_ADMIN?): $(head -n 1 "$d/probe.err")"
        return 77
    fi
    _SC_NS+=("$_SC_HUB")
    if ! ip -n "$_SC_HUB" link add br0 type bridge 2>"$d/probe.err"; then
        _sc_skip "cannot create a bridge in a network namespace: $(head -n 1 "$d/probe.err")"
        return 77
    fi
    if ! nsenter --net="/run/netns/$_SC_HUB" unshare --uts sh -c 'hostname llm4d-probe' 2>"$d/probe.err"; then
        _sc_skip "cannot give a namespace its own hostname with 'unshare --uts': $(head -n 1 "$d/probe.err")"
        return 77
    fi
    ip -n "$_SC_HUB" link set lo up && ip -n "$_SC_HUB" addr add 10.202.0.1/24 dev br0 &&
        ip -n "$_SC_HUB" link set br0 up || return 1
    local hosts=()
    for ((i = 1; i <= nodes; i++)); do
        name=llm4d-$$-n$i ns=llm4d-$$-n$i addr=10.202.0.$((10 + i))
        SLURM_CLUSTER_NODE_NAMES+=("$name")
        ip netns add "$ns" || return 1
        _SC_NS+=("$ns")
        # interface names are per namespace: no need to make them unique
        ip link add "v$i" netns "$_SC_HUB" type veth peer name eth0 netns "$ns" || return 1
        ip -n "$_SC_HUB" link set "v$i" master br0 && ip -n "$_SC_HUB" link set "v$i" up || return 1
        ip -n "$ns" link set lo up && ip -n "$ns" addr add "$addr/24" dev eth0 && ip -n "$ns" link set eth0 up || return 1
        hosts+=("$addr $name # $_SC_TAG")
        mkdir -p "$d/$name/spool"
    done
    _SC_HOSTS=1
    _sc_hosts_add "${hosts[@]}" || { echo "slurm_up: cannot update /etc/hosts"; return 1; }

    # munged: a private key and socket, run as the munge user
    mkdir -p "$d/munge" "$d/munge-run"
    chmod 700 "$d/munge"
    chmod 755 "$d/munge-run"
    if command -v mungekey >/dev/null 2>&1; then
        mungekey --create --keyfile="$d/munge/munge.key" >/dev/null 2>&1 || dd if=/dev/urandom of="$d/munge/munge.key" bs=1024 count=1 2>/dev/null
    else
        dd if=/dev/urandom of="$d/munge/munge.key" bs=1024 count=1 2>/dev/null
    fi
    chown -R munge:munge "$d/munge" "$d/munge-run"
    chmod 400 "$d/munge/munge.key"
    setpriv --reuid=munge --regid=munge --clear-groups munged --foreground \
        --socket="$d/munge-run/munge.socket" --key-file="$d/munge/munge.key" --pid-file="$d/munge-run/munged.pid" \
        --log-file="$d/munge/munged.log" --seed-file="$d/munge/munged.seed" </dev/null >"$d/munged.out" 2>&1 &
    _SC_PIDS+=($!)
    for i in $(seq 100); do [ -S "$d/munge-run/munge.socket" ] && break; sleep 0.05; done
    if [ ! -S "$d/munge-run/munge.socket" ]; then
        echo "slurm_up: munged did not start:"
        sed 's/^/    /' "$d/munged.out" "$d/munge/munged.log" 2>/dev/null | tail -n 10
        return 1
    fi

    mkdir -p "$d/ctld/state"
    {
        echo "# written by test/slurm_cluster.sh (pid $$)"
        echo "ClusterName=llm4d"
        echo "SlurmctldHost=llm4d-$$-ctl(10.202.0.1)"
        echo "SlurmUser=root"
        echo "SlurmdUser=root"
        echo "AuthType=auth/munge"
        echo "CredType=cred/munge"
        echo "AuthInfo=socket=$d/munge-run/munge.socket"
        echo "MpiDefault=none"
        echo "ProctrackType=proctrack/linuxproc"
        echo "TaskPlugin=task/none"
        echo "SelectType=select/cons_tres"
        echo "SelectTypeParameters=CR_Core"
        echo "SlurmdParameters=config_overrides"
        echo "JobAcctGatherType=jobacct_gather/none"
        echo "AccountingStorageType=accounting_storage/none"
        echo "ReturnToService=2"
        echo "MailProg=/bin/true"
        echo "SchedulerParameters=batch_sched_delay=0"
        echo "FirstJobId=$SLURM_CLUSTER_FIRST_JOB"
        echo "KillWait=5"
        echo "MinJobAge=30"
        echo "StateSaveLocation=$d/ctld/state"
        echo "SlurmctldPidFile=$d/ctld/slurmctld.pid"
        echo "SlurmctldLogFile=$d/ctld/slurmctld.log"
        echo "SlurmdSpoolDir=$d/%n/spool"
        echo "SlurmdPidFile=$d/%n/slurmd.pid"
        echo "SlurmdLogFile=$d/%n/slurmd.log"
        echo "SlurmctldDebug=info"
        echo "SlurmdDebug=info"
        for ((i = 1; i <= nodes; i++)); do
            echo "NodeName=llm4d-$$-n$i NodeHostname=llm4d-$$-n$i NodeAddr=10.202.0.$((10 + i)) CPUs=$cpus State=UNKNOWN"
        done
        echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES"
    } >"$SLURM_CLUSTER_CONF"

    # slurmctld in the hub, slurmd in each node: nsenter and unshare exec (no fork), and so does sh,
    # so $! is the daemon itself. (Not `ip netns exec`: it remounts /sys, and slurmd then cannot
    # initialise its cgroup plugin.)
    # shellcheck disable=SC2016 # $0 and $1 are the inner sh's
    nsenter --net="/run/netns/$_SC_HUB" unshare --uts \
        sh -c 'hostname "$0" && exec slurmctld -D -c -f "$1"' "llm4d-$$-ctl" "$SLURM_CLUSTER_CONF" \
        </dev/null >"$d/ctld/stdout.log" 2>&1 &
    _SC_PIDS+=($!)
    for name in "${SLURM_CLUSTER_NODE_NAMES[@]}"; do
        # shellcheck disable=SC2016
        nsenter --net="/run/netns/$name" unshare --uts \
            sh -c 'hostname "$0" && exec slurmd -D -f "$1" -N "$0"' "$name" "$SLURM_CLUSTER_CONF" \
            </dev/null >"$d/$name/stdout.log" 2>&1 &
        _SC_PIDS+=($!)
    done

    # ready when every node is idle
    local idle=0 out=""
    for i in $(seq 150); do
        out=$(slurm_run timeout 5 sinfo -h -N -o '%N %t' 2>&1)
        idle=$(grep -c ' idle$' <<<"$out")
        [ "$idle" -eq "$nodes" ] && break
        for t in "${_SC_PIDS[@]}"; do
            kill -0 "$t" 2>/dev/null || { out="a daemon exited (pid $t)"; i=999; break; }
        done
        [ "$i" -eq 999 ] && break
        sleep 0.2
    done
    if [ "$idle" -ne "$nodes" ]; then
        echo "slurm_up: the cluster did not come up ($idle of $nodes nodes idle): $out"
        for f in "$d/ctld/slurmctld.log" "$d/ctld/stdout.log" "$d"/llm4d-*/slurmd.log "$d"/llm4d-*/stdout.log; do
            [ -s "$f" ] || continue
            echo "    --- $f"
            tail -n 8 "$f" | sed 's/^/    /'
        done
        return 1
    fi
    return 0
}

# shellcheck disable=SC2207 # pids are numbers
slurm_down() {
    local ns pid pids=() i j saved
    [ "$_SC_UP" -eq 1 ] || return 0
    # a second Ctrl-C must not cut the teardown short: ignore INT and TERM until it is done
    saved=$(trap -p INT TERM)
    trap '' INT TERM
    # every process in the cluster's namespaces (daemons, slurmstepd, ranks, srun) and munged
    for ns in "${_SC_NS[@]}"; do
        pids+=($(ip netns pids "$ns" 2>/dev/null))
    done
    pids+=("${_SC_PIDS[@]}")
    for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done
    for i in $(seq 30); do
        j=0
        for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && j=1 && break; done
        [ $j -eq 0 ] && break
        sleep 0.1
    done
    # what did not go within 3 s, and anything that appeared meanwhile, is killed
    for ns in "${_SC_NS[@]}"; do
        pids+=($(ip netns pids "$ns" 2>/dev/null))
    done
    for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null; done
    for pid in "${_SC_PIDS[@]}"; do wait "$pid" 2>/dev/null; done
    for i in $(seq 20); do
        j=0
        for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && j=1 && break; done
        [ $j -eq 0 ] && break
        sleep 0.1
    done
    for ns in "${_SC_NS[@]}"; do ip netns delete "$ns" 2>/dev/null; done
    [ "$_SC_HOSTS" -eq 0 ] || _sc_hosts_remove "$_SC_TAG"
    # segments the trainer names after the job token, which Slurm jobs take from the job id
    for ((j = SLURM_CLUSTER_FIRST_JOB; j < SLURM_CLUSTER_FIRST_JOB + 1000; j++)); do
        echo "/dev/shm/llm4d-$j-"
    done | { grep -F -f - <(ls -d /dev/shm/llm4d-* 2>/dev/null) || true; } | xargs -r rm -f
    if [ -n "$SLURM_CLUSTER_DIR" ] && [ "${SLURM_CLUSTER_KEEP:-0}" != 1 ]; then rm -rf "$SLURM_CLUSTER_DIR"; fi
    [ "${SLURM_CLUSTER_KEEP:-0}" != 1 ] || echo "slurm_down: kept $SLURM_CLUSTER_DIR"
    _SC_PIDS=() _SC_NS=() _SC_HOSTS=0 _SC_UP=0
    trap - INT TERM
    eval "$saved"
    return 0
}

# run as a script: bash test/slurm_cluster.sh run CMD...
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    if [ "${1:-}" != run ] || [ $# -lt 2 ]; then
        echo "usage: bash $0 run CMD...   (or: source $0; slurm_up; slurm_run srun ...; slurm_down)" >&2
        exit 2
    fi
    shift
    trap slurm_down EXIT
    trap 'echo "interrupted: stopping the cluster"; exit 130' INT
    trap 'echo "terminated: stopping the cluster"; exit 143' TERM
    slurm_up
    rc=$?
    [ $rc -eq 0 ] || exit $rc
    # in the background (keeping stdin), so that a signal runs the trap at once instead of after CMD
    "${SLURM_CLUSTER_EXEC[@]}" "$@" <&0 &
    wait $!
    exit $?
fi
