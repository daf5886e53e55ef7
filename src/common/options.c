/*
 * options.c: the option table generated from options.def, and the loading
 * of a configuration from its three sources: defaults, then the config file,
 * then COGPU_<NAME> environment variables (each later source wins). Every
 * value is validated by its type and keeps where it came from, so errors
 * and `cogpu config --explain` can name the file and line or the variable.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

/* A config line longer than this is refused rather than split. */
#define OPT_LINE_MAX 4096

/* Bounds of options.def that say "unbounded". */
#define NOMIN INT64_MIN
#define NOMAX INT64_MAX

const cogpu__opt_desc_t cogpu__opt_table[COGPU_OPT__COUNT] = {
#define XX(NAME, key, type, def, min, max, form, help)                         \
  [COGPU_OPT_##                                                                \
      NAME] = {#NAME, #key, COGPU_OPT_TYPE_##type, def, min, max, form, help},
#include "options.def"
#undef XX
};

/* --- Names ------------------------------------------------------------ */

/* Case-insensitive, and '-' matches '_' so that a command-line flag
 * spelling ("state-dir") names the same option. */
static bool opt_name_eq(const char *a, const char *b) {
  for (; *a && *b; a++, b++) {
    char x = *a == '-' ? '_' : *a, y = *b == '-' ? '_' : *b;
    if (tolower((unsigned char)x) != tolower((unsigned char)y))
      return false;
  }
  return *a == *b;
}

int cogpu__opt_find(const char *name) {
  if (!name)
    return -1;
  for (int i = 0; i < COGPU_OPT__COUNT; i++)
    if (opt_name_eq(name, cogpu__opt_table[i].key) ||
        opt_name_eq(name, cogpu__opt_table[i].name))
      return i;
  return -1;
}

/* --- Parsing one value by type ------------------------------------------ */

/* Index of text among the '|'-separated alternatives of form, or -1. */
static int opt_enum_index(const char *form, const char *text) {
  size_t n = strlen(text);
  for (int i = 0; *form; i++) {
    size_t len = strcspn(form, "|");
    if (len == n && strncasecmp(form, text, n) == 0)
      return i;
    form += len + (form[len] == '|');
  }
  return -1;
}

/* A bound of a DURATION option as the parser would take it back: "0",
 * "10ms", "30s", "5m", "1h", "inf". */
static void opt_fmt_ms(int64_t ms, char *buf, size_t len) {
  static const struct {
    int64_t ms;
    const char *unit;
  } units[] = {{3600 * 1000, "h"}, {60 * 1000, "m"}, {1000, "s"}, {1, "ms"}};
  if (ms < 0 || ms == INT64_MAX) {
    snprintf(buf, len, "inf");
    return;
  }
  for (size_t i = 0; i < COGPU_ARRAY_SIZE(units); i++)
    if (ms == 0 || ms % units[i].ms == 0) {
      snprintf(buf, len, "%lld%s", (long long)(ms / units[i].ms),
               ms ? units[i].unit : "");
      return;
    }
}

/* Checks a DURATION value against the option's bounds; why says the range
 * (in the units the parser takes) when it is outside. */
static int opt_duration_range(const cogpu__opt_desc_t *d, int64_t ms, char *why,
                              size_t len) {
  if (ms >= d->min && ms <= d->max)
    return 0;
  char lo[24], hi[24];
  opt_fmt_ms(d->min, lo, sizeof lo);
  opt_fmt_ms(d->max, hi, sizeof hi);
  snprintf(why, len, "must be from %s to %s", lo, hi);
  return -1;
}

/* Octal digits only, at most 4 of them ("0660", "660"). */
static long opt_parse_octal(const char *s, size_t n) {
  long v = 0;
  if (n == 0 || n > 4)
    return -1;
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '7')
      return -1;
    v = v * 8 + (s[i] - '0');
  }
  return v;
}

/* A MODE value must be one of the modes listed in the form's last word
 * ("octal mode 0600|0640|..."), so that the form stays the only list. */
static int opt_parse_mode(const cogpu__opt_desc_t *d, const char *text,
                          int64_t *out) {
  long mode = opt_parse_octal(text, strlen(text));
  const char *alt = strrchr(d->form, ' ');
  alt = alt ? alt + 1 : d->form;
  while (mode >= 0 && *alt) {
    size_t len = strcspn(alt, "|");
    if (opt_parse_octal(alt, len) == mode) {
      *out = mode;
      return 0;
    }
    alt += len + (alt[len] == '|');
  }
  return -1;
}

/* "5%" is a percentage 0..100; anything else must be a size. */
static int opt_parse_size_or_pct(const char *key, const char *text,
                                 cogpu__optval_t *v) {
  size_t n = strlen(text);
  if (n == 0 || text[n - 1] != '%')
    return cogpu__parse_size(key, text, &v->u);
  char num[32];
  long pct;
  if (n > sizeof num)
    return -EINVAL;
  memcpy(num, text, n - 1);
  num[n - 1] = 0;
  if (cogpu__parse_int(key, num, 0, 100, &pct) < 0)
    return -EINVAL;
  v->pct = true;
  v->i = pct;
  return 0;
}

/* Parses text into v by the option's type. Returns 0, or -1 with why set
 * to a reason when the accepted form alone would not explain it. */
static int opt_parse(int id, const char *text, cogpu__optval_t *v, char *why,
                     size_t whylen) {
  const cogpu__opt_desc_t *d = &cogpu__opt_table[id];
  long l;
  bool b = false;
  int rc = 0;
  why[0] = 0;
  switch (d->type) {
  case COGPU_OPT_TYPE_STRING:
    if (strlen(text) >= sizeof v->s)
      snprintf(why, whylen, "longer than 255 bytes");
    else if ((id == COGPU_OPT_STATE_DIR || id == COGPU_OPT_SOCKET ||
              id == COGPU_OPT_DAEMON_DIR) &&
             text[0] != '/')
      snprintf(why, whylen, "not an absolute path");
    else if (id == COGPU_OPT_HISTORY_DIR && text[0] && text[0] != '/' &&
             strcmp(text, "none") != 0)
      snprintf(why, whylen, "not an absolute path, empty or none");
    rc = why[0] ? -1 : 0;
    break;
  case COGPU_OPT_TYPE_ENUM:
    v->i = opt_enum_index(d->form, text);
    rc = v->i < 0 ? -1 : 0;
    break;
  case COGPU_OPT_TYPE_SIZE:
    rc = cogpu__parse_size(d->key, text, &v->u);
    break;
  case COGPU_OPT_TYPE_SIZE_OR_PCT:
    rc = opt_parse_size_or_pct(d->key, text, v);
    break;
  case COGPU_OPT_TYPE_SIZE_OR_AUTO:
    /* auto: a size learned from the job history (cogpu run's mem=auto);
     * whoever has no history to learn from takes it as 0, on demand. */
    if (strcasecmp(text, "auto") == 0)
      v->i = 1;
    else
      rc = cogpu__parse_size(d->key, text, &v->u);
    break;
  case COGPU_OPT_TYPE_DURATION:
    /* The bounds are options.def's min and max: the housekeeping period
     * must be finite and not 0 (a waiter would spin), foreign memory may be
     * read at every chance but not never, and a driver that still refuses
     * is out of memory, which is said in bounded time. */
    rc = cogpu__parse_duration_ms(d->key, text, &v->i);
    if (rc == 0 && opt_duration_range(d, v->i, why, whylen) != 0)
      rc = -1;
    break;
  case COGPU_OPT_TYPE_INT:
    rc = cogpu__parse_int(d->key, text, d->min < LONG_MIN ? LONG_MIN : d->min,
                          d->max > LONG_MAX ? LONG_MAX : d->max, &l);
    v->i = l;
    break;
  case COGPU_OPT_TYPE_BOOL:
    rc = cogpu__parse_bool(d->key, text, &b);
    v->i = b;
    break;
  case COGPU_OPT_TYPE_MODE:
    rc = opt_parse_mode(d, text, &v->i);
    break;
  default:
    rc = -1;
  }
  return rc < 0 ? -1 : 0;
}

/* Copies text without surrounding whitespace into buf; false if it does
 * not fit (no valid value of a non-string option is that long). */
static bool opt_trim(const char *text, char *buf, size_t len) {
  while (isspace((unsigned char)*text))
    text++;
  size_t n = strlen(text);
  while (n > 0 && isspace((unsigned char)text[n - 1]))
    n--;
  if (n >= len)
    return false;
  memcpy(buf, text, n);
  buf[n] = 0;
  return true;
}

/* Validates text and, only if it is valid, stores it as option id. Strings
 * are kept as given; other values lose surrounding whitespace. */
static int opt_set(cogpu__config_t *cfg, int id, const char *text, int source,
                   const char *where) {
  const cogpu__opt_desc_t *d = &cogpu__opt_table[id];
  cogpu__optval_t nv;
  char trimmed[sizeof nv.s];
  char why[128];
  memset(&nv, 0, sizeof nv);
  if (d->type != COGPU_OPT_TYPE_STRING &&
      opt_trim(text, trimmed, sizeof trimmed))
    text = trimmed;
  if (opt_parse(id, text, &nv, why, sizeof why) < 0)
    return cogpu__seterr(COGPU_ECONFIG,
                         "%s: invalid value '%.200s' (from %s)%s%s; "
                         "accepted: %s",
                         d->key, text, where, why[0] ? ": " : "", why, d->form);
  /* An enum keeps its canonical spelling, whatever the case given; so does
   * auto. */
  if (d->type == COGPU_OPT_TYPE_SIZE_OR_AUTO && nv.i) {
    snprintf(nv.s, sizeof nv.s, "auto");
  } else if (d->type == COGPU_OPT_TYPE_ENUM) {
    const char *alt = d->form;
    for (int64_t k = 0; k < nv.i; k++)
      alt += strcspn(alt, "|") + 1;
    snprintf(nv.s, sizeof nv.s, "%.*s", (int)strcspn(alt, "|"), alt);
  } else if (id == COGPU_OPT_STATE_DIR && strstr(text, "%u")) {
    /* "%u" is the user's uid: a single-user ledger is each user's own. */
    const char *at = strstr(text, "%u");
    snprintf(nv.s, sizeof nv.s, "%.*s%u%s", (int)(at - text), text,
             (unsigned)geteuid(), at + 2);
  } else {
    snprintf(nv.s, sizeof nv.s, "%s", text);
  }
  nv.source = source;
  snprintf(nv.where, sizeof nv.where, "%s", where);
  cfg->v[id] = nv;
  return 0;
}

int cogpu__config_set(cogpu__config_t *cfg, int id, const char *text) {
  if (!cfg || id < 0 || id >= COGPU_OPT__COUNT || !text)
    return cogpu__seterr(-EINVAL, "cogpu__config_set: bad argument");
  return opt_set(cfg, id, text, COGPU_SRC_CLI, "command line");
}

/* --- The config file ---------------------------------------------------- */

/* Cuts a '#' comment (outside quotes) and surrounding whitespace, in
 * place; returns the start of what is left. */
static char *cfg_strip(char *s) {
  char quote = 0;
  for (char *p = s; *p; p++) {
    if (quote) {
      quote = *p == quote ? 0 : quote;
    } else if (*p == '"' || *p == '\'') {
      quote = *p;
    } else if (*p == '#') {
      *p = 0;
      break;
    }
  }
  while (isspace((unsigned char)*s))
    s++;
  size_t n = strlen(s);
  while (n > 0 && isspace((unsigned char)s[n - 1]))
    s[--n] = 0;
  return s;
}

/* `key = "a value"`: one pair of matching quotes is removed, so that an
 * empty value or one with a '#' can be written. */
static char *cfg_unquote(char *s) {
  size_t n = strlen(s);
  if (n >= 2 && (s[0] == '"' || s[0] == '\'') && s[n - 1] == s[0]) {
    s[n - 1] = 0;
    return s + 1;
  }
  return s;
}

static int cfg_unknown_key(const char *where, const char *key) {
  char known[512];
  size_t n = 0;
  known[0] = 0;
  for (int i = 0; i < COGPU_OPT__COUNT && n < sizeof known; i++)
    if (i != COGPU_OPT_CONFIG)
      n += (size_t)snprintf(known + n, sizeof known - n, "%s%s", n ? ", " : "",
                            cogpu__opt_table[i].key);
  return cogpu__seterr(COGPU_ECONFIG, "%s: unknown option '%.100s'; known: %s",
                       where, key, known);
}

static int cfg_line(cogpu__config_t *cfg, const char *path, int lineno,
                    char *line) {
  char where[300];
  snprintf(where, sizeof where, "%s:%d", path, lineno);
  line = cfg_strip(line);
  if (!*line)
    return 0;
  char *eq = strchr(line, '=');
  if (!eq)
    return cogpu__seterr(
        COGPU_ECONFIG, "%s: expected 'key = value', got '%.100s'", where, line);
  *eq = 0;
  char *key = cfg_strip(line), *value = cfg_unquote(cfg_strip(eq + 1));
  int id = cogpu__opt_find(key);
  if (id < 0)
    return cfg_unknown_key(where, key);
  if (id == COGPU_OPT_CONFIG)
    return cogpu__seterr(COGPU_ECONFIG,
                         "%s: '%s' can only be set in the environment "
                         "(COGPU_CONFIG)",
                         where, key);
  return opt_set(cfg, id, value, COGPU_SRC_FILE, where);
}

static int cfg_read_error(const char *path, bool named, int err) {
  return cogpu__seterr(COGPU_ECONFIG, "cannot read config file '%s'%s: %s",
                       path, named ? " (from env COGPU_CONFIG)" : "",
                       cogpu_strerror(-err));
}

/* Opens path for reading, refusing anything but a regular file: a FIFO
 * would block the open (and every cogpu command) until someone writes to
 * it, and a device could be read forever. Returns the stream, or NULL with
 * errno set (0 after a refusal, whose message is set). */
static FILE *cfg_open(const char *path, bool named) {
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0)
    return NULL;
  struct stat sb;
  int e = fstat(fd, &sb) != 0 ? errno : 0;
  if (e == 0 && !S_ISREG(sb.st_mode)) {
    close(fd);
    cogpu__seterr(COGPU_ECONFIG,
                  "cannot read config file '%s'%s: not a regular file (%s)",
                  path, named ? " (from env COGPU_CONFIG)" : "",
                  S_ISDIR(sb.st_mode)    ? "a directory"
                  : S_ISFIFO(sb.st_mode) ? "a FIFO"
                  : S_ISSOCK(sb.st_mode) ? "a socket"
                                         : "a device");
    errno = 0;
    return NULL;
  }
  FILE *f = e == 0 && fcntl(fd, F_SETFL, 0) == 0 ? fdopen(fd, "r") : NULL;
  if (!f) {
    e = e ? e : errno;
    close(fd);
    errno = e;
  }
  return f;
}

/* Reads path; a missing file is an error only when COGPU_CONFIG named it
 * (the default file is optional). */
static int cfg_read_file(cogpu__config_t *cfg, const char *path, bool named) {
  FILE *f = cfg_open(path, named);
  if (!f && errno == 0)
    return COGPU_ECONFIG;
  if (!f)
    return !named && errno == ENOENT ? 0 : cfg_read_error(path, named, errno);
  char line[OPT_LINE_MAX];
  int lineno = 0, rc = 0;
  while (rc == 0 && fgets(line, sizeof line, f)) {
    lineno++;
    if (!strchr(line, '\n') && !feof(f))
      rc = cogpu__seterr(COGPU_ECONFIG, "%s:%d: line longer than %d bytes",
                         path, lineno, OPT_LINE_MAX - 2);
    else
      rc = cfg_line(cfg, path, lineno, line);
  }
  if (rc == 0 && ferror(f))
    rc = cfg_read_error(path, named, errno);
  fclose(f);
  return rc;
}

/* --- Loading ------------------------------------------------------------ */

static int cfg_read_env(cogpu__config_t *cfg) {
  for (int i = 0; i < COGPU_OPT__COUNT; i++) {
    char var[64], where[80];
    snprintf(var, sizeof var, "COGPU_%s", cogpu__opt_table[i].name);
    const char *s = secure_getenv(var);
    if (!s || i == COGPU_OPT_CONFIG) /* CONFIG was used to find the file */
      continue;
    snprintf(where, sizeof where, "env %s", var);
    int rc = opt_set(cfg, i, s, COGPU_SRC_ENV, where);
    if (rc)
      return rc;
  }
  return 0;
}

int cogpu__config_load(cogpu__config_t *cfg) {
  memset(cfg, 0, sizeof *cfg);
  for (int i = 0; i < COGPU_OPT__COUNT; i++) {
    int rc =
        opt_set(cfg, i, cogpu__opt_table[i].def, COGPU_SRC_DEFAULT, "default");
    if (rc)
      return rc; /* a bad default in options.def; a test catches it */
  }
  /* COGPU_CONFIG unset: the default file if it exists; set and empty: no
   * file; set: that file, which must exist. */
  const char *path = secure_getenv("COGPU_CONFIG");
  int rc = 0;
  if (path)
    rc =
        opt_set(cfg, COGPU_OPT_CONFIG, path, COGPU_SRC_ENV, "env COGPU_CONFIG");
  if (rc == 0 && (!path || *path))
    rc = cfg_read_file(cfg, cfg->v[COGPU_OPT_CONFIG].s, path != NULL);
  if (rc == 0)
    rc = cfg_read_env(cfg);
  return rc;
}
