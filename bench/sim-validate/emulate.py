#!/usr/bin/env python3
"""emulate.py: how well any prediction can do on a replay, before running it.

The real replay (replay.py) takes minutes and its outcome moves with the
machine. This runs the same trace many times through a model of the test
cluster's Slurm, each time with the sub-second timing drawn at random,
writes what Slurm would record (whole seconds, `sacct -P`), and puts each
record through the same pipeline as the real one: sched-lag.py,
`cogpu sim --format sacct --sched-delay LAG`, compare.py. The spread of
the figures over the runs is what a trace's shape costs the prediction:
in a deep queue a few milliseconds' difference in one release reorders
the later starts (docs/simulation.md, "Against a real run").

The model, from slurmctld's log of real replays: one GPU of --gpu-mem;
a scheduling pass every second plus 1-2 ms (the pass's own time, so its
phase drifts), the first at a random phase; --load adds up to that many
seconds to each interval (a busy machine); each pass starts, in job
order, every waiting job whose memory fits; a job submitted to an empty
queue with its memory free starts at once half the time (Slurm schedules
on submission), else at the next pass; sbatch takes 0-50 ms; a job holds
its memory for its run time plus 20-50 ms of completion.

Reads make-trace.py's CSV. Prints one JSON line per run (compare.py's
figures and the lag) and a last line with the median and worst of the
runs' median start errors and makespan errors, and how many runs met
compare.py's targets. Deterministic: the same --seed gives the same
output. Exit 2 on bad input or when a step fails.
"""
import argparse
import bisect
import csv
import datetime
import heapq
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile

from slurmrec import size

HERE = os.path.dirname(os.path.abspath(__file__))
# Times are written in local time as Slurm does; a January epoch keeps
# daylight-saving changes out of the record.
EPOCH = datetime.datetime(2026, 1, 5, 12, 0, 0).timestamp()


def die(msg):
    sys.stderr.write(msg + "\n")
    sys.exit(2)


def read_trace(path):
    jobs = []
    with open(path, newline="") as f:
        for line, row in enumerate(csv.DictReader(f), start=2):
            try:
                jobs.append((float(row["submit_s"]), float(row["run_s"]),
                             int(row["mem_bytes"])))
            except (KeyError, ValueError) as e:
                die(f"{path}:{line}: {e}")
    if not jobs:
        die(f"{path}: no jobs")
    return jobs


def run_once(jobs, cap, rng, load):
    """One run of the model: each job's submit, start and end (s)."""
    n = len(jobs)
    sub = [s + rng.uniform(0, 0.05) for s, _, _ in jobs]
    st, en = [None] * n, [None] * n
    ev = [(sub[i], 1, i) for i in range(n)]  # (time, kind, job)
    heapq.heapify(ev)
    heapq.heappush(ev, (rng.random(), 2, -1))
    free, queue, running, done = cap, [], [], 0

    def start(i, t):
        nonlocal free
        free -= jobs[i][2]
        st[i], en[i] = t, t + jobs[i][1] + rng.uniform(0.02, 0.05)
        heapq.heappush(ev, (en[i], 0, i))
        running.append(i)

    while done < n:
        t, kind, i = heapq.heappop(ev)
        if kind == 0:
            running.remove(i)
            free += jobs[i][2]
            done += 1
        elif kind == 1:
            if not queue and jobs[i][2] <= free and rng.random() < 0.5:
                start(i, t)
            else:
                bisect.insort(queue, i)  # job order, as Slurm's priority
        else:
            for j in list(queue):
                if jobs[j][2] <= free:
                    queue.remove(j)
                    start(j, t)
            nxt = 1.0 + rng.uniform(0.001, 0.002) + load * rng.random()
            heapq.heappush(ev, (t + nxt, 2, -1))
    return sub, st, en


def write_record(path, jobs, sub, st, en):
    def stamp(x):  # Slurm records whole seconds
        return datetime.datetime.fromtimestamp(EPOCH + int(x)).strftime(
            "%Y-%m-%dT%H:%M:%S")

    with open(path, "w") as f:
        f.write("JobID|JobName|Submit|Start|End|State|ReqTRES|AllocTRES|"
                "AdminComment\n")
        for i, (_, _, mem) in enumerate(jobs):
            tres = f"cpu=1,node=1,gres/cogpumem={mem >> 20}M"
            f.write(f"{i + 1}|emulated-{i + 1}|{stamp(sub[i])}|{stamp(st[i])}|"
                    f"{stamp(en[i])}|COMPLETED|{tres}|{tres}|\n")


def pipeline(record, cogpu, gpu_mem, work):
    """sched-lag.py, cogpu sim and compare.py on one record, as the suite's
    replay test runs them."""
    r = subprocess.run([sys.executable, f"{HERE}/sched-lag.py", "--real",
                        record, "--gpu-mem", gpu_mem],
                       capture_output=True, text=True)
    # No job waited at the head of the queue: nothing to measure.
    lag = int(r.stdout) if r.returncode == 0 else 0
    out = os.path.join(work, "sim")
    r = subprocess.run([cogpu, "sim", "--trace", record, "--format", "sacct",
                        "--nodes", "1", "--gpus-per-node", "1", "--gpu-mem",
                        gpu_mem, "--margin", "0", "--policy", "cogpu",
                        "--sched-delay", f"{lag}ms", "--out", out, "--jobs",
                        "--quiet"], capture_output=True, text=True)
    if r.returncode:
        die(f"cogpu sim failed ({r.returncode}): {r.stderr.strip()}")
    r = subprocess.run([sys.executable, f"{HERE}/compare.py", "--real",
                        record, "--sim", f"{out}/cogpu-jobs.csv"],
                       capture_output=True, text=True)
    if r.returncode not in (0, 1):
        die(f"compare.py failed ({r.returncode}): {r.stderr.strip()}")
    res = json.loads(r.stdout)
    res["lag_ms"] = lag
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", required=True, help="make-trace.py's CSV")
    ap.add_argument("--cogpu", required=True, help="the cogpu command")
    ap.add_argument("--gpu-mem", default="80G")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--load", type=float, default=0.0,
                    help="seconds added at random to each pass interval")
    a = ap.parse_args()
    try:
        cap = size(a.gpu_mem)
    except ValueError:
        ap.error(f"--gpu-mem '{a.gpu_mem}' is not a size")
    if a.runs < 1 or a.load < 0:
        ap.error("--runs must be at least 1 and --load not negative")
    jobs = read_trace(a.trace)
    big = [i + 1 for i, j in enumerate(jobs) if j[2] > cap]
    if big:
        die(f"{a.trace}: job {big[0]} needs more than --gpu-mem")
    rng = random.Random(a.seed)
    meds, mks, ok = [], [], 0
    with tempfile.TemporaryDirectory(prefix="cogpu-emulate-") as work:
        record = os.path.join(work, "record.psv")
        for k in range(a.runs):
            write_record(record, jobs, *run_once(jobs, cap, rng, a.load))
            res = pipeline(record, a.cogpu, a.gpu_mem, work)
            res["run"] = k + 1
            print(json.dumps(res), flush=True)
            meds.append(res["start_err_median_s"])
            mks.append(res["makespan_err_pct"])
            ok += res["ok"]
    print(json.dumps({
        "runs": a.runs,
        "start_err_median_s": {"median": round(statistics.median(meds), 2),
                               "max": max(meds)},
        "makespan_err_pct": {"median": round(statistics.median(mks), 2),
                             "max": max(mks)},
        "runs_on_target": ok,
    }))


if __name__ == "__main__":
    main()
