#!/bin/sh
# run.sh: runs every benchmark built by `make bench` against the fake NVML
# test double, on a private, throw-away node state. bench-preload runs three
# times against the fake CUDA driver: without the preload library, with it
# in reserve mode, and with it on demand.
#
# Usage: B=build bench/run.sh [> bench/results/DATE-DESC.jsonl]
#   B          build directory holding bench/ and tests/fakes/ (build)
#   BENCH_OUT  also append the JSON lines to this file
#   BENCH_*    knobs of the individual benchmarks (see each bench-*.c)
#   BENCH_MODES  which ledgers bench-reserve/-wakeup measure ("single node")
#   BENCH_ONLY   run only these benchmarks (names, e.g. "bench-reserve")
#   BENCH_CKPT_GBPS  the fake driver's checkpoint copy bandwidth in GB/s
#              for bench-suspend-job (10)
#   BENCH_TIMEOUT  seconds one benchmark run may take (300)
#   BENCH_SMOKE=1  a smoke run (CI, `make bench-smoke`): every benchmark
#              end to end with a hundredth of its default counts (bench.h),
#              two process counts; the figures mean nothing
#   BENCH_CPUS, BENCH_DAEMON_CPUS  pin the benchmarks, the daemon, to these
#              CPUs (taskset -c LIST): on a VM, a wake-up of another vCPU
#              costs tens of us, and an unpinned daemon's round trips mix
#              the two placements
# Prints one JSON object per line on stdout; progress goes to stderr.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
B=${B:-build}
case $B in
/*) bdir=$B ;;
*) bdir=$root/$B ;;
esac
fake=$bdir/tests/fakes
if [ ! -e "$fake/libnvidia-ml.so.1" ] || [ ! -d "$bdir/bench" ]; then
	echo "run.sh: $bdir has no benchmarks or fake NVML: run 'make bench'" >&2
	exit 2
fi

# A private state directory: benchmarks must neither see nor disturb a real
# node's ledger, and must not start from a previous run's leftovers.
tmp=$(mktemp -d "${TMPDIR:-/tmp}/cogpu-bench.XXXXXX")
daemon_pid=
stop_daemon() {
	if [ -n "$daemon_pid" ]; then
		kill "$daemon_pid" 2>/dev/null || :
		wait "$daemon_pid" 2>/dev/null || :
		daemon_pid=
	fi
}
trap 'stop_daemon; rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM

if [ "${BENCH_SMOKE:-}" = 1 ]; then
	export BENCH_SMOKE BENCH_PROCS=${BENCH_PROCS:-1,2}
	BENCH_TIMEOUT=${BENCH_TIMEOUT:-120}
fi

export LD_LIBRARY_PATH="$fake${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export COGPU_STATE_DIR="$tmp/state"
export COGPU_CONFIG=    # set and empty: read no config file
export FAKE_NVML_GPUS=80G
export COGPU_LOG=error
# Daemonless unless a run says otherwise: a node's own cogpud (its socket
# at the default path) must not be used, nor disturbed.
export COGPU_NODE_MODE=single
export COGPU_SOCKET="$tmp/cogpud.sock"
export COGPU_DAEMON_DIR="$tmp/cogpud"
# The fake CUDA driver (bench-preload): same GPU, its own fresh state file.
export FAKE_CUDA_STATE="$tmp/fake-cuda.state"
export FAKE_CUDA_CTX_BYTES=300M

# The commit the library was built from; "-dirty" when its sources differ
# from it, so a result is never credited to a commit it did not come from.
if [ -z "${COGPU_BENCH_COMMIT:-}" ]; then
	COGPU_BENCH_COMMIT=$(git -C "$root" rev-parse --short HEAD 2>/dev/null ||
		echo unknown)
	if [ "$COGPU_BENCH_COMMIT" != unknown ] &&
		[ -n "$(git -C "$root" status --porcelain -- src include Makefile 2>/dev/null)" ]; then
		COGPU_BENCH_COMMIT=$COGPU_BENCH_COMMIT-dirty
	fi
fi
# Sources edited after the library was built: the binaries are not what
# the commit (or the tree) says.
# (The daemon's own sources are not in the library: they count against
# cogpud.)
if [ -n "$(find "$root/src" "$root/include" -path "$root/src/daemon" -prune \
	-o -newer "$bdir/libcogpu.a" -print 2>/dev/null | head -n 1)" ] ||
	{ [ -e "$bdir/cogpud" ] && [ -n "$(find "$root/src" "$root/include" \
		"$root/tools/cogpud" -newer "$bdir/cogpud" 2>/dev/null |
		head -n 1)" ]; }; then
	echo "run.sh: warning: sources are newer than $bdir/libcogpu.a or $bdir/cogpud" >&2
	COGPU_BENCH_COMMIT=$COGPU_BENCH_COMMIT-stale
fi
export COGPU_BENCH_COMMIT

status=0

# start_daemon [VAR=VALUE...]: a private cogpud on a fresh state (its
# own, in $tmp), with the benchmarks' fake GPUs and the given settings.
# Root runs are admins (no per-user limits); others get limits that let
# bench-daemon attach 10,000 clients.
start_daemon() {
	stop_daemon
	rm -rf "$COGPU_DAEMON_DIR" "$COGPU_SOCKET"
	${BENCH_DAEMON_CPUS:+taskset -c "$BENCH_DAEMON_CPUS"} \
		env -u COGPU_NODE_MODE COGPU_USER_MAX_CLIENTS=16384 \
		COGPU_USER_MAX_WAITERS=4096 "$@" "$bdir/cogpud" 2>>"$tmp/cogpud.log" &
	daemon_pid=$!
	i=0
	while [ ! -S "$COGPU_SOCKET" ]; do
		i=$((i + 1))
		if [ $i -gt 500 ] || ! kill -0 "$daemon_pid" 2>/dev/null; then
			echo "run.sh: cogpud did not start:" >&2
			cat "$tmp/cogpud.log" >&2
			daemon_pid=
			return 1
		fi
		sleep 0.02
	done
	export BENCH_DAEMON_PID=$daemon_pid
}

# run_modes LABEL BIN: once per ledger in BENCH_MODES, the node run against
# a daemon of its own.
run_modes() {
	for m in ${BENCH_MODES:-single node}; do
		case $m in
		single) run_one "$1 (single)" COGPU_NODE_MODE=single "$2" ;;
		node)
			if start_daemon; then
				run_one "$1 (node)" COGPU_NODE_MODE=daemon "$2"
				stop_daemon
			else
				status=1
			fi
			;;
		*)
			echo "run.sh: BENCH_MODES: unknown mode '$m'" >&2
			status=1
			;;
		esac
	done
}

# run_one LABEL [VAR=VALUE...] BIN: one run of a benchmark on fresh state.
run_one() {
	label=$1
	shift
	echo "run.sh: $label" >&2
	rm -rf "$COGPU_STATE_DIR" "$FAKE_CUDA_STATE"
	# Bounded: a wedged benchmark fails the suite instead of hanging it.
	# Output goes through a file so that its exit status is not lost in a
	# pipeline (POSIX sh has no pipefail).
	if ! timeout -k 5 "${BENCH_TIMEOUT:-300}" \
		${BENCH_CPUS:+taskset -c "$BENCH_CPUS"} env "$@" >"$tmp/out"; then
		echo "run.sh: $label failed" >&2
		status=1
	fi
	cat "$tmp/out"
	cat "$tmp/out" >>"$tmp/all"
	if [ -n "${BENCH_OUT:-}" ]; then
		cat "$tmp/out" >>"$BENCH_OUT"
	fi
}

# bench-preload: the hooks' cost in reserve mode (every allocation inside
# the reservation: the hot path), and on demand (growing by 64 MiB steps).
run_preload() {
	pbin=$1
	pl=$bdir/libcogpu-preload.so
	if [ ! -e "$pl" ] || [ ! -e "$fake/libcuda.so.1" ] ||
		[ ! -x "$bdir/tests/cudaprog" ]; then
		echo "run.sh: bench-preload skipped: $bdir lacks libcogpu-preload.so," \
			"tests/fakes/libcuda.so.1 or tests/cudaprog" \
			"(make B=$B preload tests)" >&2
		return
	fi
	set -- BENCH_CUDAPROG="$bdir/tests/cudaprog" COGPU_CONTEXT_BYTES=300M
	run_one "bench-preload (no preload)" "$@" "$pbin"
	run_one "bench-preload (preload, reserve mode)" "$@" \
		LD_PRELOAD="$pl" COGPU_MEM=8G "$pbin"
	run_one "bench-preload (preload, on demand)" "$@" \
		LD_PRELOAD="$pl" COGPU_GROW_STEP=64M "$pbin"
	# Node mode: the same hooks with the reservation booked through
	# cogpud (issue 23's target: within 100 ns of single-user mode).
	case " ${BENCH_MODES:-single node} " in
	*" node "*)
		if start_daemon; then
			run_one "bench-preload (preload, reserve mode, node)" "$@" \
				COGPU_NODE_MODE=daemon LD_PRELOAD="$pl" COGPU_MEM=8G "$pbin"
			stop_daemon
		else
			status=1
		fi
		;;
	esac
}

# bench-peak: what peak tracking adds to an allocation, against the
# preload library built without it (bench/libcogpu-preload-nousage.so),
# daemonless, every allocation inside an 8 GiB reservation.
run_peak() {
	pl=$bdir/libcogpu-preload.so
	plx=$bdir/bench/libcogpu-preload-nousage.so
	if [ ! -e "$pl" ] || [ ! -e "$plx" ] || [ ! -e "$fake/libcuda.so.1" ]; then
		echo "run.sh: bench-peak skipped: $bdir lacks libcogpu-preload.so," \
			"bench/libcogpu-preload-nousage.so or tests/fakes/libcuda.so.1" \
			"(make B=$B bench)" >&2
		return
	fi
	run_one bench-peak COGPU_NODE_MODE=single COGPU_CONTEXT_BYTES=300M \
		BENCH_PRELOAD="$pl" BENCH_PRELOAD_NOUSAGE="$plx" "$1"
}

# bench-suspend-job: `cogpu suspend` and `cogpu resume` of a job under
# `cogpu run`, end to end, on the fake driver with a modelled copy
# bandwidth. The fake reads FAKE_CUDA_CKPT_GBPS in the caller of the
# checkpoint API, so the daemon gets it (the benchmark reads it back from
# the daemon for its baseline). The fake's footprints cost the host
# nothing: no host-memory bounds.
run_suspend_job() {
	if [ ! -e "$bdir/libcogpu-preload.so" ] || [ ! -x "$bdir/cogpu" ] ||
		[ ! -e "$fake/libcuda.so.1" ] || [ ! -x "$bdir/tests/cudaprog" ]; then
		echo "run.sh: bench-suspend-job skipped: $bdir lacks cogpu," \
			"libcogpu-preload.so, tests/fakes/libcuda.so.1 or" \
			"tests/cudaprog (make B=$B cli preload tests)" >&2
		return
	fi
	# The daemon and the jobs must share the fake driver's state file, and
	# run_one removes $FAKE_CUDA_STATE after the daemon has opened it: a
	# file of their own.
	fstate=$tmp/fake-cuda-suspend.state
	rm -f "$fstate"
	if start_daemon FAKE_CUDA_STATE="$fstate" \
		FAKE_CUDA_CKPT_GBPS="${BENCH_CKPT_GBPS:-10}" \
		COGPU_SUSPEND_HOST_MARGIN=0 COGPU_SUSPEND_MAX=1T; then
		run_one bench-suspend-job COGPU_NODE_MODE=daemon \
			FAKE_CUDA_STATE="$fstate" BENCH_COGPU="$bdir/cogpu" \
			BENCH_CUDAPROG="$bdir/tests/cudaprog" \
			COGPU_CONTEXT_BYTES=300M "$1"
		stop_daemon
	else
		status=1
	fi
}

for bin in "$bdir"/bench/bench-*; do
	[ -x "$bin" ] || continue
	name=$(basename "$bin")
	case " ${BENCH_ONLY:-$name} " in
	*" $name "*) ;;
	*) continue ;;
	esac
	case $name in
	bench-preload) run_preload "$bin" ;;
	bench-peak) run_peak "$bin" ;;
	bench-history)
		# The daemon's history in $tmp: the bench reads it back.
		if start_daemon COGPU_HISTORY_DIR="$tmp/history"; then
			run_one "$name" COGPU_NODE_MODE=daemon \
				BENCH_HISTORY_DB="$tmp/history/history.db" "$bin"
			stop_daemon
		else
			status=1
		fi
		;;
	bench-reserve | bench-wakeup | bench-scrape) run_modes "$name" "$bin" ;;
	bench-suspend-job) run_suspend_job "$bin" ;;
	bench-daemon)
		if start_daemon; then
			run_one "$name" COGPU_NODE_MODE=daemon "$bin"
			stop_daemon
		else
			status=1
		fi
		;;
	*) run_one "$name" "$bin" ;;
	esac
done
# The node/single ratios of this run (stderr: stdout stays JSON lines).
if [ -s "$tmp/all" ] && command -v python3 >/dev/null; then
	python3 "$here/compare.py" "$tmp/all" >&2 || :
fi
exit $status
