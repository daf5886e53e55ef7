/*
 * lockfile.c: how anyone tells that a node daemon lives, whatever became of
 * its socket (node.h). cogpud holds an OFD write lock on two files for its
 * whole life (daemon.c), each holding its pid: SOCKET.lock beside its
 * socket (mode 0644) and cogpud.lock in its daemon_dir (0600: root's
 * alone). The kernel drops them however the daemon ends, kill -9 included,
 * so a dead daemon blocks no one, and daemons never remove them (removing a
 * lock file races with the next daemon's taking it).
 *
 * The lock beside the socket is the one users can read: a client that may
 * use the daemon can reach its socket's directory, which daemon_dir need
 * not be. Probing takes no lock (F_OFD_GETLK), so a client's probe never
 * makes a starting daemon find its lock taken, and only a write lock
 * counts: anyone who can read the file can take a read lock.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "node/node.h"

int cogpu__node_lock_path(const cogpu__config_t *cfg, bool of_socket, char *buf,
                          size_t len) {
  int n = of_socket ? snprintf(buf, len, "%s.lock", cfg->v[COGPU_OPT_SOCKET].s)
                    : snprintf(buf, len, "%s/" COGPU_DAEMON_LOCK_NAME,
                               cfg->v[COGPU_OPT_DAEMON_DIR].s);
  return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

long cogpu__node_lock_pid(int fd) {
  char buf[32];
  ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0)
    return 0;
  buf[n] = 0;
  char *end;
  long pid = strtol(buf, &end, 10);
  return end != buf && (*end == '\n' || *end == 0) && pid > 0 ? pid : 0;
}

bool cogpu__node_lock_held(const char *path, long *pid) {
  *pid = 0;
  int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0)
    return false; /* no such file (no daemon ever ran here), or unreadable */
  struct stat sb;
  /* A lock file counts only if it is root's or this user's: another user
   * must not be able to switch this user's processes into node mode. */
  bool held = fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) &&
              (sb.st_uid == 0 || sb.st_uid == geteuid());
  if (held) {
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
    /* A daemon's lock is a write lock; anyone who can read the file can
     * take a read lock, which says nothing. */
    held = fcntl(fd, F_OFD_GETLK, &fl) == 0 && fl.l_type == F_WRLCK;
  }
  if (held)
    *pid = cogpu__node_lock_pid(fd);
  close(fd);
  return held;
}

bool cogpu__node_daemon_alive(const cogpu__config_t *cfg) {
  char path[4200];
  long pid;
  for (int i = 0; i < 2; i++)
    if (cogpu__node_lock_path(cfg, i == 0, path, sizeof path) == 0 &&
        cogpu__node_lock_held(path, &pid))
      return true;
  return false;
}
