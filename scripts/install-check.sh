#!/bin/sh
# Checks an installed cogpu: the header, the library through pkg-config, and
# the binary. Usage: scripts/install-check.sh PREFIX
set -eu
prefix=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/t.c" <<'C'
#include <cogpu.h>
#include <schedgpu.h>
#include <stdio.h>
int main(void) {
  printf("%s %s\n", COGPU_VERSION_STRING, cogpu_strerror(COGPU_ESTATE));
  return 0;
}
C
PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --exists cogpu
cflags=$(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags cogpu)
libs=$(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --libs cogpu)
cc $cflags "$tmp/t.c" -o "$tmp/t" $libs -Wl,-rpath,"$prefix/lib"
"$tmp/t" | grep -q "node state"
"$prefix/bin/cogpu" version | grep -q "^cogpu "
# The preload library sits where cogpu run looks for it, and exports only
# the driver's entry points and dlsym.
pre="$prefix/lib/cogpu/libcogpu-preload.so"
test -r "$pre"
if command -v nm >/dev/null 2>&1; then
  extra=$(nm -D --defined-only "$pre" | awk '{print $3}' | grep -v '^cu' | grep -v '^dlsym$' || true)
  if [ -n "$extra" ]; then
    echo "install-check: $pre exports more than cu* and dlsym: $extra" >&2
    exit 1
  fi
fi
# The Slurm plug-in (built where libslurm-dev is installed) sits beside the
# preload library, where it finds it, and exports only what Slurm looks up.
spank="$prefix/lib/cogpu/spank_cogpu.so"
if [ -e /usr/include/slurm/spank.h ]; then
  test -r "$spank"
  if command -v nm >/dev/null 2>&1; then
    extra=$(nm -D --defined-only "$spank" | awk '{print $3}' |
      grep -v -e '^slurm_spank_' -e '^plugin_' || true)
    if [ -n "$extra" ]; then
      echo "install-check: $spank exports more than Slurm's names: $extra" >&2
      exit 1
    fi
  fi
fi
for f in cli_filter.lua job_submit.lua plugstack.conf slurm.conf; do
  test -r "$prefix/share/cogpu/slurm/$f"
done
# Prometheus rules (with their unit tests) and the Grafana dashboard.
for f in cogpu.rules.yml cogpu.rules.test.yml grafana-dashboard.json; do
  test -r "$prefix/share/cogpu/prometheus/$f"
done
# The node daemon, its systemd units (pointing at it) and the tmpfiles.d
# snippet that makes /run/cogpu at boot.
test -x "$prefix/sbin/cogpud"
"$prefix/sbin/cogpud" --check >/dev/null
for u in cogpud.socket cogpud.service cogpu-exporter.service; do
  test -r "$prefix/lib/systemd/system/$u"
  if grep -q '@' "$prefix/lib/systemd/system/$u"; then
    echo "install-check: $u has unexpanded @...@ placeholders" >&2
    exit 1
  fi
done
grep -q "ExecStart=$prefix/sbin/cogpud" "$prefix/lib/systemd/system/cogpud.service"
grep -q "ExecStart=$prefix/bin/cogpu exporter" \
  "$prefix/lib/systemd/system/cogpu-exporter.service"
grep -q '^d /run/cogpu 0755 root root' "$prefix/lib/tmpfiles.d/cogpu.conf"
if command -v systemd-analyze >/dev/null 2>&1; then
  # What it says of the units themselves fails the check (an unquoted
  # Environment= value once lost the exporter's port with only a warning
  # here); the installed binaries' paths outside / are expected.
  said=$(systemd-analyze verify "$prefix/lib/systemd/system/cogpud.socket" \
    "$prefix/lib/systemd/system/cogpud.service" \
    "$prefix/lib/systemd/system/cogpu-exporter.service" 2>&1 |
    grep -v -e 'not executable' -e 'No such file' || true)
  if [ -n "$said" ]; then
    echo "install-check: systemd-analyze verify: $said" >&2
    exit 1
  fi
fi
# The manual pages (their placeholders filled in, formatting without a
# warning: groff comes with the set-up's groff-base) and the bash
# completion, which must define its function and complete a subcommand.
for p in man1/cogpu.1 man5/cogpu.conf.5 man8/cogpud.8 man8/spank_cogpu.8; do
  page="$prefix/share/man/$p"
  test -r "$page"
  if grep -q '@[A-Z]*@' "$page"; then
    echo "install-check: $page has unexpanded @...@ placeholders" >&2
    exit 1
  fi
  warn=$(groff -man -ww -z "$page" 2>&1)
  if [ -n "$warn" ]; then
    echo "install-check: $page: $warn" >&2
    exit 1
  fi
done
grep -q "$prefix/lib/cogpu/libcogpu" "$prefix/share/man/man1/cogpu.1"
# The default configuration file, every option commented out: it loads.
COGPU_CONFIG="$prefix/share/cogpu/cogpu.conf.example" "$prefix/bin/cogpu" config >/dev/null
comp="$prefix/share/bash-completion/completions/cogpu"
test -r "$comp"
out=$(PATH="$prefix/bin:$PATH" bash -c ". '$comp' && COMP_WORDS=(cogpu stat) &&
  COMP_CWORD=1 && _cogpu && echo \"\${COMPREPLY[*]}\"")
if [ "$out" != status ]; then
  echo "install-check: $comp completes 'cogpu stat' as '$out', not status" >&2
  exit 1
fi
# Nothing installed needs a glibc newer than 2.28 (RHEL/Rocky 8).
"$(dirname "$0")/check-glibc.sh" "$prefix"
echo "install-check: ok ($prefix)"
