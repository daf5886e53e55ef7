/*
 * parse.c: the value parsers behind every option, environment variable and
 * command-line argument, so that "12G", "30s" or "yes" mean the same thing
 * everywhere. Each parser accepts surrounding whitespace, refuses anything
 * else it does not understand, and explains a refusal with cogpu__seterr,
 * naming what was being parsed and giving examples of accepted forms.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "internal.h"

/* Longest input quoted back in a message: enough to recognise it. */
#define PARSE_QUOTE "%.200s"

enum { PARSE_OK = 0, PARSE_NONE = -1, PARSE_OVERFLOW = -2 };

static const char *parse_skip_ws(const char *p) {
  while (isspace((unsigned char)*p))
    p++;
  return p;
}

/* Bounds of s without surrounding whitespace. */
static void parse_trim(const char *s, const char **b, size_t *n) {
  const char *e;
  *b = parse_skip_ws(s);
  e = *b + strlen(*b);
  while (e > *b && isspace((unsigned char)e[-1]))
    e--;
  *n = (size_t)(e - *b);
}

static bool parse_word_eq(const char *b, size_t n, const char *word) {
  return strlen(word) == n && strncasecmp(b, word, n) == 0;
}

static bool parse_word_in(const char *b, size_t n, const char *const *words) {
  for (; *words; words++)
    if (parse_word_eq(b, n, *words))
      return true;
  return false;
}

/* Reads decimal digits at *p into *v; no sign accepted (strtoull would take
 * "-1" as a huge number). */
static int parse_u64(const char **p, uint64_t *v) {
  const char *q = *p;
  bool overflow = false;
  *v = 0;
  for (; isdigit((unsigned char)*q); q++) {
    unsigned d = (unsigned)(*q - '0');
    if (*v > (UINT64_MAX - d) / 10)
      overflow = true;
    else
      *v = *v * 10 + d;
  }
  if (q == *p)
    return PARSE_NONE;
  *p = q;
  return overflow ? PARSE_OVERFLOW : PARSE_OK;
}

/* Reads an optional K/M/G/T/P prefix with optional "i", then an optional
 * "B"; returns the binary shift or -1 for an unknown unit. */
static int parse_size_unit(const char *p) {
  static const char prefixes[] = "KMGTP";
  int shift = 0;
  const char *u = *p ? strchr(prefixes, toupper((unsigned char)*p)) : NULL;
  if (u) {
    shift = 10 * (int)(u - prefixes + 1);
    p++;
    if (*p == 'i' || *p == 'I')
      p++;
  }
  if (*p == 'b' || *p == 'B')
    p++;
  return *parse_skip_ws(p) ? -1 : shift;
}

int cogpu__parse_size(const char *what, const char *s, uint64_t *out) {
  const char *p = parse_skip_ws(s ? s : "");
  uint64_t v;
  int r = parse_u64(&p, &v);
  int shift = r == PARSE_NONE ? -1 : parse_size_unit(parse_skip_ws(p));
  if (shift < 0)
    return cogpu__seterr(-EINVAL,
                         "invalid %s '" PARSE_QUOTE
                         "': expected a size such as 4096, 512M, 12G or 12GiB",
                         what, s ? s : "");
  if (r == PARSE_OVERFLOW || (shift && v > (UINT64_MAX >> shift)))
    return cogpu__seterr(-EINVAL,
                         "invalid %s '" PARSE_QUOTE
                         "': too large; a size must be below 16 EiB",
                         what, s);
  *out = v << shift;
  return 0;
}

/* Milliseconds per unit of a duration; "" is a bare number: seconds. */
static int64_t parse_duration_unit(const char *p) {
  static const struct {
    const char *name;
    int64_t ms;
  } units[] = {{"", 1000},       {"ms", 1},          {"s", 1000},
               {"m", 60 * 1000}, {"h", 3600 * 1000}, {"d", 86400 * 1000}};
  const char *b;
  size_t n;
  parse_trim(p, &b, &n);
  for (size_t i = 0; i < COGPU_ARRAY_SIZE(units); i++)
    if (parse_word_eq(b, n, units[i].name))
      return units[i].ms;
  return -1;
}

int cogpu__parse_duration_ms(const char *what, const char *s, int64_t *out) {
  static const char *const infinite[] = {"inf", "infinity", "forever",
                                         "unlimited", NULL};
  const char *b, *p;
  size_t n;
  uint64_t v;
  parse_trim(s ? s : "", &b, &n);
  if (parse_word_in(b, n, infinite)) {
    *out = -1;
    return 0;
  }
  p = b;
  int r = parse_u64(&p, &v);
  int64_t unit = r == PARSE_NONE ? -1 : parse_duration_unit(p);
  if (unit < 0)
    return cogpu__seterr(-EINVAL,
                         "invalid %s '" PARSE_QUOTE
                         "': expected a duration such as 0, 500ms, 30s, 5m, "
                         "2h or inf",
                         what, s ? s : "");
  if (r == PARSE_OVERFLOW || v > (uint64_t)(INT64_MAX / unit))
    return cogpu__seterr(
        -EINVAL, "invalid %s '" PARSE_QUOTE "': too long; use inf for no limit",
        what, s);
  *out = (int64_t)v * unit;
  return 0;
}

int cogpu__parse_bool(const char *what, const char *s, bool *out) {
  static const char *const yes[] = {"1", "true", "yes", "on", NULL};
  static const char *const no[] = {"0", "false", "no", "off", NULL};
  const char *b;
  size_t n;
  parse_trim(s ? s : "", &b, &n);
  if (parse_word_in(b, n, yes) || parse_word_in(b, n, no)) {
    *out = parse_word_in(b, n, yes);
    return 0;
  }
  return cogpu__seterr(-EINVAL,
                       "invalid %s '" PARSE_QUOTE
                       "': expected 1, true, yes, on or 0, false, no, off",
                       what, s ? s : "");
}

int cogpu__parse_int(const char *what, const char *s, long min, long max,
                     long *out) {
  const char *p = parse_skip_ws(s ? s : "");
  bool neg = *p == '-';
  uint64_t v;
  if (*p == '-' || *p == '+')
    p++;
  int r = parse_u64(&p, &v);
  bool ok = r != PARSE_NONE && *parse_skip_ws(p) == 0;
  /* The magnitude is checked before negating: -LONG_MIN overflows. */
  uint64_t limit = neg ? (uint64_t)LONG_MAX + 1 : (uint64_t)LONG_MAX;
  if (ok && r == PARSE_OK && v <= limit) {
    long x = neg ? (long)(0 - v) : (long)v;
    if (x >= min && x <= max) {
      *out = x;
      return 0;
    }
  }
  return cogpu__seterr(-EINVAL,
                       "invalid %s '" PARSE_QUOTE
                       "': expected an integer from %ld to %ld",
                       what, s ? s : "", min, max);
}

char *cogpu__fmt_size(uint64_t bytes, char *buf, size_t len) {
  static const char *const units[] = {"B",   "KiB", "MiB", "GiB",
                                      "TiB", "PiB", "EiB"};
  if (!buf || len == 0)
    return buf;
  if (bytes < 1024) {
    snprintf(buf, len, "%" PRIu64 " B", bytes);
    return buf;
  }
  size_t u = 0;
  double v = (double)bytes;
  while (v >= 1024 && u + 1 < COGPU_ARRAY_SIZE(units)) {
    v /= 1024;
    u++;
  }
  /* 1023.96 KiB would print as "1024.0 KiB": say "1.0 MiB" instead. */
  if ((uint64_t)(v * 10 + 0.5) >= 10240 && u + 1 < COGPU_ARRAY_SIZE(units)) {
    v /= 1024;
    u++;
  }
  snprintf(buf, len, "%.1f %s", v, units[u]);
  return buf;
}

int cogpu__gpu_spec(const char *spec, const char *const *uuids, size_t n,
                    int *gpu) {
  if (!spec || !*spec || !gpu)
    return cogpu__seterr(-EINVAL, "empty GPU name");
  char *end;
  errno = 0;
  long v = strtol(spec, &end, 10);
  if (*end == 0) {
    if (errno == ERANGE || v < 0 || (size_t)v >= n)
      return cogpu__seterr(-ENODEV, "no GPU %s on this node (%zu GPUs)", spec,
                           n);
    *gpu = (int)v;
    return 0;
  }
  int found = -1;
  size_t len = strlen(spec);
  for (size_t g = 0; g < n; g++)
    if (strncmp(uuids[g], spec, len) == 0) {
      if (found >= 0)
        return cogpu__seterr(-ENODEV, "'%s' matches more than one GPU", spec);
      found = (int)g;
    }
  if (found < 0)
    return cogpu__seterr(-ENODEV, "no GPU matches '%s'", spec);
  *gpu = found;
  return 0;
}
