#!/usr/bin/env python3
"""compare.py: node/single ratios of a bench/run.sh run.

Reads JSON lines (files named on the command line, or stdin), pairs each
line measured in node mode ("mode": "node", through cogpud) with the line of
the same benchmark and process count measured daemonless ("mode":
"single"), and prints the medians, the p99s and their ratios (node/single).
Lines that carry a baseline of their own ("model_ns": bench-suspend-job's
modelled driver copy) get a second table: the baseline, the end-to-end
median and p99, and what cogpu adds. When a file holds several runs, the
last line of each kind counts.

Usage: bench/compare.py bench/results/FILE.jsonl
       B=build bench/run.sh | bench/compare.py
Standard library only.
"""
import json
import sys


def fmt_ns(ns):
    if abs(ns) >= 1e6:
        return "%.2f ms" % (ns / 1e6)
    if abs(ns) >= 1e3:
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
    modelled = {}
    for d in lines:
        if d.get("model_ns") is not None and "median_ns" in d:
            modelled[(d.get("bench"), d.get("gib"))] = d
    if not rows and not modelled:
        print("compare.py: no benchmark measured in both modes", file=sys.stderr)
        return 1
    if rows:
        print_ratios(rows, runs)
    if modelled:
        if rows:
            print()
        print_modelled(modelled)
    return 0


def print_table(out):
    widths = [max(len(r[i]) for r in out) for i in range(len(out[0]))]
    for r in out:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                        for i, (c, w) in enumerate(zip(r, widths))))


def print_modelled(modelled):
    out = [("bench", "GiB", "moved", "model", "median", "added", "p99",
            "added p99", "daemon")]
    for (bench, gib), d in sorted(modelled.items(),
                                  key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        dm = d.get("daemon_median_ms")
        out.append((bench, str(gib),
                    "%.2f GiB" % (d.get("moved_bytes", 0) / 2**30),
                    fmt_ns(d["model_ns"]), fmt_ns(d["median_ns"]),
                    fmt_ns(d["added_median_ns"]), fmt_ns(d["p99_ns"]),
                    fmt_ns(d["added_p99_ns"]),
                    "-" if dm is None else "%d ms" % dm))
    print_table(out)


def print_ratios(rows, runs):
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
    print_table(out)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
