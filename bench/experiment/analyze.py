#!/usr/bin/env python3
"""analyze.py OUT MIXFILE: turns run.sh's raw logs into results.

Reads OUT/meta.tsv, OUT/scenarios.tsv, OUT/jobs.tsv and
OUT/<scenario>/samples.csv; writes OUT/results.json, OUT/results.md,
OUT/plot.gp and, when gnuplot is installed, OUT/plot.png.
A job's status: ok (exit 0), oom (exit 2: every workload of the kit, and
cudaprog, exit 2 on CUDA out-of-memory), timeout (124, 137: killed by the
job timeout), failed (anything else). Scenarios with a daemon of their own
(-suspend, -nosuspend) also count the daemon's suspensions
(OUT/<scenario>/cogpud.log) and each job's ("suspended: this job" in its
log). Standard library only.
"""
import json
import os
import re
import shutil
import subprocess
import sys


def read_tsv(path):
    with open(path) as f:
        return [l.rstrip("\n").split("\t") for l in f if l.strip()]


def status_of(rc):
    if rc == 0:
        return "ok"
    if rc == 2:
        return "oom"
    if rc in (124, 137):
        return "timeout"
    return "failed"


def job_peak(log):
    """The job's own last "peak_bytes=N" line (the kit's workloads print it)."""
    try:
        with open(log, errors="replace") as f:
            m = re.findall(r"peak_bytes=(\d+)", f.read())
        return int(m[-1]) if m else None
    except OSError:
        return None


def count_in(path, what):
    """How many times `what` occurs in the file at path (None: no file)."""
    try:
        with open(path, errors="replace") as f:
            return f.read().count(what)
    except OSError:
        return None


def mean(xs):
    return sum(xs) / len(xs) if xs else None


def time_weighted(samples, t0, t1, idx):
    """Mean of column idx over [t0, t1], each sample holding until the next."""
    pts = [(t, s[idx]) for t, *s in samples if s[idx] is not None and t0 - 1 <= t <= t1 + 1]
    if not pts:
        return None
    if len(pts) == 1 or t1 <= t0:
        return pts[0][1]
    total = 0.0
    for i, (t, v) in enumerate(pts):
        a = max(t, t0)
        b = min(pts[i + 1][0] if i + 1 < len(pts) else t1, t1)
        if b > a:
            total += v * (b - a)
    return total / (t1 - t0)


def main():
    out, mixfile = sys.argv[1], sys.argv[2]
    meta = dict((r[0], r[1] if len(r) > 1 else "") for r in read_tsv(os.path.join(out, "meta.tsv")))
    total_mib = None
    with open(mixfile) as f:
        for line in f:
            m = re.match(r"#\s*gpu_total_mib:\s*(\d+)", line)
            if m:
                total_mib = int(m.group(1))
    if meta.get("gpu_total_mib", "").strip().isdigit():
        total_mib = int(meta["gpu_total_mib"])
    total_bytes = total_mib * 1048576 if total_mib else None

    jobs = {}
    for r in read_tsv(os.path.join(out, "jobs.tsv")):
        scen, jid, jtype, peak, prio, t0, t1, rc = r
        jobs.setdefault(scen, []).append(dict(
            id=jid, type=jtype, expected_peak_bytes=int(peak) * 1048576,
            priority=int(prio), start=float(t0), end=float(t1), exit=int(rc),
            status=status_of(int(rc)),
            reported_peak_bytes=job_peak(os.path.join(out, scen, "jobs", jid + ".log")),
            suspended=count_in(os.path.join(out, scen, "jobs", jid + ".log"),
                               "suspended: this job")))

    scenarios = []
    for scen, s0, s1 in read_tsv(os.path.join(out, "scenarios.tsv")):
        s0, s1 = float(s0), float(s1)
        samples, fake = [], None
        try:
            with open(os.path.join(out, scen, "samples.csv")) as f:
                for line in f:
                    p = line.strip().split(",")
                    if p[0] == "#ooms":
                        fake = dict(ooms=int(p[1]), peak_bytes=int(p[2]))
                    elif len(p) >= 2 and p[0]:
                        util = float(p[2]) if len(p) > 2 and p[2] else None
                        samples.append((float(p[0]), float(p[1]), util))
        except OSError:
            pass
        js = sorted(jobs.get(scen, []), key=lambda j: j["id"])
        for j in js:
            j["turnaround_s"] = round(j["end"] - s0, 3)
            j["runtime_s"] = round(j["end"] - j["start"], 3)
            j["start_s"] = round(j["start"] - s0, 3)
            j["end_s"] = round(j["end"] - s0, 3)
            del j["start"], j["end"]
        mem = time_weighted(samples, s0, s1, 0)
        util = time_weighted(samples, s0, s1, 1)
        sc = dict(
            name=scen,
            makespan_s=round(s1 - s0, 3),
            jobs=len(js),
            jobs_completed=sum(j["status"] == "ok" for j in js),
            jobs_failed=sum(j["status"] != "ok" for j in js),
            jobs_oom=sum(j["status"] == "oom" for j in js),
            mean_turnaround_s=round(mean([j["turnaround_s"] for j in js]) or 0, 3),
            mean_mem_used_bytes=round(mem) if mem is not None else None,
            mean_mem_used_pct=round(100 * mem / total_bytes, 1) if mem is not None and total_bytes else None,
            peak_mem_used_bytes=round(max(s[1] for s in samples)) if samples else None,
            mean_util_pct=round(util, 1) if util is not None else None,
            samples=[[round(t - s0, 3), round(m), u] for t, m, u in samples],
            job_results=js)
        if fake:
            sc["driver_ooms"] = fake["ooms"]
            sc["driver_peak_bytes"] = fake["peak_bytes"]
        # The daemon's own account: suspensions done and refused.
        dlog = os.path.join(out, scen, "cogpud.log")
        sc["daemon_suspend"] = ("yes" if scen.endswith("-suspend") else
                                "no" if scen.endswith("-nosuspend") else None)
        sc["suspensions"] = count_in(dlog, "suspended the job of pid")
        sc["suspension_failures"] = count_in(dlog, "could not suspend")
        sc["jobs_suspended"] = sum(1 for j in js if j.get("suspended"))
        scenarios.append(sc)

    base = next((s for s in scenarios if s["name"] == "one-at-a-time"), None)
    for s in scenarios:
        s["speedup_vs_one_at_a_time"] = (
            round(base["makespan_s"] / s["makespan_s"], 2) if base and s["makespan_s"] > 0 else None)

    res = dict(mix=meta.get("mix"), meta=meta, gpu_total_bytes=total_bytes,
               oom_exit_code=2, scenarios=scenarios)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(res, f, indent=1)

    def fmt(v, unit=""):
        return "n/a" if v is None else "%s%s" % (v, unit)

    gib = lambda b: None if b is None else round(b / 2**30, 1)
    md = ["# cogpu experiment: %s mix" % meta.get("mix"), "",
          "Commit %s, host %s, %s. GPU: %s (%s MiB)%s. Sampler: %s." % (
              meta.get("commit"), meta.get("host"), meta.get("date"),
              meta.get("gpu_name", "fake 16 GiB" if (meta.get("mix") or "").startswith("fake") else "?"),
              total_mib, ", driver " + meta["driver"] if meta.get("driver") else "",
              meta.get("sampler")), ""]
    if meta.get("settings", "").strip():
        md += ["Settings: `%s`." % meta["settings"].strip(), ""]
    md += [
          "| scenario | makespan (s) | speed-up vs one-at-a-time | jobs failed (OOM) | mean turnaround (s) | mean memory used (GiB, % of GPU) | peak memory (GiB) | mean GPU util (%) | suspensions (jobs) |",
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in scenarios:
        susp = ("n/a" if s["suspensions"] is None else
                "%d (%d)" % (s["suspensions"], s["jobs_suspended"]))
        md.append("| %s | %.1f | %s | %d (%d) | %.1f | %s | %s | %s | %s |" % (
            s["name"], s["makespan_s"], fmt(s["speedup_vs_one_at_a_time"], "x"),
            s["jobs_failed"], s["jobs_oom"], s["mean_turnaround_s"],
            "n/a" if s["mean_mem_used_bytes"] is None else "%s (%s %%)" % (gib(s["mean_mem_used_bytes"]), fmt(s["mean_mem_used_pct"])),
            fmt(gib(s["peak_mem_used_bytes"])), fmt(s["mean_util_pct"]), susp))
    md += ["", "Per job (status: ok, oom = exit 2, timeout, failed; times in s from the scenario's start):", ""]
    md.append("| scenario | job | type | start | end | turnaround | exit | status | suspended |")
    md.append("|---|---|---|---:|---:|---:|---:|---|---:|")
    for s in scenarios:
        for j in s["job_results"]:
            md.append("| %s | %s | %s | %.2f | %.2f | %.2f | %d | %s | %s |" % (
                s["name"], j["id"], j["type"], j["start_s"], j["end_s"],
                j["turnaround_s"], j["exit"], j["status"],
                "" if not j.get("suspended") else j["suspended"]))
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write("\n".join(md) + "\n")

    # gnuplot: memory (and utilisation) over time per scenario, summary bars.
    for s in scenarios:
        with open(os.path.join(out, s["name"], "samples.dat"), "w") as f:
            for t, m, u in s["samples"]:
                f.write("%.3f %.3f %s\n" % (t, m / 2**30, "NaN" if u is None else u))
    with open(os.path.join(out, "summary.dat"), "w") as f:
        for i, s in enumerate(scenarios):
            f.write('%d "%s" %.3f %d %s\n' % (i, s["name"], s["makespan_s"], s["jobs_failed"],
                                              "NaN" if s["mean_mem_used_pct"] is None else s["mean_mem_used_pct"]))
    n = len(scenarios)
    has_util = any(s["mean_util_pct"] is not None for s in scenarios)
    gp = ["set terminal pngcairo size 1400,%d font ',9'" % (300 * (n + 1) // 2 + 350),
          "set output '%s'" % os.path.join(out, "plot.png"),
          "set multiplot layout %d,2 title 'cogpu experiment: %s mix'" % ((n + 1) // 2 + 1, meta.get("mix")),
          "set grid", "set key top right"]
    for s in scenarios:
        dat = os.path.join(out, s["name"], "samples.dat")
        # The range from the run itself: a scenario shorter than the
        # sampling interval has one sample or none, and gnuplot's own range
        # would then be empty ("x range is invalid").
        last = max([t for t, _, _ in s["samples"]] + [s["makespan_s"] or 0, 0.1])
        gp += ["set title '%s (makespan %.1f s, %d failed)'" % (s["name"], s["makespan_s"], s["jobs_failed"]),
               "set xlabel 'time (s)'", "set ylabel 'GPU memory used (GiB)'",
               "set yrange [0:%s]" % ("%.1f" % (total_bytes / 2**30 * 1.05) if total_bytes else "1"),
               "set xrange [0:%.3f]" % last]
        if not s["samples"]:
            gp += ["unset y2tics", "unset y2label", "plot 1/0 title 'no samples'"]
        elif has_util:
            gp += ["set y2label 'utilisation (%)'", "set y2range [0:100]", "set y2tics",
                   "plot '%s' using 1:2 with lines lw 2 title 'memory', '' using 1:3 axes x1y2 with lines title 'util'" % dat]
        else:
            gp += ["unset y2tics", "unset y2label",
                   "plot '%s' using 1:2 with lines lw 2 title 'memory'" % dat]
    if n % 2:
        gp += ["set multiplot next"]
    summ = os.path.join(out, "summary.dat")
    gp += ["unset y2tics", "unset y2label", "set yrange [0:*]", "set xrange [-0.5:%f]" % (n - 0.5),
           "set style fill solid 0.6", "set boxwidth 0.6", "set xtics rotate by -30",
           "set title 'makespan (s)'", "set xlabel ''", "set ylabel 's'",
           "plot '%s' using 1:3:xtic(2) with boxes notitle" % summ,
           "set title 'jobs failed / mean memory used (%)'", "set ylabel ''",
           "plot '%s' using 1:(NaN):xtic(2) notitle, '' using ($1-0.15):4:(0.3) with boxes title 'failed', '' using ($1+0.15):5:(0.3) with boxes title 'mem %%'" % summ,
           "unset multiplot"]
    with open(os.path.join(out, "plot.gp"), "w") as f:
        f.write("\n".join(gp) + "\n")
    if shutil.which("gnuplot"):
        try:
            r = subprocess.run(["gnuplot", os.path.join(out, "plot.gp")], timeout=60,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            if r.returncode != 0:
                sys.stderr.write("analyze.py: gnuplot failed: %s\n" % r.stderr[-500:])
        except subprocess.TimeoutExpired:
            sys.stderr.write("analyze.py: gnuplot timed out\n")
    else:
        sys.stderr.write("analyze.py: no gnuplot: plot.gp written, plot.png not made\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
