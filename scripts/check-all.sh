#!/usr/bin/env bash
# scripts/check-all.sh: the whole suite, every build and every pass (what
# `make check-all` runs; README, "Set up and test").
#
# Passes: plain and ASan+UBSan, each daemonless then in node mode; TSan
# daemonless, then in node mode the tests where threads share a daemon
# connection (TSAN_NODE_TESTS, from the Makefile). Each pass runs its tests
# in parallel (run-tests -j, COGPU_TEST_JOBS). The three builds come first.
# Then the plain daemonless pass, which holds the Slurm tests (one cluster
# at a time: a chain of about four minutes that no parallelism shortens),
# runs in the background while the other passes run one after another
# beside it. Each pass's output goes to a log, printed whole when the pass
# ends, so passes never interleave; the summary lists every pass with its
# time, and the exit status is 1 if any pass failed.
set -uo pipefail
cd "$(dirname "$0")/.."
ncpu=$(nproc 2>/dev/null || echo 2)
start=$(date +%s)
for san in "" asan tsan; do
  t0=$(date +%s)
  if ! make --no-print-directory -j"$ncpu" SAN="$san" all; then
    echo "check-all: the ${san:-plain} build failed" >&2
    exit 1
  fi
  echo "check-all: ${san:-plain} build: $(($(date +%s) - t0)) s"
done
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
tsan_node=$(make --no-print-directory -s print-tsan-node-tests)

# run_pass NAME MAKE-ARGS...: one pass, its log, its line in $logs/summary.
run_pass() {
  local name=$1 t0 rc
  shift
  t0=$(date +%s)
  make --no-print-directory "$@" >"$logs/$name.log" 2>&1
  rc=$?
  echo "=== $name: make $* ==="
  cat "$logs/$name.log"
  printf '%-10s %s in %d s: %s\n' "$name" "$([ $rc = 0 ] && echo ok ||
    echo FAILED)" "$(($(date +%s) - t0))" \
    "$(grep -E '^[0-9]+ passed' "$logs/$name.log" | tail -1)" \
    >>"$logs/summary"
  return $rc
}

run_pass plain check >"$logs/plain.out" 2>&1 &
bg=$!
fail=0
run_pass node check-node || fail=1
run_pass asan SAN=asan check || fail=1
run_pass asan-node SAN=asan check-node || fail=1
run_pass tsan SAN=tsan check || fail=1
run_pass tsan-node SAN=tsan check-node T="$tsan_node" || fail=1
wait $bg || fail=1
cat "$logs/plain.out"
echo "=== check-all: $(($(date +%s) - start)) s ==="
cat "$logs/summary"
exit $fail
