#!/usr/bin/env python3
"""replay.py: run a job trace (make-trace.py's CSV) for real on a Slurm
cluster with cogpu: each job is submitted at its time with --gpu-mem,
and runs a CUDA program (the test suite's cudaprog on the fake driver)
that allocates its memory and holds it for its run time. When all have
ended, what Slurm recorded of each job is written as a `sacct -P` dump
(JobID|JobName|Submit|Start|End|State|ReqTRES|AdminComment), read from
`scontrol show job -o` (the test cluster has no accounting database, so
MinJobAge must keep finished jobs for the length of the replay).

SLURM_CONF must name the cluster. Exit status 0 when every job ran.
"""
import argparse
import csv
import os
import subprocess
import sys
import time

MIB = 1 << 20


def sh(args, timeout=60):
    return subprocess.run(args, capture_output=True, text=True,
                          timeout=timeout)


def parse_show(text):
    """`scontrol show job -o`: one job per line, KEY=VALUE fields (values
    with spaces only in fields we do not read)."""
    jobs = []
    for line in text.splitlines():
        f = {}
        for tok in line.split():
            if "=" in tok:
                k, v = tok.split("=", 1)
                f.setdefault(k, v)
        if "JobId" in f:
            jobs.append(f)
    return jobs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", required=True)
    ap.add_argument("--prog", required=True, help="cudaprog")
    ap.add_argument("--ctx", default=300 * MIB, type=int,
                    help="bytes a CUDA context takes (FAKE_CUDA_CTX_BYTES)")
    ap.add_argument("--out", required=True, help="the sacct -P dump")
    ap.add_argument("--timeout", type=float, default=1800)
    a = ap.parse_args()
    if not os.environ.get("SLURM_CONF"):
        sys.exit("replay.py: SLURM_CONF is not set")
    with open(a.trace, newline="") as f:
        rows = list(csv.DictReader(f))
    t0 = time.monotonic()
    names = {}
    for r in rows:
        due = t0 + float(r["submit_s"])
        now = time.monotonic()
        if due > now:
            time.sleep(due - now)
        mem = int(r["mem_bytes"])
        hold = int(float(r["run_s"]) * 1000)
        alloc = mem - a.ctx
        body = f"{a.prog} direct init ctx"
        if alloc > 0:
            body += f" alloc:{alloc}"
        body += f" hold:{hold} freeall"
        name = f"replay-{r['id']}"
        p = sh(["sbatch", "--parsable", "-J", name, "-o", "/dev/null",
                f"--gpu-mem={-(-mem // MIB)}M", "--wrap", body])
        if p.returncode != 0:
            sys.exit(f"replay.py: sbatch of job {r['id']}: {p.stderr.strip()}")
        names[p.stdout.strip().split(";")[0]] = name
    while time.monotonic() - t0 < a.timeout:
        q = sh(["squeue", "-h", "-o", "%i"])
        if q.returncode == 0 and not q.stdout.strip():
            break
        time.sleep(0.5)
    else:
        sys.exit("replay.py: jobs still queued or running at the timeout")
    show = sh(["scontrol", "show", "job", "-o"])
    jobs = [j for j in parse_show(show.stdout) if j["JobId"] in names]
    if len(jobs) != len(rows):
        sys.exit(f"replay.py: Slurm kept {len(jobs)} of {len(rows)} jobs "
                 "(MinJobAge too short?)")
    jobs.sort(key=lambda j: int(j["JobId"]))

    def tres(j, key):
        # What sacct would show: the TRES, with cogpu's GRES as
        # AccountingStorageTRES=gres/cogpumem records it (the test cluster
        # keeps no accounting: taken from the job's per-node GRES).
        t = j.get(key) or j.get("TRES", "")
        per_node = j.get("TresPerNode", "")
        if "gres/cogpumem" not in t and "cogpumem:" in per_node:
            n = per_node.split("cogpumem:", 1)[1].split(",")[0]
            t = (t + "," if t else "") + f"gres/cogpumem={n}"
        return t

    bad = 0
    with open(a.out, "w") as out:
        out.write("JobID|JobName|Submit|Start|End|State|ReqTRES|AllocTRES|"
                  "AdminComment\n")
        for j in jobs:
            bad += j.get("JobState") != "COMPLETED"
            out.write("|".join([j["JobId"], j.get("JobName", ""),
                                j.get("SubmitTime", ""),
                                j.get("StartTime", ""), j.get("EndTime", ""),
                                j.get("JobState", ""), tres(j, "ReqTRES"),
                                tres(j, "AllocTRES"),
                                j.get("AdminComment", "")]) + "\n")
    if bad:
        sys.exit(f"replay.py: {bad} jobs did not complete")


if __name__ == "__main__":
    main()
