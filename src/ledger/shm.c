/*
 * shm.c: the node state file: finding, checking, creating, rebuilding and
 * mapping it, and claiming a client slot in it.
 *
 * Who shares a node's state: every user who can open state_dir/state for
 * writing. The file is created with state_mode (default 0666: all users of
 * the node share one queue; 0660 with state_group: one group; 0600: one
 * user). A file or directory whose owner or mode does not match is refused
 * rather than trusted. cogpu is a cooperative safety mechanism, not a
 * security boundary: a user who can write the state can disturb it.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ledger-int.h"

#define SHM_OPEN_TRIES 8

static int shm_dir_lock(struct cogpu_s *h, mode_t mode);

/* Where a deleted state is re-published by reference (below). */
static void shm_ref_path(const struct cogpu_s *h, char *buf, size_t len) {
  snprintf(buf, len, "%s.unlinked", h->path);
}

static int shm_err_errno(int e, const char *what, const char *path) {
  return cogpu__seterr(-e, "%s %s: %s", what, path, strerror(e));
}

uint64_t cogpu__ledger_checksum(const ledger_hdr_t *hd) {
  /* FNV-1a over the immutable part: the fixed header fields and the GPU
   * descriptors' identity. */
  uint64_t x = 1469598103934665603ull;
  const unsigned char *p = (const unsigned char *)hd;
  size_t n = offsetof(ledger_hdr_t, checksum);
  for (size_t i = 0; i < n; i++)
    x = (x ^ p[i]) * 1099511628211ull;
  for (uint32_t g = 0; g < hd->ngpus && g < LEDGER_MAX_GPUS; g++) {
    p = (const unsigned char *)&hd->gpus[g];
    for (size_t i = 0; i < offsetof(ledger_gpu_t, foreign); i++)
      x = (x ^ p[i]) * 1099511628211ull;
  }
  return x;
}

static mode_t dir_mode_for(mode_t file_mode) {
  if (file_mode & 0002)
    return 01777;
  if (file_mode & 0020)
    return 02770;
  return 0700;
}

static int shm_check_dir(const char *dir, mode_t file_mode) {
  struct stat sb;
  if (lstat(dir, &sb) != 0)
    return shm_err_errno(errno, "cannot use state directory", dir);
  if (!S_ISDIR(sb.st_mode))
    return cogpu__seterr(-ENOTDIR,
                         "state directory %s is not a directory (or is a "
                         "symbolic link); set COGPU_STATE_DIR",
                         dir);
  if ((sb.st_mode & 0002) && !(sb.st_mode & S_ISVTX))
    return cogpu__seterr(-EPERM,
                         "state directory %s (owner uid %u, mode %04o) is "
                         "writable by others without the sticky bit: refused",
                         dir, (unsigned)sb.st_uid, sb.st_mode & 07777);
  if ((file_mode & 0077) == 0 && sb.st_uid != geteuid())
    return cogpu__seterr(-EPERM,
                         "state directory %s belongs to uid %u but state_mode "
                         "%04o makes the state private to its user",
                         dir, (unsigned)sb.st_uid, (unsigned)file_mode);
  return 0;
}

static int shm_ensure_dir(const char *dir, mode_t file_mode) {
  mode_t dm = dir_mode_for(file_mode);
  if (mkdir(dir, dm) == 0) {
    chmod(dir, dm); /* the umask narrowed it */
  } else if (errno != EEXIST) {
    return cogpu__seterr(-errno,
                         "cannot create state directory %s: %s (its parent "
                         "must exist; set COGPU_STATE_DIR)",
                         dir, strerror(errno));
  }
  return shm_check_dir(dir, file_mode);
}

/* The file must be ours, root's or the directory owner's, with the
 * configured mode: anything else was made by someone we should not trust,
 * or under another configuration. */
static int shm_check_file(struct cogpu_s *h, int fd, mode_t want) {
  struct stat sb, db;
  if (fstat(fd, &sb) != 0)
    return shm_err_errno(errno, "cannot stat", h->path);
  if (!S_ISREG(sb.st_mode))
    return cogpu__seterr(COGPU_ESTATE, "%s is not a regular file", h->path);
  char dir[512];
  snprintf(dir, sizeof dir, "%s", h->cfg.v[COGPU_OPT_STATE_DIR].s);
  uid_t downer = stat(dir, &db) == 0 ? db.st_uid : 0;
  if (sb.st_uid != 0 && sb.st_uid != geteuid() && sb.st_uid != downer)
    return cogpu__seterr(-EPERM,
                         "state file %s belongs to uid %u, which is neither "
                         "root, you, nor the owner of its directory: refused",
                         h->path, (unsigned)sb.st_uid);
  if (sb.st_mode & 0022)
    return cogpu__seterr(-EPERM,
                         "state file %s can be written by other users (mode "
                         "%04o): a ledger that several users write cannot "
                         "be trusted by any of them; a node shared by "
                         "several users runs the node daemon, cogpud (see "
                         "README), and single-user mode keeps a ledger of "
                         "your own (state_dir, state_mode 0600)",
                         h->path, sb.st_mode & 0777);
  if ((sb.st_mode & 0777) != want)
    return cogpu__seterr(-EPERM,
                         "state file %s has mode %04o but state_mode is %04o: "
                         "refused (an admin should fix the mode or run "
                         "`cogpu reset`)",
                         h->path, sb.st_mode & 0777, (unsigned)want);
  return 0;
}

static uint64_t shm_margin(const cogpu__optval_t *m, uint64_t total) {
  if (m->pct)
    return total / 100 * (uint64_t)m->i + total % 100 * (uint64_t)m->i / 100;
  return m->u < total ? m->u : total;
}

static int shm_init_state(struct cogpu_s *h, ledger_state_t *st) {
  cogpu__gpu_desc_t gpus[LEDGER_MAX_GPUS];
  size_t n = 0;
  int rc = cogpu__nvml_open();
  if (rc == 0)
    rc = cogpu__nvml_discover(gpus, LEDGER_MAX_GPUS, &n);
  if (rc != 0)
    return rc;
  ledger_hdr_t *hd = &st->hdr;
  const cogpu__config_t *c = &h->cfg;
  memcpy(hd->magic, LEDGER_MAGIC, sizeof hd->magic);
  hd->version = LEDGER_VERSION;
  hd->hdr_size = sizeof(ledger_hdr_t);
  hd->file_size = sizeof(ledger_state_t);
  hd->slot_size = sizeof(ledger_slot_t);
  hd->waiter_size = sizeof(ledger_waiter_t);
  hd->max_slots = LEDGER_MAX_SLOTS;
  hd->max_waiters = LEDGER_MAX_WAITERS;
  hd->ngpus = (uint32_t)n;
  hd->policy = (uint32_t)c->v[COGPU_OPT_POLICY].i;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  hd->created_ns = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
  hd->max_clients = (uint64_t)c->v[COGPU_OPT_MAX_CLIENTS].i;
  hd->mmu_max_age_ms = (uint64_t)c->v[COGPU_OPT_MMU_MAX_AGE].i;
  hd->foreign_refresh_ms = (uint64_t)c->v[COGPU_OPT_FOREIGN_REFRESH].i;
  hd->sweep_interval_ms = (uint64_t)c->v[COGPU_OPT_SWEEP_INTERVAL].i;
  for (size_t g = 0; g < n; g++) {
    ledger_gpu_t *gp = &hd->gpus[g];
    snprintf(gp->uuid, sizeof gp->uuid, "%s", gpus[g].uuid);
    snprintf(gp->name, sizeof gp->name, "%s", gpus[g].name);
    gp->index = gpus[g].index;
    gp->total = gpus[g].total;
    gp->margin = shm_margin(&c->v[COGPU_OPT_MARGIN], gpus[g].total);
  }
  hd->checksum = cogpu__ledger_checksum(hd);
  return 0;
}

static int shm_apply_owner(int fd, const char *group, mode_t mode) {
  if (group && *group) {
    struct group *gr = getgrnam(group);
    if (!gr)
      return cogpu__seterr(COGPU_ECONFIG, "state_group: no group named '%s'",
                           group);
    if (fchown(fd, (uid_t)-1, gr->gr_gid) != 0)
      return cogpu__seterr(-errno, "cannot give the state to group %s: %s",
                           group, strerror(errno));
  }
  if (fchmod(fd, mode) != 0)
    return cogpu__seterr(-errno, "cannot set the state's mode: %s",
                         strerror(errno));
  return 0;
}

/* Allocates the state's blocks in the file at fd (named path), or says
 * why not and what to do. */
static int shm_allocate(int fd, const char *path) {
  int e = posix_fallocate(fd, 0, sizeof(ledger_state_t));
  if (e == 0)
    return 0;
  char need[32];
  cogpu__fmt_size(sizeof(ledger_state_t), need, sizeof need);
  if (e == ENOSPC || e == EFBIG || e == EDQUOT)
    return cogpu__seterr(-e,
                         "cannot allocate the node state %s (%s): %s; free "
                         "space there, or set state_dir to a file system "
                         "with room",
                         path, need, strerror(e));
  return cogpu__seterr(-e, "cannot allocate the node state %s (%s): %s", path,
                       need, strerror(e));
}

/* Build a complete state in a temporary file and link it into place, so no
 * process ever sees a half-written state. Returns 0, or -EEXIST when
 * another process won the race (then open theirs). */
static int shm_create(struct cogpu_s *h, mode_t mode) {
  char tmp[600];
  snprintf(tmp, sizeof tmp, "%s.tmp.%d", h->path, (int)getpid());
  /* A file already there (left by a crash, or planted: a hard link to
   * someone's file) is never written into: it goes, and ours is new. */
  unlink(tmp);
  int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0)
    return shm_err_errno(errno, "cannot create state file", tmp);
  int rc = shm_apply_owner(fd, h->cfg.v[COGPU_OPT_STATE_GROUP].s, mode);
  /* Every block is allocated now: a file that is only sized (ftruncate)
   * would fault with SIGBUS, in whichever process first touches a page, when
   * the file system (a small or full /dev/shm) has no room for it. */
  if (rc == 0)
    rc = shm_allocate(fd, tmp);
  void *p = MAP_FAILED;
  if (rc == 0) {
    p = mmap(NULL, sizeof(ledger_state_t), PROT_READ | PROT_WRITE, MAP_SHARED,
             fd, 0);
    if (p == MAP_FAILED)
      rc = shm_err_errno(errno, "cannot map state file", tmp);
  }
  if (rc == 0)
    rc = shm_init_state(h, p);
  if (p != MAP_FAILED)
    munmap(p, sizeof(ledger_state_t));
  cogpu__fault(COGPU_FP_CREATE);
  if (rc == 0 && link(tmp, h->path) != 0)
    rc = errno == EEXIST ? -EEXIST
                         : shm_err_errno(errno, "cannot publish", h->path);
  if (rc == 0) {
    /* A new state replaces any re-published deleted one. */
    char rp[600];
    shm_ref_path(h, rp, sizeof rp);
    unlink(rp);
  }
  unlink(tmp);
  close(fd);
  if (rc == 0)
    cogpu__log(COGPU_LOG_INFO, "created node state %s", h->path);
  return rc;
}

int cogpu__ledger_shm_in_use(int fd, bool *in_use) {
  struct flock fl = {.l_type = F_WRLCK,
                     .l_whence = SEEK_SET,
                     .l_start = LEDGER_LOCK_BASE,
                     .l_len = LEDGER_MAX_SLOTS};
  if (fcntl(fd, F_OFD_GETLK, &fl) != 0)
    return -errno;
  *in_use = fl.l_type != F_UNLCK;
  return 0;
}

/* Why the file at fd cannot be used as this version's state, or NULL. */
static const char *shm_validate(int fd, char *why, size_t len) {
  ledger_hdr_t hd;
  struct stat sb;
  if (fstat(fd, &sb) != 0)
    return strerror(errno);
  ssize_t r = pread(fd, &hd, sizeof hd, 0);
  if (r < (ssize_t)offsetof(ledger_hdr_t, hdr_size))
    snprintf(why, len, "it is truncated (%lld bytes)", (long long)sb.st_size);
  else if (memcmp(hd.magic, LEDGER_MAGIC, sizeof hd.magic) != 0)
    snprintf(why, len, "it is not a cogpu state (bad magic)");
  else if (hd.version != LEDGER_VERSION)
    snprintf(why, len, "it has layout version %u; this cogpu reads %u",
             hd.version, LEDGER_VERSION);
  else if (r != sizeof hd || hd.hdr_size != sizeof hd ||
           hd.file_size != sizeof(ledger_state_t) ||
           (uint64_t)sb.st_size != sizeof(ledger_state_t) ||
           hd.slot_size != sizeof(ledger_slot_t) ||
           hd.waiter_size != sizeof(ledger_waiter_t) ||
           hd.max_slots != LEDGER_MAX_SLOTS ||
           hd.max_waiters != LEDGER_MAX_WAITERS)
    snprintf(why, len,
             "its sizes do not match this build (file %lld bytes, "
             "expected %zu)",
             (long long)sb.st_size, sizeof(ledger_state_t));
  else if (hd.ngpus > LEDGER_MAX_GPUS || hd.policy >= COGPU_POLICY__COUNT ||
           hd.checksum != cogpu__ledger_checksum(&hd))
    snprintf(why, len, "its header is corrupt (checksum mismatch)");
  else
    return NULL;
  return why;
}

/* A state that cannot be read: set it aside and start afresh if nobody
 * uses it; otherwise refuse and say what to do. Called with the directory
 * lock held. */
static int shm_replace_bad(struct cogpu_s *h, int fd, const char *why) {
  bool busy = true;
  int rc = cogpu__ledger_shm_in_use(fd, &busy);
  if (rc != 0 || busy)
    return cogpu__seterr(COGPU_ESTATE,
                         "state file %s cannot be used: %s; live processes "
                         "still use it, so it was left alone. Stop them, or "
                         "run `cogpu reset --force`, or point COGPU_STATE_DIR "
                         "elsewhere",
                         h->path, why);
  char bad[640];
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  snprintf(bad, sizeof bad, "%s.bad.%lld.%09ld.%d", h->path,
           (long long)ts.tv_sec, ts.tv_nsec, (int)getpid());
  if (rename(h->path, bad) != 0)
    return cogpu__seterr(COGPU_ESTATE,
                         "state file %s cannot be used (%s) and cannot be "
                         "moved aside: %s; an admin should run `cogpu reset "
                         "--force`",
                         h->path, why, strerror(errno));
  cogpu__log(COGPU_LOG_WARN,
             "state file %s could not be used (%s) and no process used it: "
             "kept as %s, starting a new state",
             h->path, why, bad);
  return 0;
}

/* --- A state deleted under running processes (issue 11 item 4) ---------
 * systemd-logind's RemoveIPC=yes (its default) deletes a user's files and
 * directories in /dev/shm when their last session ends, although their
 * jobs run on. The attached processes keep the unlinked file; a newcomer
 * would create a second state, and the GPUs would be booked twice.
 *
 * The file cannot be linked back under its name: Linux refuses linkat() of
 * an inode whose link count fell to 0 (-ENOENT; only an O_TMPFILE file
 * before its first link may be), even through /proc/self/fd. So an attached
 * process that finds its state unlinked (st_nlink == 0, checked off the
 * fast path: a request that does not fit, a waiter's housekeeping tick,
 * status) re-publishes it by reference instead: it writes
 * state_dir/state.unlinked, "PID FD INODE", naming its own descriptor of
 * the file. A newcomer that finds no state looks there first and opens
 * /proc/PID/fd/FD, which is the very inode (same mapping, same OFD
 * liveness locks, same futex words), if it is still unlinked, the same
 * inode and a valid state; otherwise it creates a new state as usual. Each
 * attached process re-checks at its ticks, so the reference moves on to a
 * live process when its writer exits. If a new state was created meanwhile
 * (a newcomer came first), both exist: the error names both. `cogpu reset`
 * retires a state before removing it (its magic is overwritten), and a
 * retired state is never re-published. In node mode the state is root's,
 * in /run/cogpu (created at boot by contrib/systemd/cogpu-tmpfiles.conf),
 * which RemoveIPC does not touch. */
/* Opens the state an attached process re-published by reference, or
 * returns -1 (and removes a stale reference). Directory lock held. */
static int shm_open_ref(struct cogpu_s *h, mode_t mode) {
  char rp[600], buf[96], proc[64], why[256];
  shm_ref_path(h, rp, sizeof rp);
  int rfd = open(rp, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (rfd < 0)
    return -1;
  ssize_t n = read(rfd, buf, sizeof buf - 1);
  close(rfd);
  int pid = 0, ofd = -1;
  unsigned long long ino = 0;
  int fd = -1;
  if (n > 0) {
    buf[n] = 0;
    if (sscanf(buf, "%d %d %llu", &pid, &ofd, &ino) == 3 && pid > 0 &&
        ofd >= 0) {
      snprintf(proc, sizeof proc, "/proc/%d/fd/%d", pid, ofd);
      fd = open(proc, O_RDWR | O_CLOEXEC);
    }
  }
  struct stat sb;
  if (fd >= 0 &&
      (fstat(fd, &sb) != 0 || sb.st_nlink != 0 ||
       (unsigned long long)sb.st_ino != ino || shm_check_file(h, fd, mode) ||
       shm_validate(fd, why, sizeof why))) {
    close(fd);
    fd = -1;
  }
  if (fd < 0) {
    unlink(rp); /* its writer is gone, or it names another file now */
    return -1;
  }
  cogpu__log(COGPU_LOG_WARN,
             "node state %s was deleted (systemd-logind RemoveIPC?); "
             "joining the state still used by pid %d",
             h->path, pid);
  return fd;
}

int cogpu__ledger_shm_check_linked(struct cogpu_s *h) {
  struct stat sb, cur;
  if (cogpu__ledger_trusted(h) || h->fd < 0 || h->forked)
    return 0;
  if (fstat(h->fd, &sb) != 0 || sb.st_nlink != 0)
    return 0;
  if (memcmp(h->st->hdr.magic, LEDGER_MAGIC, sizeof h->st->hdr.magic) != 0)
    return 0; /* retired by `cogpu reset --force`: not ours to revive */
  mode_t mode = (mode_t)h->cfg.v[COGPU_OPT_STATE_MODE].i;
  if (shm_ensure_dir(h->cfg.v[COGPU_OPT_STATE_DIR].s, mode) != 0)
    return -1;
  int lk = shm_dir_lock(h, mode);
  if (lk < 0)
    return -1;
  int rc = 0;
  if (stat(h->path, &cur) == 0) {
    if (!h->unlinked_said)
      cogpu__log(COGPU_LOG_ERROR,
                 "node state %s was deleted under running processes "
                 "(systemd-logind RemoveIPC?), and a new state %s (inode "
                 "%llu) was created meanwhile: this process and others still "
                 "use the deleted one (inode %llu), so the GPUs are booked "
                 "in two ledgers until they end. Set RemoveIPC=no in "
                 "/etc/systemd/logind.conf, or run the node daemon",
                 h->path, h->path, (unsigned long long)cur.st_ino,
                 (unsigned long long)sb.st_ino);
    h->unlinked_said = true;
    rc = -1;
  } else {
    char rp[600], tmp[640], buf[96];
    shm_ref_path(h, rp, sizeof rp);
    int rfd = open(rp, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    ssize_t n = rfd >= 0 ? read(rfd, buf, sizeof buf - 1) : -1;
    if (rfd >= 0)
      close(rfd);
    int pid = 0, ofd = -1;
    unsigned long long ino = 0;
    bool live = false;
    struct stat o;
    if (n > 0) {
      buf[n] = 0;
      /* Re-published already, through a descriptor that is still open:
       * another handle of this process, or a process that lives. */
      if (sscanf(buf, "%d %d %llu", &pid, &ofd, &ino) == 3 &&
          ino == (unsigned long long)sb.st_ino && pid > 0 && ofd >= 0)
        live = pid == getpid() ? fstat(ofd, &o) == 0 && o.st_ino == sb.st_ino &&
                                     o.st_dev == sb.st_dev
                               : kill(pid, 0) == 0 || errno == EPERM;
    }
    if (!live) {
      snprintf(tmp, sizeof tmp, "%s.%d", rp, (int)getpid());
      int wfd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC,
                     0600);
      int len = snprintf(buf, sizeof buf, "%d %d %llu\n", (int)getpid(), h->fd,
                         (unsigned long long)sb.st_ino);
      if (wfd < 0 || write(wfd, buf, (size_t)len) != len ||
          rename(tmp, rp) != 0) {
        cogpu__log(COGPU_LOG_ERROR,
                   "node state %s was deleted under running processes and "
                   "cannot be re-published (%s): a newcomer will start a "
                   "second state",
                   h->path, strerror(errno));
        unlink(tmp);
        rc = -1;
      } else {
        cogpu__log(COGPU_LOG_ERROR,
                   "node state %s was deleted under running processes "
                   "(systemd-logind RemoveIPC?): re-published for newcomers "
                   "through %s; set RemoveIPC=no in /etc/systemd/logind.conf, "
                   "or run the node daemon",
                   h->path, rp);
      }
      if (wfd >= 0)
        close(wfd);
    }
  }
  close(lk);
  return rc;
}

/* The lock is readable (so lockable) by those who may use the state, and
 * no one else: a user who could flock it would stall state creation. */
static int shm_dir_lock(struct cogpu_s *h, mode_t mode) {
  char lp[600];
  mode_t lmode = 0600 | (mode & 0044);
  snprintf(lp, sizeof lp, "%s.lock", h->path);
  int fd = open(lp, O_RDONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, lmode);
  if (fd < 0 && errno == EACCES)
    fd = open(lp, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0)
    return shm_err_errno(errno, "cannot open", lp);
  fchmod(fd, lmode);
  while (flock(fd, LOCK_EX) != 0 && errno == EINTR) {
  }
  return fd;
}

/* Open the state (creating or replacing it under the directory lock when
 * needed) and return a checked, mapped file descriptor. */
static int shm_open_file(struct cogpu_s *h, mode_t mode, int *out) {
  char why[256];
  for (int tries = 0; tries < SHM_OPEN_TRIES; tries++) {
    int fd = open(h->path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 && errno != ENOENT) {
      struct stat sb;
      if (errno == EACCES && stat(h->path, &sb) == 0)
        return cogpu__seterr(-EACCES,
                             "cannot open state file %s (owner uid %u, mode "
                             "%04o): permission denied; the node's state_mode "
                             "must let every cogpu user write it",
                             h->path, (unsigned)sb.st_uid, sb.st_mode & 0777);
      return shm_err_errno(errno, "cannot open state file", h->path);
    }
    if (fd >= 0) {
      int rc = shm_check_file(h, fd, mode);
      const char *bad = rc ? NULL : shm_validate(fd, why, sizeof why);
      if (rc == 0 && !bad) {
        *out = fd;
        return 0;
      }
      if (rc != 0) {
        close(fd);
        return rc;
      }
      int lk = shm_dir_lock(h, mode);
      if (lk < 0) {
        close(fd);
        return lk;
      }
      /* Someone may have replaced it while we waited for the lock. */
      struct stat a, b;
      bool same = fstat(fd, &a) == 0 && stat(h->path, &b) == 0 &&
                  a.st_ino == b.st_ino && a.st_dev == b.st_dev;
      rc = same ? shm_replace_bad(h, fd, bad) : 0;
      close(lk);
      close(fd);
      if (rc != 0)
        return rc;
      continue;
    }
    int lk = shm_dir_lock(h, mode);
    if (lk < 0)
      return lk;
    if (access(h->path, F_OK) != 0) {
      int ref = shm_open_ref(h, mode);
      if (ref >= 0) {
        close(lk);
        *out = ref;
        return 0;
      }
    }
    int rc = access(h->path, F_OK) == 0 ? -EEXIST : shm_create(h, mode);
    close(lk);
    if (rc != 0 && rc != -EEXIST)
      return rc;
  }
  return cogpu__seterr(COGPU_ESTATE, "state file %s keeps changing; retry",
                       h->path);
}

/* Claim a free client slot: the first whose liveness byte we can lock. */
static int shm_claim_slot(struct cogpu_s *h) {
  uint32_t start = (uint32_t)getpid() % LEDGER_MAX_SLOTS;
  for (int pass = 0; pass < 2; pass++) {
    for (uint32_t k = 0; k < LEDGER_MAX_SLOTS; k++) {
      uint32_t s = (start + k) % LEDGER_MAX_SLOTS;
      /* First pass: skip slots that look taken, to spare syscalls. */
      if (pass == 0 && h->st->slots[s].state == SLOT_ACTIVE)
        continue;
      struct flock fl = {.l_type = F_WRLCK,
                         .l_whence = SEEK_SET,
                         .l_start = LEDGER_LOCK_BASE + s,
                         .l_len = 1};
      if (fcntl(h->fd, F_OFD_SETLK, &fl) == 0) {
        h->slot = s;
        h->res_slot = s;
        h->gen = atomic_fetch_add(&h->st->slots[s].gen, 1) + 1;
        /* Named at once, even as an observer: a process that stops while
         * holding the lock is named to those it blocks. */
        h->st->slots[s].pid = getpid();
        return 0;
      }
      if (errno != EAGAIN && errno != EACCES)
        return shm_err_errno(errno, "cannot lock a client slot in", h->path);
    }
  }
  return cogpu__seterr(-ENOSPC, "all %u client slots of %s are in use",
                       LEDGER_MAX_SLOTS, h->path);
}

int cogpu__ledger_shm_open(struct cogpu_s *h) {
  const char *dir = h->cfg.v[COGPU_OPT_STATE_DIR].s;
  mode_t mode = (mode_t)h->cfg.v[COGPU_OPT_STATE_MODE].i;
  snprintf(h->path, sizeof h->path, "%s/state", dir);
  int rc = shm_ensure_dir(dir, mode);
  if (rc == 0)
    rc = shm_open_file(h, mode, &h->fd);
  if (rc != 0)
    return rc;
  void *p = mmap(NULL, sizeof(ledger_state_t), PROT_READ | PROT_WRITE,
                 MAP_SHARED, h->fd, 0);
  if (p == MAP_FAILED) {
    rc = shm_err_errno(errno, "cannot map state file", h->path);
    close(h->fd);
    return rc;
  }
  h->st = p;
  rc = shm_claim_slot(h);
  if (rc != 0)
    cogpu__ledger_shm_close(h);
  return rc;
}

void cogpu__ledger_shm_close(struct cogpu_s *h) {
  if (h->st)
    munmap(h->st, sizeof(ledger_state_t));
  h->st = NULL;
  if (h->fd >= 0 && !h->forked)
    close(h->fd); /* drops our liveness lock */
  h->fd = -1;
}
