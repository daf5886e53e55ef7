#!/usr/bin/env bash
# suspend.sh: the suspension steps of docs/gpu-validation.md (issue 12) on
# a lent GPU machine, one step per command, each within the machine's
# 10-minute limit. Run it from the repository root, as root (the daemon
# needs ptrace rights over the jobs it suspends, and is not their
# ancestor). Builds into build/ unless a build was carried there. Writes
# everything under $OUT (or ./gpu-out).
#
#   bench/gpu/suspend.sh sizes   suspend/resume time and data at 1, 10 and
#                                40 GiB: the driver alone (bench-suspend)
#                                and end to end through cogpu
#                                (bench-suspend-job); about 5 minutes
#   bench/gpu/suspend.sh host    where the suspended copy lives: the job's
#                                RSS, locked/pinned memory, its cgroup's
#                                charge, MemAvailable, NVML, while a 10 GiB
#                                job is suspended; then a job whose memory
#                                cgroup is smaller than its GPU footprint;
#                                about 2 minutes
#   bench/gpu/suspend.sh torch   a PyTorch job suspended mid-training and
#                                resumed, by the driver directly and through
#                                cogpu: its losses must equal an
#                                uninterrupted run's; about 4 minutes
# The growing-jobs mix is bench/experiment/run.sh --mix growing (see
# docs/gpu-validation.md for its commands).
set -u
step=${1:-}
case $step in sizes | host | torch) ;; *)
	sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
	exit 2
	;;
esac
O=${OUT:-$PWD/gpu-out}
mkdir -p "$O"
B=$PWD/build
log() { echo "=== $* ($(date +%T))"; }

if [ ! -x "$B/cogpud" ] || [ ! -x "$B/bench/bench-suspend-job" ] ||
	[ ! -x "$B/tests/cudaprog" ]; then
	log build
	if ! { make -j"$(nproc)" all && make -j"$(nproc)" "$B/bench/bench-suspend" \
		"$B/bench/bench-suspend-job"; } >"$O/build-$step.log" 2>&1; then
		tail -30 "$O/build-$step.log"
		exit 1
	fi
fi

# A private node: its own state, socket and daemon; never a node's own.
T=$(mktemp -d /tmp/cogpu-gpu.XXXXXX)
export COGPU_CONFIG='' COGPU_STATE_DIR=$T/state COGPU_SOCKET=$T/cogpud.sock \
	COGPU_DAEMON_DIR=$T/cogpud COGPU_NODE_MODE=single
dpid=
stop_daemon() {
	[ -n "$dpid" ] || return 0
	kill -TERM "$dpid" 2>/dev/null
	for _ in $(seq 100); do kill -0 "$dpid" 2>/dev/null || break; sleep 0.1; done
	kill -KILL "$dpid" 2>/dev/null
	wait "$dpid" 2>/dev/null
	dpid=
}
trap 'stop_daemon; rm -rf "$T"' EXIT
trap 'exit 130' INT TERM

# start_daemon: cogpud with the node's defaults; returns once it
# has initialised CUDA (its cuInit takes seconds) or said why it cannot
# suspend. Its log: $O/cogpud-$step.log.
start_daemon() {
	env -u COGPU_NODE_MODE COGPU_LOG=info "$B/cogpud" \
		2>>"$O/cogpud-$step.log" </dev/null &
	dpid=$!
	for _ in $(seq 600); do
		if ! kill -0 "$dpid" 2>/dev/null; then
			echo "cogpud exited at start"
			dpid=
			return 1
		fi
		[ -S "$COGPU_SOCKET" ] &&
			grep -q 'checkpoint API of\|cannot be suspended' "$O/cogpud-$step.log" &&
			break
		sleep 0.1
	done
	grep 'checkpoint API of\|cannot be suspended' "$O/cogpud-$step.log"
	export COGPU_NODE_MODE=daemon
}

# The memory cgroup of a process: v2 memory.current, else v1
# memory.usage_in_bytes; and the charge's kinds (memory.stat).
cg_dir() {
	local v2 v1
	v2=$(sed -n 's/^0:://p' "/proc/$1/cgroup")
	v1=$(sed -n 's/^[0-9]*:[^:]*memory[^:]*://p' "/proc/$1/cgroup")
	if [ -n "$v1" ] && [ -d "/sys/fs/cgroup/memory$v1" ]; then
		echo "/sys/fs/cgroup/memory$v1"
	elif [ -e "/sys/fs/cgroup$v2/memory.current" ]; then
		echo "/sys/fs/cgroup$v2"
	fi
}

# host_memory LABEL PID: the process's memory, its cgroup's, the node's.
host_memory() {
	local d
	echo "--- $1: pid $2"
	grep -E '^(VmRSS|RssAnon|RssFile|RssShmem|VmLck|VmPin|VmSwap)' "/proc/$2/status"
	d=$(cg_dir "$2")
	if [ -n "$d" ]; then
		echo "cgroup $d: $(cat "$d/memory.current" "$d/memory.usage_in_bytes" 2>/dev/null | head -1) bytes," \
			"max $(cat "$d/memory.max" "$d/memory.limit_in_bytes" 2>/dev/null | head -1)"
		grep -E '^(total_)?(anon|file|shmem|unevictable|mlocked|rss|cache|mapped_file) ' "$d/memory.stat"
	else
		echo "no memory cgroup found"
	fi
	grep -E '^(MemAvailable|Mlocked|Unevictable|Shmem):' /proc/meminfo
	nvidia-smi --query-gpu=memory.used --format=csv,noheader
	nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
}

# job_start TAG ARGS...: starts `cogpu run -- ARGS` (the job keeps that pid:
# cogpu run execs); output in $O/TAG.txt.
job_start() {
	local tag=$1
	shift
	"$B/cogpu" run -- "$@" >"$O/$tag.txt" 2>&1 </dev/null &
	jpid=$!
}

# Waits (60 s at most) until the job's output has a line matching $1.
job_wait_line() {
	for _ in $(seq 600); do
		grep -q "$1" "$O/$2.txt" 2>/dev/null && return 0
		kill -0 "$jpid" 2>/dev/null || return 1
		sleep 0.1
	done
	return 1
}

timed() { # timed CMD...: runs it, prints its output and wall time
	local t0=$EPOCHREALTIME rc
	"$@"
	rc=$?
	echo "[$* -> rc $rc, $(awk "BEGIN { printf \"%.3f\", $EPOCHREALTIME - $t0 }") s]"
	return $rc
}

{
	log "$step: environment"
	nvidia-smi
	nvidia-smi -q | grep -iE 'driver version|cuda version|persistence mode|product name'
	uname -r
	id
	echo "ptrace_scope $(cat /proc/sys/kernel/yama/ptrace_scope 2>/dev/null || echo none)"
	free -g | head -2
	cat /proc/self/cgroup
	git rev-parse --short HEAD 2>/dev/null
} >"$O/env-$step.txt" 2>&1

# Everything from here on also goes to $O/$step.txt (not a pipeline: the
# daemon's pid must stay in this shell for the exit trap).
exec > >(tee "$O/$step.txt") 2>&1

case $step in
sizes)
	# The driver alone: Lock, Checkpoint, Restore, Unlock of a target of
	# each size that fills every word with a pattern, keeps a heartbeat
	# thread calling the driver, and verifies every word afterwards; with
	# NVML's used memory, the target's RSS and its cgroup.
	log "bench-suspend --sizes 1,10,40"
	timeout 280 "$B/bench/bench-suspend" --sizes 1,10,40 --hold 2 \
		>"$O/suspend-driver.jsonl" 2>"$O/suspend-driver.err"
	echo "rc=$?" >>"$O/suspend-driver.err"
	cat "$O/suspend-driver.jsonl"
	# Through cogpu: `cogpu suspend` and `cogpu resume` of a job under
	# `cogpu run`, end to end, 3 cycles a size; each job holds its memory
	# long enough for its cycles (at 2 GB/s or better), then verifies it.
	log "bench-suspend-job 1, 10, 40 GiB"
	if start_daemon; then
		# Holds: enough for 3 cycles at 3 GB/s or more (40 GiB: 6 x 14 s).
		for g in 1:15000 10:45000 40:110000; do
			BENCH_SUSPEND_GIB=${g%%:*} BENCH_SUSPEND_HOLD_MS=${g#*:} \
				BENCH_SUSPEND_REPS=3 BENCH_COGPU="$B/cogpu" \
				BENCH_CUDAPROG="$B/tests/cudaprog" BENCH_DAEMON_PID=$dpid \
				timeout 240 "$B/bench/bench-suspend-job" \
				>>"$O/suspend-cogpu.jsonl" 2>>"$O/suspend-cogpu.err"
			echo "${g%%:*} GiB rc=$?" >>"$O/suspend-cogpu.err"
		done
		stop_daemon
	fi
	cat "$O/suspend-cogpu.jsonl" "$O/suspend-cogpu.err"
	;;
host)
	start_daemon || exit 1
	log "a 10 GiB job, suspended"
	job_start host-job "$B/tests/cudaprog" direct init ctx alloc:10G \
		hold:40000 verify freeall
	job_wait_line "alloc " host-job
	host_memory "running" "$jpid"
	timed "$B/cogpu" suspend "$jpid"
	host_memory "suspended" "$jpid"
	"$B/cogpu" status
	sleep 5
	host_memory "suspended, 5 s later" "$jpid"
	timed "$B/cogpu" resume "$jpid"
	host_memory "resumed" "$jpid"
	wait "$jpid"
	echo "job rc=$? (0 and 'verify ok' expected)"
	cat "$O/host-job.txt"

	# A job whose memory cgroup is smaller than its GPU footprint (a Slurm
	# job's --mem below it): does the suspended copy count against it, and
	# is the job OOM-killed? Needs a writable memory cgroup (v1 or v2).
	log "a 10 GiB job in a 6 GiB memory cgroup, suspended"
	cg=
	if [ -d /sys/fs/cgroup/memory ] && mkdir -p /sys/fs/cgroup/memory/cogpu-val 2>/dev/null &&
		echo 6G >/sys/fs/cgroup/memory/cogpu-val/memory.limit_in_bytes 2>/dev/null; then
		cg=/sys/fs/cgroup/memory/cogpu-val
	elif grep -qw memory /sys/fs/cgroup/cgroup.controllers 2>/dev/null &&
		mkdir -p /sys/fs/cgroup/cogpu-val 2>/dev/null &&
		echo 6G >/sys/fs/cgroup/cogpu-val/memory.max 2>/dev/null; then
		cg=/sys/fs/cgroup/cogpu-val
	fi
	if [ -z "$cg" ]; then
		echo "no writable memory cgroup here: skipped"
	else
		(echo "$BASHPID" >"$cg/cgroup.procs" && exec "$B/cogpu" run -- \
			"$B/tests/cudaprog" direct init ctx alloc:10G hold:30000 verify \
			freeall) >"$O/cgroup-job.txt" 2>&1 </dev/null &
		jpid=$!
		job_wait_line "alloc " cgroup-job
		host_memory "in $cg, running" "$jpid"
		timeout 120 "$B/cogpu" suspend "$jpid"
		echo "suspend rc=$?"
		kill -0 "$jpid" 2>/dev/null && host_memory "in $cg, suspended" "$jpid"
		grep -E 'oom|failcnt' "$cg"/memory.events "$cg"/memory.failcnt 2>/dev/null
		timeout 120 "$B/cogpu" resume "$jpid"
		echo "resume rc=$?"
		timeout 120 tail --pid="$jpid" -f /dev/null
		wait "$jpid"
		echo "job rc=$? (137: OOM-killed)"
		cat "$O/cgroup-job.txt"
		"$B/cogpu" status
		rmdir "$cg" 2>/dev/null
	fi
	stop_daemon
	tail -20 "$O/cogpud-$step.log"
	;;
torch)
	S=bench/gpu/suspend-torch.py
	log "uninterrupted run"
	timeout 150 python3 "$S" --steps 3000 --every 250 >"$O/torch-plain.txt" 2>&1
	echo "plain rc=$?"
	# The driver directly: bench-suspend --pid, 3 s suspended.
	log "suspended by the driver (bench-suspend --pid)"
	rm -f "$T/torch.pid"
	python3 "$S" --steps 3000 --every 250 --pidfile "$T/torch.pid" \
		>"$O/torch-driver.txt" 2>&1 &
	tp=$!
	for _ in $(seq 300); do [ -s "$T/torch.pid" ] && break; sleep 0.1; done
	sleep 2
	timeout 120 "$B/bench/bench-suspend" --pid "$(cat "$T/torch.pid")" --hold 3
	echo "bench-suspend rc=$?"
	wait "$tp"
	echo "driver-suspended run rc=$?"
	# Through cogpu: the job under `cogpu run`, `cogpu suspend`, 3 s, `cogpu
	# resume`, as a user would.
	log "suspended through cogpu"
	start_daemon || exit 1
	rm -f "$T/torch.pid"
	job_start torch-cogpu python3 "$S" --steps 3000 --every 250 \
		--pidfile "$T/torch.pid"
	for _ in $(seq 300); do [ -s "$T/torch.pid" ] && break; sleep 0.1; done
	sleep 2
	"$B/cogpu" status
	host_memory "training" "$jpid"
	timed "$B/cogpu" suspend "$jpid"
	host_memory "suspended" "$jpid"
	sleep 3
	timed "$B/cogpu" resume "$jpid"
	wait "$jpid"
	echo "cogpu-suspended run rc=$?"
	stop_daemon
	for v in driver cogpu; do
		if diff <(grep -o 'loss [0-9.]*\|final [0-9.]*' "$O/torch-plain.txt") \
			<(grep -o 'loss [0-9.]*\|final [0-9.]*' "$O/torch-$v.txt"); then
			echo "$v: LOSSES IDENTICAL"
		else
			echo "$v: LOSSES DIFFER"
		fi
	done
	for v in plain driver cogpu; do echo "--- $v"; cat "$O/torch-$v.txt"; done
	;;
esac
log "$step done"
