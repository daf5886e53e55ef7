#!/bin/sh
# Builds the Debian packages (debian/) with dpkg-buildpackage -b from a copy
# of this checkout's tracked files (out of tree: the checkout gets no
# build-deb/ and no ../*.deb), runs lintian on them, and tests them: install,
# cogpu doctor, upgrade over an older build (which must restart cogpud, not
# stop it before unpacking), remove, purge.
#
# The test never changes this machine's system: dpkg runs chrooted in a
# copy-on-write view of / (an overlay whose writes go to a tmpfs), in a
# mount namespace of its own, so the real dpkg database, /usr and /etc are
# untouched, and everything goes when the namespace ends. It needs root
# (CI runs as root; the Slurm tests need it too), debhelper, dpkg-dev and
# lintian (scripts/setup.sh installs them); it fails, never skips, without
# them.
#
# The "older build" is the new packages repacked as version VERSION~older1
# with a different /etc/cogpu.conf: upgrading over it runs the maintainer
# scripts of both and replaces the unmodified conffile, as a real upgrade
# does. Usage: scripts/deb-test.sh [DIR]  (DIR keeps the .debs and logs).
set -eu
cd "$(dirname "$0")/.."
top=$(pwd)
fail() {
  echo "deb-test: $*" >&2
  exit 1
}
[ "$(id -u)" -eq 0 ] || fail "needs root (unshare, mount, chroot)"
for t in dpkg-buildpackage dh lintian unshare chroot; do
  command -v "$t" >/dev/null 2>&1 ||
    fail "$t is missing: scripts/setup.sh installs it (dpkg-dev, debhelper, lintian, util-linux)"
done

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
out=${1:-$tmp/out}
mkdir -p "$out"
version=$(dpkg-parsechangelog -l debian/changelog -S Version)

# The tracked files as they are in the working tree.
src=$tmp/src/cogpu
mkdir -p "$src"
git ls-files -z | xargs -0 tar --ignore-failed-read -cf - 2>/dev/null | tar -C "$src" -xf -
COGPU_COMMIT=$(git describe --always --dirty --abbrev=12 --exclude='*' 2>/dev/null || echo unknown)
export COGPU_COMMIT
echo "deb-test: building $version (commit $COGPU_COMMIT)"
# No -dbgsym packages here: the test has no use for them.
if ! (cd "$src" && DEB_BUILD_OPTIONS="noautodbgsym ${DEB_BUILD_OPTIONS:-}" \
  dpkg-buildpackage -b -us -uc -j2) >"$out/build.log" 2>&1; then
  tail -40 "$out/build.log" >&2
  fail "dpkg-buildpackage failed (log: $out/build.log)"
fi
mkdir -p "$out/new" "$out/old"
mv "$tmp"/src/*.deb "$tmp"/src/*.changes "$tmp"/src/*.buildinfo "$out/new/"
ls "$out/new"

# lintian: no error or warning; the tags that remain are explained in
# debian/*.lintian-overrides.
if ! lintian --fail-on error,warning --tag-display-limit 0 "$out"/new/*.changes \
  >"$out/lintian.log" 2>&1; then
  cat "$out/lintian.log" >&2
  fail "lintian found errors or warnings"
fi
echo "deb-test: lintian: $(grep -c . "$out/lintian.log" || true) remark(s) below warning"

# The older build.
old="${version}~older1"
for deb in "$out"/new/*.deb; do
  d=$tmp/repack
  rm -rf "$d"
  dpkg-deb -R "$deb" "$d"
  sed -i -e "s/^Version: .*/Version: $old/" \
    -e "s/(= $version)/(= $old)/g" "$d/DEBIAN/control"
  if [ -f "$d/etc/cogpu.conf" ]; then
    echo "# the older build's file" >>"$d/etc/cogpu.conf"
    (cd "$d" && md5sum etc/cogpu.conf) >"$tmp/sum"
    grep -v ' etc/cogpu.conf$' "$d/DEBIAN/md5sums" >>"$tmp/sum" || true
    mv "$tmp/sum" "$d/DEBIAN/md5sums"
  fi
  dpkg-deb --root-owner-group -b "$d" "$out/old/" >/dev/null
done

# The test, in a private copy-on-write root.
cat >"$tmp/in-root.sh" <<'EOF'
set -eu
step() { echo "deb-test: $*"; }
bad() { echo "deb-test: FAIL: $*" >&2; exit 1; }
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
cd /debs
# man-db's trigger rebuilds its whole database at each dpkg run: not here.
echo "man-db man-db/auto-update boolean false" | debconf-set-selections
# systemd as the maintainer scripts see it on a booted node
# (/run/systemd/system), with what they ask of it logged instead of done.
mkdir -p /run/systemd/system
for t in systemctl deb-systemd-invoke; do
  printf '#!/bin/sh\necho "%s $*" >>/tmp/systemd.log\n' "$t" >"/usr/bin/$t"
  chmod 755 "/usr/bin/$t"
done
step "install the older build"
dpkg -i old/*.deb >/dev/null
grep -q "older build" /etc/cogpu.conf || bad "the older /etc/cogpu.conf is not installed"
step "install: files in place"
for f in /usr/bin/cogpu /usr/sbin/cogpud /usr/lib/cogpu/libcogpu-preload.so \
  /usr/lib/cogpu/spank_cogpu.so /lib/systemd/system/cogpud.service \
  /lib/systemd/system/cogpud.socket /usr/lib/tmpfiles.d/cogpu.conf \
  /usr/share/man/man1/cogpu.1.gz /usr/share/man/man5/cogpu.conf.5.gz \
  /usr/share/man/man8/cogpud.8.gz /usr/share/man/man8/spank_cogpu.8.gz \
  /usr/include/cogpu.h /usr/lib/libcogpu.a /usr/lib/pkgconfig/cogpu.pc \
  /usr/share/bash-completion/completions/cogpu /usr/share/cogpu/slurm/plugstack.conf \
  /usr/share/cogpu/prometheus/cogpu.rules.yml /usr/share/cogpu/prometheus/grafana-dashboard.json \
  /usr/share/doc/cogpu/security.md; do
  [ -e "$f" ] || bad "$f is missing"
done
step "upgrade to the new build: cogpud keeps running through the unpack, then restarts"
: >/tmp/systemd.log
dpkg -i new/*.deb >/dev/null
dpkg -s cogpu | grep -qx "Version: $VERSION" || bad "cogpu is not at $VERSION after the upgrade"
# Jobs run through an upgrade (docs/architecture.md "Rolling upgrades"):
# cogpud is restarted after the new files are in place, never stopped
# before them (a stopped cogpud would leave clients waiting daemon_wait).
cat /tmp/systemd.log
grep -q "^deb-systemd-invoke stop .*cogpud" /tmp/systemd.log &&
  bad "the upgrade stopped cogpud before unpacking"
restarts=$(grep "^deb-systemd-invoke restart " /tmp/systemd.log || true)
for u in cogpud.service cogpud.socket; do
  echo "$restarts" | grep -qw "$u" || bad "the upgrade did not restart $u"
done
grep -q "older build" /etc/cogpu.conf && bad "the unmodified conffile was not upgraded"
/usr/bin/cogpu --version
/usr/sbin/cogpud --check
step "cogpu doctor (no GPU here: it may report problems, but must run and read /etc/cogpu.conf)"
rc=0
COGPU_NODE_MODE=single COGPU_STATE_DIR=/tmp/cogpu-state /usr/bin/cogpu doctor >/tmp/doctor.out 2>&1 || rc=$?
cat /tmp/doctor.out
[ "$rc" -le 1 ] || bad "cogpu doctor exited $rc"
grep -q "/etc/cogpu.conf" /tmp/doctor.out || bad "cogpu doctor did not report /etc/cogpu.conf"
pkg-config --modversion cogpu | grep -qx "${VERSION%%-*}" || bad "pkg-config cogpu"
printf '#include <cogpu.h>\nint main(void){return cogpu_strerror(0)==0;}\n' >/tmp/t.c
if command -v cc >/dev/null; then
  cc /tmp/t.c -o /tmp/t $(pkg-config --cflags --libs cogpu) && /tmp/t || bad "a program linked with -lcogpu"
fi
step "remove: /etc/cogpu.conf stays, the programs go"
dpkg -r cogpu-slurm libcogpu-dev cogpu >/dev/null
[ -e /usr/bin/cogpu ] && bad "/usr/bin/cogpu is still there after remove"
grep -q "^deb-systemd-invoke stop .*cogpud.service" /tmp/systemd.log ||
  bad "removing cogpu did not stop cogpud"
[ -e /etc/cogpu.conf ] || bad "remove took /etc/cogpu.conf (a conffile stays until purge)"
step "purge: nothing left"
dpkg -P cogpu >/dev/null # the others, without conffiles, went with -r
[ -e /etc/cogpu.conf ] && bad "/etc/cogpu.conf is still there after purge"
left=$(dpkg -l 'cogpu*' 'libcogpu*' 2>/dev/null | grep '^[a-z][a-z] ' | grep -v '^un ' || true)
[ -z "$left" ] || bad "packages left: $left"
step "install, upgrade, remove and purge: ok"
EOF
mkdir -p "$tmp/ovl"
VERSION=$version unshare --mount --propagation private sh -eu -c '
  t=$1
  mount -t tmpfs tmpfs "$t/ovl"
  mkdir -p "$t/ovl/upper" "$t/ovl/work" "$t/ovl/root"
  mount -t overlay overlay \
    -o "lowerdir=/,upperdir=$t/ovl/upper,workdir=$t/ovl/work" "$t/ovl/root"
  r=$t/ovl/root
  mount --rbind /dev "$r/dev"
  mount -t proc proc "$r/proc"
  mount -t tmpfs tmpfs "$r/tmp"
  mount -t tmpfs tmpfs "$r/run"
  # A cogpu that make install put under /usr/local would come first in
  # PATH, pkg-config and the linker'"'"'s search: hidden.
  mount -t tmpfs tmpfs "$r/usr/local"
  mkdir -p "$r/debs"
  mount --bind "$2" "$r/debs"
  cp "$t/in-root.sh" "$r/tmp/"
  chroot "$r" sh /tmp/in-root.sh
' sh "$tmp" "$out" || fail "the package test failed"
echo "deb-test: ok"
