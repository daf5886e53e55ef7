#!/bin/sh
# Install cogpu's build dependencies (Debian packages), build, and install.
# Usage: ./scripts/setup.sh                 (installs under /usr/local)
#        PREFIX=/opt/cogpu ./scripts/setup.sh
# DESTDIR is honoured too (for packaging). Run it as root, or as a user:
# it then builds as that user and uses sudo only for what needs root
# (installing packages, and installing where the user cannot write).
set -eu
cd "$(dirname "$0")/.."
PREFIX=${PREFIX:-/usr/local}

# Runs "$@" as root: directly when root already (a fresh container often
# has no sudo), through sudo otherwise.
as_root() {
  if [ "$(id -u)" -eq 0 ]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    echo "setup: '$*' needs root, and sudo is not installed: run this" \
      "script as root" >&2
    exit 1
  fi
}

# The nearest existing directory of path: can the user create path?
existing_parent() {
  d=$1
  while [ ! -e "$d" ]; do d=$(dirname "$d"); done
  echo "$d"
}
# gcc, make, libc headers: the build. The sanitizer runtimes (libasan,
# libubsan, libtsan) come with gcc. python3: the CLI tests parse JSON with it.
# pkg-config: to check the installed cogpu.pc.
# libsystemd-dev: cogpud's socket activation, readiness and watchdog.
# libslurm-dev: spank.h and slurm.h, to build the Slurm SPANK plug-in.
# slurmctld, slurmd, slurm-client, munge: the test suite starts a private
# one-node Slurm cluster with them (the packages start no daemon).
# gnuplot-nox: `cogpu sim` draws its PNGs with it (optional at run time;
# the suite checks the PNGs).
# groff-base: the suite and the install check format the manual pages
# with groff -ww (a page with a warning fails).
# dpkg-dev, debhelper, lintian: the Debian packages (debian/), which CI
# builds, lints and tests (scripts/deb-test.sh).
# prometheus (with promtool), python3-yaml: the suite scrapes cogpu's
# exporter with a private Prometheus of its own and checks the rules and
# dashboard of contrib/prometheus (tests/node/test-prometheus.c). On a host
# with systemd the package also enables prometheus.service, which the suite
# does not use: `systemctl disable --now prometheus` if it is not wanted.
# rpm: rpmbuild, with which CI builds the RPM packages of contrib/rpm and
# checks their file lists (scripts/rpm-test.sh).
deps="gcc make libc6-dev pkg-config python3 libsystemd-dev libsqlite3-dev libslurm-dev slurmctld slurmd
      slurm-client munge gnuplot-nox groff-base dpkg-dev debhelper lintian prometheus python3-yaml rpm"
missing=""
for p in $deps; do
  dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
if [ -n "$missing" ]; then
  as_root apt-get update -q
  as_root env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -q --no-install-recommends $missing
fi
make -j"$(nproc)"
if [ -w "$(existing_parent "${DESTDIR:-}$PREFIX")" ]; then
  make install PREFIX="$PREFIX" DESTDIR="${DESTDIR:-}"
else
  as_root make install PREFIX="$PREFIX" DESTDIR="${DESTDIR:-}"
fi
echo "cogpu installed under ${DESTDIR:-}$PREFIX"
