#!/usr/bin/env python3
"""sched-lag.py: the scheduler's lag in a real run, from Slurm's record.

For a replay on one GPU (replay.py's: every job asks --gpu-mem, the node
has one GPU of --gpu-mem): for each job that waited and was the oldest
job waiting when it started, the seconds from the first moment its
memory was free (by the other jobs' Start and End) to its Start. Slurm
starts such a job at its next scheduling pass, so the mean is what
`cogpu sim --sched-delay` should be for that run; it moves from run to
run with the machine's load (docs/simulation.md). The record's times are
whole seconds: each figure is known to a second, the mean to much less.

Prints the mean in milliseconds (for --sched-delay NNNms) and, with
--json, the mean, the count and the distribution, and the same mean for
the jobs submitted to an empty queue with their memory free (the pass alone:
Slurm tries to schedule on submission, while a release also waits for
the ended job's epilog and completion). Exit 2 on bad input
or when no job qualifies.
"""
import argparse
import collections
import csv
import json
import statistics
import sys

from slurmrec import size, ts


def mib(s):
    return size(s) / (1 << 20)


def read_jobs(path):
    jobs = []
    with open(path, newline="") as f:
        for line, row in enumerate(csv.DictReader(f, delimiter="|"), start=2):
            try:
                tres = row["ReqTRES"]
                if "gres/cogpumem=" not in tres:
                    continue
                m = mib(tres.split("gres/cogpumem=", 1)[1].split(",")[0])
                jobs.append((int(row["JobID"]), ts(row["Submit"]),
                             ts(row["Start"]), ts(row["End"]), m))
            except (KeyError, ValueError, IndexError) as e:
                sys.stderr.write(f"{path}:{line}: {e}\n")
                sys.exit(2)
    return jobs


def sched_lag(jobs, capacity_mib):
    lags = []
    for j in jobs:
        jid, sub, st, _, m = j
        if st <= sub:
            continue  # started at once
        if any(x[0] < jid and x[1] <= st < x[2] for x in jobs):
            continue  # an older job was still waiting: not the head
        t = st
        while t - 1 >= sub:
            used = sum(x[4] for x in jobs
                       if x is not j and x[2] <= t - 1 < x[3])
            if capacity_mib - used < m:
                break
            t -= 1
        lags.append(st - t)
    return lags


def arrival_lag(jobs, capacity_mib):
    # Jobs submitted to an empty queue whose memory was free (by the
    # others' Start and End): from Submit to Start. Slurm tries to schedule on
    # submission, so this is the pass alone; a release also waits for the
    # job's end to be processed (epilog, completion), which the lag above
    # includes and this does not.
    lags = []
    for j in jobs:
        _, sub, st, _, m = j
        if any(x is not j and x[1] <= sub < x[2] for x in jobs):
            continue  # others waiting: they may take the memory first
        used = sum(x[4] for x in jobs if x is not j and x[2] <= sub < x[3])
        if capacity_mib - used >= m:
            lags.append(st - sub)
    return lags


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--real", required=True, help="sacct -P dump")
    ap.add_argument("--gpu-mem", required=True, help="the GPU's memory")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    try:
        cap = mib(a.gpu_mem)
    except ValueError:
        sys.stderr.write(f"sched-lag.py: --gpu-mem '{a.gpu_mem}' is not a "
                         "size\n")
        sys.exit(2)
    jobs = read_jobs(a.real)
    lags = sched_lag(jobs, cap)
    if not lags:
        sys.stderr.write(f"{a.real}: no job waited at the head of the "
                         "queue\n")
        sys.exit(2)
    mean_ms = round(statistics.mean(lags) * 1000)
    arr = arrival_lag(jobs, cap)
    if a.json:
        print(json.dumps({"sched_lag_mean_s": round(mean_ms / 1000, 3),
                          "jobs": len(lags),
                          "arrival_lag_mean_s": round(statistics.mean(arr), 3)
                          if arr else None,
                          "arrival_jobs": len(arr),
                          "by_seconds": dict(sorted(collections.Counter(
                              int(x) for x in lags).items()))}))
    else:
        print(mean_ms)


if __name__ == "__main__":
    main()
