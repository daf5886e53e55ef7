#!/usr/bin/env bash
# suspend-mix.sh: does suspension converge? (issue 25, docs/suspension.md)
#
# Runs the experiment kit's growing mixes on the fake driver against a
# private cogpud, for each shape and checkpoint bandwidth, twice in a row:
# "first" (a node that has never seen the jobs) and "learnt" (the same jobs
# again: the daemon has learnt their peaks from the first run's history),
# beside one-at-a-time in the same run. With B_BASE set, the same again
# with that build (e.g. main's), so that before and after are measured in
# one run on the same machine. Prints one JSON line per (build, shape,
# bandwidth, run): jobs finished, failed, suspensions, jobs suspended,
# the most suspensions of one job, bytes moved (out and back, from the
# daemon's log), time spent copying, makespan and its ratio to
# one-at-a-time.
#
# Usage: B=build [B_BASE=/path/to/other/build] bench/suspend-mix.sh
#        [--shapes "fake-growing fake-underdeclared"] [--gbps "10 2"]
#        [--suspend-max "1T"] [--gpus "16G"] [--migrate "no"] [--out DIR]
# --suspend-max: the daemon's suspend_max for each row (a host that can
# park little, e.g. 3G; 1T: no bound, the default).
# --gpus: the fake node's GPUs (FAKE_NVML_GPUS, e.g. "16G,16G": the jobs
# are placed on them by cogpu run); --migrate: the daemon's migrate option
# for each row ("no yes": both); a row counts the resumes that moved.
# About 15 s per shape and bandwidth at 10 GB/s on a 2-core VM; at
# 0.5 GB/s each first run moves gigabytes at that speed (minutes).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
shapes="fake-growing fake-underdeclared"
gbps_list="10 2"
caps="1T"
gpus="16G"
migrates="no"
out=
while [ $# -gt 0 ]; do
	case $1 in
	--shapes) shapes=$2; shift 2 ;;
	--gbps) gbps_list=$2; shift 2 ;;
	--suspend-max) caps=$2; shift 2 ;;
	--gpus) gpus=$2; shift 2 ;;
	--migrate) migrates=$2; shift 2 ;;
	--out) out=$2; shift 2 ;;
	*) echo "usage: $0 [--shapes LIST] [--gbps LIST] [--suspend-max LIST] [--gpus SIZES] [--migrate LIST] [--out DIR]" >&2; exit 2 ;;
	esac
done
B=${B:-build}
[ -n "$out" ] || out=$(mktemp -d /tmp/cogpu-suspend-mix.XXXXXX)
mkdir -p "$out"

scenario_of() { # shape -> the daemon-backed scenario that runs it
	case $1 in
	fake-underdeclared) echo cogpu-fifo-mem-suspend ;;
	*) echo cogpu-fifo-suspend ;;
	esac
}

# One JSON line from a run folder's results.json and daemon log.
report() { # build shape gbps run dir scenario suspend_max gpus migrate
	python3 - "$@" <<'EOF'
import json, re, sys
build, shape, gbps, run, d, scen, cap, gpus, migrate = sys.argv[1:10]
res = json.load(open(d + "/results.json"))
by = {s["name"]: s for s in res["scenarios"]}
s, one = by[scen], by.get("one-at-a-time")
moved = 0.0
copy_s = 0.0
moves = 0
unit = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
for line in open(d + "/" + scen + "/cogpud.log", errors="replace"):
    m = re.search(r"(suspended|resumed) the job of pid \d+ \(([\d.]+) (\w+)"
                  r"[^)]*\)(?: on GPU \d+ \(moved from GPU \d+\))?"
                  r" in ([\d.]+) s", line)
    moves += "(moved from GPU" in line
    if m:
        moved += float(m.group(2)) * unit.get(m.group(3), 1)
        copy_s += float(m.group(4))
most = 0
for j in s.get("job_results", []):
    most = max(most, int(j.get("suspended") or 0))
row = {
    "bench": "suspend-mix", "build": build, "shape": shape,
    "gbps": float(gbps), "suspend_max": cap, "gpus": gpus,
    "migrate": migrate, "run": run, "jobs": s["jobs"],
    "completed": s["jobs_completed"], "failed": s["jobs_failed"],
    "oom": s["jobs_oom"], "suspensions": s["suspensions"],
    "jobs_suspended": s["jobs_suspended"], "most_per_job": most,
    "moves": moves,
    "bytes_moved": int(moved), "copy_s": round(copy_s, 2),
    "makespan_s": s["makespan_s"],
    "one_at_a_time_s": one["makespan_s"] if one else None,
    "ratio_to_one_at_a_time":
        round(s["makespan_s"] / one["makespan_s"], 3) if one else None,
}
print(json.dumps(row))
EOF
}

run_build() { # label build-dir
	local label=$1 bdir=$2
	for shape in $shapes; do
		local scen
		scen=$(scenario_of "$shape")
		for cap in $caps; do
			for mg in $migrates; do
				for g in $gbps_list; do
					local d=$out/$label-$shape-$g-$cap-$gpus-$mg
					rm -rf "$d"
					# One at a time once per folder, then the mix twice:
					# the second run's daemon learns from the first one's
					# history.
					COGPU_EXP_SUSPEND_MAX=$cap COGPU_EXP_GPUS=$gpus \
						COGPU_EXP_MIGRATE=$mg B=$bdir FAKE_CUDA_CKPT_GBPS=$g \
						"$here/experiment/run.sh" --mix "$shape" --out "$d" \
						--scenarios "one-at-a-time,$scen" >"$d.log" 2>&1
					report "$label" "$shape" "$g" first "$d" "$scen" "$cap" "$gpus" "$mg"
					COGPU_EXP_SUSPEND_MAX=$cap COGPU_EXP_GPUS=$gpus \
						COGPU_EXP_MIGRATE=$mg B=$bdir FAKE_CUDA_CKPT_GBPS=$g \
						"$here/experiment/run.sh" --mix "$shape" --out "$d" \
						--scenarios "$scen" >>"$d.log" 2>&1
					report "$label" "$shape" "$g" learnt "$d" "$scen" "$cap" "$gpus" "$mg"
				done
			done
		done
	done
}

if [ -n "${B_BASE:-}" ]; then
	run_build base "$B_BASE"
fi
run_build new "$B"
