/*
 * proc.c: what a process knows about itself from /proc, and users' names.
 */
#include <pwd.h>
#include <stdio.h>

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
