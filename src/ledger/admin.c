/*
 * admin.c: reset and inspection of a node state without attaching to it.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "ledger-int.h"
#include "ledger/admin.h"

static void admin_path(const cogpu__config_t *cfg, char *buf, size_t len) {
  snprintf(buf, len, "%s/state", cfg->v[COGPU_OPT_STATE_DIR].s);
}

static int admin_count_live(int fd, int *live) {
  *live = 0;
  for (uint32_t s = 0; s < LEDGER_MAX_SLOTS; s++) {
    struct flock fl = {.l_type = F_WRLCK,
                       .l_whence = SEEK_SET,
                       .l_start = LEDGER_LOCK_BASE + s,
                       .l_len = 1};
    if (fcntl(fd, F_OFD_GETLK, &fl) != 0)
      return -errno;
    *live += fl.l_type != F_UNLCK;
  }
  return 0;
}

int cogpu__ledger_live(const cogpu__config_t *cfg, bool *exists, int *live) {
  char path[600];
  admin_path(cfg, path, sizeof path);
  *live = 0;
  int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  *exists = fd >= 0;
  if (fd < 0)
    return errno == ENOENT ? 0
                           : cogpu__seterr(-errno, "cannot open %s: %s", path,
                                           strerror(errno));
  int rc = admin_count_live(fd, live);
  close(fd);
  if (rc)
    return cogpu__seterr(rc, "cannot inspect locks of %s: %s", path,
                         strerror(-rc));
  return 0;
}

int cogpu__ledger_reset(const cogpu__config_t *cfg, bool force, int *live) {
  bool exists;
  int rc = cogpu__ledger_live(cfg, &exists, live);
  if (rc)
    return rc;
  char path[600];
  admin_path(cfg, path, sizeof path);
  if (!exists)
    return 0;
  if (*live > 0 && !force)
    return cogpu__seterr(-EBUSY,
                         "%d process(es) still use %s; stop them first or "
                         "use --force (they keep the old state until they "
                         "exit, outside the new queue)",
                         *live, path);
  /* Retired first: processes still attached to it must not re-publish it
   * when they find it deleted (cogpu__ledger_shm_check_linked). */
  int fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  if (fd >= 0) {
    if (pwrite(fd, LEDGER_RETIRED_MAGIC, 8, 0) != 8)
      cogpu__log(COGPU_LOG_WARN, "cannot mark %s as retired: %s", path,
                 strerror(errno));
    close(fd);
  }
  if (unlink(path) != 0)
    return cogpu__seterr(-errno, "cannot remove %s: %s", path, strerror(errno));
  char ref[640];
  snprintf(ref, sizeof ref, "%s.unlinked", path);
  unlink(ref);
  cogpu__log(COGPU_LOG_INFO, "removed node state %s", path);
  return 0;
}

const char *cogpu__ledger_check(const cogpu__config_t *cfg, char *why,
                                size_t len) {
  char path[600];
  admin_path(cfg, path, sizeof path);
  int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    snprintf(why, len, "cannot open %s: %s", path, strerror(errno));
    return why;
  }
  ledger_hdr_t hd;
  ssize_t r = pread(fd, &hd, sizeof hd, 0);
  off_t size = lseek(fd, 0, SEEK_END);
  close(fd);
  if (r != (ssize_t)sizeof hd || memcmp(hd.magic, LEDGER_MAGIC, 8) != 0)
    snprintf(why, len, "%s is not a cogpu state", path);
  else if (hd.version != LEDGER_VERSION)
    snprintf(why, len, "%s has layout version %u, this cogpu reads %u", path,
             hd.version, LEDGER_VERSION);
  else if (size != (off_t)sizeof(ledger_state_t) ||
           hd.checksum != cogpu__ledger_checksum(&hd))
    snprintf(why, len, "%s is corrupt (size or checksum)", path);
  else
    return NULL;
  return why;
}
