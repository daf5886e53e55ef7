#!/bin/sh
# sim-fgd.sh: FGD's arrivals-only experiment (its Fig. 9 and 11-14) with
# `cogpu sim --fgd` (docs/simulation.md) on every workload its artifact
# publishes curves for, against the Alibaba openb GPU node list: every
# placement, SEEDS seeds (10, from 42, as the artifact), compared with the
# artifact's means at 100 % and 130 % arrived (scripts/sim-fgd-expected.csv)
# for the three curves: allocation, fragmentation (of all GPUs) and
# fragmentation ratio (to the idle GPU). Fails if any differs by more than
# TOL points (1). OUTDIR/compare.md gets the tables.
#
# Usage: B=build scripts/sim-fgd.sh [OUTDIR]
#        (COGPU_TRACES, SEEDS, TOL, WORKLOADS="default gpuspec33 ...")
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
	"$B/cogpu" sim --fgd all --trace "$a/openb_pod_list_$w.csv" \
		--format alibaba --cluster "$a/openb_node_list_gpu_node.csv" \
		--seed 42 --seeds "${SEEDS:-10}" --upto 130 --out "$out/$w" --quiet
	# fgd.md's rows: | placement | a100 | a130 | failed | f100 | f130 |
	# r100 | r130 |, against the published row of the same placement.
	awk -F'|' -v w="$w" -v tol="${TOL:-1}" -v md="$out/compare.md" '
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
			if (d > tol || d < -tol) bad = 1
			if (d > worst || -d > worst) worst = d < 0 ? -d : d
			line = line sprintf(" %.2f | %.2f | %+.2f |", o[i], e[i], d)
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
		printf "sim-fgd: %-11s largest difference %.2f point%s\n", w, worst, \
			bad ? " (more than " tol ")" : ""
		exit bad
	}' "$exp" "$out/$w/fgd.md" || bad=1
done
if [ "$bad" -ne 0 ]; then
	echo "sim-fgd: a figure is more than ${TOL:-1} point off (tables in $out/compare.md)"
	exit 1
fi
echo "sim-fgd: every placement within ${TOL:-1} point of the published curves (tables in $out/compare.md; points per seed in $out/*/fgd.csv)"
