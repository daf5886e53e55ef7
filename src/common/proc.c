/*
 * proc.c: what a process knows about itself from /proc.
 */
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
