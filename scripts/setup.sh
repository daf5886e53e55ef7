#!/bin/sh
# Install cogpu's build dependencies (Debian packages), build, and install.
# Usage: sudo ./scripts/setup.sh            (installs under /usr/local)
#        PREFIX=/opt/cogpu ./scripts/setup.sh
# DESTDIR is honoured too (for packaging).
set -eu
cd "$(dirname "$0")/.."
PREFIX=${PREFIX:-/usr/local}
# gcc, make, libc headers: the build. The sanitizer runtimes (libasan,
# libubsan, libtsan) come with gcc. python3: the CLI tests parse JSON with it.
# pkg-config: to check the installed cogpu.pc.
# libsystemd-dev: cogpud's socket activation, readiness and watchdog.
# libslurm-dev: spank.h and slurm.h, to build the Slurm SPANK plug-in.
# slurmctld, slurmd, slurm-client, munge: the test suite starts a private
# one-node Slurm cluster with them (the packages start no daemon).
deps="gcc make libc6-dev pkg-config python3 libsystemd-dev libslurm-dev slurmctld slurmd
      slurm-client munge"
missing=""
for p in $deps; do
  dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
if [ -n "$missing" ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: missing packages:$missing (run as root, or install them)" >&2
    exit 1
  fi
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $missing
fi
make -j"$(nproc)"
make install PREFIX="$PREFIX" DESTDIR="${DESTDIR:-}"
echo "cogpu installed under ${DESTDIR:-}$PREFIX"
