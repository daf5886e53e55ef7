#!/bin/sh
# Checks that every ELF file under an install prefix (or the files given)
# runs on glibc 2.28, the oldest glibc cogpu supports (RHEL/Rocky 8).
# Usage: scripts/check-glibc.sh PREFIX|FILE...
#
# A file fails if it needs a GLIBC_ symbol version newer than 2.28, with
# one exception: functions that glibc 2.28 has too, and that a newer glibc
# gave a new version only because it moved or re-declared them (2.33: the
# stat family, until then macros over __xstat; 2.34: everything from
# libpthread, libdl, librt, libutil and libanl, merged into libc). A build
# on a newer glibc binds those to the new version; the same sources built
# on glibc 2.28 bind them to the old one. So do exp, exp2, log, log2 and
# pow in 2.29, re-versioned when their SVID error wrappers went (the same
# functions, without the matherr hook). A function that glibc 2.28 lacks
# (strerrorname_np, GLIBC_2.32, say) fails wherever it was built.
set -eu
max_minor=28
if [ $# -eq 0 ]; then
  echo "usage: $0 PREFIX|FILE..." >&2
  exit 2
fi
if ! command -v objdump >/dev/null 2>&1; then
  echo "check-glibc: objdump not found (binutils)" >&2
  exit 2
fi
files=$(
  for a in "$@"; do
    if [ -d "$a" ]; then find "$a" -type f; else echo "$a"; fi
  done
)
bad=0
checked=0
for f in $files; do
  # ELF files only: headers, scripts and data are skipped.
  [ "$(head -c 4 "$f" 2>/dev/null | od -An -c | tr -d ' ')" = '177ELF' ] ||
    continue
  checked=$((checked + 1))
  out=$(objdump -T "$f" | awk -v max="$max_minor" -v file="$f" '
    # The stat family was re-versioned in 2.33, and the libraries merged
    # into libc in 2.34; pthread and semaphore functions added after 2.28
    # are not covered.
    function moved(name, minor) {
      if (minor == 29)
        return name ~ /^(exp|exp2|log|log2|pow)$/
      if (minor == 33)
        return name ~ /^(__)?(f?stat|lstat|fstatat|mknod|mknodat)(64)?$/
      if (minor != 34)
        return 0
      if (name ~ /^(pthread_cond_clockwait|pthread_rwlock_clock(rd|wr)lock|pthread_mutex_clocklock|sem_clockwait|pthread_clockjoin_np|pthread_attr_[gs]etsigmask_np)$/)
        return 0
      return name ~ /^(__libc_start_main|pthread_|__pthread_|_pthread_|sem_|dl(open|close|sym|vsym|error|addr|addr1|info|mopen|iterate_phdr)$|thrd_|mtx_|cnd_|tss_|call_once$|shm_(open|unlink)$|timer_|mq_|aio_|lio_|forkpty$|openpty$|login|logout|logwtmp$|getaddrinfo_a$|gai_)/
    }
    /\*UND\*/ && match($0, /GLIBC_2\.[0-9]+(\.[0-9]+)?/) {
      v = substr($0, RSTART, RLENGTH)
      split(v, p, ".")
      name = $NF
      if (p[2] + 0 > max && !moved(name, p[2] + 0))
        printf "%s: %s needs %s (newer than glibc 2.%d)\n", file, name, v, max
    }')
  if [ -n "$out" ]; then
    echo "$out" >&2
    bad=1
  fi
done
if [ "$checked" -eq 0 ]; then
  echo "check-glibc: no ELF file found in $*" >&2
  exit 1
fi
if [ "$bad" -ne 0 ]; then
  echo "check-glibc: these files would not run on glibc 2.$max_minor" >&2
  exit 1
fi
echo "check-glibc: ok ($checked files run on glibc 2.$max_minor and later)"
