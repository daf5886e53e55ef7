#!/usr/bin/env python3
"""make-trace.py: a scaled-down GPU job trace for a real replay on the test
suite's private Slurm cluster (bench/sim-validate/replay.py) and for
`cogpu sim` on the same jobs.

Takes a window of single-GPU pods from Alibaba's openb pod list (the file
stays in ../shared/traces; nothing of it is copied into the repository),
compresses arrivals into --span seconds and lifetimes into [--min-run,
--max-run] seconds (log-scaled, so the trace's long tail stays a tail),
and maps gpu_milli to bytes as gpu_milli/1000 x --gpu-mem, rounded up to
256 MiB. Deterministic: the same arguments give the same file.

Output (CSV, one job per line, in submit order):
  id,submit_s,run_s,mem_bytes,source
where source names the pod the job came from.
"""
import argparse
import csv
import math
import sys

from slurmrec import size

MIB = 1 << 20


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pods", required=True, help="openb_pod_list_*.csv")
    ap.add_argument("--jobs", type=int, default=300)
    ap.add_argument("--skip", type=int, default=0,
                    help="GPU pods to skip from the start of the trace")
    ap.add_argument("--span", type=float, default=120.0,
                    help="seconds over which the jobs arrive")
    ap.add_argument("--min-run", type=float, default=2.0)
    ap.add_argument("--max-run", type=float, default=20.0)
    ap.add_argument("--gpu-mem", default="80G",
                    help="the memory gpu_milli=1000 stands for")
    ap.add_argument("--sharing-only", action="store_true",
                    help="only pods that share a GPU (gpu_milli < 1000)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    gpu = size(a.gpu_mem)
    pods = []
    with open(a.pods, newline="") as f:
        for line, row in enumerate(csv.DictReader(f), start=2):
            try:
                if int(row["num_gpu"]) != 1:
                    continue
                milli = int(row["gpu_milli"])
                c, d = int(row["creation_time"]), int(row["deletion_time"])
            except (KeyError, ValueError) as e:
                sys.exit(f"{a.pods}:{line}: {e}")
            if milli <= 0 or d <= c or (a.sharing_only and milli >= 1000):
                continue
            pods.append((c, d - c, milli, row["name"]))
    pods.sort(key=lambda p: (p[0], p[3]))
    pods = pods[a.skip:a.skip + a.jobs]
    if len(pods) < a.jobs:
        sys.exit(f"only {len(pods)} single-GPU pods after --skip {a.skip}")
    t0, t1 = pods[0][0], pods[-1][0]
    span = max(t1 - t0, 1)
    lo = math.log(min(p[1] for p in pods))
    hi = math.log(max(p[1] for p in pods))
    with open(a.out, "w") as out:
        out.write("id,submit_s,run_s,mem_bytes,source\n")
        for i, (c, life, milli, name) in enumerate(pods):
            submit = round((c - t0) / span * a.span, 3)
            x = (math.log(life) - lo) / (hi - lo) if hi > lo else 0.5
            run = round(a.min_run + x * (a.max_run - a.min_run), 3)
            mem = -(-milli * gpu // 1000 // (256 * MIB)) * 256 * MIB
            out.write(f"{i + 1},{submit},{run},{mem},{name}\n")


if __name__ == "__main__":
    main()
