#!/bin/bash
# cluster.sh: a private one-node Slurm cluster for the tests, entirely under
# one directory, on loopback, with its own munge key and ports.
#   cluster.sh start DIR [GPUMEM]   start munged, slurmctld, slurmd; wait idle
#   cluster.sh stop DIR             cancel jobs, stop the daemons, kill leftovers
#   cluster.sh check DIR            list processes left behind; 1 if any
# DIR/env is written for callers to source (SLURM_CONF). Start-up and
# teardown are bounded; start failing leaves nothing running.
# Environment: COGPU_SPANK (the plug-in to load), COGPU_CLI_FILTER (a
# cli_filter.lua to use), COGPU_JOB_SUBMIT (a job_submit.lua to use), COGPU_CLUSTER_OWNER (a pid: when it is gone, the
# cluster stops itself, so a test killed outright leaves nothing behind).
# The daemons inherit the caller's environment (fake GPU, node state).
set -u
cmd=${1:?usage: cluster.sh start|stop DIR [GPUMEM]}
dir=${2:?usage: cluster.sh start|stop DIR [GPUMEM]}
gpumem=${3:-80G}
# COGPU_CLUSTER_GPUS=N: also N whole GPUs as `gpu` GRES (device files
# /dev/null, /dev/zero: Slurm needs files, the fake GPUs have none).
gpus=${COGPU_CLUSTER_GPUS:-0}
# COGPU_CLUSTER_GRES: the name of cogpu's GRES (gpumem: as before cogpu 0.2).
gres=${COGPU_CLUSTER_GRES:-cogpumem}
# COGPU_CLUSTER_GPU_SIZE: the node's largest GPU, as its cogpu_gpu_SIZE
# feature (what `cogpu slurm-conf` prints); none if empty.
gpu_size=${COGPU_CLUSTER_GPU_SIZE:-}
# COGPU_CLUSTER_PROCTRACK: cgroup (docs/slurm.md recommends it; cgroup v1
# here) or linuxproc (the default: needs nothing from the host). With
# cgroup the node gets a name of its own, which names its cgroups
# (slurm_NODE): clusters of other tests running at once must not share them.
proctrack=${COGPU_CLUSTER_PROCTRACK:-linuxproc}
# COGPU_CLUSTER_CPUS: the node's CPUs (16): a replay of many small jobs
# needs more, so that GPU memory, not CPUs, bounds how many run at once.
cpus=${COGPU_CLUSTER_CPUS:-16}
# COGPU_CLUSTER_SCHED: SchedulerParameters (sched_interval=1).
sched=${COGPU_CLUSTER_SCHED:-sched_interval=1}
# COGPU_CLUSTER_CONF_EXTRA: lines added to slurm.conf (e.g. MinJobAge).
extra=${COGPU_CLUSTER_CONF_EXTRA:-}
node=localhost
{ [ "$proctrack" = cgroup ] || [ -f "$dir/cgroup.conf" ]; } &&
  node=cg$(printf %s "$dir" | cksum | cut -d' ' -f1)
here=$(cd "$(dirname "$0")" && pwd)
PATH="$PATH:/usr/sbin"

die() { echo "cluster.sh: $*" >&2; exit 1; }

wait_for() { # wait_for SECONDS CMD...: poll until CMD succeeds
  local end=$((SECONDS + $1)); shift
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -ge $end ] && return 1
    sleep 0.1
  done
}

# Running, and not a zombie waiting for whoever adopted it to reap it.
alive() {
  local st
  st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null) || return 1
  [ "${st%% *}" != Z ]
}

pid_of() { [ -s "$dir/$1.pid" ] && cat "$dir/$1.pid"; }

stop_pid() { # stop_pid NAME: TERM, then KILL after 5 s
  local p; p=$(pid_of "$1") || return 0
  kill -TERM "$p" 2>/dev/null || { rm -f "$dir/$1.pid"; return 0; }
  local end=$((SECONDS + 5))
  while alive "$p"; do
    [ $SECONDS -ge $end ] && { kill -KILL "$p" 2>/dev/null; break; }
    sleep 0.1
  done
  rm -f "$dir/$1.pid"
}

# Processes started by this cluster's daemons: anything whose environment
# names this cluster's SLURM_CONF (job steps, tasks, holders).
leftovers() {
  # One grep over every process's environment (NUL-separated entries):
  # two processes per process on the machine took over 10 s while CI's
  # other passes ran beside this one.
  local conf="SLURM_CONF=$dir/slurm.conf" f p
  for f in $(grep -lzxF "$conf" /proc/[0-9]*/environ 2>/dev/null); do
    p=${f#/proc/}
    p=${p%/environ}
    alive "$p" && echo "$p"
  done
  return 0
}

stop() {
  [ -f "$dir/slurm.conf" ] || return 0
  local conf="$dir/slurm.conf"
  if [ -n "$(pid_of slurmctld)" ]; then
    SLURM_CONF=$conf timeout 5 sh -c 'j=$(squeue -h -o %A); [ -z "$j" ] || scancel --full $j' >/dev/null 2>&1
    SLURM_CONF=$conf wait_for 5 sh -c '[ -z "$(squeue -h 2>/dev/null)" ]'
  fi
  stop_pid slurmd
  stop_pid slurmctld
  # slurmstepd of a job that outlived slurmd, and its tasks.
  local p left
  left=$(leftovers | grep -vx "$$")
  for p in $left; do kill -KILL "$p" 2>/dev/null; done
  stop_pid munged
  # Cgroups slurmd left (proctrack/cgroup): empty once the jobs are gone.
  if [ -f "$dir/cgroup.conf" ]; then
    local d
    for d in /sys/fs/cgroup/*/slurm_"$node"; do
      [ -d "$d" ] && find "$d" -depth -type d -exec rmdir {} + 2>/dev/null
    done
  fi
  local w; w=$(pid_of watchdog) && [ "$w" != "$PPID" ] && kill "$w" 2>/dev/null
  rm -f "$dir/watchdog.pid"
  return 0
}

write_conf() {
  local port=$1
  cat >"$dir/slurm.conf" <<CONF
ClusterName=cogputest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge.sock
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid.conf
SlurmdPidFile=$dir/slurmd.pid.conf
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
SlurmctldDebug=info
SlurmdDebug=debug
ProctrackType=proctrack/$proctrack
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
SchedulerParameters=$sched
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
DefMemPerCPU=64
PlugStackConfig=$dir/plugstack.conf
GresTypes=$gres$([ "$gpus" -gt 0 ] && echo ,gpu)
${COGPU_CLI_FILTER:+CliFilterPlugins=cli_filter/lua}
${COGPU_JOB_SUBMIT:+JobSubmitPlugins=lua}
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$((cpus * 256)) Gres=$gres:$gpumem$([ "$gpus" -gt 0 ] && echo ",gpu:$gpus")${gpu_size:+ Features=cogpu_gpu_$gpu_size} State=UNKNOWN
PartitionName=test Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
$extra
CONF
  if [ "$proctrack" = cgroup ]; then
    printf 'CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\nCgroupAutomount=no\n' >"$dir/cgroup.conf"
  fi
  echo "Name=$gres Count=$gpumem Flags=CountOnly" >"$dir/gres.conf"
  local files="/dev/null /dev/zero" f i=0
  for f in $files; do
    [ $i -lt "$gpus" ] && echo "Name=gpu File=$f" >>"$dir/gres.conf"
    i=$((i + 1))
  done
  : >"$dir/plugstack.conf"
  [ -n "${COGPU_SPANK:-}" ] && echo "required $COGPU_SPANK" >"$dir/plugstack.conf"
  return 0
}

# A base port with it and the next one unused, below the ephemeral range
# (where outgoing connections would take ports from under us).
free_port() {
  local lo p
  lo=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null) || lo=32768
  [ "$lo" -gt 12000 ] 2>/dev/null || lo=32768
  for p in $(shuf -i 10000-$((lo - 2)) -n 50); do
    if ! ss -Htan "( sport = :$p or sport = :$((p + 1)) )" 2>/dev/null |
      grep -q .; then
      echo "$p"; return 0
    fi
  done
  return 1
}

# Start slurmctld and slurmd on a fresh port; 1 if either died (a port
# taken between the check and the bind) or the node is not idle in 30 s.
start_daemons() {
  local conf="$dir/slurm.conf" port end
  port=$(free_port) || return 1
  write_conf "$port"
  # Not exported: what carries SLURM_CONF in its environment is this
  # cluster's (see leftovers).
  SLURM_CONF=$conf slurmctld -D -i -f "$conf" >>"$dir/slurmctld.out" 2>&1 &
  echo $! >"$dir/slurmctld.pid"
  SLURM_CONF=$conf slurmd -D -N "$node" -f "$conf" >>"$dir/slurmd.out" 2>&1 &
  echo $! >"$dir/slurmd.pid"
  end=$((SECONDS + 30))
  until SLURM_CONF=$conf sinfo -h -N -o %T 2>/dev/null | grep -qx idle; do
    alive "$(pid_of slurmctld)" && alive "$(pid_of slurmd)" || return 1
    [ $SECONDS -ge $end ] && return 1
    sleep 0.1
  done
}

start() {
  for b in munged mungekey slurmctld slurmd sinfo; do
    command -v "$b" >/dev/null || [ -x "/usr/sbin/$b" ] || die "$b not installed"
  done
  mkdir -p "$dir/state" "$dir/spool" "$dir/munge" || die "cannot create $dir"
  chmod 0755 "$dir" "$dir/munge"
  mungekey --create --keyfile="$dir/munge/munge.key" --force ||
    die "mungekey failed"
  chmod 0600 "$dir/munge/munge.key"
  munged -F --socket="$dir/munge.sock" --key-file="$dir/munge/munge.key" \
    --pid-file="$dir/munge/munged.pid" --log-file="$dir/munged.log" \
    --seed-file="$dir/munge/seed" --force >>"$dir/munged.log" 2>&1 &
  echo $! >"$dir/munged.pid"
  wait_for 10 test -S "$dir/munge.sock" || { stop; die "munged did not start"; }
  if [ -n "${COGPU_CLI_FILTER:-}" ]; then
    cp "$COGPU_CLI_FILTER" "$dir/cli_filter.lua" || { stop; die "no cli_filter"; }
  fi
  if [ -n "${COGPU_JOB_SUBMIT:-}" ]; then
    cp "$COGPU_JOB_SUBMIT" "$dir/job_submit.lua" || { stop; die "no job_submit"; }
  fi
  echo "export SLURM_CONF=$dir/slurm.conf" >"$dir/env"
  local try=1
  until start_daemons; do
    stop_pid slurmd
    stop_pid slurmctld
    if [ $try -ge 3 ]; then
      {
        echo "--- slurmctld.log"; tail -20 "$dir/slurmctld.log"
        echo "--- slurmd.log"; tail -20 "$dir/slurmd.log"
      } >&2
      stop; die "the node did not become idle (3 tries)"
    fi
    try=$((try + 1))
  done
  if [ -n "${COGPU_CLUSTER_OWNER:-}" ]; then
    setsid sh -c 'while kill -0 "$1" 2>/dev/null; do sleep 0.5; done
                  exec "$2" stop "$3"' watchdog "$COGPU_CLUSTER_OWNER" \
      "$here/cluster.sh" "$dir" </dev/null >/dev/null 2>&1 &
    echo $! >"$dir/watchdog.pid"
  fi
}

check() {
  local left
  left=$(leftovers | grep -vx "$$")
  [ -z "$left" ] && return 0
  for p in $left; do
    echo "left behind: $p $(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null)"
  done
  return 1
}

case $cmd in
  start) start ;;
  stop) stop ;;
  check) check ;;
  *) die "unknown command $cmd" ;;
esac
