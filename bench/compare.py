#!/usr/bin/env python3
"""compare.py: node/single ratios of a bench/run.sh run.

Reads JSON lines (files named on the command line, or stdin), pairs each
line measured in node mode ("mode": "node", through cogpud) with the line of
the same benchmark and process count measured daemonless ("mode":
"single"), and prints the medians, the p99s and their ratios (node/single).
When a file holds several runs, the last line of each kind counts.

Usage: bench/compare.py bench/results/FILE.jsonl
       B=build bench/run.sh | bench/compare.py
Standard library only.
"""
import json
import sys


def fmt_ns(ns):
    if ns >= 1e6:
        return "%.2f ms" % (ns / 1e6)
    if ns >= 1e3:
        return "%.1f us" % (ns / 1e3)
    return "%d ns" % ns


def key(d):
    return (d.get("bench"), d.get("procs"), d.get("load", ""))


def main(argv):
    lines = []
    files = argv[1:] or ["-"]
    for name in files:
        f = sys.stdin if name == "-" else open(name)
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                lines.append(json.loads(line))
            except ValueError:
                continue
    runs = {"single": {}, "node": {}}
    order = []
    for d in lines:
        mode = d.get("mode")
        if mode not in runs or "median_ns" not in d:
            continue
        k = key(d)
        if k not in order:
            order.append(k)
        runs[mode][k] = d
    rows = [k for k in order if k in runs["single"] and k in runs["node"]]
    if not rows:
        print("compare.py: no benchmark measured in both modes", file=sys.stderr)
        return 1
    head = ("bench", "procs", "single med", "node med", "ratio",
            "single p99", "node p99", "ratio")
    out = [head]
    for k in rows:
        s, n = runs["single"][k], runs["node"][k]
        name = k[0] + ("" if not k[2] else " (%s)" % k[2])
        out.append((name, str(k[1]),
                    fmt_ns(s["median_ns"]), fmt_ns(n["median_ns"]),
                    "%.0fx" % (n["median_ns"] / max(s["median_ns"], 1)),
                    fmt_ns(s["p99_ns"]), fmt_ns(n["p99_ns"]),
                    "%.0fx" % (n["p99_ns"] / max(s["p99_ns"], 1))))
    widths = [max(len(r[i]) for r in out) for i in range(len(head))]
    for r in out:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                        for i, (c, w) in enumerate(zip(r, widths))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
