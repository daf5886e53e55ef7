/*
 * report.c: the end-of-job report's text (cogpu run, the Slurm plug-in),
 * from the figures either backend gives (cogpu__job_end).
 */
#include <stdio.h>

#include "api/api.h"

/* A declaration worth suggesting: the peak and 5 % more, rounded up to
 * a whole GiB (to 256 MiB below 4 GiB). */
static uint64_t report_suggest(uint64_t peak) {
  uint64_t want = peak + peak / 20;
  uint64_t unit = want < (4ull << 30) ? 256ull << 20 : 1ull << 30;
  return (want + unit - 1) / unit * unit;
}

/* The report's line on memory that escaped the preload library, if any:
 * its length in buf. */
static size_t report_escaped(const cogpu__job_report_t *r, const char *job,
                             char *buf, size_t len) {
  if (!r->escaped || len == 0)
    return 0;
  char e[32];
  int n = snprintf(buf, len,
                   "cogpu: %s: processes of it held up to %s of GPU memory "
                   "outside the preload library (not in the figures above; "
                   "counted as foreign: `cogpu status` named them)\n",
                   job, cogpu__fmt_size(r->escaped, e, sizeof e));
  return n < 0 ? 0 : (size_t)n < len ? (size_t)n : len - 1;
}

size_t cogpu__job_report_line(const cogpu__job_report_t *r, const char *job,
                              const char *flag, uint64_t declared, char *buf,
                              size_t len) {
  char pk[32], res[32], sug[32], tail[160] = "";
  int n;
  if (r->gpu < 0) {
    n = snprintf(buf, len,
                 "cogpu: %s used no GPU memory that cogpu saw; waited %.0f "
                 "s; suspended %u times\n",
                 job, (double)r->waited_ms / 1e3, r->suspensions);
    size_t u = n < 0 ? 0 : (size_t)n < len ? (size_t)n : len ? len - 1 : 0;
    return u + report_escaped(r, job, buf + u, len - u);
  }
  cogpu__fmt_size(r->peak, pk, sizeof pk);
  if (r->reserved && declared && r->peak) {
    uint64_t s = report_suggest(r->peak);
    /* Far off: a quarter of the reservation unused, or grown beyond it. */
    if ((r->peak < r->reserved / 4 * 3 || r->peak > declared) && s != declared)
      snprintf(tail, sizeof tail, " (%s%s would have done)", flag,
               cogpu__fmt_size(s, sug, sizeof sug));
  }
  if (r->reserved)
    n = snprintf(buf, len,
                 "cogpu: %s used at most %s of GPU %d (reserved %s, %.0f %%); "
                 "waited %.0f s; suspended %u times%s\n",
                 job, pk, r->gpu, cogpu__fmt_size(r->reserved, res, sizeof res),
                 100.0 * (double)r->peak / (double)r->reserved,
                 (double)r->waited_ms / 1e3, r->suspensions, tail);
  else
    n = snprintf(buf, len,
                 "cogpu: %s used at most %s of GPU %d (on demand); waited "
                 "%.0f s; suspended %u times\n",
                 job, pk, r->gpu, (double)r->waited_ms / 1e3, r->suspensions);
  size_t used = n < 0 ? 0 : (size_t)n < len ? (size_t)n : len ? len - 1 : 0;
  if (r->guard_failures && used < len) {
    n = snprintf(buf + used, len - used,
                 "cogpu: %s: the deadlock guard failed %u of its requests\n",
                 job, r->guard_failures);
    used += n < 0 ? 0 : (size_t)n < len - used ? (size_t)n : len - used - 1;
  }
  return used + report_escaped(r, job, buf + used, len - used);
}
