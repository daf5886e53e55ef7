/*
 * proc.c: what /proc tells of this process and of others, and users' names.
 */
#include <dirent.h>
#include <fcntl.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "internal.h"

void cogpu__self_cmdline(char *buf, size_t len) {
  FILE *f = fopen("/proc/self/cmdline", "re");
  size_t n = f ? fread(buf, 1, len - 1, f) : 0;
  if (f)
    fclose(f);
  buf[n] = 0;
  /* Arguments are NUL-separated: shown with spaces. */
  for (size_t i = 0; n && i < n - 1; i++)
    if (buf[i] == 0)
      buf[i] = ' ';
}

void cogpu__user_name(uint32_t uid, char *buf, size_t len) {
  struct passwd pw, *res = NULL;
  char tmp[1024];
  if (getpwuid_r(uid, &pw, tmp, sizeof tmp, &res) == 0 && res)
    snprintf(buf, len, "%s", res->pw_name);
  else
    snprintf(buf, len, "%u", uid);
}

/* A thread's state letter from /proc/PID/task/TID/stat: after the last ')'
 * (a command name may hold any character, ')' included). */
static char thread_state(int dfd, const char *tid) {
  char path[300], buf[512];
  snprintf(path, sizeof path, "%s/stat", tid);
  int fd = openat(dfd, path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return 0;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0)
    return 0;
  buf[n] = 0;
  char *p = strrchr(buf, ')');
  return p && p[1] == ' ' ? p[2] : 0;
}

bool cogpu__proc_runnable(pid_t pid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
  DIR *dir = opendir(path);
  if (!dir)
    return false;
  /* The caller's own thread runs by definition: it is not news. */
  long self = pid == getpid() ? syscall(SYS_gettid) : 0;
  bool found = false;
  for (struct dirent *e; !found && (e = readdir(dir));) {
    if (e->d_name[0] < '1' || e->d_name[0] > '9' ||
        strtol(e->d_name, NULL, 10) == self)
      continue;
    found = thread_state(dirfd(dir), e->d_name) == 'R';
  }
  closedir(dir);
  return found;
}

const char *cogpu__proc_stat(pid_t pid, char *buf, size_t len) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "re");
  if (!f || len < 2) {
    if (f)
      fclose(f);
    return NULL;
  }
  size_t n = fread(buf, 1, len - 1, f);
  fclose(f);
  buf[n] = 0;
  /* The command name may hold spaces and parentheses: the last ')' ends
   * it. */
  const char *p = strrchr(buf, ')');
  return p && p[1] == ' ' ? p + 2 : NULL;
}

/* The start time of a process (field 22 of /proc/PID/stat), 0 if gone. */
uint64_t cogpu__proc_starttime(pid_t pid) {
  char buf[1024];
  const char *p = cogpu__proc_stat(pid, buf, sizeof buf);
  unsigned long long t = 0;
  if (!p || sscanf(p,
                   "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d "
                   "%*d %*d %*d %*d %*d %llu",
                   &t) != 1)
    return 0;
  return t;
}
