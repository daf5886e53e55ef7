/*
 * fs.c: directories made on the way to a file, for the CLI's outputs and
 * the job history's database.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "internal.h"

int cogpu__mkdirs(const char *dir, mode_t mode) {
  char p[PATH_MAX];
  if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p)
    return cogpu__seterr(-ENAMETOOLONG, "%.64s...: path too long", dir);
  for (char *s = p + 1;; s++) {
    bool last = *s == 0;
    if (*s != '/' && !last)
      continue;
    *s = 0;
    if (mkdir(p, mode) != 0) {
      int e = errno;
      struct stat st;
      /* What is already there must be a directory (or a link to one): a
       * file in the way is said here, not as a puzzling failure later. */
      if (e != EEXIST)
        return cogpu__seterr(-e, "%s: %s", p, strerror(e));
      if (stat(p, &st) != 0 || !S_ISDIR(st.st_mode))
        return cogpu__seterr(-ENOTDIR, "%s: %s", p, strerror(ENOTDIR));
    }
    if (last)
      return 0;
    *s = '/';
  }
}
