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
echo "install-check: ok ($prefix)"
