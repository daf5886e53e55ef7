#!/usr/bin/env bash
# part1.sh: the first GPU command of docs/gpu-validation.md's plan (issue
# 16): the driver and entry routes, context bytes against NVML, suspend and
# resume through the checkpoint API, PyTorch under cogpu (overhead and
# expandable segments), and the preload's cost on the real driver. Expects
# a build in build/ (carried) with build/experiment (nvcc workloads).
# Writes everything under $OUT (or ./gpu-out).
set -u
O=${OUT:-$PWD/gpu-out}; mkdir -p "$O"
B=$PWD/build
export COGPU_STATE_DIR=/tmp/cogpu-state COGPU_CONFIG=
log() { echo "=== $* ($(date +%T))"; }
{
log env
nvidia-smi; nvidia-smi -q | grep -iE 'driver version|cuda version|persistence mode|product name'
uname -r; ldd --version | head -1; nproc; free -g | head -2
cat /proc/sys/kernel/yama/ptrace_scope 2>/dev/null
python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)'
log doctor
COGPU_LOG=info $B/cogpu doctor; echo "doctor rc=$?"
} > "$O/env-doctor.txt" 2>&1

log stencil-context
{
# The same stencil without and with cogpu; NVML per process while it runs.
for mode in plain cogpu; do
	if [ $mode = plain ]; then
		$B/experiment/stencil --mem-gib 4 --gpu-seconds 6 --cpu-seconds 0 --phases 1 &
	else
		COGPU_LOG=info $B/cogpu run -- $B/experiment/stencil --mem-gib 4 --gpu-seconds 6 --cpu-seconds 0 --phases 1 &
	fi
	p=$!
	sleep 4
	echo "--- $mode: nvidia-smi per process"
	nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv
	nvidia-smi --query-gpu=memory.used --format=csv
	if [ $mode = cogpu ]; then echo "--- cogpu status"; $B/cogpu status --json; $B/cogpu status; fi
	wait $p; echo "$mode rc=$?"
done
# A bare context (cuInit + primary context, no allocation): what it costs.
$B/tests/cudaprog direct init ctx hold:3000 2>&1 &
p=$!; sleep 2; echo "--- bare context"; nvidia-smi --query-compute-apps=pid,used_memory --format=csv; wait $p; echo "cudaprog rc=$?"
} > "$O/stencil-context.txt" 2>&1

log routes
{
# Every route the preload recognises, every memory path cudaprog has, on
# the real driver: exit codes, "does not recognise" lines, and the job's
# count in cogpu status while it holds its memory.
for r in direct dlsym runtime legacy; do
	echo "--- route $r"
	COGPU_LOG=info timeout 60 $B/cogpu run --mem 4G -- $B/tests/cudaprog $r init ctx alloc:256M pitch:4096:1024 async:64M vmm:64M array:1024:1024 mipmap:256:256:4 graph:64M info hold:2500 free asyncfree vmmfree arrayfree mipmapfree &
	p=$!; sleep 2; $B/cogpu status --json; nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
	wait $p; echo "route $r rc=$?"
done
} > "$O/routes.txt" 2>&1

log suspend-sizes
timeout 240 $B/bench/bench-suspend --sizes 1,10,40 --hold 2 > "$O/suspend.jsonl" 2> "$O/suspend.err"
echo "rc=$?" >> "$O/suspend.err"

log suspend-torch
{
S=bench/gpu/suspend-torch.py
python3 $S --steps 3000 --every 250 > /tmp/torch-a.txt 2>&1; echo "plain rc=$?"
rm -f /tmp/torch.pid
python3 $S --steps 3000 --every 250 --pidfile /tmp/torch.pid > /tmp/torch-b.txt 2>&1 &
tp=$!
for i in $(seq 100); do [ -s /tmp/torch.pid ] && break; sleep 0.1; done
sleep 2
$B/bench/bench-suspend --pid "$(cat /tmp/torch.pid)" --hold 3; echo "bench-suspend rc=$?"
wait $tp; echo "suspended rc=$?"
echo "--- uninterrupted"; cat /tmp/torch-a.txt
echo "--- suspended for 3 s"; cat /tmp/torch-b.txt
if diff <(grep -o 'loss [0-9.]*\|final [0-9.]*' /tmp/torch-a.txt) <(grep -o 'loss [0-9.]*\|final [0-9.]*' /tmp/torch-b.txt); then echo "LOSSES IDENTICAL"; else echo "LOSSES DIFFER"; fi
} > "$O/suspend-torch.txt" 2>&1

log torch-overhead
{
R=bench/experiment/workloads/resnet.py
for i in 1 2 3; do
	echo "plain $i: $(python3 $R --steps 400 --batch 64 2>&1 | grep -E 'seconds=|peak_bytes=' | tr '\n' ' ')"
	echo "cogpu $i: $(COGPU_LOG=info $B/cogpu run -- python3 $R --steps 400 --batch 64 2>&1 | grep -E 'seconds=|peak_bytes=|cogpu' | tr '\n' ' ')"
done
echo "--- expandable segments, under cogpu, status while it runs"
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True COGPU_LOG=info $B/cogpu run -- python3 $R --steps 600 --batch 64 --footprint-gib 3 > /tmp/exp.txt 2>&1 &
p=$!; sleep 12; $B/cogpu status; nvidia-smi --query-compute-apps=pid,used_memory --format=csv; wait $p; echo "rc=$?"; cat /tmp/exp.txt
echo "--- --mem 6G with footprint 4"
COGPU_LOG=info $B/cogpu run --mem 6G -- python3 $R --steps 200 --batch 64 --footprint-gib 4 2>&1 | tail -5
} > "$O/torch.txt" 2>&1

log bench-preload
{
export COGPU_LOG=error BENCH_ITERS=20000 BENCH_STARTUP_RUNS=4 BENCH_BURST_ROUNDS=5
export BENCH_CUDAPROG=$B/tests/cudaprog
rm -rf $COGPU_STATE_DIR
$B/bench/bench-preload
rm -rf $COGPU_STATE_DIR
LD_PRELOAD=$B/libcogpu-preload.so COGPU_MEM=8G $B/bench/bench-preload
rm -rf $COGPU_STATE_DIR
LD_PRELOAD=$B/libcogpu-preload.so COGPU_GROW_STEP=64M $B/bench/bench-preload
} > "$O/bench-preload.jsonl" 2> "$O/bench-preload.err"
log done
