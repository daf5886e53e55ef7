#!/usr/bin/env bash
# scripts/rpm-test.sh: build the RPM packages (contrib/rpm/cogpu.spec) from
# a tarball of the tracked files (git archive; untracked files are left
# out), in a
# scratch _topdir, and check each package's file list (rpm -qlp) and
# that cogpu.conf is %config(noreplace). `make rpm` runs it.
#
# Here that is Debian with its rpm package, not a real RHEL: the build
# requirements (RHEL's names: sqlite-devel, systemd-devel, slurm-devel)
# are not RPMs here, so rpmbuild runs with --nodeps, and
# systemd-rpm-macros' macros are missing (the spec has fallbacks for
# them). What this shows and what it does not: README.md, "RPM packages".
# KEEP=1 keeps the scratch directory (its path is printed).
set -euo pipefail
cd "$(dirname "$0")/.."
for p in rpmbuild rpm git; do
  command -v "$p" >/dev/null || {
    echo "rpm-test: $p is missing (Debian: apt-get install rpm git)" >&2
    exit 1
  }
done
version=$(sed -n 's/^#define COGPU_VERSION_STRING "\(.*\)"$/\1/p' include/cogpu.h)
spec_version=$(sed -n 's/^Version: *//p' contrib/rpm/cogpu.spec)
if [ "$version" != "$spec_version" ]; then
  echo "rpm-test: cogpu.h says $version, the spec $spec_version" >&2
  exit 1
fi
top=$(mktemp -d)
if [ "${KEEP:-0}" = 1 ]; then
  echo "rpm-test: keeping $top"
else
  trap 'rm -rf "$top"' EXIT
fi
mkdir -p "$top/SOURCES"
# The tracked files as they are now, committed or not (git stash create
# makes a commit of them without touching the tree or the stash).
tree=$(git stash create)
git archive --prefix="cogpu-$version/" -o "$top/SOURCES/cogpu-$version.tar.gz" "${tree:-HEAD}"
commit=$(git rev-parse --short=12 HEAD)
[ -z "$tree" ] || commit=$commit-dirty
with_slurm=--with=slurm
if [ ! -e /usr/include/slurm/spank.h ]; then
  echo "rpm-test: no Slurm headers: cogpu-slurm cannot be built" >&2
  exit 1
fi
if ! rpmbuild -bb --nodeps --define "_topdir $top" --define "commit $commit" \
  "$with_slurm" contrib/rpm/cogpu.spec >"$top/build.log" 2>&1; then
  tail -40 "$top/build.log" >&2
  echo "rpm-test: rpmbuild failed (log above)" >&2
  exit 1
fi
bad=0
fail() {
  echo "rpm-test: $*" >&2
  bad=1
}
rpms=$(find "$top/RPMS" -name '*.rpm' | sort)
echo "$rpms" | sed "s|$top/RPMS/||"
pkg() { echo "$rpms" | grep "/$1-$version-" | grep -v debug || true; }
# Each package's files: those listed (extended regular expressions, whole
# lines) must be there; none matching those given with "!" (the split of
# debian/*.install). Manual pages: RHEL's rpmbuild compresses them,
# Debian's does not.
check() {
  local name=$1 file list
  shift
  file=$(pkg "$name")
  [ -n "$file" ] || {
    fail "no $name package"
    return
  }
  list=$(rpm -qlp "$file")
  for f in "$@"; do
    case $f in
    !*) ! echo "$list" | grep -q "${f#!}" || fail "$name has ${f#!}" ;;
    *) echo "$list" | grep -qxE "$f" || fail "$name lacks $f" ;;
    esac
  done
}
lib=$(rpm --eval '%{_libdir}')
check cogpu /usr/bin/cogpu /usr/sbin/cogpud /usr/lib/cogpu/libcogpu-preload.so \
  "$lib/libcogpu.so.0" "$lib/libcogpu.so.$version" /etc/cogpu.conf \
  /usr/lib/systemd/system/cogpud.service /usr/lib/systemd/system/cogpud.socket \
  /usr/lib/systemd/system/cogpu-exporter.service /usr/lib/tmpfiles.d/cogpu.conf \
  '/usr/share/man/man1/cogpu\.1(\.gz)?' '/usr/share/man/man5/cogpu\.conf\.5(\.gz)?' \
  '/usr/share/man/man8/cogpud\.8(\.gz)?' /usr/share/doc/cogpu/metrics.md \
  /usr/share/bash-completion/completions/cogpu /usr/share/cogpu/cogpu.conf.example \
  /usr/share/cogpu/prometheus/cogpu.rules.yml /usr/share/cogpu/prometheus/grafana-dashboard.json \
  '!spank_cogpu' '!/usr/include' '!libcogpu.a' '!\.pc$' '!/slurm/'
check cogpu-slurm /usr/lib/cogpu/spank_cogpu.so /usr/share/cogpu/slurm/plugstack.conf \
  /usr/share/cogpu/slurm/job_submit.lua /usr/share/cogpu/slurm/cli_filter.lua \
  /usr/share/cogpu/slurm/slurm.conf '/usr/share/man/man8/spank_cogpu\.8(\.gz)?' \
  '!/usr/bin' '!libcogpu'
check cogpu-devel /usr/include/cogpu.h /usr/include/schedgpu.h "$lib/libcogpu.a" \
  "$lib/libcogpu.so" "$lib/pkgconfig/cogpu.pc" '!/usr/bin' '!\.so\.0'
# /etc/cogpu.conf is a configuration file kept when the admin changed it.
if file=$(pkg cogpu) && [ -n "$file" ]; then
  rpm -qp --qf '[%{FILEFLAGS:fflags} %{FILENAMES}\n]' "$file" |
    grep -qx 'cn /etc/cogpu.conf' || fail "/etc/cogpu.conf is not %config(noreplace)"
  # The installed paths are the package's: the plug-in's snippet and the
  # pkg-config file point into it.
  for p in cogpu-slurm cogpu-devel; do
    mkdir -p "$top/root"
    rpm2archive - <"$(pkg $p)" | tar -xzf - -C "$top/root"
  done
  grep -q '^required /usr/lib/cogpu/spank_cogpu.so' "$top/root/usr/share/cogpu/slurm/plugstack.conf" ||
    fail "plugstack.conf does not point at /usr/lib/cogpu/spank_cogpu.so"
  grep -qx "libdir=$lib" "$top/root$lib/pkgconfig/cogpu.pc" || fail "cogpu.pc's libdir is not $lib"
fi
[ $bad = 0 ] || exit 1
echo "rpm-test: ok (cogpu, cogpu-slurm, cogpu-devel $version)"
