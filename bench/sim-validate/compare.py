#!/usr/bin/env python3
"""compare.py: how well `cogpu sim` predicted a real run.

Reads the real run's `sacct -P` dump (replay.py's, or a site's own: the
JobID, Submit, Start and End columns) and the simulator's per-job output
for one policy (`cogpu sim --jobs`'s POLICY-jobs.csv: the trace line of
each job, its submit_s, start_s and end_s in seconds from the trace's
first submission), matches jobs by their line in the dump, and
reports the makespan error and the start-time error per job.

Prints one JSON line; exits 1 when a figure is past its target
(--makespan-pct, --median-start-s: under, not at), 2 on bad input.
"""
import argparse
import csv
import json
import statistics
import sys

from slurmrec import ts


def real_jobs(path):
    jobs = {}
    with open(path, newline="") as f:
        for line, row in enumerate(csv.DictReader(f, delimiter="|"), start=2):
            try:
                jobs[str(line)] = (ts(row["Submit"]), ts(row["Start"]),
                                   ts(row["End"]))
            except (KeyError, ValueError) as e:
                sys.stderr.write(f"{path}:{line}: {e}\n")
                sys.exit(2)
    if not jobs:
        sys.stderr.write(f"{path}: no jobs\n")
        sys.exit(2)
    t0 = min(j[0] for j in jobs.values())
    return {k: tuple(x - t0 for x in v) for k, v in jobs.items()}


def sim_jobs(path):
    jobs = {}
    with open(path, newline="") as f:
        for line, row in enumerate(csv.DictReader(f), start=2):
            try:
                jobs[row["line"]] = (float(row["submit_s"]),
                                   float(row["start_s"]), float(row["end_s"]))
            except (KeyError, ValueError) as e:
                sys.stderr.write(f"{path}:{line}: {e}\n")
                sys.exit(2)
    return jobs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--real", required=True, help="sacct -P dump")
    ap.add_argument("--sim", required=True, help="cogpu sim's jobs CSV")
    ap.add_argument("--makespan-pct", type=float, default=5.0)
    ap.add_argument("--median-start-s", type=float, default=2.0)
    a = ap.parse_args()
    real, sim = real_jobs(a.real), sim_jobs(a.sim)
    common = sorted(set(real) & set(sim), key=int)
    if len(common) != len(real) or len(common) != len(sim):
        sys.stderr.write(f"jobs: {len(real)} real, {len(sim)} simulated, "
                         f"{len(common)} in both\n")
        sys.exit(2)
    err = [abs(sim[k][1] - real[k][1]) for k in common]
    real_mk = max(v[2] for v in real.values())
    sim_mk = max(v[2] for v in sim.values())
    mk_pct = abs(sim_mk - real_mk) / real_mk * 100 if real_mk else 0.0
    res = {
        "jobs": len(common),
        "makespan_real_s": round(real_mk, 1),
        "makespan_sim_s": round(sim_mk, 1),
        "makespan_err_pct": round(mk_pct, 2),
        "start_err_median_s": round(statistics.median(err), 2),
        "start_err_p90_s": round(sorted(err)[int(0.9 * (len(err) - 1))], 2),
        "start_err_max_s": round(max(err), 2),
        "waited_real": sum(1 for k in common if real[k][1] - real[k][0] > 1),
        "waited_sim": sum(1 for k in common if sim[k][1] - sim[k][0] > 1),
    }
    res["ok"] = (mk_pct <= a.makespan_pct and
                 statistics.median(err) < a.median_start_s)
    print(json.dumps(res))
    sys.exit(0 if res["ok"] else 1)


if __name__ == "__main__":
    main()
