#!/usr/bin/env bash
# A throw-away single-node Slurm cluster for end-to-end tests.
#
#   cluster.sh up DIR     create DIR (config, fake GPUs, munge key), start
#                         munged, slurmctld and slurmd, wait until the node
#                         is idle; clients then use `. DIR/env`
#   cluster.sh down DIR   stop everything `up` started (safe to call twice)
#   cluster.sh restart DIR  stop slurmd and slurmctld and start them again
#                         on DIR's (edited) slurm.conf and gres.conf, as an
#                         admin does after changing GRES; waits until idle
#
# Must run as root (mknod, SlurmUser=root). Everything lives in DIR: its own
# munged (own key and socket, passed to Slurm with AuthInfo=socket=...),
# state, spool, logs and pid files, so it neither needs nor disturbs a system
# Slurm/munge install. Ports default to 6917 (slurmctld) and 6918 (slurmd);
# override with SMARTMIG_SLURMCTLD_PORT / SMARTMIG_SLURMD_PORT.
# SMARTMIG_SLURM_CRED_EXPIRE=N sets AuthInfo's cred_expire (Slurm holds a
# requeued job for cred_expire + 1 s; default 120), and
# SMARTMIG_SLURM_SCHED_EXTRA=k=v,... adds SchedulerParameters.
# SMARTMIG_SLURM_JOB_SUBMIT=PATH installs PATH as DIR/job_submit.lua (next to
# slurm.conf, where Slurm's job_submit/lua plugin looks for it) and sets
# JobSubmitPlugins=lua, e.g. etc/slurm/job_submit.lua; unset: no job_submit
# plugin.
# SMARTMIG_SLURM_EXTRA_NODES=N declares N more smartmig nodes smnode1..N (same
# GRES, in the partition, no slurmd: DOWN), so several smartmigd with
# node_name = "smnodeK" can stand for a bigger cluster's nodes (the control-
# plane measurement of docs/architecture.md, "Cluster scale").
# SMARTMIG_SLURM_SERIES=24.11 runs the cluster on that Slurm release series:
# munged, slurmctld, slurmd and the clients of its Debian suite's root file
# system (scripts/slurm-series; made there with `scripts/slurm-series root
# 24.11`), started inside it with `scripts/slurm-series run`, DIR being at
# the same path inside and out. Unset, or the host's series (22.05): the
# host's own Slurm. Clients then run `scripts/slurm-series run SERIES CMD`
# with `. DIR/env` (DIR/env names the series as SMARTMIG_SLURM_SERIES).
# SMARTMIG_SLURM_TYPED_GPUS=1 gives each GPU its own GRES type, mig0 and mig1
# (gres.conf `Type=mig<i>` on its gpu and shard lines), so that smartmigd can
# hold a given GPU's stranded shards (`--gres=shard:mig0:1`, issue 42); jobs
# still ask untyped `--gres=shard:K`.
# SMARTMIG_SLURM_HOLD_PARTITION=NAME adds a partition NAME on the node with
# Hidden=YES AllowGroups=root, for smartmigd's holds (`[slurm]
# hold_partition`): users' squeue does not list its jobs.
# SMARTMIG_SLURM_CONF_EXTRA='Key=Value ...' appends these settings (one per
# word) to slurm.conf, e.g. MinJobAge=3600 to keep ended jobs in scontrol.
# SMARTMIG_SLURM_MIG_GRES=4g.20gb,3g.20gb,... declares the node the way a site
# without smartmig runs a static MIG setup (advise mode watches one): one
# typed `gpu` GRES per MIG device, in that order, backed by fake devices
# DIR/dev/nvidia-mig<N>, and no shards; jobs ask `--gres=gpu:3g.20gb:1`.
#
# The node is declared like a real smartmig node (see etc/slurm/*.snippet and
# docs): two GPUs, each one `gpu` GRES with 7 `shard` GRES, backed by fake
# character devices DIR/dev/nvidia0 and nvidia1 (slurmd rejects regular files).
# The partition lets jobs share CPU cores (OverSubscribe=FORCE:32) so that,
# as on a real GPU node, the shards and not the test machine's few cores
# limit how many jobs run at once.
set -euo pipefail

usage() {
    echo "usage: $0 up|down|restart DIR" >&2
    exit 2
}

die() {
    echo "cluster.sh: $*" >&2
    exit 1
}

[[ $# -eq 2 ]] || usage
cmd=$1
dir=$2

# The Slurm series: its commands run through `in_series` (as they are on the
# host's series).
series=${SMARTMIG_SLURM_SERIES:-}
in_series() {
    if [[ -n $series ]]; then
        "$(dirname "$0")/../../scripts/slurm-series" run "$series" "$@"
    else
        "$@"
    fi
}

# Stop the processes recorded in the given pid files: SIGTERM to all of them
# at once, wait up to 10 s, then SIGKILL what is left. Missing or stale pid
# files are fine (so `down` can run twice).
stop_pidfiles() {
    local pidfile pid i alive
    local -a pids=()
    for pidfile in "$@"; do
        [[ -f $pidfile ]] || continue
        pid=$(cat "$pidfile" 2>/dev/null || true)
        if [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null; then
            kill -TERM "$pid" 2>/dev/null || true
            pids+=("$pid")
        fi
    done
    for ((i = 0; i < 100; i++)); do
        alive=0
        for pid in "${pids[@]}"; do
            kill -0 "$pid" 2>/dev/null && alive=1
        done
        ((alive)) || break
        sleep 0.1
    done
    for pid in "${pids[@]}"; do
        if kill -0 "$pid" 2>/dev/null; then
            echo "cluster.sh: pid $pid ignored SIGTERM for 10 s, sending SIGKILL" >&2
            kill -KILL "$pid" 2>/dev/null || true
        fi
    done
    rm -f "$@"
}

show_logs() {
    local f
    for f in "$dir"/log/slurmctld.log "$dir"/log/slurmd.log "$dir"/log/munged.log; do
        if [[ -f $f ]]; then
            echo "----- tail $f -----" >&2
            tail -n 40 "$f" >&2
        fi
    done
}

port_in_use() {
    # ss is in iproute2; fall back to "not in use" when it is missing.
    command -v ss >/dev/null 2>&1 || return 1
    ss -Htln "sport = :$1" 2>/dev/null | grep -q .
}

cluster_down() {
    [[ -d $dir ]] || return 0
    stop_pidfiles "$dir/run/slurmd.pid" "$dir/run/slurmctld.pid"
    # slurmstepd processes outlive slurmd; end those of this cluster.
    if [[ -f $dir/slurm.conf ]] && command -v pgrep >/dev/null 2>&1; then
        local pid
        for pid in $(pgrep -x slurmstepd || true); do
            if grep -qsF "$dir/" "/proc/$pid/environ" "/proc/$pid/cmdline" 2>/dev/null; then
                kill -KILL "$pid" 2>/dev/null || true
            fi
        done
    fi
    # munged last: the Slurm daemons may still authenticate while stopping.
    stop_pidfiles "$dir/run/munged.pid"
}

cluster_up() {
    [[ $(id -u) -eq 0 ]] || die "must run as root (mknod, SlurmUser=root)"
    [[ $series =~ ^[0-9.]*$ ]] || die "SMARTMIG_SLURM_SERIES: a Slurm series such as 24.11 expected"
    local bin
    for bin in munged slurmctld slurmd sinfo scontrol; do
        in_series sh -c "command -v $bin" >/dev/null 2>&1 ||
            die "$bin not found${series:+ in the Slurm $series root}: apt-get install slurmctld slurmd slurm-client munge${series:+ (or scripts/slurm-series root $series)}"
    done
    # The release (22.05.8): settings differ between series.
    local version major
    version=$(in_series slurmd -V | awk '{print $2}')
    major=${version%%.*}
    [[ $major =~ ^[0-9]+$ ]] || die "slurmd -V printed no version ('$version')"
    # Credential lifetime (s); Slurm's default is 120. A requeued job may
    # start again only cred_expire + 1 s later, so tests of requeues set
    # SMARTMIG_SLURM_CRED_EXPIRE to a few seconds.
    local cred_expire=${SMARTMIG_SLURM_CRED_EXPIRE:-}
    [[ -z $cred_expire || $cred_expire =~ ^[0-9]+$ ]] || die "SMARTMIG_SLURM_CRED_EXPIRE must be a number of seconds"
    # Extra SchedulerParameters, e.g. sched_interval=2 (a requeued job that
    # becomes eligible is otherwise only seen by the next periodic pass).
    local sched_extra=${SMARTMIG_SLURM_SCHED_EXTRA:-}
    [[ $sched_extra =~ ^[a-z_=0-9,]*$ ]] || die "SMARTMIG_SLURM_SCHED_EXTRA: only key=value,... expected"
    # Optional job_submit/lua script (etc/slurm/job_submit.lua).
    local job_submit=${SMARTMIG_SLURM_JOB_SUBMIT:-}
    if [[ -n $job_submit ]]; then
        [[ -f $job_submit && -r $job_submit ]] ||
            die "SMARTMIG_SLURM_JOB_SUBMIT=$job_submit: no such readable file"
    fi
    # Optional static MIG devices instead of GPUs with shards.
    local mig_gres=${SMARTMIG_SLURM_MIG_GRES:-}
    [[ $mig_gres =~ ^[0-9a-z.+,]*$ ]] || die "SMARTMIG_SLURM_MIG_GRES: MIG profile names separated by commas expected"
    local typed_gpus=${SMARTMIG_SLURM_TYPED_GPUS:-}
    [[ -z $typed_gpus || $typed_gpus == 1 ]] || die "SMARTMIG_SLURM_TYPED_GPUS must be 1 or unset"
    local conf_extra=${SMARTMIG_SLURM_CONF_EXTRA:-}
    [[ $conf_extra =~ ^[A-Za-z0-9_=,.:/\ -]*$ ]] || die "SMARTMIG_SLURM_CONF_EXTRA: Key=Value words expected"
    local hold_partition=${SMARTMIG_SLURM_HOLD_PARTITION:-}
    [[ $hold_partition =~ ^[a-z0-9_-]*$ ]] || die "SMARTMIG_SLURM_HOLD_PARTITION: a partition name expected"
    local extra_nodes=${SMARTMIG_SLURM_EXTRA_NODES:-0}
    [[ $extra_nodes =~ ^[0-9]+$ ]] || die "SMARTMIG_SLURM_EXTRA_NODES must be a number of nodes"
    local ctld_port=${SMARTMIG_SLURMCTLD_PORT:-6917}
    local slurmd_port=${SMARTMIG_SLURMD_PORT:-6918}
    local port
    for port in "$ctld_port" "$slurmd_port"; do
        if port_in_use "$port"; then
            die "port $port is already in use (a cluster left running? try \`$0 down OLD_DIR\`, or set SMARTMIG_SLURMCTLD_PORT/SMARTMIG_SLURMD_PORT)"
        fi
    done

    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd -P)
    mkdir -p "$dir"/{dev,state,spool,log,run,munge/etc,munge/lib,munge/sock}
    chmod 0755 "$dir" "$dir/munge"
    chmod 0700 "$dir/munge/etc" "$dir/munge/lib"
    chmod 0711 "$dir/munge/sock"

    # Fake GPUs: character devices with the NVIDIA major number.
    local i
    for i in 0 1; do
        [[ -c $dir/dev/nvidia$i ]] || mknod "$dir/dev/nvidia$i" c 195 "$i"
    done
    # Static MIG devices (SMARTMIG_SLURM_MIG_GRES): their node GRES and
    # gres.conf lines.
    local -a mig_types=()
    local node_gres="gpu:2,shard:14" gres_types="gpu,shard" t
    if [[ -n $typed_gpus && -z $mig_gres ]]; then
        node_gres="gpu:mig0:1,gpu:mig1:1,shard:mig0:7,shard:mig1:7"
    fi
    if [[ -n $mig_gres ]]; then
        IFS=, read -r -a mig_types <<<"$mig_gres"
        node_gres=""
        gres_types="gpu"
        for i in "${!mig_types[@]}"; do
            t=${mig_types[$i]}
            [[ -c $dir/dev/nvidia-mig$i ]] || mknod "$dir/dev/nvidia-mig$i" c 195 $((10 + i))
        done
        for t in $(printf '%s\n' "${mig_types[@]}" | sort -u); do
            node_gres+="${node_gres:+,}gpu:$t:$(printf '%s\n' "${mig_types[@]}" | grep -cxF "$t")"
        done
    fi

    # munged with its own key and socket.
    local key=$dir/munge/etc/munge.key
    local sock=$dir/munge/sock/munge.socket
    if [[ ! -s $key ]]; then
        (umask 077 && head -c 1024 /dev/urandom >"$key")
    fi
    chmod 0600 "$key"
    # --force: replace a stale socket left in DIR by a killed earlier run.
    in_series munged --force \
        --socket="$sock" \
        --key-file="$key" \
        --pid-file="$dir/run/munged.pid" \
        --log-file="$dir/log/munged.log" \
        --seed-file="$dir/munge/lib/munged.seed" ||
        {
            show_logs
            die "munged failed to start"
        }
    for ((i = 0; i < 50; i++)); do
        [[ -S $sock ]] && break
        sleep 0.1
    done
    [[ -S $sock ]] || {
        show_logs
        die "munged socket $sock did not appear"
    }

    # Hardware line of this machine, as slurmd sees it.
    local node hw
    node=$(hostname -s)
    hw=$(in_series slurmd -C | head -n 1 | sed -e 's/^NodeName=[^ ]* //')
    [[ -n $hw ]] || die "slurmd -C printed nothing"

    cat >"$dir/slurm.conf" <<CONF
# Generated by tests/slurm/cluster.sh for a throw-away test cluster.
ClusterName=smartmig-test
SlurmctldHost=$node
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$sock${cred_expire:+,cred_expire=$cred_expire}
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=debug
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
MailProg=/bin/true
SchedulerParameters=batch_sched_delay=0${sched_extra:+,$sched_extra}
ReturnToService=2
KillWait=2
# Batch jobs may be requeued (smartmigd requeues a job that ran out of GPU
# memory with "scontrol requeue"); 1 is Slurm's default, stated for clarity.
JobRequeue=1
PlugStackConfig=$dir/plugstack.conf
GresTypes=$gres_types
NodeName=$node $hw Gres=$node_gres State=UNKNOWN
CONF
    local part_nodes=$node
    if ((extra_nodes > 0)); then
        echo "NodeName=smnode[1-$extra_nodes] NodeAddr=127.0.0.1 Port=9 CPUs=2 RealMemory=1000 Gres=$node_gres State=DOWN" >>"$dir/slurm.conf"
        part_nodes+=",smnode[1-$extra_nodes]"
    fi
    echo "PartitionName=debug Nodes=$part_nodes Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:32" >>"$dir/slurm.conf"
    if [[ -n $hold_partition ]]; then
        # smartmigd's holds apart, hidden from users' squeue (docs/slurm-integration.md §9).
        echo "PartitionName=$hold_partition Nodes=$part_nodes Hidden=YES AllowGroups=root MaxTime=INFINITE State=UP OverSubscribe=FORCE:32" >>"$dir/slurm.conf"
    fi

    if [[ -n $conf_extra ]]; then
        echo "# SMARTMIG_SLURM_CONF_EXTRA" >>"$dir/slurm.conf"
        printf '%s\n' $conf_extra >>"$dir/slurm.conf"
    fi

    if [[ -n $job_submit ]]; then
        cp "$job_submit" "$dir/job_submit.lua"
        chmod 0644 "$dir/job_submit.lua"
        cat >>"$dir/slurm.conf" <<CONF
# SMARTMIG_SLURM_JOB_SUBMIT: job_submit/lua with $dir/job_submit.lua
JobSubmitPlugins=lua
CONF
    fi

    if [[ -n $mig_gres ]]; then
        {
            echo "# A static MIG setup: one typed gpu GRES per MIG device."
            for i in "${!mig_types[@]}"; do
                echo "NodeName=$node Name=gpu Type=${mig_types[$i]} File=$dir/dev/nvidia-mig$i"
            done
        } >"$dir/gres.conf"
    elif [[ -n $typed_gpus ]]; then
        cat >"$dir/gres.conf" <<CONF
# One gpu GRES per GPU, each with its own type, and as many shards per GPU
# as it has MIG compute slices; see etc/slurm/gres.conf.snippet.
NodeName=$node Name=gpu Type=mig0 File=$dir/dev/nvidia0
NodeName=$node Name=gpu Type=mig1 File=$dir/dev/nvidia1
NodeName=$node Name=shard Type=mig0 Count=7 File=$dir/dev/nvidia0
NodeName=$node Name=shard Type=mig1 Count=7 File=$dir/dev/nvidia1
CONF
    else
        cat >"$dir/gres.conf" <<CONF
# One gpu GRES per GPU, and as many shards per GPU as it has MIG compute
# slices (7 on A100/H100/H200); see etc/slurm/gres.conf.snippet.
NodeName=$node Name=gpu File=$dir/dev/nvidia[0-1]
NodeName=$node Name=shard Count=7 File=$dir/dev/nvidia0
NodeName=$node Name=shard Count=7 File=$dir/dev/nvidia1
CONF
    fi

    [[ -f $dir/plugstack.conf ]] || : >"$dir/plugstack.conf"

    # Slurm 24.11 and later start their cgroup plugin even with
    # proctrack/linuxproc and task/none, and slurmd exits where no cgroup
    # file system is set up for it (a root file system, a container).
    if ((major >= 24)); then
        cat >"$dir/cgroup.conf" <<CONF
# Generated by tests/slurm/cluster.sh: no cgroups in the test cluster.
CgroupPlugin=disabled
CONF
    fi

    cat >"$dir/env" <<ENV
export SLURM_CONF=$dir/slurm.conf
${series:+export SMARTMIG_SLURM_SERIES=$series}
ENV
    export SLURM_CONF=$dir/slurm.conf
    start_slurm "$version"
}

# Starts slurmctld and slurmd on DIR's config and waits until the node is
# idle; $1 is the Slurm version (for the last line).
start_slurm() {
    local version=$1 node
    node=$(hostname -s)
    in_series slurmctld -f "$dir/slurm.conf" || {
        show_logs
        die "slurmctld failed to start"
    }
    in_series slurmd -f "$dir/slurm.conf" -N "$node" || {
        show_logs
        die "slurmd failed to start"
    }

    # slurmctld may die after its start command exited 0: poll the node state.
    local state="" deadline=$((SECONDS + 60))
    while ((SECONDS < deadline)); do
        state=$(in_series sinfo -h -n "$node" -o %T 2>/dev/null | head -n 1 || true)
        [[ $state == idle ]] && break
        if [[ -f $dir/run/slurmctld.pid ]] && ! kill -0 "$(cat "$dir/run/slurmctld.pid")" 2>/dev/null; then
            show_logs
            die "slurmctld exited during start-up"
        fi
        sleep 0.2
    done
    if [[ $state != idle ]]; then
        show_logs
        die "node $node not idle after 60 s (last state: '${state:-no answer from slurmctld}')"
    fi
    echo "cluster.sh: node $node idle (Slurm $version); use: . $dir/env"
}

cluster_restart() {
    [[ -f $dir/slurm.conf ]] || die "$dir/slurm.conf: no cluster there"
    dir=$(cd "$dir" && pwd -P)
    stop_pidfiles "$dir/run/slurmd.pid" "$dir/run/slurmctld.pid"
    export SLURM_CONF=$dir/slurm.conf
    start_slurm "$(in_series slurmd -V | awk '{print $2}')"
}

case $cmd in
up) cluster_up ;;
down) cluster_down ;;
restart) cluster_restart ;;
*) usage ;;
esac
