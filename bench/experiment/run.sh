#!/usr/bin/env bash
# run.sh: the workload-mix experiment (issue 6). Runs one mix of jobs in
# several scenarios and compares them:
#   one-at-a-time       each job alone, one after the other (an exclusive GPU)
#   naive               all jobs at once, no cogpu: some die of out-of-memory
#   cogpu-POLICY        all at once under `cogpu run`, on demand (no --mem),
#                       daemonless (single-user mode)
#   cogpu-POLICY-mem    the same with --mem set to each job's expected peak
#   cogpu-POLICY-auto   the same with --mem auto: what the job's same command
#                       peaked at in the history, plus auto_margin (a second
#                       run into the same DIR learns from the first's records;
#                       bench/history-predict.sh measures the prediction)
#   cogpu-...-suspend   a cogpu scenario against a private node daemon
#                       (cogpud) that suspends jobs to break hold-and-wait
#                       deadlocks (suspend=yes, docs/suspension.md)
#   cogpu-...-nosuspend the same daemon with suspend=no
# POLICY: fifo, mmu, priority-fifo, priority-mmu.
#
# Usage: bench/experiment/run.sh --mix MIX [--out DIR]
#            [--scenarios LIST] [--gpu INDEX] [--job-timeout SECONDS]
#   MIX: small, quick, large, growing (real GPU); fake, fake-growing,
#   fake-underdeclared, fake-growing-large
#   LIST: comma-separated scenario names (default: the mix's own "#
#         scenarios:" line, else the ten without a daemon)
#   fake*: synthetic jobs (tests/preload/cudaprog) on the fake driver and
#         the fake 16 GiB NVML GPU, from build directory $B (default
#         build); no GPU needed. The daemon's checkpoints copy at
#         FAKE_CUDA_CKPT_GBPS (default 10 GB/s); its suspend_max is
#         COGPU_EXP_SUSPEND_MAX (default 1T: no bound).
# Environment: B (build directory), COGPU (the cogpu binary), COGPUD (the
#   cogpud binary: next to cogpu, else on PATH, else $B/cogpud), PYTHON (a
#   python3 with torch, real mixes), WL_DIR (built CUDA workloads, default
#   $B/experiment), COGPU_EXP_PRELOAD (LD_PRELOAD for the jobs only: the
#   sanitizer runtime in sanitizer test runs). On a real GPU the daemon
#   needs ptrace rights over the jobs to suspend them: run as root.
# Writes DIR/results.json, DIR/results.md, DIR/plot.png (with gnuplot),
# DIR/jobs.tsv (raw per-job log), DIR/<scenario>/{samples.csv,jobs/*.log}.
# Runs into the same DIR add up: a scenario run again replaces its earlier
# result, the others are kept, and the results cover all of them. So a mix
# can be run a few scenarios at a time. DIR must hold results of the same
# mix (or none).
# Exit: 0 done, 2 bad usage or missing pieces, 1 analysis failed.
set -u

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
all_scenarios="one-at-a-time,naive,cogpu-fifo,cogpu-mmu,cogpu-priority-fifo,cogpu-priority-mmu,cogpu-fifo-mem,cogpu-mmu-mem,cogpu-priority-fifo-mem,cogpu-priority-mmu-mem"
# Every scenario run.sh knows, in the order results list them: the ten,
# then each cogpu scenario against a daemon without and with suspension,
# then the learned reservations (--mem auto).
known_scenarios=$all_scenarios
for s in ${all_scenarios//,/ }; do
	case $s in cogpu-*) known_scenarios+=",$s-nosuspend,$s-suspend" ;; esac
done
known_scenarios+=",cogpu-fifo-auto,cogpu-mmu-auto,cogpu-priority-fifo-auto,cogpu-priority-mmu-auto"

usage() {
	sed -n '2,/^# Exit/p' "$0" | sed 's/^# \{0,1\}//' >&2
	exit 2
}

mix= out= scenarios= gpu=0 job_timeout=
while [ $# -gt 0 ]; do
	case $1 in
	--mix) mix=${2:-}; shift 2 || usage ;;
	--out) out=${2:-}; shift 2 || usage ;;
	--scenarios) scenarios=${2:-}; shift 2 || usage ;;
	--gpu) gpu=${2:-}; shift 2 || usage ;;
	--job-timeout) job_timeout=${2:-}; shift 2 || usage ;;
	-h | --help) usage ;;
	*) echo "run.sh: unknown argument '$1'" >&2; usage ;;
	esac
done
mixfile=$here/mixes/$mix.mix
if [ -z "$mix" ] || [ ! -f "$mixfile" ]; then
	echo "run.sh: --mix must name one of: $(cd "$here/mixes" && ls | sed 's/\.mix$//' | tr '\n' ' ')" >&2
	exit 2
fi
# A mix may name the scenarios that make its point ("# scenarios: LIST").
if [ -z "$scenarios" ]; then
	scenarios=$(sed -n 's/^#[[:space:]]*scenarios:[[:space:]]*//p' "$mixfile" | head -n 1)
	: "${scenarios:=$all_scenarios}"
fi
# A mix may have its jobs declare less than their peaks in the -mem
# scenarios ("# declare_mib: N"): the under-declared shape, whose growth
# past --mem waits.
declare_mib=$(sed -n 's/^#[[:space:]]*declare_mib:[[:space:]]*//p' "$mixfile" | head -n 1)
for s in ${scenarios//,/ }; do
	case ",$known_scenarios," in
	*",$s,"*) ;;
	*) echo "run.sh: unknown scenario '$s' (known: $known_scenarios)" >&2; exit 2 ;;
	esac
done
fake=false
case $mix in fake*) fake=true ;; esac
if [ -n "$out" ] && [ -f "$out/meta.tsv" ]; then
	had=$(awk -F'\t' '$1 == "mix" { print $2 }' "$out/meta.tsv")
	if [ "$had" != "$mix" ]; then
		echo "run.sh: $out holds results of the '$had' mix, not '$mix': pick another --out" >&2
		exit 2
	fi
fi
command -v python3 >/dev/null || { echo "run.sh: python3 is needed" >&2; exit 2; }
command -v timeout >/dev/null || { echo "run.sh: timeout (coreutils) is needed" >&2; exit 2; }

B=${B:-build}
case $B in /*) bdir=$B ;; *) bdir=$root/$B ;; esac

if $fake; then
	: "${job_timeout:=60}"
	cudaprog=$bdir/tests/cudaprog
	COGPU=${COGPU:-$bdir/cogpu}
	COGPUD=${COGPUD:-$bdir/cogpud}
	for f in "$cudaprog" "$COGPU" "$bdir/tests/fakes/libcuda.so.1" "$bdir/tests/fakes/libnvidia-ml.so.1"; do
		[ -e "$f" ] || { echo "run.sh: $f missing: run 'make B=$B all'" >&2; exit 2; }
	done
	export LD_LIBRARY_PATH="$bdir/tests/fakes${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
	# COGPU_EXP_GPUS: the fake node's GPUs (bench/suspend-mix.sh --gpus).
	export FAKE_NVML_GPUS=${COGPU_EXP_GPUS:-16G} FAKE_CUDA_CTX_BYTES=300M
	export COGPU_CONTEXT_BYTES=300M COGPU_MARGIN=0 COGPU_CONFIG= COGPU_LOG=error
	# The fake's checkpoint copies take bytes / bandwidth in the caller
	# (the daemon); its suspended footprints cost the host nothing, so
	# the daemon's host-memory bounds must not refuse them, unless
	# COGPU_EXP_SUSPEND_MAX sets suspend_max (a host that can park
	# little: bench/suspend-mix.sh --suspend-max).
	export FAKE_CUDA_CKPT_GBPS=${FAKE_CUDA_CKPT_GBPS:-10}
	daemon_env=(COGPU_SUSPEND_HOST_MARGIN=0 COGPU_SUSPEND_MAX=${COGPU_EXP_SUSPEND_MAX:-1T}
		COGPU_MIGRATE=${COGPU_EXP_MIGRATE:-no})
	sampler_mode=fake
	: "${out:=$(mktemp -d "${TMPDIR:-/tmp}/cogpu-experiment-fake.XXXXXX")}"
	# The fake jobs' records stay with the results (never in the user's
	# own history), and later runs into the same DIR learn from them.
	mkdir -p "$out" || exit 2
	export COGPU_HISTORY_DIR=${COGPU_HISTORY_DIR:-$(cd "$out" && pwd)/history}
else
	: "${job_timeout:=1800}"
	if [ -z "${COGPU:-}" ]; then
		COGPU=$(command -v cogpu || echo "$bdir/cogpu")
	fi
	[ -x "$COGPU" ] || { echo "run.sh: no cogpu (install it, or set COGPU or B)" >&2; exit 2; }
	if [ -z "${COGPUD:-}" ]; then
		COGPUD=$(dirname "$COGPU")/cogpud
		[ -x "$COGPUD" ] || COGPUD=$(command -v cogpud || echo "$bdir/cogpud")
	fi
	daemon_env=()
	WL_DIR=${WL_DIR:-$bdir/experiment}
	PYTHON=${PYTHON:-python3}
	if grep -q '^[^#]*@WL' "$mixfile" && [ ! -x "$WL_DIR/stencil" ]; then
		echo "run.sh: no workloads in $WL_DIR: run 'make -C bench/experiment workloads B=$B'" >&2
		exit 2
	fi
	if command -v nvidia-smi >/dev/null; then
		sampler_mode=nvidia-smi
		used=$(nvidia-smi -i "$gpu" --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -n 1)
		if [ -n "$used" ] && [ "${used%%.*}" -gt 1024 ] 2>/dev/null; then
			echo "run.sh: warning: GPU $gpu already has $used MiB in use: results will be skewed" >&2
		fi
	else
		sampler_mode=none
		echo "run.sh: warning: no nvidia-smi: memory and utilisation are not sampled" >&2
	fi
	: "${out:=$root/bench/results/$(date +%Y-%m-%d)-experiment-$mix}"
fi
mkdir -p "$out" || exit 2
out=$(cd "$out" && pwd)

# Daemon-backed scenarios need cogpud; suspending real jobs needs ptrace
# rights over them (root: the daemon is no ancestor of the jobs).
case ",$scenarios," in
*suspend,*)
	[ -x "$COGPUD" ] || { echo "run.sh: no cogpud ($COGPUD): set COGPUD or B" >&2; exit 2; }
	if ! $fake && [ "$(id -u)" != 0 ]; then
		echo "run.sh: warning: not root: cogpud cannot checkpoint the jobs (ptrace rights): -suspend scenarios will behave like -nosuspend" >&2
	fi
	;;
esac

# The mix, one job a line: id, type, peak_mib, priority, command.
mapfile -t joblines < <(grep -v '^[[:space:]]*\(#\|$\)' "$mixfile")
njobs=${#joblines[@]}

expand() { # a mix command with its placeholders filled in
	local c=$1
	c=${c//@CUDAPROG/${cudaprog:-}}
	c=${c//@WL/${WL_DIR:-}}
	c=${c//@PYTHON/${PYTHON:-python3}}
	c=${c//@PY/$here/workloads}
	printf '%s' "$c"
}

now() { printf '%s' "${EPOCHREALTIME:-$(date +%s.%N)}"; }

children=()
daemon_pid=
cleanup() {
	for p in "${children[@]}"; do kill -TERM "$p" 2>/dev/null; done
	stop_daemon
}

# start_daemon yes|no: a private cogpud for this scenario (its state and
# log under $sdir; its socket in a short directory of its own, since a
# socket's path may not exceed 107 bytes), with suspension on or off; the
# jobs use it. Waits until it answers and has initialised CUDA (seconds on
# a real node): until then it can suspend nobody.
sockdir=
start_daemon() {
	if [ -z "$sockdir" ]; then
		sockdir=$(mktemp -d "${TMPDIR:-/tmp}/cogpu-exp.XXXXXX") || return 1
		trap 'rm -rf "$sockdir"' EXIT
	fi
	export COGPU_SOCKET=$sockdir/$scen.sock COGPU_DAEMON_DIR=$sdir/cogpud
	env -u COGPU_NODE_MODE -u LD_PRELOAD COGPU_SUSPEND="$1" COGPU_LOG=info \
		"${daemon_env[@]}" "$COGPUD" 2>"$sdir/cogpud.log" </dev/null &
	daemon_pid=$!
	for _ in $(seq 600); do
		if ! kill -0 "$daemon_pid" 2>/dev/null; then
			echo "run.sh: cogpud exited at start:" >&2
			cat "$sdir/cogpud.log" >&2
			daemon_pid=
			return 1
		fi
		if [ -S "$COGPU_SOCKET" ] && grep -q 'checkpoint API of\|cannot be suspended' "$sdir/cogpud.log"; then
			grep 'cannot be suspended' "$sdir/cogpud.log" >&2
			export COGPU_NODE_MODE=daemon
			return 0
		fi
		sleep 0.1
	done
	echo "run.sh: cogpud did not come up in 60 s:" >&2
	cat "$sdir/cogpud.log" >&2
	stop_daemon
	return 1
}

stop_daemon() {
	[ -n "$daemon_pid" ] || return 0
	kill -TERM "$daemon_pid" 2>/dev/null
	for _ in $(seq 100); do kill -0 "$daemon_pid" 2>/dev/null || break; sleep 0.05; done
	kill -KILL "$daemon_pid" 2>/dev/null
	wait "$daemon_pid" 2>/dev/null
	daemon_pid=
}
trap 'cleanup; exit 130' INT TERM

# One job: start, end, exit status into $sdir/jobs/ID.rec. The job is
# bounded by the job timeout (then killed); its output is in ID.log.
run_job() { # id type peak_mib priority scenario command...
	local id=$1 type=$2 peak=$3 prio=$4 scen=$5
	shift 5
	local pre=()
	if [ -n "${COGPU_EXP_PRELOAD:-}" ]; then
		pre=(env "LD_PRELOAD=$COGPU_EXP_PRELOAD")
	fi
	local cmd=()
	case $scen in
	one-at-a-time | naive) cmd=("$@") ;;
	cogpu-*-mem | cogpu-*-mem-*suspend) cmd=("$COGPU" run --mem "${declare_mib:-$peak}M" --priority "$prio" --gpu "$cogpu_gpu" -- "$@") ;;
	cogpu-*-auto) cmd=("$COGPU" run --mem auto --priority "$prio" --gpu "$cogpu_gpu" -- "$@") ;;
	cogpu-*) cmd=("$COGPU" run --priority "$prio" --gpu "$cogpu_gpu" -- "$@") ;;
	esac
	local t0 t1 rc
	t0=$(now)
	timeout -k 5 "$job_timeout" "${pre[@]}" "${cmd[@]}" >"$sdir/jobs/$id.log" 2>&1 </dev/null
	rc=$?
	t1=$(now)
	printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$scen" "$id" "$type" "$peak" "$prio" "$t0" "$t1" "$rc" >"$sdir/jobs/$id.rec"
}

# In fake mode every process sees the fake GPU as index 0; on a fake node
# of several GPUs (COGPU_EXP_GPUS) cogpu run places each job ("auto"), so
# that it sees them all, its own first, and may be moved (migrate).
cogpu_gpu=$gpu
$fake && cogpu_gpu=0
$fake && [[ ${COGPU_EXP_GPUS:-} == *,* ]] && cogpu_gpu=auto

commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
{
	printf 'mix\t%s\n' "$mix"
	printf 'gpu\t%s\n' "$gpu"
	printf 'sampler\t%s\n' "$sampler_mode"
	printf 'commit\t%s\n' "$commit"
	printf 'host\t%s\n' "$(uname -n)"
	printf 'date\t%s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
	printf 'cogpu\t%s\n' "$COGPU"
	# Settings that change the results (the policy, the daemon's tick, the
	# fake's copy bandwidth...), as this run had them before any scenario.
	printf 'settings\t%s\n' "$(env | grep -E '^(COGPU_[A-Z_]*|FAKE_CUDA_CKPT_GBPS)=' |
		grep -vE '^COGPU_(CONFIG|STATE_DIR|SOCKET|DAEMON_DIR|EXP_PRELOAD)=' | sort | tr '\n' ' ')"
	if [ "$sampler_mode" = nvidia-smi ]; then
		printf 'gpu_name\t%s\n' "$(nvidia-smi -i "$gpu" --query-gpu=name --format=csv,noheader 2>/dev/null)"
		printf 'driver\t%s\n' "$(nvidia-smi -i "$gpu" --query-gpu=driver_version --format=csv,noheader 2>/dev/null)"
		printf 'gpu_total_mib\t%s\n' "$(nvidia-smi -i "$gpu" --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null)"
	fi
} >"$out/meta.tsv"

# The combined logs, from every scenario this folder holds, in the
# canonical order.
combine() {
	: >"$out/jobs.tsv.tmp"
	: >"$out/scenarios.tsv.tmp"
	for s in ${known_scenarios//,/ }; do
		[ -f "$out/$s/scenario.tsv" ] || continue
		cat "$out/$s/scenario.tsv" >>"$out/scenarios.tsv.tmp"
		cat "$out/$s"/jobs/*.rec >>"$out/jobs.tsv.tmp" 2>/dev/null
	done
	mv "$out/jobs.tsv.tmp" "$out/jobs.tsv"
	mv "$out/scenarios.tsv.tmp" "$out/scenarios.tsv"
}

for scen in ${scenarios//,/ }; do
	sdir=$out/$scen
	rm -rf "$sdir"
	mkdir -p "$sdir/jobs"
	echo "run.sh: $mix mix, scenario $scen ($njobs jobs)" >&2
	suspend=
	case $scen in
	cogpu-*)
		# A private node state per scenario: the policy is fixed when the
		# state is created, and no scenario inherits another's queue.
		pol=${scen#cogpu-}
		case $pol in
		*-nosuspend) suspend=no pol=${pol%-nosuspend} ;;
		*-suspend) suspend=yes pol=${pol%-suspend} ;;
		esac
		pol=${pol%-mem}
		pol=${pol%-auto}
		export COGPU_STATE_DIR=$sdir/state COGPU_POLICY=$pol
		;;
	*) unset COGPU_POLICY ;;
	esac
	# Daemonless unless the scenario has a daemon of its own: a node's
	# cogpud (its socket at the default path) is never used.
	export COGPU_NODE_MODE=single
	unset COGPU_SOCKET COGPU_DAEMON_DIR
	# The fake driver's used-bytes, peak and out-of-memory counters start
	# afresh in every scenario.
	$fake && export FAKE_CUDA_STATE=$sdir/fake-cuda.state
	if [ -n "$suspend" ]; then
		# The jobs' warnings say when they were suspended and resumed.
		start_daemon "$suspend" || exit 1
		saved_log=${COGPU_LOG-}
		export COGPU_LOG=warn
	fi

	env -u LD_PRELOAD python3 "$here/sample.py" --mode "$sampler_mode" --gpu "$gpu" \
		--out "$sdir/samples.csv" &
	spid=$!
	children=("$spid")
	sleep 0.3
	t0=$(now)
	if [ "$scen" = one-at-a-time ]; then
		for line in "${joblines[@]}"; do
			read -r id type peak prio rest <<<"$line"
			read -r -a argv <<<"$(expand "$rest")"
			run_job "$id" "$type" "$peak" "$prio" "$scen" "${argv[@]}"
		done
	else
		pids=()
		for line in "${joblines[@]}"; do
			read -r id type peak prio rest <<<"$line"
			read -r -a argv <<<"$(expand "$rest")"
			run_job "$id" "$type" "$peak" "$prio" "$scen" "${argv[@]}" &
			pids+=("$!")
			children+=("$!")
		done
		# Bounded: every job is under its own timeout.
		for p in "${pids[@]}"; do wait "$p"; done
	fi
	t1=$(now)
	sleep 0.3
	kill -TERM "$spid" 2>/dev/null
	# The sampler exits within its interval; never wait on it for long.
	for _ in $(seq 50); do kill -0 "$spid" 2>/dev/null || break; sleep 0.1; done
	kill -KILL "$spid" 2>/dev/null
	wait "$spid" 2>/dev/null
	children=()
	if [ -n "$suspend" ]; then
		stop_daemon
		if [ -n "$saved_log" ]; then export COGPU_LOG=$saved_log; else unset COGPU_LOG; fi
	fi
	printf '%s\t%s\t%s\n' "$scen" "$t0" "$t1" >"$sdir/scenario.tsv"
	combine
	# Real GPU: let the driver settle between scenarios.
	$fake || sleep 5
done

env -u LD_PRELOAD python3 "$here/analyze.py" "$out" "$mixfile" || exit 1
echo "run.sh: results in $out (results.md, results.json$([ -f "$out/plot.png" ] && echo ', plot.png'))" >&2
