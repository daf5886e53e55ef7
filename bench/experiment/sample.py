#!/usr/bin/env python3
"""sample.py: samples GPU memory use and utilisation until SIGTERM.

Writes CSV lines "t,mem_used_bytes,util_pct" (t: Unix time in seconds;
util_pct empty where unknown) to --out.
  --mode nvidia-smi  nvidia-smi --query-gpu=utilization.gpu,memory.used
                     -lms 500 (NVML), one line per sample
  --mode fake        the fake CUDA driver (tests/fakes/cuda): its
                     fake_cuda_stats(nvml_index, &used, &peak, &ooms) every
                     100 ms; the last line "#ooms,N,peak_bytes" is the
                     driver's out-of-memory count and peak use
  --mode none        nothing (no NVML available)
Standard library only.
"""
import argparse
import ctypes
import signal
import subprocess
import sys
import time

stop = False


def on_term(signum, frame):
    global stop
    stop = True


def sample_fake(f, gpu, interval):
    lib = ctypes.CDLL("libcuda.so.1")
    stats = lib.fake_cuda_stats
    stats.argtypes = [ctypes.c_int] + [ctypes.POINTER(ctypes.c_ulonglong)] * 3
    stats.restype = ctypes.c_int
    used, peak, ooms = ctypes.c_ulonglong(), ctypes.c_ulonglong(), ctypes.c_ulonglong()
    while not stop:
        if stats(gpu, ctypes.byref(used), ctypes.byref(peak), ctypes.byref(ooms)) == 0:
            f.write("%.3f,%d,\n" % (time.time(), used.value))
            f.flush()
        time.sleep(interval)
    if stats(gpu, ctypes.byref(used), ctypes.byref(peak), ctypes.byref(ooms)) == 0:
        f.write("#ooms,%d,%d\n" % (ooms.value, peak.value))


def sample_nvidia_smi(f, gpu):
    p = subprocess.Popen(
        ["nvidia-smi", "-i", str(gpu),
         "--query-gpu=utilization.gpu,memory.used",
         "--format=csv,noheader,nounits", "-lms", "500"],
        stdout=subprocess.PIPE, text=True)
    try:
        while not stop:
            line = p.stdout.readline()
            if not line:
                break
            parts = [x.strip() for x in line.split(",")]
            try:
                util, mib = float(parts[0]), float(parts[1])
            except (ValueError, IndexError):
                continue
            f.write("%.3f,%d,%g\n" % (time.time(), int(mib * 1048576), util))
            f.flush()
    finally:
        p.terminate()
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["fake", "nvidia-smi", "none"], required=True)
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--out", required=True)
    ap.add_argument("--interval", type=float, default=0.1)
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    with open(a.out, "w") as f:
        if a.mode == "fake":
            # In fake mode every process sees the fake GPU as NVML index 0.
            sample_fake(f, 0, a.interval)
        elif a.mode == "nvidia-smi":
            sample_nvidia_smi(f, a.gpu)
        else:
            while not stop:
                time.sleep(0.1)


if __name__ == "__main__":
    sys.exit(main())
