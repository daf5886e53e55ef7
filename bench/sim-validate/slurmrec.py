"""slurmrec.py: what the validation scripts read from Slurm's record and
their arguments, in one place (imported by make-trace.py, sched-lag.py and
compare.py, which run from this directory)."""
import datetime


def ts(s):
    # Slurm's times: local, ISO 8601, whole seconds.
    return datetime.datetime.strptime(s, "%Y-%m-%dT%H:%M:%S").timestamp()


def size(s):
    # Bytes from "16G", "61440M", "30GiB" or a plain number of bytes;
    # ValueError when it is none of these.
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    s = s.strip().upper().rstrip("B").rstrip("I")
    if s and s[-1] in units:
        return int(float(s[:-1]) * units[s[-1]])
    return int(s)
