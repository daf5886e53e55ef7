/*
 * fuzz-daemon.c: the afl++ driver for cogpud's message handler (`make
 * fuzz`, docs/security.md). Reads one input (a file named on the command
 * line, or stdin) of N*512 bytes and feeds it to the daemon through
 * fuzz-harness.c: no sockets, a few fake connections of a few users, the
 * ledger's invariants and the authorisation rules checked after every
 * message; a broken one abort()s, which afl++ records as a crash.
 *
 *   fuzz-daemon [FILE]       one input (plain build, or to replay a crash)
 *   fuzz-daemon --seeds DIR  write a seed corpus of valid messages to DIR
 *
 * Built with afl-cc (afl-clang-fast), it runs in afl++'s persistent mode:
 * one process, many inputs, the node made idle between them.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz-harness.h"

#ifdef __AFL_FUZZ_TESTCASE_LEN
__AFL_FUZZ_INIT();
#endif

#define FZ_MAX_INPUT (64 * COGPU_MSG_SIZE)

static int write_seeds(const char *dir) {
  static const int types[] = {
      COGPU_M_ATTACH,   COGPU_M_RESERVE, COGPU_M_RELEASE, COGPU_M_CLAIM,
      COGPU_M_UNCLAIM,  COGPU_M_ROOM,    COGPU_M_HELD,    COGPU_M_WAIT,
      COGPU_M_ACK,      COGPU_M_RESUME,  COGPU_M_STATUS,  COGPU_M_DETACH,
      COGPU_M_FIND_JOB, COGPU_M_RECHECK};
  const int nt = (int)(sizeof types / sizeof types[0]);
  if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
    perror(dir);
    return 1;
  }
  uint64_t rnd = 0x9e3779b97f4a7c15ull;
  for (int seed = 0; seed < 16; seed++) {
    cogpu__msg_t m[12];
    int n = 0;
    /* Each seed attaches on a few connections first, then mixes requests,
     * so that the fuzzer starts from inputs that get past ATTACH. */
    for (int k = 0; k < 3; k++) {
      fz_make(&m[n], COGPU_M_ATTACH, &rnd);
      m[n].seq = (m[n].seq & ~0xffu) | (uint32_t)(seed + k);
      fz_version(&m[n]);
      n++;
    }
    while (n < 12) {
      int t = types[(seed * 7 + n * 3) % nt];
      fz_make(&m[n], t, &rnd);
      m[n].seq = (m[n].seq & ~0xffu) | (uint32_t)(seed + n % 3);
      if (t == COGPU_M_WAIT || t == COGPU_M_RESUME)
        m[n].seq = (m[n].seq & ~0xffu) | (uint32_t)(seed + 3);
      fz_version(&m[n]);
      n++;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/seed-%02d", dir, seed);
    FILE *f = fopen(path, "we");
    if (!f || fwrite(m, sizeof m[0], (size_t)n, f) != (size_t)n) {
      perror(path);
      return 1;
    }
    fclose(f);
  }
  return 0;
}

#ifndef __AFL_FUZZ_TESTCASE_LEN
static size_t read_all(int fd, uint8_t *buf, size_t cap) {
  size_t n = 0;
  while (n < cap) {
    ssize_t r = read(fd, buf + n, cap - n);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      break;
    n += (size_t)r;
  }
  return n;
}
#endif

static char fz_dir[] = "/tmp/cogpu-fuzz-XXXXXX";
static char fz_sdir[sizeof fz_dir + 8];

/* The daemon's state directory goes with the process, even one that is
 * about to abort(): a RESET makes a new state file there. */
static void cleanup(void) {
  char p[sizeof fz_sdir + 16];
  snprintf(p, sizeof p, "%s/state", fz_sdir);
  unlink(p);
  snprintf(p, sizeof p, "%s/state.lock", fz_sdir);
  unlink(p);
  rmdir(fz_sdir);
  rmdir(fz_dir);
}

static void run_one(const uint8_t *buf, size_t len) {
  const char *why;
  if (fz_feed(buf, len, &why) != 0) {
    fprintf(stderr, "fuzz-daemon: invariant broken: %s\n", why);
    cleanup();
    abort();
  }
  fz_reset();
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--seeds") == 0)
    return write_seeds(argv[2]);
  if (argc > 2 || (argc == 2 && argv[1][0] == '-' && argv[1][1])) {
    fprintf(stderr, "usage: fuzz-daemon [FILE] | --seeds DIR\n");
    return 2;
  }
  if (!getenv("FAKE_NVML_GPUS"))
    setenv("FAKE_NVML_GPUS", "16G,16G", 1);
  setenv("COGPU_LOG", "off", 1);
  if (!mkdtemp(fz_dir)) {
    perror("mkdtemp");
    return 1;
  }
  snprintf(fz_sdir, sizeof fz_sdir, "%s/d", fz_dir);
  atexit(cleanup);
  const char *why;
  if (fz_init(fz_sdir, &why) != 0) {
    fprintf(stderr, "fuzz-daemon: cannot start the daemon: %s\n", why);
    return 1;
  }
#ifdef __AFL_FUZZ_TESTCASE_LEN
  (void)argc;
  __AFL_INIT();
  const uint8_t *abuf = __AFL_FUZZ_TESTCASE_BUF;
  while (__AFL_LOOP(10000)) {
    size_t len = (size_t)__AFL_FUZZ_TESTCASE_LEN;
    run_one(abuf, len > FZ_MAX_INPUT ? FZ_MAX_INPUT : len);
  }
#else
  static uint8_t buf[FZ_MAX_INPUT];
  int fd = argc == 2 && strcmp(argv[1], "-") ? open(argv[1], O_RDONLY) : 0;
  if (fd < 0) {
    perror(argv[1]);
    return 1;
  }
  run_one(buf, read_all(fd, buf, sizeof buf));
#endif
  fz_fini();
  return 0;
}
