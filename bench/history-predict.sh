#!/usr/bin/env bash
# history-predict.sh: the prediction error of `cogpu run --mem auto`
# (docs/history.md, "Prediction error") on the experiment kit's fake mixes.
#
# For each mix, into one folder: a first run of the mix under cogpu, on
# demand (scenario cogpu-fifo: each job's exact peak goes into the
# folder's history), then what `cogpu history --suggest` says for each of
# the mix's commands, then a second run with --mem auto (cogpu-fifo-auto).
# For each job of the second run it compares what --mem auto reserved (and
# the peak it learned, before auto_margin) with the job's exact peak in
# that run: error = (predicted - peak) / peak, in % of the peak; positive
# is reserved beyond the need.
#
# Usage: B=build bench/history-predict.sh [--out DIR] [MIX...]
#   MIX: fake and fake-growing by default (the kit's mixes for the fake
#        driver; the others need a GPU)
# Writes DIR/MIX/ (the kit's results of both runs, its history) and
# DIR/prediction.json, DIR/prediction.md; prints the markdown.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
B=${B:-build}
case $B in /*) bdir=$B ;; *) bdir=$root/$B ;; esac
out=
if [ "${1:-}" = --out ]; then
	out=$2
	shift 2
fi
mixes=("$@")
[ ${#mixes[@]} -gt 0 ] || mixes=(fake fake-growing)
: "${out:=$(mktemp -d "${TMPDIR:-/tmp}/cogpu-predict.XXXXXX")}"
mkdir -p "$out"
out=$(cd "$out" && pwd)
for f in "$bdir/cogpu" "$bdir/tests/cudaprog" "$bdir/tests/fakes/libnvidia-ml.so.1"; do
	[ -e "$f" ] || { echo "history-predict.sh: $f missing: run 'make B=$B all'" >&2; exit 2; }
done

# The fake GPU as the kit's runs see it (its model is part of "the same
# command"), daemonless, for `cogpu history` here.
export LD_LIBRARY_PATH="$bdir/tests/fakes${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export FAKE_NVML_GPUS=16G COGPU_CONFIG='' COGPU_NODE_MODE=single COGPU_LOG=error

for mix in "${mixes[@]}"; do
	d=$out/$mix
	rm -rf "$d"
	mkdir -p "$d"
	export COGPU_HISTORY_DIR=$d/history COGPU_STATE_DIR=$d/cli-state
	B=$bdir "$root/bench/experiment/run.sh" --mix "$mix" --out "$d" \
		--scenarios cogpu-fifo >&2
	# What --mem auto will reserve for each command, learned from run 1.
	: >"$d/suggest.jsonl"
	grep -v '^[[:space:]]*\(#\|$\)' "$root/bench/experiment/mixes/$mix.mix" |
		while read -r _id _type _peak _prio rest; do
			read -r -a argv <<<"${rest//@CUDAPROG/$bdir/tests/cudaprog}"
			"$bdir/cogpu" history --suggest --json -- "${argv[@]}" >>"$d/suggest.jsonl"
		done
	"$bdir/cogpu" history --json >"$d/history-run1.json"
	B=$bdir "$root/bench/experiment/run.sh" --mix "$mix" --out "$d" \
		--scenarios cogpu-fifo-auto >&2
	"$bdir/cogpu" history --json >"$d/history-all.json"
done

python3 - "$out" "${mixes[@]}" <<'EOF'
"""The error of each second-run job's prediction, per mix and overall."""
import json, os, statistics, sys

out, mixes = sys.argv[1], sys.argv[2:]
rows, per_mix = [], {}
for mix in mixes:
    d = os.path.join(out, mix)
    sug = {}
    for line in open(os.path.join(d, "suggest.jsonl")):
        s = json.loads(line)
        sug[s["command"]] = s
    run1 = {r["id"] for r in json.load(open(os.path.join(d, "history-run1.json")))}
    run2 = [r for r in json.load(open(os.path.join(d, "history-all.json")))
            if r["id"] not in run1]
    for r in sorted(run2, key=lambda r: r["id"]):
        s = sug.get(r["command"])
        if not s or not s["runs"] or not r["peak_bytes"]:
            rows.append(dict(mix=mix, command=r["command"], learned=None))
            continue
        peak = r["peak_bytes"]
        rows.append(dict(
            mix=mix, command=r["command"], peak=peak,
            learned=s["peak_bytes"], reserved=s["suggested_bytes"],
            runs=s["runs"], declared=r["declared_bytes"],
            exit_code=r["exit_code"],
            learned_err=100.0 * (s["peak_bytes"] - peak) / peak,
            reserved_err=100.0 * (s["suggested_bytes"] - peak) / peak,
            # Declared is the most its reservation held: --mem auto's
            # figure, or more if the job grew beyond it.
            grew=r["declared_bytes"] > s["suggested_bytes"]))
        if r["declared_bytes"] < s["suggested_bytes"]:
            sys.exit("history-predict.sh: a job of %s reserved %d bytes, not "
                     "the %d --mem auto was to use" % (
                         mix, r["declared_bytes"], s["suggested_bytes"]))

def summary(rs):
    ok = [r for r in rs if r.get("learned") is not None]
    if not ok:
        return dict(jobs=len(rs), predicted=0)
    le = [r["learned_err"] for r in ok]
    re = [r["reserved_err"] for r in ok]
    return dict(jobs=len(rs), predicted=len(ok),
                learned_err_median=statistics.median(le),
                learned_err_max=max(le, key=abs),
                reserved_err_median=statistics.median(re),
                reserved_err_max=max(re, key=abs),
                under_predicted=sum(1 for r in ok if r["reserved"] < r["peak"]),
                grew=sum(1 for r in ok if r["grew"]),
                failed=sum(1 for r in ok if r["exit_code"] != 0))

res = dict(mixes={m: summary([r for r in rows if r["mix"] == m]) for m in mixes},
           all=summary(rows), jobs=rows)
json.dump(res, open(os.path.join(out, "prediction.json"), "w"), indent=1)
md = ["| mix | jobs | predicted | learned peak error, median (max) | reserved error, median (max) | under-reserved | failed |",
      "|---|---:|---:|---:|---:|---:|---:|"]
for name, s in list(res["mixes"].items()) + [("all", res["all"])]:
    if not s.get("predicted"):
        md.append("| %s | %d | 0 | | | | |" % (name, s["jobs"]))
        continue
    md.append("| %s | %d | %d | %+.1f %% (%+.1f %%) | %+.1f %% (%+.1f %%) | %d | %d |" % (
        name, s["jobs"], s["predicted"], s["learned_err_median"], s["learned_err_max"],
        s["reserved_err_median"], s["reserved_err_max"], s["under_predicted"], s["failed"]))
md += ["", "| mix | command | runs learned from | learned peak (MiB) | reserved (MiB) | peak, run 2 (MiB) | reserved error |",
       "|---|---|---:|---:|---:|---:|---:|"]
seen = set()
for r in rows:
    if r.get("learned") is None or (r["mix"], r["command"], r["peak"]) in seen:
        continue
    seen.add((r["mix"], r["command"], r["peak"]))
    cmd = r["command"].split("cudaprog", 1)[-1].strip()
    md.append("| %s | `%s` | %d | %.0f | %.0f | %.0f | %+.1f %% |" % (
        r["mix"], cmd[:60], r["runs"], r["learned"] / 2**20, r["reserved"] / 2**20,
        r["peak"] / 2**20, r["reserved_err"]))
open(os.path.join(out, "prediction.md"), "w").write("\n".join(md) + "\n")
print("\n".join(md))
EOF
echo "history-predict.sh: results in $out (prediction.md, prediction.json)" >&2
