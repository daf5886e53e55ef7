/*
 * state.c: the node state's life in cogpud: opened (or, after a crash,
 * recovered by the ledger) in daemon_dir, opened late when the GPUs could
 * not be discovered at start, and forgotten and made anew by `cogpu
 * reset`. Below the dispatch (a RESET message, the first message after
 * the GPUs appear) and the loop (start); above the connections, which a
 * reset ends.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/daemon-int.h"

/* The daemon's directory is the daemon's user's own, writable by no one
 * else and not a symbolic link: a user who could write there could plant
 * state.tmp.<pid>, state.lock or a state of their own. It is created 0755,
 * so that a socket inside it (the default /run/cogpu/cogpu.sock) stays
 * reachable; every file in it is the daemon's, mode 0600. */
int cogpu__daemon_check_dir(const char *dir) {
  struct stat sb;
  if (mkdir(dir, 0755) == 0)
    chmod(dir, 0755); /* the umask narrowed it */
  else if (errno != EEXIST)
    return cogpu__seterr(-errno, "cannot create daemon_dir %s: %s", dir,
                         strerror(errno));
  if (lstat(dir, &sb) != 0)
    return cogpu__seterr(-errno, "daemon_dir %s: %s", dir, strerror(errno));
  if (S_ISLNK(sb.st_mode))
    return cogpu__seterr(-EPERM, "daemon_dir %s is a symbolic link: refused",
                         dir);
  if (!S_ISDIR(sb.st_mode))
    return cogpu__seterr(-ENOTDIR, "daemon_dir %s is not a directory", dir);
  if (sb.st_uid != geteuid())
    return cogpu__seterr(-EPERM,
                         "daemon_dir %s belongs to uid %u, not to the "
                         "daemon's uid %u: refused",
                         dir, (unsigned)sb.st_uid, (unsigned)geteuid());
  if (sb.st_mode & 0022)
    return cogpu__seterr(-EPERM,
                         "daemon_dir %s (mode %04o) is writable by other "
                         "users: refused (they could plant files the daemon "
                         "would use); make it 0755 or 0700",
                         dir, (unsigned)(sb.st_mode & 07777));
  return 0;
}

/* Puts a fresh lock file in the place of path: another's read lock stays
 * on the old one. */
static int open_state(cogpu__daemon_t *d) {
  int rc = cogpu__daemon_check_dir(d->cfg.v[COGPU_OPT_DAEMON_DIR].s);
  if (rc)
    return rc;
  cogpu__config_t cfg = d->cfg;
  /* The daemon's state is its own: root's, readable by nobody else. */
  rc = cogpu__config_set(&cfg, COGPU_OPT_STATE_DIR,
                         d->cfg.v[COGPU_OPT_DAEMON_DIR].s);
  if (rc == 0)
    rc = cogpu__config_set(&cfg, COGPU_OPT_STATE_MODE, "0600");
  if (rc == 0)
    rc = cogpu__config_set(&cfg, COGPU_OPT_STATE_GROUP, "");
  if (rc == 0)
    rc = cogpu__ledger_open_trusted(&cfg, &d->host, &d->dh);
  if (rc)
    return rc;
  d->proxy = *d->dh;
  d->orphans_dirty = true; /* a state left by a previous daemon has slots */
  return 0;
}

int cogpu__daemon_ensure_state(cogpu__daemon_t *d) {
  return d->dh ? 0 : open_state(d);
}

int cogpu__daemon_reset(cogpu__daemon_t *d, bool force, int *live) {
  int n = 0, parked = 0, pid = 0;
  if (d->dh)
    LEDGER_FOR_SLOTS(d->dh->st, s) {
      const ledger_slot_t *sl = &d->dh->st->slots[s];
      if (sl->state != SLOT_ACTIVE || s == d->dh->slot)
        continue;
      n++;
      if (sl->susp != SUSP_NONE && !parked++)
        pid = sl->pid;
    }
  *live = n;
  /* Not even with --force: the state is the only record that those jobs'
   * processes are checkpointed (or being moved), and a new one would leave
   * them wedged in the driver for good, or let an operation in flight act
   * on an unrelated job that took its slot (issue 23, items 7 and 8). */
  if (parked)
    return cogpu__seterr(-EBUSY,
                         "%d jobs are suspended or being moved (the job of "
                         "pid %d among them): a reset would leave their "
                         "processes checkpointed with nobody to restore "
                         "them; `cogpu resume PID` them, or end them, first",
                         parked, pid);
  if (n && !force)
    return cogpu__seterr(-EBUSY,
                         "%d processes are attached; `cogpu reset --force` "
                         "disconnects them (their memory is no longer "
                         "accounted)",
                         n);
  for (dconn_t *c = d->conns, *next; c; c = next) {
    next = c->next;
    cogpu__daemon_end_later(d, c);
    if (c->kind == DC_MAIN || c->kind == DC_WAIT || c->kind == DC_PIDFD)
      cogpu__conn_end(d, c);
  }
  if (d->dh) {
    char path[600];
    snprintf(path, sizeof path, "%s", d->dh->path);
    cogpu__ledger_close_trusted(d->dh);
    d->dh = NULL;
    d->state_epoch++; /* operations under way are of the old state's jobs */
    unlink(path);
  }
  cogpu__config_t cfg;
  if (cogpu__config_load(&cfg) == 0) {
    /* An edited configuration applies, but the daemon stays where it is
     * (--socket and --state-dir are not in the file). */
    cfg.v[COGPU_OPT_SOCKET] = d->cfg.v[COGPU_OPT_SOCKET];
    cfg.v[COGPU_OPT_DAEMON_DIR] = d->cfg.v[COGPU_OPT_DAEMON_DIR];
    d->cfg = cfg;
  }
  int rc = open_state(d);
  if (rc == COGPU_ENVML || rc == COGPU_ENOGPU) {
    /* Served again once the GPUs can be discovered. */
    cogpu__log(COGPU_LOG_ERROR, "reset: no GPUs to make a new state: %s",
               cogpu_last_error());
  } else if (rc) {
    /* Anything else (an unsafe daemon_dir, a planted file) will not pass
     * by itself: stop, loudly, rather than serve without a ledger. */
    cogpu__log(COGPU_LOG_ERROR,
               "a reset could not make a new node state: %s; stopping",
               cogpu_last_error());
    d->stop = true;
    d->failed = true;
  }
  return rc;
}
