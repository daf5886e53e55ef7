#!/bin/sh
# Mean wait of the short and the long GPU jobs under each policy of a
# `cogpu sim --jobs` output: short as the latency policy says (a run time at
# most the median of the GPU jobs', the lower one), run times taken from
# REF's jobs (a policy that suspends nobody: end - start is the run time).
# Usage: short.sh DIR REF POLICY...
d=$1 ref=$2; shift 2
m=$(awk -F, 'NR > 1 && $5 > 0 && $4 != "" { print $4 - $3 }' "$d/$ref-jobs.csv" |
  sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')
for p in "$@"; do
  f=$(printf %s "$p" | sed 's/[^A-Za-z0-9_-]/-/g')
  awk -F, -v m="$m" -v p="$p" '
    FNR == 1 { next }
    NR == FNR { if ($5 > 0 && $4 != "") d[$1] = $4 - $3; next }
    $5 > 0 && $4 != "" && ($1 in d) {
      w = $3 - $2
      if (d[$1] <= m) { sw += w; sn++ } else { lw += w; ln++ } }
    END { printf "%s: short (<= %s s) %d jobs, wait %.0f s; long %d jobs, wait %.0f s\n",
          p, m, sn, sn ? sw / sn : 0, ln, ln ? lw / ln : 0 }' \
    "$d/$ref-jobs.csv" "$d/$f-jobs.csv"
done
