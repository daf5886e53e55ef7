#!/bin/sh
# sim-fgd.sh: FGD's arrivals-only experiment (its Fig. 9 and 11-14) with
# `cogpu sim --fgd` (docs/simulation.md) on every workload its artifact
# publishes curves for, against the Alibaba openb GPU node list: every
# placement, SEEDS seeds (10, from 42, as the artifact), compared with the
# artifact's means at 100 % and 130 % arrived (scripts/sim-fgd-expected.csv)
# for the three curves: allocation, fragmentation (of all GPUs) and
# fragmentation ratio (to the idle GPU). Fails if an allocation or a
# fragmentation differs by more than TOL points (1). The ratio is
# compared and shown, and gates only with RATIO_TOL: near a full cluster
# it divides two small numbers (fragmentation / idle GPU, about 4 / 4.3
# at 130 %), so 0.05 point of allocation moves it by a point, and the
# artifact's own seeds spread by 2-4 points at 100 % on the gpuspec lists
# (docs/simulation.md). OUTDIR/compare.md gets the tables (a '*' marks a
# difference past its tolerance, or a ratio's past 1 point). REUSE=1
# compares the runs already in OUTDIR again without running them.
#
# Usage: B=build scripts/sim-fgd.sh [OUTDIR]
#        (COGPU_TRACES, SEEDS, TOL, RATIO_TOL, REUSE, WORKLOADS="default ...")
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
B=${B:-build}
case $B in /*) ;; *) B=$root/$B ;; esac
traces=${COGPU_TRACES:-$root/../shared/traces}
a=$traces/alibaba-clusterdata
exp=$root/scripts/sim-fgd-expected.csv
out=${1:-$(mktemp -d "${TMPDIR:-/tmp}/cogpu-fgd.XXXXXX")}
mkdir -p "$out"
all=$(awk -F, '!/^#/ && $1 != "workload" && !s[$1]++ { print $1 }' "$exp")
workloads=${WORKLOADS:-$all}
: >"$out/compare.md"
bad=0
for w in $workloads; do
	if ! grep -q "^$w," "$exp"; then
		echo "sim-fgd: no published curves for '$w'" >&2
		exit 2
	fi
	if [ -z "${REUSE:-}" ] || [ ! -f "$out/$w/fgd.md" ]; then
		"$B/cogpu" sim --fgd all --trace "$a/openb_pod_list_$w.csv" \
			--format alibaba --cluster "$a/openb_node_list_gpu_node.csv" \
			--seed 42 --seeds "${SEEDS:-10}" --upto 130 --out "$out/$w" \
			--quiet
	fi
	# fgd.md's rows: | placement | a100 | a130 | failed | f100 | f130 |
	# r100 | r130 |, against the published row of the same placement.
	awk -F'|' -v w="$w" -v tol="${TOL:-1}" -v rtol="${RATIO_TOL:-0}" \
		-v md="$out/compare.md" '
	FNR == NR {
		if ($0 ~ /^#/) next
		split($0, f, ",")
		if (f[1] == w) pub[f[2]] = f[3] " " f[4] " " f[5] " " f[6] " " \
			f[7] " " f[8]
		next
	}
	$2 ~ /^ [a-z]+ $/ {
		p = $2; gsub(/ /, "", p)
		if (!(p in pub)) next
		split(pub[p], e, " ")
		split($3 " " $4 " " $6 " " $7 " " $8 " " $9, o, " ")
		line = sprintf("| %s |", p)
		for (i = 1; i <= 6; i++) {
			d = o[i] - e[i]
			t = i <= 4 ? tol : rtol
			off = (t > 0 || i <= 4) && (d > t || d < -t)
			if (off) bad = 1
			if (i <= 4 && (d > worst || -d > worst)) worst = d < 0 ? -d : d
			if (i > 4 && (d > rworst || -d > rworst)) rworst = d < 0 ? -d : d
			line = line sprintf(" %.2f | %.2f | %+.2f%s |", o[i], e[i], d, \
				off || (i > 4 && (d > 1 || d < -1)) ? "*" : "")
		}
		rows = rows line "\n"
		n++
	}
	END {
		printf "### %s\n\n", w >>md
		printf "| placement | alloc 100 | pub. | diff | alloc 130 | pub. | " \
			"diff | frag 100 | pub. | diff | frag 130 | pub. | diff | " \
			"ratio 100 | pub. | diff | ratio 130 | pub. | diff |\n" >>md
		printf "|---|%s\n", "---:|---:|---:|---:|---:|---:|---:|---:|" \
			"---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|" >>md
		printf "%s\n", rows >>md
		if (n != 6) { print "sim-fgd: " w ": expected 6 placements, got " n; exit 1 }
		printf "sim-fgd: %-11s largest difference %.2f point (allocation, " \
			"fragmentation), %.2f (ratio)%s\n", w, worst, rworst, \
			bad ? ": past the tolerance" : ""
		exit bad
	}' "$exp" "$out/$w/fgd.md" || bad=1
done
if [ "$bad" -ne 0 ]; then
	echo "sim-fgd: a figure is past its tolerance (tables in $out/compare.md)"
	exit 1
fi
echo "sim-fgd: every allocation and fragmentation within ${TOL:-1} point of the published curves (tables in $out/compare.md; points per seed in $out/*/fgd.csv)"
