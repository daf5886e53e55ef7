/*
 * test-cli.c: the `cogpu` command end to end. Every test drives the built
 * binary (found first in PATH) through th_run or a forked process, against
 * the fake NVML and the test's private node state, and checks exit codes,
 * messages and what `cogpu status --json` reports afterwards.
 *
 * Exit codes of cogpu itself (tools/cogpu/cli.h): 2 for bad flags or
 * arguments, 125 when cogpu cannot do it; `cogpu run` otherwise exits as its
 * command did (126 not executable, 127 not found, 128+N killed by signal N).
 *
 * Background `cogpu run` processes ("holders") run a shell loop that writes
 * its PID to <tag>.ready once running, and ends when <tag>.release appears,
 * so a test decides exactly how long a reservation is held. Every wait is
 * bounded and scaled by th_ms().
 *
 * JSON output is checked with a small strict parser below (RFC 8259, UTF-8
 * validated, duplicate keys refused), so no external tool is needed; one test
 * also checks with python3's json module when python3 is available.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "task.h"

#define GIB (1024ull * 1024 * 1024)

/* ------------------------------------------------------------------------ */
/* Small utilities                                                           */
/* ------------------------------------------------------------------------ */

static int64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static bool file_exists(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0;
}

/* Whole file as a NUL-terminated malloc'd string ("" if unreadable). */
static char *slurp(const char *path) {
  FILE *f = fopen(path, "re");
  size_t cap = 4096, n = 0;
  char *buf = malloc(cap);
  ASSERT(buf);
  while (f) {
    if (n + 1024 > cap) {
      cap *= 2;
      buf = realloc(buf, cap);
      ASSERT(buf);
    }
    size_t r = fread(buf + n, 1, cap - n - 1, f);
    if (r == 0)
      break;
    n += r;
  }
  if (f)
    fclose(f);
  buf[n] = 0;
  return buf;
}

static size_t count_substr(const char *hay, const char *needle) {
  size_t n = 0;
  for (const char *p = hay; (p = strstr(p, needle)) != NULL; p++)
    n++;
  return n;
}

/* Number of files matching pattern. */
static size_t count_glob(const char *pattern) {
  glob_t g;
  if (glob(pattern, 0, NULL, &g) != 0)
    return 0;
  size_t n = g.gl_pathc;
  globfree(&g);
  return n;
}

/* th_path() into a buffer of its own (th_path's are reused after 8 calls). */
static const char *tp(const char *name) {
  char *p = strdup(th_path(name));
  ASSERT(p);
  return p;
}

static const char *state_file(void) {
  static char buf[PATH_MAX];
  snprintf(buf, sizeof buf, "%s/state", getenv("COGPU_STATE_DIR"));
  return buf;
}

/* What status names as the node's state: the daemon's socket in node
 * mode, the state file otherwise. */
static const char *status_state(void) {
  static char buf[PATH_MAX + 16];
  if (th_node_mode())
    snprintf(buf, sizeof buf, "cogpud %s", getenv("COGPU_SOCKET"));
  else
    snprintf(buf, sizeof buf, "%s", state_file());
  return buf;
}

/* Points the following cogpu commands at a fresh state directory. */
static void use_state_dir(const char *name) {
  setenv("COGPU_STATE_DIR", tp(name), 1);
}

/* ------------------------------------------------------------------------ */
/* Running cogpu                                                             */
/* ------------------------------------------------------------------------ */

typedef struct res_s {
  int rc;
  int64_t ms;
  char out[1 << 17];
  char err[1 << 14];
} res_t;

/* The cogpu under test is the one in the build directory: fail clearly
 * rather than run another one found further along PATH. */
static void check_binary(void) {
  static bool checked;
  if (checked)
    return;
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/cogpu", th_build_dir());
  if (access(path, X_OK) != 0)
    th_fail(__FILE__, __LINE__,
            "%s is missing: build it too (make cli, or make all / make "
            "check); `make tests` alone does not",
            path);
  checked = true;
}

static res_t *run_argv(const char *const env[], const char *const argv[]) {
  static res_t pool[4];
  static int next;
  res_t *r = &pool[next++ % 4];
  check_binary();
  int64_t t0 = mono_ms();
  r->rc = th_run(argv, env, r->out, sizeof r->out, r->err, sizeof r->err,
                 th_ms(15000));
  r->ms = mono_ms() - t0;
  return r;
}

#define RUN(env, ...) run_argv(env, (const char *const[]){__VA_ARGS__, NULL})
#define COGPU(...) RUN(NULL, "cogpu", __VA_ARGS__)
#define COGPU_ENV(env, ...) RUN(env, "cogpu", __VA_ARGS__)

#define EXPECT_RC(res, code)                                                   \
  do {                                                                         \
    const res_t *r_ = (res);                                                   \
    int c_ = (code);                                                           \
    if (r_->rc != c_)                                                          \
      th_fail(                                                                 \
          __FILE__, __LINE__,                                                  \
          "exit %d, expected %d\n--- stdout:\n%.600s\n--- stderr:\n%.1000s",   \
          r_->rc, c_, r_->out, r_->err);                                       \
  } while (0)

/* Start argv with stdout and stderr going to <tag>.out and <tag>.err in the
 * test's directory; env as for th_run. */
static pid_t spawn_logged(const char *tag, const char *const argv[],
                          const char *const env[]) {
  char out[PATH_MAX], err[PATH_MAX];
  check_binary();
  snprintf(out, sizeof out, "%s/%s.out", th_tmpdir(), tag);
  snprintf(err, sizeof err, "%s/%s.err", th_tmpdir(), tag);
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0)
    th_fail(__FILE__, __LINE__, "fork: %s", strerror(errno));
  if (pid == 0) {
    int fo = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int fe = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fo < 0 || fe < 0)
      _exit(126);
    dup2(fo, 1);
    dup2(fe, 2);
    th_apply_env(env);
    execvp(argv[0], (char *const *)argv);
    _exit(127);
  }
  return pid;
}

static char *tag_file(const char *tag, const char *ext) {
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/%s.%s", th_tmpdir(), tag, ext);
  return slurp(path);
}

/* Wait for pid at most timeout_ms (fails the test then, after killing it);
 * returns its exit code (128+N if killed by signal N); *ru gets its usage. */
static int wait_exit_(const char *file, int line, pid_t pid, int timeout_ms,
                      struct rusage *ru, const char *what) {
  struct rusage tmp;
  int64_t deadline = mono_ms() + timeout_ms;
  int st;
  for (;;) {
    pid_t r = wait4(pid, &st, WNOHANG, ru ? ru : &tmp);
    if (r == pid)
      return th_exit_code(st);
    if (r < 0 && errno != EINTR)
      th_fail(file, line, "wait %s (%d): %s", what, (int)pid, strerror(errno));
    if (mono_ms() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      th_fail(file, line, "%s (pid %d) still running after %d ms", what,
              (int)pid, timeout_ms);
    }
    th_sleep_ms(5);
  }
}
#define WAIT_EXIT(pid, ms, ru, what)                                           \
  wait_exit_(__FILE__, __LINE__, pid, ms, ru, what)

/* True while pid has not exited (without reaping it). */
static bool still_running(pid_t pid) {
  siginfo_t si;
  memset(&si, 0, sizeof si);
  if (waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT) != 0)
    return false;
  return si.si_pid == 0;
}

/* ------------------------------------------------------------------------ */
/* A strict little JSON parser                                               */
/* ------------------------------------------------------------------------ */

typedef struct jv_s jv_t;
struct jv_s {
  char
      t; /* 'n' null, 'b' bool, '#' number, 's' string, '[' array, '{' object */
  bool b;
  char *s; /* decoded string, or the number's text */
  size_t n;
  jv_t **items;
  char **keys;
};

typedef struct jp_s {
  const char *p;
  const char *err;
} jp_t;

static jv_t *jv_new(char t) {
  jv_t *v = calloc(1, sizeof *v);
  ASSERT(v);
  v->t = t;
  return v;
}

static void jv_push(jv_t *v, char *key, jv_t *item) {
  v->items = realloc(v->items, (v->n + 1) * sizeof *v->items);
  v->keys = realloc(v->keys, (v->n + 1) * sizeof *v->keys);
  ASSERT(v->items && v->keys);
  v->items[v->n] = item;
  v->keys[v->n] = key;
  v->n++;
}

static void jp_ws(jp_t *j) {
  while (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r')
    j->p++;
}

/* Length of the well-formed UTF-8 sequence at s (s[0] >= 0x80), or 0. */
static int utf8_len(const unsigned char *s) {
  unsigned c = s[0];
  int n;
  uint32_t cp;
  if (c >= 0xc2 && c <= 0xdf) {
    n = 2;
    cp = c & 0x1f;
  } else if (c >= 0xe0 && c <= 0xef) {
    n = 3;
    cp = c & 0x0f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4;
    cp = c & 0x07;
  } else {
    return 0;
  }
  for (int i = 1; i < n; i++) {
    if ((s[i] & 0xc0) != 0x80)
      return 0;
    cp = cp << 6 | (s[i] & 0x3f);
  }
  if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
      (cp >= 0xd800 && cp <= 0xdfff))
    return 0;
  return n;
}

static void utf8_put(char *buf, size_t *n, uint32_t cp) {
  if (cp < 0x80) {
    buf[(*n)++] = (char)cp;
  } else if (cp < 0x800) {
    buf[(*n)++] = (char)(0xc0 | cp >> 6);
    buf[(*n)++] = (char)(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    buf[(*n)++] = (char)(0xe0 | cp >> 12);
    buf[(*n)++] = (char)(0x80 | ((cp >> 6) & 0x3f));
    buf[(*n)++] = (char)(0x80 | (cp & 0x3f));
  } else {
    buf[(*n)++] = (char)(0xf0 | cp >> 18);
    buf[(*n)++] = (char)(0x80 | ((cp >> 12) & 0x3f));
    buf[(*n)++] = (char)(0x80 | ((cp >> 6) & 0x3f));
    buf[(*n)++] = (char)(0x80 | (cp & 0x3f));
  }
}

static bool jp_hex4(const char *p, uint32_t *out) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) {
    char c = p[i];
    int d = c >= '0' && c <= '9'   ? c - '0'
            : c >= 'a' && c <= 'f' ? c - 'a' + 10
            : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                   : -1;
    if (d < 0)
      return false;
    v = v << 4 | (uint32_t)d;
  }
  *out = v;
  return true;
}

/* At the opening quote; returns the decoded string or NULL (j->err set). */
static char *jp_string(jp_t *j) {
  j->p++;
  char *buf = malloc(strlen(j->p) + 1);
  size_t n = 0;
  ASSERT(buf);
  for (;;) {
    unsigned char c = (unsigned char)*j->p;
    if (c == '"') {
      j->p++;
      buf[n] = 0;
      return buf;
    }
    if (c == 0) {
      j->err = "unterminated string";
      return NULL;
    }
    if (c < 0x20) {
      j->err = "unescaped control character in a string";
      return NULL;
    }
    if (c >= 0x80) {
      int l = utf8_len((const unsigned char *)j->p);
      if (!l) {
        j->err = "invalid UTF-8 in a string";
        return NULL;
      }
      memcpy(buf + n, j->p, (size_t)l);
      n += (size_t)l;
      j->p += l;
      continue;
    }
    if (c != '\\') {
      buf[n++] = (char)c;
      j->p++;
      continue;
    }
    char e = j->p[1];
    j->p += 2;
    const char *simple = strchr("\"\\/bfnrt", e);
    if (e && simple) {
      static const char repl[] = "\"\\/\b\f\n\r\t";
      buf[n++] = repl[simple - "\"\\/bfnrt"];
      continue;
    }
    uint32_t cp, lo;
    if (e != 'u' || !jp_hex4(j->p, &cp)) {
      j->err = "bad escape in a string";
      return NULL;
    }
    j->p += 4;
    if (cp >= 0xdc00 && cp <= 0xdfff) {
      j->err = "lone low surrogate";
      return NULL;
    }
    if (cp >= 0xd800 && cp <= 0xdbff) {
      if (j->p[0] != '\\' || j->p[1] != 'u' || !jp_hex4(j->p + 2, &lo) ||
          lo < 0xdc00 || lo > 0xdfff) {
        j->err = "lone high surrogate";
        return NULL;
      }
      j->p += 6;
      cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
    }
    utf8_put(buf, &n, cp);
  }
}

static jv_t *jp_number(jp_t *j) {
  const char *s = j->p;
  if (*j->p == '-')
    j->p++;
  if (*j->p == '0') {
    j->p++;
  } else if (*j->p >= '1' && *j->p <= '9') {
    while (isdigit((unsigned char)*j->p))
      j->p++;
  } else {
    j->err = "unexpected character";
    return NULL;
  }
  if (*j->p == '.') {
    j->p++;
    if (!isdigit((unsigned char)*j->p)) {
      j->err = "bad number";
      return NULL;
    }
    while (isdigit((unsigned char)*j->p))
      j->p++;
  }
  if (*j->p == 'e' || *j->p == 'E') {
    j->p++;
    if (*j->p == '+' || *j->p == '-')
      j->p++;
    if (!isdigit((unsigned char)*j->p)) {
      j->err = "bad number";
      return NULL;
    }
    while (isdigit((unsigned char)*j->p))
      j->p++;
  }
  jv_t *v = jv_new('#');
  v->s = strndup(s, (size_t)(j->p - s));
  ASSERT(v->s);
  return v;
}

static jv_t *jp_value(jp_t *j, int depth);

static jv_t *jp_container(jp_t *j, int depth, char open) {
  char close = open == '{' ? '}' : ']';
  jv_t *v = jv_new(open);
  j->p++;
  jp_ws(j);
  if (*j->p == close) {
    j->p++;
    return v;
  }
  for (;;) {
    char *key = NULL;
    jp_ws(j);
    if (open == '{') {
      if (*j->p != '"') {
        j->err = "expected a key";
        return NULL;
      }
      if (!(key = jp_string(j)))
        return NULL;
      for (size_t i = 0; i < v->n; i++)
        if (strcmp(v->keys[i], key) == 0) {
          j->err = "duplicate key";
          return NULL;
        }
      jp_ws(j);
      if (*j->p != ':') {
        j->err = "expected ':'";
        return NULL;
      }
      j->p++;
    }
    jv_t *item = jp_value(j, depth + 1);
    if (!item)
      return NULL;
    jv_push(v, key, item);
    jp_ws(j);
    if (*j->p == ',') {
      j->p++;
      continue;
    }
    if (*j->p == close) {
      j->p++;
      return v;
    }
    j->err = open == '{' ? "expected ',' or '}'" : "expected ',' or ']'";
    return NULL;
  }
}

static jv_t *jp_value(jp_t *j, int depth) {
  jp_ws(j);
  if (depth > 64) {
    j->err = "nested too deep";
    return NULL;
  }
  static const struct {
    const char *word;
    char t;
    bool b;
  } words[] = {{"true", 'b', true}, {"false", 'b', false}, {"null", 'n', 0}};
  for (size_t i = 0; i < COGPU_ARRAY_SIZE(words); i++)
    if (strncmp(j->p, words[i].word, strlen(words[i].word)) == 0) {
      j->p += strlen(words[i].word);
      jv_t *v = jv_new(words[i].t);
      v->b = words[i].b;
      return v;
    }
  if (*j->p == '{' || *j->p == '[')
    return jp_container(j, depth, *j->p);
  if (*j->p == '"') {
    char *s = jp_string(j);
    if (!s)
      return NULL;
    jv_t *v = jv_new('s');
    v->s = s;
    return v;
  }
  return jp_number(j);
}

/* Parses one JSON text (the whole of text, surrounding whitespace aside). */
static jv_t *json_parse_(const char *file, int line, const char *text) {
  jp_t j = {text, NULL};
  jv_t *v = jp_value(&j, 0);
  if (v) {
    jp_ws(&j);
    if (*j.p)
      j.err = "trailing characters after the value";
  }
  if (j.err) {
    size_t off = (size_t)(j.p - text);
    size_t from = off > 60 ? off - 60 : 0;
    th_fail(file, line,
            "invalid JSON at byte %zu: %s; near: %.120s\nwhole: %.1200s", off,
            j.err, text + from, text);
  }
  return v;
}
#define JSON(text) json_parse_(__FILE__, __LINE__, text)

static jv_t *jv_lookup(jv_t *v, const char *path) {
  char buf[256], *save = NULL;
  snprintf(buf, sizeof buf, "%s", path);
  for (char *tok = strtok_r(buf, ".", &save); tok && v;
       tok = strtok_r(NULL, ".", &save)) {
    jv_t *next = NULL;
    if (v->t == '{') {
      for (size_t i = 0; i < v->n; i++)
        if (strcmp(v->keys[i], tok) == 0)
          next = v->items[i];
    } else if (v->t == '[') {
      char *end;
      long i = strtol(tok, &end, 10);
      if (*end == 0 && i >= 0 && (size_t)i < v->n)
        next = v->items[i];
    }
    v = next;
  }
  return v;
}

static jv_t *jv_at(jv_t *root, char t, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));
static jv_t *jv_at(jv_t *root, char t, const char *fmt, va_list ap) {
  char path[256];
  vsnprintf(path, sizeof path, fmt, ap);
  jv_t *v = jv_lookup(root, path);
  if (!v)
    th_fail(__FILE__, __LINE__, "JSON has no %s", path);
  if (t && v->t != t)
    th_fail(__FILE__, __LINE__, "JSON %s is of type '%c', expected '%c'", path,
            v->t, t);
  return v;
}

#define JV_GETTER(fname, T, t, expr)                                           \
  static T fname(jv_t *root, const char *fmt, ...)                             \
      __attribute__((format(printf, 2, 3)));                                   \
  static T fname(jv_t *root, const char *fmt, ...) {                           \
    va_list ap;                                                                \
    va_start(ap, fmt);                                                         \
    jv_t *v = jv_at(root, t, fmt, ap);                                         \
    va_end(ap);                                                                \
    return expr;                                                               \
  }

static uint64_t jv_u64(const jv_t *v) {
  for (const char *p = v->s; *p; p++)
    if (!isdigit((unsigned char)*p))
      th_fail(__FILE__, __LINE__, "JSON number %s is not a whole number", v->s);
  return strtoull(v->s, NULL, 10);
}

static int64_t jv_i64(const jv_t *v) {
  for (const char *p = v->s + (v->s[0] == '-'); *p; p++)
    if (!isdigit((unsigned char)*p))
      th_fail(__FILE__, __LINE__, "JSON number %s is not an integer", v->s);
  return strtoll(v->s, NULL, 10);
}

JV_GETTER(ju, uint64_t, '#', jv_u64(v))
JV_GETTER(ji, int64_t, '#', jv_i64(v))
JV_GETTER(js, const char *, 's', v->s)
JV_GETTER(jb, bool, 'b', v->b)
JV_GETTER(jlen, size_t, '[', v->n)
JV_GETTER(jnum, double, '#', strtod(v->s, NULL))

/* ------------------------------------------------------------------------ */
/* Status helpers                                                            */
/* ------------------------------------------------------------------------ */

static jv_t *status_json_(const char *file, int line) {
  res_t *r = COGPU("status", "--json");
  if (r->rc != 0)
    th_fail(file, line, "cogpu status --json: exit %d: %s", r->rc, r->err);
  return json_parse_(file, line, r->out);
}
#define STATUS() status_json_(__FILE__, __LINE__)

/* Nothing reserved, no client, nobody waiting, on every GPU. */
static void assert_idle_(const char *file, int line) {
  jv_t *st = status_json_(file, line);
  size_t n = jlen(st, "gpus");
  if (n == 0)
    th_fail(file, line, "status lists no GPU");
  for (size_t g = 0; g < n; g++) {
    if (ju(st, "gpus.%zu.reserved_bytes", g) != 0 ||
        jlen(st, "gpus.%zu.clients", g) != 0 ||
        jlen(st, "gpus.%zu.waiting", g) != 0 || jb(st, "gpus.%zu.exclusive", g))
      th_fail(file, line, "GPU %zu is not idle: %.1500s", g,
              COGPU("status", "--json")->out);
  }
}
#define ASSERT_IDLE() assert_idle_(__FILE__, __LINE__)

/* Polls status until GPU gpu has n waiters; returns that snapshot. */
static jv_t *wait_waiters_(const char *file, int line, int gpu, size_t n) {
  int64_t deadline = mono_ms() + th_ms(10000);
  for (;;) {
    jv_t *st = status_json_(file, line);
    if (jlen(st, "gpus.%d.waiting", gpu) == n)
      return st;
    if (mono_ms() > deadline)
      th_fail(file, line, "GPU %d never had %zu waiter(s): %.1500s", gpu, n,
              COGPU("status", "--json")->out);
    th_sleep_ms(20);
  }
}
#define WAIT_WAITERS(gpu, n) wait_waiters_(__FILE__, __LINE__, gpu, n)

/* Polls <tag>.err until it contains needle (while pid runs). */
static void wait_stderr_(const char *file, int line, const char *tag, pid_t pid,
                         const char *needle) {
  int64_t deadline = mono_ms() + th_ms(10000);
  for (;;) {
    char *e = tag_file(tag, "err");
    bool found = strstr(e, needle) != NULL;
    free(e);
    if (found)
      return;
    if (!still_running(pid) || mono_ms() > deadline)
      th_fail(file, line, "%s never printed '%s' on stderr: %s", tag, needle,
              tag_file(tag, "err"));
    th_sleep_ms(10);
  }
}
#define WAIT_STDERR(tag, pid, needle)                                          \
  wait_stderr_(__FILE__, __LINE__, tag, pid, needle)

/* ------------------------------------------------------------------------ */
/* Holders: `cogpu run` processes that keep their command running           */
/* ------------------------------------------------------------------------ */

/* $1: ready file (gets "PID" once running), $2: release file. Ends by
 * itself after about a minute, whatever happens to the test. */
static const char hold_script[] =
    "echo $$ > \"$1.tmp\" && mv \"$1.tmp\" \"$1\"; n=0; "
    "while [ ! -e \"$2\" ]; do sleep 0.02; n=$((n+1)); "
    "[ $n -lt 3000 ] || exit 99; done; exit 0";

typedef struct holder_s {
  pid_t pid; /* the cogpu run process */
  char tag[32];
  char ready[PATH_MAX];
  char release[PATH_MAX];
} holder_t;

/* Start `cogpu run OPTS -- sh -c SCRIPT sh READY RELEASE` (not waiting). */
static void hold_spawn_script(holder_t *h, const char *tag,
                              const char *const opts[], const char *script,
                              const char *const env[]) {
  const char *argv[40];
  int n = 0;
  memset(h, 0, sizeof *h);
  snprintf(h->tag, sizeof h->tag, "%s", tag);
  snprintf(h->ready, sizeof h->ready, "%s/%s.ready", th_tmpdir(), tag);
  snprintf(h->release, sizeof h->release, "%s/%s.release", th_tmpdir(), tag);
  unlink(h->ready);
  unlink(h->release);
  argv[n++] = "cogpu";
  argv[n++] = "run";
  for (int i = 0; opts && opts[i] && n < 30; i++)
    argv[n++] = opts[i];
  argv[n++] = "--";
  argv[n++] = "sh";
  argv[n++] = "-c";
  argv[n++] = script;
  argv[n++] = "sh";
  argv[n++] = h->ready;
  argv[n++] = h->release;
  argv[n] = NULL;
  h->pid = spawn_logged(tag, argv, env);
}

static void hold_spawn(holder_t *h, const char *tag, const char *const opts[],
                       const char *const env[]) {
  hold_spawn_script(h, tag, opts, hold_script, env);
}

/* Wait until the holder's command runs (so its reservation is held). */
static void hold_ready_(const char *file, int line, holder_t *h) {
  int64_t deadline = mono_ms() + th_ms(10000);
  while (!file_exists(h->ready)) {
    if (!still_running(h->pid))
      th_fail(file, line, "holder %s ended before its command ran: %s", h->tag,
              tag_file(h->tag, "err"));
    if (mono_ms() > deadline)
      th_fail(file, line, "holder %s: command not running after 10 s: %s",
              h->tag, tag_file(h->tag, "err"));
    th_sleep_ms(5);
  }
}
#define HOLD_READY(h) hold_ready_(__FILE__, __LINE__, h)

#define HOLD(h, tag, ...)                                                      \
  do {                                                                         \
    hold_spawn(h, tag, (const char *const[]){__VA_ARGS__, NULL}, NULL);        \
    HOLD_READY(h);                                                             \
  } while (0)

/* Let the command end; returns cogpu's exit code. */
static int hold_end_(const char *file, int line, holder_t *h) {
  th_write_file(h->release, "");
  return wait_exit_(file, line, h->pid, th_ms(10000), NULL, h->tag);
}
#define HOLD_END(h) hold_end_(__FILE__, __LINE__, h)

/* ------------------------------------------------------------------------ */
/* cogpu run                                                                 */
/* ------------------------------------------------------------------------ */

TEST_IMPL(cli_run_sets_gpu_environment) {
  /* Whatever the caller had is replaced by the reserved GPU. */
  res_t *r = COGPU_ENV(
      ((const char *const[]){"CUDA_VISIBLE_DEVICES=3", "COGPU_GPU=9", NULL}),
      "run", "--mem", "1G", "--", "sh", "-c",
      "echo \"$CUDA_VISIBLE_DEVICES|$COGPU_GPU|$COGPU_RESERVED_BYTES\"");
  EXPECT_RC(r, 0);
  jv_t *st = STATUS();
  const char *uuid = js(st, "gpus.0.uuid");
  ASSERT(strncmp(uuid, "GPU-", 4) == 0);
  char want[256];
  snprintf(want, sizeof want, "%s|0|%llu\n", uuid, 1ull * GIB);
  ASSERT_STREQ(r->out, want);
  ASSERT_IDLE();
}

TEST_IMPL(cli_run_exit_status_propagated) {
  static const struct {
    const char *script;
    int code;
  } cases[] = {{"exit 0", 0},
               {"exit 7", 7},
               {"exit 1", 1},
               {"exit 255", 255},
               {"exit 126", 126}};
  for (size_t i = 0; i < COGPU_ARRAY_SIZE(cases); i++) {
    res_t *r = COGPU("run", "--mem", "512M", "--", "sh", "-c", cases[i].script);
    EXPECT_RC(r, cases[i].code);
  }
  /* Also without any reservation. */
  EXPECT_RC(COGPU("run", "--", "sh", "-c", "exit 9"), 9);
  ASSERT_IDLE();
}

TEST_IMPL(cli_run_exit_by_signal_propagated) {
  static const struct {
    const char *script;
    int sig;
  } cases[] = {{"kill -TERM $$", SIGTERM},
               {"kill -KILL $$", SIGKILL},
               {"kill -USR1 $$", SIGUSR1}};
  for (size_t i = 0; i < COGPU_ARRAY_SIZE(cases); i++) {
    res_t *r = COGPU("run", "--mem", "1G", "--", "sh", "-c", cases[i].script);
    EXPECT_RC(r, 128 + cases[i].sig);
  }
  /* The reservation went with it. */
  ASSERT_IDLE();
}

TEST_IMPL(cli_run_forwards_signals_to_command) {
  static const struct {
    const char *trap;
    int sig, code;
  } cases[] = {{"trap 'exit 42' TERM", SIGTERM, 42},
               {"trap 'exit 43' USR1", SIGUSR1, 43},
               {"trap 'exit 44' HUP", SIGHUP, 44}};
  for (size_t i = 0; i < COGPU_ARRAY_SIZE(cases); i++)
    signal(cases[i].sig, SIG_DFL); /* whatever the runner inherited */
  for (size_t i = 0; i < COGPU_ARRAY_SIZE(cases); i++) {
    char script[512], tag[16];
    snprintf(script, sizeof script, "%s; %s", cases[i].trap, hold_script);
    snprintf(tag, sizeof tag, "sig%zu", i);
    holder_t h;
    hold_spawn_script(&h, tag, (const char *const[]){"--mem", "1G", NULL},
                      script, NULL);
    HOLD_READY(&h);
    ASSERT_EQ(kill(h.pid, cases[i].sig), 0);
    int code = WAIT_EXIT(h.pid, th_ms(5000), NULL, "cogpu run after a signal");
    if (code != cases[i].code)
      th_fail(__FILE__, __LINE__,
              "signal %d to cogpu: exit %d, expected the command's %d; "
              "stderr: %s",
              cases[i].sig, code, cases[i].code, tag_file(tag, "err"));
  }
  ASSERT_IDLE();
}

/* nohup (or a non-interactive shell's `&`) starts a program with signals
 * ignored; the command started by `cogpu run` must inherit that, as it
 * would without cogpu. */
TEST_IMPL(cli_run_keeps_ignored_signals) {
  signal(SIGHUP, SIG_IGN);
  res_t *r = RUN(NULL, "sh", "-c", "kill -HUP $$; echo survived");
  if (r->rc != 0)
    SKIP("this sh does not keep a signal ignored on entry");
  r = COGPU("run", "--mem", "1G", "--", "sh", "-c",
            "kill -HUP $$; echo survived");
  if (r->rc != 0)
    th_fail(__FILE__, __LINE__,
            "with SIGHUP ignored (nohup), the command died: exit %d "
            "(expected 0, the command ignoring SIGHUP as without cogpu); "
            "stderr: %s",
            r->rc, r->err);
  ASSERT_STREQ(r->out, "survived\n");
  /* A SIGHUP sent to cogpu itself under nohup must not kill the job. */
  holder_t h;
  HOLD(&h, "nohup", "--mem", "1G");
  ASSERT_EQ(kill(h.pid, SIGHUP), 0);
  th_sleep_ms(100);
  ASSERT_EQ(HOLD_END(&h), 0);
}

TEST_IMPL(cli_run_command_not_found) {
  res_t *r = COGPU("run", "--mem", "1G", "--", "cogpu-test-no-such-command");
  EXPECT_RC(r, 127);
  ASSERT_CONTAINS(r->err, "cogpu-test-no-such-command");
  ASSERT_CONTAINS(r->err, "cannot run");
  /* Not executable: 126. */
  const char *path = tp("not-executable");
  th_write_file(path, "#!/bin/sh\nexit 0\n");
  chmod(path, 0644);
  r = COGPU("run", "--mem", "1G", "--", path);
  EXPECT_RC(r, 126);
  ASSERT_CONTAINS(r->err, "not-executable");
  /* An empty command name. */
  r = COGPU("run", "--mem", "1G", "--", "");
  EXPECT_RC(r, 127);
  ASSERT_IDLE();
}

TEST_IMPL(cli_run_status_lists_reservation) {
  holder_t h;
  HOLD(&h, "a", "--mem", "3G", "--job-id", "JOB-7", "--priority", "7");
  jv_t *st = STATUS();
  ASSERT_EQ(jlen(st, "gpus"), 1);
  ASSERT_UEQ(ju(st, "gpus.0.reserved_bytes"), 3 * GIB);
  ASSERT_EQ(jlen(st, "gpus.0.clients"), 1);
  ASSERT_EQ(jlen(st, "gpus.0.waiting"), 0);
  ASSERT_EQ(ji(st, "gpus.0.clients.0.pid"), h.pid);
  ASSERT_UEQ(ju(st, "gpus.0.clients.0.reserved_bytes"), 3 * GIB);
  ASSERT_STREQ(js(st, "gpus.0.clients.0.job_id"), "JOB-7");
  ASSERT_EQ(ji(st, "gpus.0.clients.0.priority"), 7);
  ASSERT_EQ(ju(st, "gpus.0.clients.0.uid"), geteuid());
  ASSERT(!jb(st, "gpus.0.clients.0.exclusive"));
  const char *cmd = js(st, "gpus.0.clients.0.command");
  ASSERT(strncmp(cmd, "sh -c echo $$", 13) == 0);
  /* The table says the same. */
  res_t *r = COGPU("status");
  EXPECT_RC(r, 0);
  ASSERT_CONTAINS(r->out, "JOB-7");
  ASSERT_CONTAINS(r->out, "3.0 GiB");
  char pid[32];
  snprintf(pid, sizeof pid, "%d", (int)h.pid);
  ASSERT_CONTAINS(r->out, pid);
  /* What is held is not available to others. */
  r = COGPU("run", "--mem", "13G", "--timeout", "0", "--", "true");
  EXPECT_RC(r, 125);
  EXPECT_RC(COGPU("run", "--mem", "12G", "--timeout", "0", "--", "true"), 0);
  ASSERT_EQ(HOLD_END(&h), 0);
  ASSERT_IDLE();
}

/* `cogpu run --gpu SPEC --mem 1G` and what its command sees. */
static void run_on_gpu(const char *spec, int want, const char *want_uuid) {
  res_t *r = COGPU("run", "--gpu", spec, "--mem", "1G", "--", "sh", "-c",
                   "echo \"$COGPU_GPU $CUDA_VISIBLE_DEVICES\"; "
                   "cogpu status --json");
  EXPECT_RC(r, 0);
  char line[200];
  snprintf(line, sizeof line, "%d %s\n", want, want_uuid);
  if (strncmp(r->out, line, strlen(line)) != 0)
    th_fail(__FILE__, __LINE__, "--gpu %s: got '%.200s', expected '%s'", spec,
            r->out, line);
  /* The command's own view: the reservation is on that GPU only. */
  jv_t *st = JSON(r->out + strlen(line));
  for (size_t g = 0; g < jlen(st, "gpus"); g++)
    ASSERT_UEQ(ju(st, "gpus.%zu.reserved_bytes", g), (int)g == want ? GIB : 0);
}

TEST_IMPL(cli_run_gpu_by_index_uuid_and_prefix) {
  th_setenv("FAKE_NVML_GPUS", "8G,8G");
  jv_t *st = STATUS();
  ASSERT_EQ(jlen(st, "gpus"), 2);
  char u0[128], u1[128];
  snprintf(u0, sizeof u0, "%s", js(st, "gpus.0.uuid"));
  snprintf(u1, sizeof u1, "%s", js(st, "gpus.1.uuid"));
  ASSERT(strcmp(u0, u1) != 0);
  run_on_gpu("1", 1, u1);
  run_on_gpu("0", 0, u0);
  run_on_gpu(u1, 1, u1);
  run_on_gpu(u0, 0, u0);
  /* A prefix both UUIDs share is refused. */
  res_t *r = COGPU("run", "--gpu", "GPU-", "--mem", "1G", "--", "true");
  EXPECT_RC(r, 125);
  ASSERT_CONTAINS(r->err, "--gpu");
  ASSERT_CONTAINS(r->err, "more than one");
  ASSERT_IDLE();
  /* A unique prefix picks its GPU (one-GPU node). */
  use_state_dir("state1");
  th_setenv("FAKE_NVML_GPUS", "16G");
  st = STATUS();
  char prefix[16];
  snprintf(prefix, sizeof prefix, "%.12s", js(st, "gpus.0.uuid"));
  run_on_gpu(prefix, 0, js(st, "gpus.0.uuid"));
  ASSERT_IDLE();
}

static int run_auto_gpu(const char *mem) {
  res_t *r = COGPU("run", "--mem", mem, "--timeout", "0", "--", "sh", "-c",
                   "echo $COGPU_GPU");
  EXPECT_RC(r, 0);
  return atoi(r->out);
}

TEST_IMPL(cli_run_gpu_auto_picks_most_free) {
  /* The bigger GPU when both are empty. */
  th_setenv("FAKE_NVML_GPUS", "4G,8G");
  ASSERT_EQ(run_auto_gpu("1G"), 1);
  /* The emptier one when equal. */
  use_state_dir("state2");
  th_setenv("FAKE_NVML_GPUS", "8G,8G");
  holder_t a, b;
  HOLD(&a, "a", "--gpu", "0", "--mem", "3G");
  ASSERT_EQ(run_auto_gpu("1G"), 1);
  EXPECT_RC(COGPU("run", "--gpu", "auto", "--mem", "1G", "--", "sh", "-c",
                  "test \"$COGPU_GPU\" = 1"),
            0);
  HOLD(&b, "b", "--gpu", "1", "--mem", "5G");
  ASSERT_EQ(run_auto_gpu("1G"), 0);
  /* 4G only fits on GPU 0 now. */
  ASSERT_EQ(run_auto_gpu("4G"), 0);
  ASSERT_EQ(HOLD_END(&a), 0);
  ASSERT_EQ(HOLD_END(&b), 0);
  ASSERT_IDLE();
}

TEST_IMPL(cli_run_exclusive) {
  holder_t x, y;
  HOLD(&x, "x", "--exclusive");
  jv_t *st = STATUS();
  ASSERT(jb(st, "gpus.0.exclusive"));
  ASSERT_EQ(jlen(st, "gpus.0.clients"), 1);
  ASSERT(jb(st, "gpus.0.clients.0.exclusive"));
  ASSERT_EQ(ji(st, "gpus.0.clients.0.pid"), x.pid);
  ASSERT_UEQ(ju(st, "gpus.0.clients.0.reserved_bytes"), 0);
  ASSERT_CONTAINS(COGPU("status")->out, "[exclusive]");
  /* Nobody else gets any memory, nor the GPU. */
  const char *ran = tp("ran");
  res_t *r = COGPU("run", "--mem", "1M", "--timeout", "0", "--", "touch", ran);
  EXPECT_RC(r, 125);
  ASSERT(!file_exists(ran));
  EXPECT_RC(COGPU("run", "--exclusive", "--timeout", "0", "--", "touch", ran),
            125);
  ASSERT(!file_exists(ran));
  ASSERT_EQ(HOLD_END(&x), 0);
  ASSERT_IDLE();
  /* --exclusive with --mem holds both. */
  r = COGPU("run", "--exclusive", "--mem", "2G", "--", "cogpu", "status",
            "--json");
  EXPECT_RC(r, 0);
  st = JSON(r->out);
  ASSERT(jb(st, "gpus.0.exclusive"));
  ASSERT(jb(st, "gpus.0.clients.0.exclusive"));
  ASSERT_UEQ(ju(st, "gpus.0.clients.0.reserved_bytes"), 2 * GIB);
  ASSERT_UEQ(ju(st, "gpus.0.reserved_bytes"), 2 * GIB);
  /* Exclusive use is refused while someone else holds memory. */
  HOLD(&y, "y", "--mem", "1G");
  EXPECT_RC(COGPU("run", "--exclusive", "--timeout", "0", "--", "touch", ran),
            125);
  ASSERT(!file_exists(ran));
  ASSERT_EQ(HOLD_END(&y), 0);
  ASSERT_IDLE();
}

/* A failed exclusive request should say what was asked for. */
TEST_IMPL(cli_run_exclusive_failure_message) {
  holder_t y;
  HOLD(&y, "y", "--mem", "1G");
  const char *const timeouts[] = {"0", "200ms"};
  for (size_t i = 0; i < COGPU_ARRAY_SIZE(timeouts); i++) {
    res_t *r =
        COGPU("run", "--exclusive", "--timeout", timeouts[i], "--", "true");
    EXPECT_RC(r, 125);
    if (strstr(r->err, " 0 bytes") || !strstr(r->err, "exclusive"))
      th_fail(__FILE__, __LINE__,
              "--exclusive --timeout %s: the message speaks of 0 bytes "
              "instead of exclusive use: %s",
              timeouts[i], r->err);
  }
  ASSERT_EQ(HOLD_END(&y), 0);
}

TEST_IMPL(cli_run_priority_and_job_id) {
  res_t *r = COGPU("run", "--priority", "7", "--job-id", "J-1", "--mem", "1G",
                   "--", "cogpu", "status", "--json");
  EXPECT_RC(r, 0);
  jv_t *st = JSON(r->out);
  ASSERT_EQ(ji(st, "gpus.0.clients.0.priority"), 7);
  ASSERT_STREQ(js(st, "gpus.0.clients.0.job_id"), "J-1");
  ASSERT_STREQ(js(st, "gpus.0.clients.0.command"), "cogpu status --json");
  r = COGPU("run", "--priority", "-1000", "--mem", "1G", "--", "cogpu",
            "status", "--json");
  EXPECT_RC(r, 0);
  ASSERT_EQ(ji(JSON(r->out), "gpus.0.clients.0.priority"), -1000);
  r = COGPU("run", "--priority", "1000", "--mem", "1G", "--", "cogpu", "status",
            "--json");
  EXPECT_RC(r, 0);
  ASSERT_EQ(ji(JSON(r->out), "gpus.0.clients.0.priority"), 1000);
  /* The job id defaults to Slurm's; --job-id wins; none: empty. */
  const char *const slurm[] = {"SLURM_JOB_ID=4321", NULL};
  r = COGPU_ENV(slurm, "run", "--mem", "1G", "--", "cogpu", "status", "--json");
  EXPECT_RC(r, 0);
  ASSERT_STREQ(js(JSON(r->out), "gpus.0.clients.0.job_id"), "4321");
  r = COGPU_ENV(slurm, "run", "--job-id", "mine", "--mem", "1G", "--", "cogpu",
                "status", "--json");
  EXPECT_RC(r, 0);
  ASSERT_STREQ(js(JSON(r->out), "gpus.0.clients.0.job_id"), "mine");
  const char *const noslurm[] = {"SLURM_JOB_ID=", NULL};
  r = COGPU_ENV(noslurm, "run", "--mem", "1G", "--", "cogpu", "status",
                "--json");
  EXPECT_RC(r, 0);
  jv_t *v = JSON(r->out);
  ASSERT_STREQ(js(v, "gpus.0.clients.0.job_id"), "");
  ASSERT_EQ(ji(v, "gpus.0.clients.0.priority"), 0);
  ASSERT_IDLE();
}

TEST_IMPL(cli_run_waits_until_memory_is_free) {
  holder_t h;
  HOLD(&h, "h", "--mem", "10G");
  const char *ran = tp("w.ran");
  pid_t w = spawn_logged("w",
                         (const char *const[]){"cogpu", "run", "--mem", "10G",
                                               "--", "touch", ran, NULL},
                         NULL);
  jv_t *st = WAIT_WAITERS(0, 1);
  ASSERT_EQ(ji(st, "gpus.0.waiting.0.pid"), w);
  ASSERT_UEQ(ju(st, "gpus.0.waiting.0.requested_bytes"), 10 * GIB);
  ASSERT_EQ(ji(st, "gpus.0.waiting.0.position"), 1);
  ASSERT_STREQ(js(st, "gpus.0.waiting.0.gpu"), "auto");
  ASSERT(!jb(st, "gpus.0.waiting.0.exclusive"));
  ASSERT(jnum(st, "gpus.0.waiting.0.waiting_seconds") >= 0);
  ASSERT(strncmp(js(st, "gpus.0.waiting.0.command"), "touch ", 6) == 0);
  ASSERT_EQ(jlen(st, "gpus.0.clients"), 1);
  WAIT_STDERR("w", w, "waiting for");
  /* Still waiting, command not started. */
  th_sleep_ms(100);
  ASSERT(still_running(w));
  ASSERT(!file_exists(ran));
  res_t *r = COGPU("status");
  ASSERT_CONTAINS(r->out, "waiting:");
  ASSERT_EQ(HOLD_END(&h), 0);
  ASSERT_EQ(WAIT_EXIT(w, th_ms(5000), NULL, "waiter"), 0);
  ASSERT(file_exists(ran));
  char *err = tag_file("w", "err");
  if (count_substr(err, "cogpu: waiting for") != 1)
    th_fail(__FILE__, __LINE__, "expected one 'waiting for' line: %s", err);
  ASSERT_CONTAINS(err, "position 1");
  ASSERT_CONTAINS(err, "10.0 GiB");
  ASSERT_IDLE();
}

TEST_IMPL(cli_run_priority_order_in_queue) {
  th_setenv("COGPU_POLICY", "priority-fifo");
  holder_t h, a, b;
  HOLD(&h, "h", "--mem", "10G");
  hold_spawn(&a, "a", (const char *const[]){"--mem", "10G", NULL}, NULL);
  WAIT_WAITERS(0, 1);
  hold_spawn(&b, "b",
             (const char *const[]){"--mem", "10G", "--priority", "5", NULL},
             NULL);
  jv_t *st = WAIT_WAITERS(0, 2);
  ASSERT_STREQ(js(st, "policy"), "priority-fifo");
  ASSERT_EQ(ji(st, "gpus.0.waiting.0.pid"), b.pid);
  ASSERT_EQ(ji(st, "gpus.0.waiting.0.priority"), 5);
  ASSERT_EQ(ji(st, "gpus.0.waiting.0.position"), 1);
  ASSERT_EQ(ji(st, "gpus.0.waiting.1.pid"), a.pid);
  ASSERT_EQ(ji(st, "gpus.0.waiting.1.priority"), 0);
  ASSERT_EQ(ji(st, "gpus.0.waiting.1.position"), 2);
  ASSERT_EQ(HOLD_END(&h), 0);
  HOLD_READY(&b);
  st = STATUS();
  ASSERT(!file_exists(a.ready));
  ASSERT_EQ(jlen(st, "gpus.0.waiting"), 1);
  ASSERT_EQ(ji(st, "gpus.0.waiting.0.pid"), a.pid);
  ASSERT_EQ(ji(st, "gpus.0.clients.0.pid"), b.pid);
  ASSERT_EQ(HOLD_END(&b), 0);
  HOLD_READY(&a);
  ASSERT_EQ(HOLD_END(&a), 0);
  ASSERT_IDLE();
}

TEST_IMPL(cli_run_timeout_zero_fails_at_once) {
  holder_t h;
  HOLD(&h, "h", "--mem", "10G");
  const char *ran = tp("ran");
  res_t *r = COGPU("run", "--mem", "10G", "--timeout", "0", "--", "touch", ran);
  EXPECT_RC(r, 125);
  ASSERT_LT(r->ms, th_ms(2000));
  ASSERT_CONTAINS(r->err, "cannot reserve");
  ASSERT_CONTAINS(r->err, "not available");
  ASSERT(!strstr(r->err, "waiting for"));
  /* The node's default timeout applies to cogpu run: env and file. */
  r = COGPU_ENV(((const char *const[]){"COGPU_TIMEOUT=0", NULL}), "run",
                "--mem", "10G", "--", "touch", ran);
  EXPECT_RC(r, 125);
  ASSERT_LT(r->ms, th_ms(2000));
  const char *conf = tp("cogpu.conf");
  th_write_file(conf, "timeout = 0\n");
  char cenv[PATH_MAX + 32];
  snprintf(cenv, sizeof cenv, "COGPU_CONFIG=%s", conf);
  r = COGPU_ENV(((const char *const[]){cenv, NULL}), "run", "--mem", "10G",
                "--", "touch", ran);
  EXPECT_RC(r, 125);
  ASSERT_LT(r->ms, th_ms(2000));
  /* --timeout overrides the default. */
  r = COGPU_ENV(((const char *const[]){"COGPU_TIMEOUT=0", NULL}), "run",
                "--mem", "10G", "--timeout", "300ms", "--", "touch", ran);
  EXPECT_RC(r, 125);
  ASSERT_GE(r->ms, 290);
  ASSERT(!file_exists(ran));
  jv_t *st = STATUS();
  ASSERT_EQ(jlen(st, "gpus.0.waiting"), 0);
  ASSERT_EQ(jlen(st, "gpus.0.clients"), 1);
  ASSERT_EQ(HOLD_END(&h), 0);
  ASSERT_IDLE();
}

TEST_IMPL(cli_run_timeout_bound) {
  holder_t h;
  HOLD(&h, "h", "--mem", "10G");
  const char *ran = tp("ran");
  res_t *r =
      COGPU("run", "--mem", "10G", "--timeout", "300ms", "--", "touch", ran);
  EXPECT_RC(r, 125);
  ASSERT_GE(r->ms, 290);
  ASSERT_LT(r->ms, th_ms(3000));
  ASSERT_CONTAINS(r->err, "timed out");
  ASSERT_EQ(count_substr(r->err, "cogpu: waiting for"), 1);
  ASSERT(!file_exists(ran));
  jv_t *st = STATUS();
  ASSERT_EQ(jlen(st, "gpus.0.waiting"), 0);
  ASSERT_EQ(jlen(st, "gpus.0.clients"), 1);
  ASSERT_EQ(HOLD_END(&h), 0);
  ASSERT_IDLE();
}

/* A bound of centuries is a long wait. 18446744073709 ms is 2^64 ns less
 * 551616 ns (585 years): unsaturated, now + that wrapped into the past and
 * the request timed out at once. Longer still saturates as well. */
TEST_IMPL(cli_run_timeout_centuries_waits) {
  const char *const bounds[] = {"18446744073709ms", "18446744073710ms",
                                "100000000000s", "9223372036854775807ms"};
  holder_t h;
  HOLD(&h, "h", "--mem", "10G");
  for (size_t i = 0; i < COGPU_ARRAY_SIZE(bounds); i++) {
    char tag[16];
    snprintf(tag, sizeof tag, "w%zu", i);
    pid_t w = spawn_logged(tag,
                           (const char *const[]){"cogpu", "run", "--mem", "10G",
                                                 "--timeout", bounds[i], "--",
                                                 "true", NULL},
                           NULL);
    WAIT_WAITERS(0, 1);
    th_sleep_ms(300);
    if (!still_running(w))
      th_fail(__FILE__, __LINE__, "--timeout %s: ended at once: %s", bounds[i],
              tag_file(tag, "err"));
    kill(w, SIGTERM);
    WAIT_EXIT(w, th_ms(5000), NULL, "waiter");
    WAIT_WAITERS(0, 0);
  }
  /* The same bound from the node's default, and then served. */
  pid_t w = spawn_logged(
      "wd",
      (const char *const[]){"cogpu", "run", "--mem", "10G", "--", "true", NULL},
      (const char *const[]){"COGPU_TIMEOUT=18446744073709ms", NULL});
  WAIT_WAITERS(0, 1);
  th_sleep_ms(300);
  ASSERT(still_running(w));
  ASSERT_EQ(HOLD_END(&h), 0);
  ASSERT_EQ(WAIT_EXIT(w, th_ms(5000), NULL, "waiter"), 0);
  ASSERT_IDLE();
}

TEST_IMPL(cli_run_larger_than_gpu_fails_at_once) {
  const char *ran = tp("ran");
  const char *const sizes[] = {"17G", "16G", "1T", "16777215T"};
  holder_t h;
  HOLD(&h, "h", "--mem", "1G");
  for (size_t i = 0; i < COGPU_ARRAY_SIZE(sizes); i++) {
    res_t *r =
        COGPU("run", "--mem", sizes[i], "--timeout", "inf", "--", "touch", ran);
    EXPECT_RC(r, 125);
    ASSERT_LT(r->ms, th_ms(3000));
    ASSERT_CONTAINS(r->err, "larger than");
    ASSERT(!strstr(r->err, "waiting for"));
  }
  ASSERT(!file_exists(ran));
  ASSERT_EQ(HOLD_END(&h), 0);
  ASSERT_IDLE();
  /* Larger than the GPU asked for, though another could take it. */
  use_state_dir("state2");
  th_setenv("FAKE_NVML_GPUS", "8G,16G");
  res_t *r = COGPU("run", "--gpu", "0", "--mem", "9G", "--", "touch", ran);
  EXPECT_RC(r, 125);
  ASSERT_CONTAINS(r->err, "larger than");
  ASSERT(!file_exists(ran));
  r = COGPU("run", "--mem", "9G", "--", "sh", "-c", "echo $COGPU_GPU");
  EXPECT_RC(r, 0);
  ASSERT_STREQ(r->out, "1\n");
  ASSERT_IDLE();
}

TEST_IMPL(cli_run_sigterm_while_waiting_leaves_queue) {
  holder_t h;
  HOLD(&h, "h", "--mem", "10G");
  pid_t w = spawn_logged(
      "w",
      (const char *const[]){"cogpu", "run", "--mem", "10G", "--", "true", NULL},
      NULL);
  WAIT_WAITERS(0, 1);
  ASSERT_EQ(kill(w, SIGTERM), 0);
  ASSERT_EQ(WAIT_EXIT(w, th_ms(5000), NULL, "waiter"), 128 + SIGTERM);
  jv_t *st = STATUS();
  ASSERT_EQ(jlen(st, "gpus.0.waiting"), 0);
  ASSERT_EQ(jlen(st, "gpus.0.clients"), 1);
  ASSERT_UEQ(ju(st, "gpus.0.reserved_bytes"), 10 * GIB);
  ASSERT_EQ(HOLD_END(&h), 0);
  ASSERT_IDLE();
}

TEST_IMPL_SINGLE(cli_run_nvml_unavailable) {
  const char *ran = tp("ran");
  res_t *r = COGPU_ENV(((const char *const[]){"FAKE_NVML_FAIL=init", NULL}),
                       "run", "--mem", "1G", "--", "touch", ran);
  EXPECT_RC(r, 125);
  ASSERT_CONTAINS(r->err, "nvmlInit");
  r = COGPU_ENV(((const char *const[]){"FAKE_NVML_FAIL=init", NULL}), "status");
  EXPECT_RC(r, 125);
  ASSERT_CONTAINS(r->err, "nvmlInit");
  r = COGPU_ENV(((const char *const[]){"FAKE_NVML_FAIL=zero", NULL}), "run",
                "--mem", "1G", "--", "touch", ran);
  EXPECT_RC(r, 125);
  ASSERT_CONTAINS(r->err, "no GPU");
  ASSERT(!file_exists(ran));
  ASSERT(!file_exists(state_file()));
  char pattern[PATH_MAX + 16];
  snprintf(pattern, sizeof pattern, "%s.tmp.*", state_file());
  ASSERT_EQ(count_glob(pattern), 0);
}

/* ------------------------------------------------------------------------ */
/* cogpu run: bad flags                                                      */
/* ------------------------------------------------------------------------ */

/* Runs `cogpu run ARGS`; expects exit code `code`, stderr naming `needle`,
 * and no trace: the command (touching <tmp>/ran) never ran. */
static void expect_run_refused_(const char *file, int line,
                                const char *const args[], int code,
                                const char *needle) {
  const char *argv[32];
  int n = 0;
  argv[n++] = "cogpu";
  argv[n++] = "run";
  for (int i = 0; args[i] && n < 31; i++)
    argv[n++] = args[i];
  argv[n] = NULL;
  res_t *r = run_argv(NULL, argv);
  char shown[512] = "";
  for (int i = 0; args[i]; i++)
    snprintf(shown + strlen(shown), sizeof shown - strlen(shown), " '%s'",
             args[i]);
  if (r->rc != code)
    th_fail(file, line, "cogpu run%s: exit %d, expected %d; stderr: %s", shown,
            r->rc, code, r->err);
  if (!strstr(r->err, needle))
    th_fail(file, line, "cogpu run%s: stderr does not name '%s': %s", shown,
            needle, r->err);
  if (!strstr(r->err, "cogpu"))
    th_fail(file, line, "cogpu run%s: message not prefixed: %s", shown, r->err);
  if (file_exists(tp("ran")))
    th_fail(file, line, "cogpu run%s: the command ran", shown);
}
#define EXPECT_RUN_REFUSED(code, needle, ...)                                  \
  expect_run_refused_(__FILE__, __LINE__,                                      \
                      (const char *const[]){__VA_ARGS__, NULL}, code, needle)

/* `cogpu run FLAG VALUE -- touch <tmp>/ran` */
static void expect_flag_refused_(const char *file, int line, const char *flag,
                                 const char *value, const char *extra,
                                 int code) {
  const char *args[8];
  int n = 0;
  args[n++] = flag;
  args[n++] = value;
  if (extra) {
    args[n++] = "--mem";
    args[n++] = extra;
  }
  args[n++] = "--";
  args[n++] = "touch";
  args[n++] = tp("ran");
  args[n] = NULL;
  expect_run_refused_(file, line, args, code, flag);
}

TEST_IMPL(cli_run_bad_mem) {
  ASSERT_IDLE(); /* the state exists: bad input must leave it untouched */
  const char *const bad[] = {
      "banana", "-5",  "1.5G", "0",   "",
      "0G",     "12X", "0x10", "1G1", "18446744073709551616",
      "16E",    "-0"};
  for (size_t i = 0; i < COGPU_ARRAY_SIZE(bad); i++)
    expect_flag_refused_(__FILE__, __LINE__, "--mem", bad[i], NULL, 2);
  EXPECT_RUN_REFUSED(2, "--mem", "--mem=", "--", "touch", tp("ran"));
  EXPECT_RUN_REFUSED(2, "--mem", "--mem=banana", "--", "touch", tp("ran"));
  EXPECT_RUN_REFUSED(2, "--mem", "--mem");
  ASSERT_IDLE();
}

TEST_IMPL(cli_run_bad_priority) {
  ASSERT_IDLE();
  const char *const bad[] = {"abc",  "99999", "-1001",
                             "1001", "1.5",   "",
                             "0x10", "7a",    "9223372036854775808"};
  for (size_t i = 0; i < COGPU_ARRAY_SIZE(bad); i++)
    expect_flag_refused_(__FILE__, __LINE__, "--priority", bad[i], "1G", 2);
  EXPECT_RUN_REFUSED(2, "--priority", "--priority");
  ASSERT_IDLE();
}

TEST_IMPL(cli_run_bad_timeout) {
  ASSERT_IDLE();
  const char *const bad[] = {"xyz",       "-1s", "-1",
                             "1.5s",      "",    "5 minutes",
                             "10parsecs", "s",   "99999999999999999999"};
  for (size_t i = 0; i < COGPU_ARRAY_SIZE(bad); i++)
    expect_flag_refused_(__FILE__, __LINE__, "--timeout", bad[i], "1G", 2);
  EXPECT_RUN_REFUSED(2, "--timeout", "--timeout");
  ASSERT_IDLE();
}

TEST_IMPL(cli_run_bad_gpu) {
  th_setenv("FAKE_NVML_GPUS", "8G,8G");
  ASSERT_IDLE();
  const char *const bad[] = {"7",           "2",   "-1", "GPU-deadbeef", "",
                             "nonexistent", "0x0", "1 ", "GPU"};
  for (size_t i = 0; i < COGPU_ARRAY_SIZE(bad); i++) {
    expect_flag_refused_(__FILE__, __LINE__, "--gpu", bad[i], "1G", 125);
    /* Even with nothing to reserve. */
    expect_flag_refused_(__FILE__, __LINE__, "--gpu", bad[i], NULL, 125);
  }
  EXPECT_RUN_REFUSED(2, "--gpu", "--gpu");
  ASSERT_IDLE();
}

/* A GPU index past INT_MAX must not wrap around to a valid one. */
TEST_IMPL(cli_run_gpu_index_overflow) {
  th_setenv("FAKE_NVML_GPUS", "8G,8G");
  ASSERT_IDLE();
  const char *const bad[] = {"4294967296", "4294967297", "-4294967295",
                             "99999999999999999999"};
  for (size_t i = 0; i < COGPU_ARRAY_SIZE(bad); i++)
    expect_flag_refused_(__FILE__, __LINE__, "--gpu", bad[i], "1G", 125);
  ASSERT_IDLE();
}

TEST_IMPL(cli_run_usage_errors) {
  ASSERT_IDLE();
  const char *ran = tp("ran");
  EXPECT_RUN_REFUSED(2, "--bogus", "--bogus", "--", "touch", ran);
  EXPECT_RUN_REFUSED(2, "-z", "-z", "--", "touch", ran);
  EXPECT_RUN_REFUSED(2, "--exclusive=yes", "--exclusive=yes", "--", "touch",
                     ran);
  EXPECT_RUN_REFUSED(2, "no command", "--mem", "1G");
  EXPECT_RUN_REFUSED(2, "no command", "--mem", "1G", "--");
  EXPECT_RUN_REFUSED(2, "--job-id", "--job-id");
  EXPECT_RUN_REFUSED(2, "no command", "--exclusive");
  /* The usage line follows. */
  res_t *r = COGPU("run");
  EXPECT_RC(r, 2);
  ASSERT_CONTAINS(r->err, "usage: cogpu run");
  ASSERT_IDLE();
}

/* "PROG VERSION (commit C)\n": C is an abbreviated hash, with -dirty for
 * a tree that differs from it, or "unknown" (a build outside git that was
 * given none); in a git checkout, HEAD's (make check builds first). */
static void expect_version_line(const char *out, const char *prog) {
  char want[128];
  snprintf(want, sizeof want, "%s " COGPU_VERSION_STRING " (commit ", prog);
  if (strncmp(out, want, strlen(want)) != 0)
    th_fail(__FILE__, __LINE__, "version line \"%s\" does not start with %s",
            out, want);
  const char *c = out + strlen(want);
  size_t n = strspn(c, "0123456789abcdef");
  const char *end = c + n;
  if (n >= 7 && !strncmp(end, "-dirty", 6))
    end += 6;
  else if (n == 0 && !strncmp(c, "unknown", 7))
    end = c + 7;
  if ((n < 7 && end == c) || strcmp(end, ")\n") != 0)
    th_fail(__FILE__, __LINE__, "bad commit in version line \"%s\"", out);
  char git[PATH_MAX + 64];
  snprintf(git, sizeof git, "%s/../.git", th_build_dir());
  if (n == 0 || !file_exists(git))
    return;
  /* git without a sanitizer build's preloaded runtime (its leak check). */
  static const char *const env[] = {"LD_PRELOAD=", NULL};
  res_t *r = RUN(env, "git", "-C", th_build_dir(), "rev-parse", "HEAD");
  if (r->rc == 0 && strncmp(r->out, c, n) != 0)
    th_fail(__FILE__, __LINE__, "version names commit %.*s, HEAD is %s", (int)n,
            c, r->out);
}

TEST_IMPL(cli_usage_and_version) {
  res_t *r = COGPU("version");
  EXPECT_RC(r, 0);
  expect_version_line(r->out, "cogpu");
  char line[256];
  snprintf(line, sizeof line, "%.200s", r->out);
  r = COGPU("--version");
  EXPECT_RC(r, 0);
  ASSERT_STREQ(r->out, line);
  r = RUN(NULL, "cogpud", "--version");
  EXPECT_RC(r, 0);
  expect_version_line(r->out, "cogpud");
  r = COGPU("--help");
  EXPECT_RC(r, 0);
  ASSERT_CONTAINS(r->out, "usage: cogpu");
  ASSERT_CONTAINS(r->out, "run ");
  /* Every subcommand is in the usage, at the start of its entry. */
  static char usage[sizeof r->out];
  snprintf(usage, sizeof usage, "%s", r->out);
  r = COGPU("help", "--commands");
  EXPECT_RC(r, 0);
  ASSERT_CONTAINS(r->out, "run\nstatus\n");
  for (char *p = r->out, *nl; (nl = strchr(p, '\n')); p = nl + 1) {
    char a[64], b[64];
    snprintf(a, sizeof a, "\n  %.*s ", (int)(nl - p), p);
    snprintf(b, sizeof b, "\n  %.*s\n", (int)(nl - p), p);
    if (!strstr(usage, a) && !strstr(usage, b))
      th_fail(__FILE__, __LINE__, "cogpu help has no entry for '%.*s'",
              (int)(nl - p), p);
  }
  EXPECT_RC(COGPU("help", "--bogus"), 2);
  r = RUN(NULL, "cogpu");
  EXPECT_RC(r, 2);
  ASSERT_CONTAINS(r->err, "usage: cogpu");
  r = COGPU("frobnicate");
  EXPECT_RC(r, 2);
  ASSERT_CONTAINS(r->err, "unknown command 'frobnicate'");
  ASSERT(!file_exists(state_file()));
}

/* ------------------------------------------------------------------------ */
/* Options: environment and config file                                      */
/* ------------------------------------------------------------------------ */

/* Bad values per option (by NAME); a NULL value stands for a string longer
 * than any option accepts. */
static const struct {
  const char *name, *bad;
} bad_values[] = {
    {"STATE_DIR", "relative/state"},
    {"STATE_DIR", NULL},
    {"POLICY", "lifo"},
    {"POLICY", "fifo,mmu"},
    {"MARGIN", "banana"},
    {"MARGIN", "101%"},
    {"MARGIN", "-1G"},
    {"MARGIN", "5.5%"},
    {"MAX_CLIENTS", "1025"},
    {"MAX_CLIENTS", "-1"},
    {"MAX_CLIENTS", "many"},
    {"MMU_MAX_AGE", "xyz"},
    {"MMU_MAX_AGE", "-5s"},
    {"FOREIGN_REFRESH", "soon"},
    {"FOREIGN_REFRESH", "1.5s"},
    {"SWEEP_INTERVAL", "often"},
    {"SWEEP_INTERVAL", "-1s"},
    {"STATE_MODE", "0777"},
    {"STATE_MODE", "rw-rw-rw-"},
    {"STATE_MODE", "0"},
    {"STATE_MODE", "01666"},
    {"STATE_GROUP", NULL},
    {"LOG", "loud"},
    {"TIMEOUT", "xyz"},
    {"TIMEOUT", "-1"},
    {"MEM", "lots"},
    {"MEM", "1.5G"},
    {"MEM", "automatic"},
    {"MEM", "auto,4G"},
    {"LIMIT", "-1G"},
    {"PRIORITY", "1001"},
    {"PRIORITY", "high"},
    {"JOB_ID", NULL},
    {"JOB_TOKEN", NULL},
    {"STAKE_GPU", "32"},
    {"CONTEXT_BYTES", "big"},
    {"GROW_STEP", "1e6"},
    {"GROW_WAIT", "maybe"},
    {"CONTEXT_MEASURE", "sometimes"},
    {"DRIVER_WAIT", "2m"},
    {"DRIVER_WAIT", "inf"},
    {"REPORT_TOTAL", "2"},
    {"NODE_MODE", "maybe"},
    {"SOCKET", "relative/sock"},
    {"DAEMON_WAIT", "2h"},
    {"DAEMON_DIR", "run/cogpu"},
    {"ADMIN_GROUP", NULL},
    {"PRIORITY_CAP", "1001"},
    {"USER_MAX_CLIENTS", "0"},
    {"USER_MAX_WAITERS", "5000"},
    {"SUSPEND", "sometimes"},
    {"PREEMPT_PRIORITY", "2"},
    {"MAX_IDLE", "soon"},
    {"SUSPEND_LOCK_TIMEOUT", "1h"},
    {"SUSPEND_HOST_MARGIN", "lots"},
    {"SUSPEND_MAX", "-1G"},
    {"ADMIT_LEARNT", "often"},
    {"MIGRATE", "sometimes"},
    {"HISTORY_DIR", "var/lib/cogpu"},
    {"HISTORY_MAX_AGE", "a while"},
    {"HISTORY_MAX_ROWS", "-1"},
    {"JOB_REPORT", "loud"},
    {"AUTO_MARGIN", "1001"},
};

static const char *long_value(void) {
  static char buf[301];
  memset(buf, 'g', sizeof buf - 1);
  buf[0] = '/';
  return buf;
}

static const char *lower(const char *s) {
  static char buf[64];
  size_t i = 0;
  for (; s[i] && i + 1 < sizeof buf; i++)
    buf[i] = (char)tolower((unsigned char)s[i]);
  buf[i] = 0;
  return buf;
}

/* Every way of loading the configuration fails naming what, with `what2`
 * (the source) too; nothing runs, nothing is created. */
static void expect_config_refused_(const char *file, int line, const char *what,
                                   const char *what2, const char *value) {
  const char *ran = tp("ran");
  const char *cmds[][8] = {
      {"cogpu", "status", NULL},
      {"cogpu", "status", "--json", NULL},
      {"cogpu", "config", "--explain", NULL},
      {"cogpu", "run", "--mem", "1G", "--", "touch", ran, NULL},
      {"cogpu", "reset", NULL},
  };
  for (size_t c = 0; c < COGPU_ARRAY_SIZE(cmds); c++) {
    res_t *r = run_argv(NULL, cmds[c]);
    if (r->rc != 125 || !strstr(r->err, what) || !strstr(r->err, what2) ||
        (value && !strstr(r->err, value)))
      th_fail(file, line,
              "%s %s with bad %s ('%s', from %s): exit %d (expected 125), "
              "stderr: %s",
              cmds[c][1], cmds[c][2] ? cmds[c][2] : "", what,
              value ? value : "(long)", what2, r->rc, r->err);
  }
  res_t *r = COGPU("doctor");
  if (r->rc != 1 || !strstr(r->out, "PROBLEM  config") || !strstr(r->out, what))
    th_fail(file, line, "doctor with bad %s: exit %d, stdout: %s", what, r->rc,
            r->out);
  if (file_exists(ran))
    th_fail(file, line, "the command ran with bad %s", what);
}

/* A process per option and bad value, in series: long under load. */
TEST_IMPL_T(cli_config_bad_env_values, 120) {
  /* Every option of options.def has a case (CONFIG: see below). */
  for (int i = 0; i < COGPU_OPT__COUNT; i++) {
    bool found = i == COGPU_OPT_CONFIG;
    for (size_t k = 0; k < COGPU_ARRAY_SIZE(bad_values); k++)
      found |= strcmp(bad_values[k].name, cogpu__opt_table[i].name) == 0;
    if (!found)
      th_fail(__FILE__, __LINE__, "no bad-value case for option %s",
              cogpu__opt_table[i].name);
  }
  char saved_dir[PATH_MAX];
  snprintf(saved_dir, sizeof saved_dir, "%s", getenv("COGPU_STATE_DIR"));
  /* The runner's private socket and daemon directory come back too: the
   * defaults are the machine's, where a real daemon may run. */
  char saved_sock[PATH_MAX], saved_ddir[PATH_MAX];
  snprintf(saved_sock, sizeof saved_sock, "%s", getenv("COGPU_SOCKET"));
  snprintf(saved_ddir, sizeof saved_ddir, "%s", getenv("COGPU_DAEMON_DIR"));
  for (size_t k = 0; k < COGPU_ARRAY_SIZE(bad_values); k++) {
    char var[64];
    snprintf(var, sizeof var, "COGPU_%s", bad_values[k].name);
    const char *bad = bad_values[k].bad ? bad_values[k].bad : long_value();
    setenv(var, bad, 1);
    char where[80];
    snprintf(where, sizeof where, "env %s", var);
    expect_config_refused_(__FILE__, __LINE__, lower(bad_values[k].name), where,
                           bad_values[k].bad);
    if (strcmp(bad_values[k].name, "LOG") == 0)
      setenv(var, "error", 1);
    else if (strcmp(bad_values[k].name, "STATE_DIR") == 0)
      setenv(var, saved_dir, 1);
    else if (strcmp(bad_values[k].name, "SOCKET") == 0)
      setenv(var, saved_sock, 1);
    else if (strcmp(bad_values[k].name, "DAEMON_DIR") == 0)
      setenv(var, saved_ddir, 1);
    else if (strcmp(bad_values[k].name, "NODE_MODE") == 0 && th_node_mode())
      setenv(var, "daemon", 1);
    else
      unsetenv(var);
  }
  ASSERT(!file_exists(state_file()));
  /* COGPU_CONFIG naming a file that does not exist, or a directory. */
  const char *missing = tp("missing.conf");
  setenv("COGPU_CONFIG", missing, 1);
  expect_config_refused_(__FILE__, __LINE__, missing, "COGPU_CONFIG", NULL);
  setenv("COGPU_CONFIG", th_tmpdir(), 1);
  expect_config_refused_(__FILE__, __LINE__, th_tmpdir(), "COGPU_CONFIG", NULL);
  setenv("COGPU_CONFIG", "", 1);
  ASSERT_IDLE();
}

/* A FIFO (or any file that is not a regular file) named as the config file
 * is refused at once: before, opening it blocked every command forever. */
TEST_IMPL(cli_config_not_a_regular_file) {
  const char *fifo = tp("cogpu.fifo");
  ASSERT_EQ(mkfifo(fifo, 0644), 0);
  setenv("COGPU_CONFIG", fifo, 1);
  expect_config_refused_(__FILE__, __LINE__, fifo, "not a regular file",
                         "a FIFO");
  setenv("COGPU_CONFIG", th_tmpdir(), 1);
  expect_config_refused_(__FILE__, __LINE__, th_tmpdir(), "not a regular file",
                         "a directory");
  setenv("COGPU_CONFIG", "/dev/null", 1);
  expect_config_refused_(__FILE__, __LINE__, "/dev/null", "not a regular file",
                         "a device");
  setenv("COGPU_CONFIG", "", 1);
  ASSERT_IDLE();
}

/* A process per option and bad value, in series: long under load. */
TEST_IMPL_T(cli_config_bad_file_values, 120) {
  const char *conf = tp("cogpu.conf");
  setenv("COGPU_CONFIG", conf, 1);
  char where[PATH_MAX + 8];
  snprintf(where, sizeof where, "%s:2", conf);
  for (size_t k = 0; k < COGPU_ARRAY_SIZE(bad_values); k++) {
    const char *bad = bad_values[k].bad ? bad_values[k].bad : long_value();
    char text[1024];
    snprintf(text, sizeof text, "# a bad value\n%s = %s\n",
             lower(bad_values[k].name), bad);
    th_write_file(conf, text);
    expect_config_refused_(__FILE__, __LINE__, lower(bad_values[k].name), where,
                           bad_values[k].bad);
  }
  /* The config file cannot name another one. */
  th_write_file(conf, "# a bad value\nconfig = /etc/other.conf\n");
  expect_config_refused_(__FILE__, __LINE__, "config", where, "environment");
  ASSERT(!file_exists(state_file()));
  th_write_file(conf, "");
  ASSERT_IDLE();
}

TEST_IMPL(cli_config_file_syntax_errors) {
  const char *conf = tp("cogpu.conf");
  setenv("COGPU_CONFIG", conf, 1);
  char where[PATH_MAX + 8];
  th_write_file(conf, "# header\n\npolicy = mmu\nbogus_key = 1\n");
  snprintf(where, sizeof where, "%s:4", conf);
  expect_config_refused_(__FILE__, __LINE__, "bogus_key", where, "unknown");
  th_write_file(conf, "policy = mmu\njust some words\n");
  snprintf(where, sizeof where, "%s:2", conf);
  expect_config_refused_(__FILE__, __LINE__, "just some words", where,
                         "key = value");
  th_write_file(conf, "= fifo\n");
  snprintf(where, sizeof where, "%s:1", conf);
  expect_config_refused_(__FILE__, __LINE__, where, "unknown", NULL);
  char *big = malloc(6000);
  ASSERT(big);
  memcpy(big, "policy = ", 9);
  memset(big + 9, 'x', 5000);
  strcpy(big + 5009, "\n");
  th_write_file(conf, big);
  free(big);
  expect_config_refused_(__FILE__, __LINE__, where, "longer", NULL);
  ASSERT(!file_exists(state_file()));
  /* Comments, blank lines, quotes and odd spacing are fine. */
  th_write_file(conf, "# cogpu\n\n  policy=\"mmu\"   # the policy\n"
                      "state_group = ''\nmargin\t=\t1G\n");
  if (th_node_mode()) /* node settings are the daemon's to read */
    th_daemon_restart_fresh();
  jv_t *st = STATUS();
  ASSERT_STREQ(js(st, "policy"), "mmu");
  ASSERT_UEQ(ju(st, "gpus.0.margin_bytes"), GIB);
}

/* The value and source `cogpu config --explain` shows for key. */
static void explain_line(const char *out, const char *key, char *value,
                         size_t vlen, char *src, size_t slen) {
  const char *p = out;
  size_t kl = strlen(key);
  for (; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
    if (strncmp(p, key, kl) == 0 && p[kl] == ' ')
      break;
  if (!p || !*p)
    th_fail(__FILE__, __LINE__, "config --explain has no line for %s: %s", key,
            out);
  const char *end = strchr(p, '\n');
  const char *eq = strstr(p, " = ");
  if (!end || !eq || eq > end)
    th_fail(__FILE__, __LINE__, "config --explain: odd line for %s: %s", key,
            p);
  const char *open = NULL;
  for (const char *q = eq; q < end; q++)
    if (*q == '(')
      open = q;
  if (!open || end[-1] != ')')
    th_fail(__FILE__, __LINE__, "config --explain: no source for %s: %.*s", key,
            (int)(end - p), p);
  size_t n = (size_t)(open - (eq + 3));
  while (n > 0 && eq[3 + n - 1] == ' ')
    n--;
  snprintf(value, vlen, "%.*s", (int)n, eq + 3);
  snprintf(src, slen, "%.*s", (int)(end - open - 2), open + 1);
}

TEST_IMPL(cli_config_explain_shows_sources) {
  const char *conf = tp("cogpu.conf");
  th_write_file(conf, "# test\npolicy = mmu\ntimeout = 5s\nmargin = 1G\n");
  setenv("COGPU_CONFIG", conf, 1);
  setenv("COGPU_TIMEOUT", "7s", 1);
  res_t *r = COGPU("config", "--explain");
  EXPECT_RC(r, 0);
  char v[512], src[512], want[PATH_MAX + 16];
  for (int i = 0; i < COGPU_OPT__COUNT; i++)
    explain_line(r->out, cogpu__opt_table[i].key, v, sizeof v, src, sizeof src);
  explain_line(r->out, "policy", v, sizeof v, src, sizeof src);
  ASSERT_STREQ(v, "mmu");
  snprintf(want, sizeof want, "%s:2", conf);
  ASSERT_STREQ(src, want);
  explain_line(r->out, "margin", v, sizeof v, src, sizeof src);
  ASSERT_STREQ(v, "1G");
  snprintf(want, sizeof want, "%s:4", conf);
  ASSERT_STREQ(src, want);
  explain_line(r->out, "timeout", v, sizeof v, src, sizeof src);
  ASSERT_STREQ(v, "7s");
  ASSERT_STREQ(src, "env COGPU_TIMEOUT");
  explain_line(r->out, "max_clients", v, sizeof v, src, sizeof src);
  ASSERT_STREQ(v, "0");
  ASSERT_STREQ(src, "default");
  explain_line(r->out, "sweep_interval", v, sizeof v, src, sizeof src);
  ASSERT_STREQ(v, "1s");
  ASSERT_STREQ(src, "default");
  explain_line(r->out, "config", v, sizeof v, src, sizeof src);
  ASSERT_STREQ(v, conf);
  ASSERT_STREQ(src, "env COGPU_CONFIG");
  explain_line(r->out, "state_dir", v, sizeof v, src, sizeof src);
  ASSERT_STREQ(v, getenv("COGPU_STATE_DIR"));
  ASSERT_STREQ(src, "env COGPU_STATE_DIR");
  /* The environment wins over the file; an enum is shown canonically. */
  th_setenv("COGPU_POLICY", "PRIORITY-MMU");
  r = COGPU("config", "--explain");
  EXPECT_RC(r, 0);
  explain_line(r->out, "policy", v, sizeof v, src, sizeof src);
  ASSERT_STREQ(v, "priority-mmu");
  ASSERT_STREQ(src, "env COGPU_POLICY");
  /* And the node is created with what was configured. */
  jv_t *st = STATUS();
  ASSERT_STREQ(js(st, "policy"), "priority-mmu");
  ASSERT_UEQ(ju(st, "gpus.0.margin_bytes"), GIB);
  /* Usage errors. */
  r = COGPU("config", "--explain", "extra");
  EXPECT_RC(r, 2);
  ASSERT_CONTAINS(r->err, "usage");
  r = COGPU("config", "--bogus");
  EXPECT_RC(r, 2);
  ASSERT_CONTAINS(r->err, "usage");
}

TEST_IMPL(cli_config_list) {
  const char *const forms[][3] = {{"config", NULL}, {"config", "--list"}};
  for (size_t f = 0; f < COGPU_ARRAY_SIZE(forms); f++) {
    res_t *r = forms[f][1] ? COGPU("config", "--list") : COGPU("config");
    EXPECT_RC(r, 0);
    for (int i = 0; i < COGPU_OPT__COUNT; i++) {
      const cogpu__opt_desc_t *d = &cogpu__opt_table[i];
      char env[64];
      snprintf(env, sizeof env, "COGPU_%s ", d->name);
      ASSERT_CONTAINS(r->out, env);
      ASSERT_CONTAINS(r->out, d->form);
      ASSERT_CONTAINS(r->out, d->help);
      if (d->def[0])
        ASSERT_CONTAINS(r->out, d->def);
    }
  }
  /* Listing needs no valid configuration. */
  EXPECT_RC(COGPU_ENV(((const char *const[]){"COGPU_POLICY=lifo", NULL}),
                      "config", "--list"),
            0);
}

/* CPU time (ms) a waiter spends while it waits `wait_ms` for memory that a
 * holder keeps; its exit code in *code. */
static int64_t waiter_cpu_ms(const char *tag, const char *timeout, int *code,
                             int64_t *elapsed) {
  struct rusage ru;
  int64_t t0 = mono_ms();
  pid_t w = spawn_logged(tag,
                         (const char *const[]){"cogpu", "run", "--mem", "10G",
                                               "--timeout", timeout, "--",
                                               "true", NULL},
                         NULL);
  *code = WAIT_EXIT(w, th_ms(6000), &ru, "waiter");
  *elapsed = mono_ms() - t0;
  return (int64_t)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000 +
         (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1000;
}

/* A value the configuration accepts must not make waiters busy-loop: a
 * waiter sleeps on its futex between housekeeping ticks. */
TEST_IMPL(cli_config_sweep_interval_zero_no_spin) {
  const char *const values[] = {NULL, "0"};
  for (size_t i = 0; i < COGPU_ARRAY_SIZE(values); i++) {
    char dir[32];
    snprintf(dir, sizeof dir, "state%zu", i);
    use_state_dir(dir);
    if (values[i])
      th_setenv("COGPU_SWEEP_INTERVAL", values[i]);
    res_t *r = COGPU("status");
    if (r->rc != 0) { /* refusing the value is fine, with a message */
      ASSERT_CONTAINS(r->err, "sweep_interval");
      continue;
    }
    holder_t h;
    HOLD(&h, "h", "--mem", "10G");
    int code;
    int64_t elapsed, cpu = waiter_cpu_ms("w", "1500ms", &code, &elapsed);
    ASSERT_EQ(code, 125);
    /* A busy loop costs about the whole wait; a sleeping waiter costs its
     * start-up, which a sanitizer runtime on a loaded machine makes over
     * 150 ms (TSan under two busy loops: 159 ms). */
    if (cpu > elapsed / 3)
      th_fail(__FILE__, __LINE__,
              "sweep_interval=%s: a waiter used %" PRId64
              " ms of CPU in %" PRId64 " ms of waiting (busy loop)",
              values[i] ? values[i] : "(default)", cpu, elapsed);
    ASSERT_EQ(HOLD_END(&h), 0);
  }
}

TEST_IMPL(cli_config_sweep_interval_inf_honours_timeout) {
  th_setenv("COGPU_SWEEP_INTERVAL", "inf");
  res_t *r = COGPU("status");
  if (r->rc != 0) {
    ASSERT_CONTAINS(r->err, "sweep_interval");
    return;
  }
  holder_t h;
  HOLD(&h, "h", "--mem", "10G");
  int64_t t0 = mono_ms();
  pid_t w = spawn_logged("w",
                         (const char *const[]){"cogpu", "run", "--mem", "10G",
                                               "--timeout", "300ms", "--",
                                               "true", NULL},
                         NULL);
  int64_t deadline = t0 + th_ms(4000);
  while (still_running(w) && mono_ms() < deadline)
    th_sleep_ms(10);
  if (still_running(w)) {
    kill(w, SIGKILL);
    waitpid(w, NULL, 0);
    th_fail(__FILE__, __LINE__,
            "sweep_interval=inf: `cogpu run --timeout 300ms` still waiting "
            "after %d ms",
            th_ms(4000));
  }
  ASSERT_EQ(WAIT_EXIT(w, 1000, NULL, "waiter"), 125);
  /* Without a timeout, the waiter sleeps rather than spins. */
  struct rusage ru;
  w = spawn_logged(
      "w2",
      (const char *const[]){"cogpu", "run", "--mem", "10G", "--", "true", NULL},
      NULL);
  WAIT_WAITERS(0, 1);
  th_sleep_ms(1000);
  ASSERT_EQ(HOLD_END(&h), 0);
  ASSERT_EQ(WAIT_EXIT(w, th_ms(5000), &ru, "waiter"), 0);
  int64_t cpu = (int64_t)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000 +
                (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1000;
  if (cpu > 150)
    th_fail(__FILE__, __LINE__,
            "sweep_interval=inf: a waiter used %" PRId64
            " ms of CPU in about 1 s of waiting (busy loop)",
            cpu);
}

TEST_IMPL_SINGLE(cli_config_state_group_unknown) {
  setenv("COGPU_STATE_GROUP", "cogpu-test-no-such-group", 1);
  res_t *r = COGPU("status");
  EXPECT_RC(r, 125);
  ASSERT_CONTAINS(r->err, "state_group");
  ASSERT_CONTAINS(r->err, "cogpu-test-no-such-group");
  r = COGPU("run", "--mem", "1G", "--", "touch", tp("ran"));
  EXPECT_RC(r, 125);
  ASSERT(!file_exists(tp("ran")));
  ASSERT(!file_exists(state_file()));
}

/* ------------------------------------------------------------------------ */
/* cogpu status                                                              */
/* ------------------------------------------------------------------------ */

static void check_status_shape(jv_t *st) {
  ASSERT(st->t == '{');
  ASSERT_STREQ(js(st, "policy"), "fifo");
  ASSERT_STREQ(js(st, "state"), status_state());
  ASSERT_GE(ju(st, "layout_version"), 1);
  for (size_t g = 0; g < jlen(st, "gpus"); g++) {
    ASSERT_EQ(ju(st, "gpus.%zu.index", g), g);
    ASSERT(strncmp(js(st, "gpus.%zu.uuid", g), "GPU-", 4) == 0);
    ASSERT(js(st, "gpus.%zu.name", g)[0]);
    uint64_t total = ju(st, "gpus.%zu.total_bytes", g);
    uint64_t margin = ju(st, "gpus.%zu.margin_bytes", g);
    uint64_t foreign = ju(st, "gpus.%zu.foreign_bytes", g);
    uint64_t cap = ju(st, "gpus.%zu.capacity_bytes", g);
    ASSERT_UEQ(cap, total > margin + foreign ? total - margin - foreign : 0);
    ASSERT_UEQ(ju(st, "gpus.%zu.reserved_bytes", g), 0);
    ASSERT_EQ(ju(st, "gpus.%zu.max_clients", g), 0);
    ASSERT(!jb(st, "gpus.%zu.exclusive", g));
    jlen(st, "gpus.%zu.clients", g);
    jlen(st, "gpus.%zu.waiting", g);
  }
}

TEST_IMPL(cli_status_json_fields) {
  th_setenv("FAKE_NVML_GPUS", "80G,40G");
  res_t *r = COGPU("status", "--json");
  EXPECT_RC(r, 0);
  jv_t *st = JSON(r->out);
  check_status_shape(st);
  ASSERT_EQ(jlen(st, "gpus"), 2);
  ASSERT_UEQ(ju(st, "gpus.0.total_bytes"), 80 * GIB);
  ASSERT_UEQ(ju(st, "gpus.1.total_bytes"), 40 * GIB);
  ASSERT_STREQ(js(st, "gpus.0.name"), "Fake GPU 80G");
  ASSERT_STREQ(js(st, "gpus.1.name"), "Fake GPU 40G");
  /* Default margin: 2%. */
  ASSERT_UEQ(ju(st, "gpus.0.margin_bytes"), 80 * GIB / 50);
  ASSERT_UEQ(ju(st, "gpus.0.foreign_bytes"), 0);
  ASSERT_UEQ(ju(st, "gpus.0.capacity_bytes"), 80 * GIB - 80 * GIB / 50);
  /* A second opinion, where python3 is at hand. */
  const char *path = tp("status.json");
  th_write_file(path, r->out);
  static const char *const no_preload[] = {"LD_PRELOAD=", NULL};
  res_t *p = RUN(no_preload, "python3", "-c",
                 "import json,sys\n"
                 "d=json.load(open(sys.argv[1],encoding='utf-8'))\n"
                 "assert d['policy']=='fifo'\n"
                 "for g in d['gpus']:\n"
                 "  for k in ('index','uuid','name','total_bytes',"
                 "'capacity_bytes','reserved_bytes','foreign_bytes',"
                 "'margin_bytes','clients','waiting'):\n"
                 "    assert k in g, k\n"
                 "print(len(d['gpus']))\n",
                 path);
  if (p->rc != 127 || !strstr(p->err, "exec python3")) {
    EXPECT_RC(p, 0);
    ASSERT_STREQ(p->out, "2\n");
  }
}

TEST_IMPL(cli_status_table) {
  res_t *r = COGPU("status");
  EXPECT_RC(r, 0);
  ASSERT_CONTAINS(r->out, "policy fifo");
  ASSERT_CONTAINS(r->out, status_state());
  ASSERT_CONTAINS(r->out, "GPU 0  Fake GPU 16G  GPU-");
  ASSERT_CONTAINS(r->out, "total 16.0 GiB");
  ASSERT_CONTAINS(r->out, "reserved 0 B");
  ASSERT(!strstr(r->out, "\033["));
  ASSERT_STREQ(r->err, "");
}

TEST_IMPL(cli_status_watch_count) {
  res_t *r = COGPU("status", "--json", "--watch=100ms", "--count", "3");
  EXPECT_RC(r, 0);
  ASSERT_GE(r->ms, 190);
  size_t docs = 0;
  for (char *line = strtok(r->out, "\n"); line; line = strtok(NULL, "\n")) {
    jv_t *st = JSON(line);
    ASSERT_EQ(jlen(st, "gpus"), 1);
    docs++;
  }
  ASSERT_EQ(docs, 3);
  r = COGPU("status", "--watch=100ms", "--count", "2");
  EXPECT_RC(r, 0);
  ASSERT_EQ(count_substr(r->out, "policy fifo"), 2);
  ASSERT(!strstr(r->out, "\033[")); /* not a terminal: no screen clearing */
  r = COGPU("status", "--watch=50ms", "--count=1");
  EXPECT_RC(r, 0);
  ASSERT_EQ(count_substr(r->out, "policy fifo"), 1);
}

TEST_IMPL(cli_status_bad_arguments) {
  static const struct {
    const char *a, *b, *needle;
  } cases[] = {
      {"--watch=0", NULL, "--watch"},   {"--watch=abc", NULL, "--watch"},
      {"--watch=-1s", NULL, "--watch"}, {"--watch=inf", NULL, "--watch"},
      {"--watch=", NULL, "--watch"},    {"--count", "0", "--count"},
      {"--count", "abc", "--count"},    {"--count", "-3", "--count"},
      {"--count", NULL, "--count"},     {"--bogus", NULL, "--bogus"},
      {"--json=yes", NULL, "--json"},   {"extra", NULL, "extra"},
      {"--watch", "100ms", "100ms"}};
  for (size_t i = 0; i < COGPU_ARRAY_SIZE(cases); i++) {
    res_t *r = cases[i].b ? COGPU("status", cases[i].a, cases[i].b)
                          : COGPU("status", cases[i].a);
    if (r->rc != 2 || !strstr(r->err, cases[i].needle) || r->out[0])
      th_fail(__FILE__, __LINE__,
              "status %s %s: exit %d (expected 2), stderr: %s, stdout: %.200s",
              cases[i].a, cases[i].b ? cases[i].b : "", r->rc, r->err, r->out);
  }
  ASSERT(!file_exists(state_file()));
}

static void write_procs(const char *text) {
  th_write_file(tp("procs"), text);
}

TEST_IMPL(cli_status_foreign_memory) {
  th_setenv("FAKE_NVML_GPUS", "8G,8G");
  th_setenv("COGPU_FOREIGN_REFRESH", "0");
  th_setenv("COGPU_SWEEP_INTERVAL", "100ms");
  th_setenv("FAKE_NVML_PROCS", tp("procs"));
  /* This test process is not a cogpu client: its memory is foreign. */
  char text[256];
  snprintf(text, sizeof text, "# foreign\n0 %d 2G\n", (int)getpid());
  write_procs(text);
  jv_t *st = STATUS();
  uint64_t total = ju(st, "gpus.0.total_bytes"),
           margin = ju(st, "gpus.0.margin_bytes");
  ASSERT_UEQ(ju(st, "gpus.0.foreign_bytes"), 2 * GIB);
  ASSERT_UEQ(ju(st, "gpus.0.capacity_bytes"), total - margin - 2 * GIB);
  ASSERT_UEQ(ju(st, "gpus.1.foreign_bytes"), 0);
  ASSERT_UEQ(ju(st, "gpus.1.capacity_bytes"), total - margin);
  ASSERT_CONTAINS(COGPU("status")->out, "foreign 2.0 GiB");
  /* 7G fits the GPU but not beside the foreign 2G. */
  res_t *r =
      COGPU("run", "--gpu", "0", "--mem", "7G", "--timeout", "0", "--", "true");
  EXPECT_RC(r, 125);
  ASSERT_CONTAINS(r->err, "not available");
  EXPECT_RC(
      COGPU("run", "--gpu", "1", "--mem", "7G", "--timeout", "0", "--", "true"),
      0);
  /* A waiter is served once the foreign process is gone. */
  const char *ran = tp("ran");
  pid_t w =
      spawn_logged("w",
                   (const char *const[]){"cogpu", "run", "--gpu", "0", "--mem",
                                         "7G", "--", "touch", ran, NULL},
                   NULL);
  WAIT_WAITERS(0, 1);
  ASSERT(!file_exists(ran));
  write_procs("");
  ASSERT_EQ(WAIT_EXIT(w, th_ms(5000), NULL, "waiter"), 0);
  ASSERT(file_exists(ran));
  st = STATUS();
  ASSERT_UEQ(ju(st, "gpus.0.foreign_bytes"), 0);
  ASSERT_UEQ(ju(st, "gpus.0.capacity_bytes"), total - margin);
  ASSERT_IDLE();
}

TEST_IMPL(cli_status_client_processes_not_foreign) {
  th_setenv("COGPU_FOREIGN_REFRESH", "0");
  th_setenv("FAKE_NVML_PROCS", tp("procs"));
  write_procs("");
  /* The command and its own child allocate; both descend from the client. */
  static const char script[] =
      "sleep 30 & echo \"$$ $!\" > \"$1.tmp\" && mv \"$1.tmp\" \"$1\"; n=0; "
      "while [ ! -e \"$2\" ]; do sleep 0.02; n=$((n+1)); "
      "[ $n -lt 3000 ] || break; done; kill $! 2>/dev/null; exit 0";
  holder_t h;
  hold_spawn_script(&h, "h", (const char *const[]){"--mem", "1G", NULL}, script,
                    NULL);
  HOLD_READY(&h);
  char *pids = slurp(h.ready);
  int sh = 0, child = 0;
  ASSERT_EQ(sscanf(pids, "%d %d", &sh, &child), 2);
  free(pids);
  char text[256];
  /* The job's processes outside the preload library hold 4G, its
   * reservation 1G: the 3G beyond it count as foreign (nobody else may be
   * granted them), beside the 2G of a process outside the job; the job is
   * named, with its biggest such process (issue 24, item 2). The client's
   * own figure is counted allocation by allocation, not from NVML. */
  snprintf(text, sizeof text, "0 %d 3G\n0 %d 1G\n0 %d 512M\n0 %d 2G\n", sh,
           child, (int)h.pid, (int)getpid());
  write_procs(text);
  jv_t *st = STATUS();
  ASSERT_UEQ(ju(st, "gpus.0.foreign_bytes"), 5 * GIB);
  ASSERT_UEQ(ju(st, "gpus.0.reserved_bytes"), GIB);
  ASSERT_UEQ(ju(st, "gpus.0.clients.0.escaped_bytes"), 4 * GIB);
  ASSERT_UEQ(ju(st, "gpus.0.clients.0.escaped_pid"), (uint64_t)sh);
  /* Within the reservation (a job run with --no-preload declares what its
   * processes use): nothing counts twice. */
  snprintf(text, sizeof text, "0 %d 768M\n0 %d 2G\n", child, (int)getpid());
  write_procs(text);
  st = STATUS();
  ASSERT_UEQ(ju(st, "gpus.0.foreign_bytes"), 2 * GIB);
  ASSERT_UEQ(ju(st, "gpus.0.clients.0.escaped_bytes"), 768 * GIB / 1024);
  res_t *r = COGPU("status");
  EXPECT_RC(r, 0);
  ASSERT_CONTAINS(r->out, "[escaped: 768.0 MiB held by pid");
  write_procs("");
  ASSERT_EQ(HOLD_END(&h), 0);
  ASSERT_IDLE();
}

TEST_IMPL(cli_status_json_escaping) {
  res_t *r = COGPU("run", "--mem", "1G", "--job-id", "q\"b\\s\tt", "--", "sh",
                   "-c", "cogpu status --json", "a\"b\\c", "x\ny\001");
  EXPECT_RC(r, 0);
  jv_t *st = JSON(r->out);
  ASSERT_STREQ(js(st, "gpus.0.clients.0.job_id"), "q\"b\\s\tt");
  ASSERT_STREQ(js(st, "gpus.0.clients.0.command"),
               "sh -c cogpu status --json a\"b\\c x\ny\001");
}

/* Terminal controls in a job id or command (newlines, escape sequences,
 * DEL, C1 controls, bytes that are not UTF-8) are shown escaped by the
 * table, so that they cannot forge lines or drive the terminal, and the
 * JSON stays valid JSON (and valid UTF-8) that decodes to the same text. */
TEST_IMPL(cli_status_escapes_controls) {
  const char *job = "evil\n\x1b[31mred\x7f";
  res_t *r = COGPU("run", "--mem", "1G", "--job-id", job, "--", "sh", "-c",
                   "cogpu status", "a\x1b]0;title\x07", "x\ny",
                   "c1\xc2\x9b"
                   "2J",
                   "bad\xff\xed\xa0\x80");
  EXPECT_RC(r, 0);
  for (const unsigned char *p = (const unsigned char *)r->out; *p; p++)
    if ((*p < 0x20 && *p != '\n') || *p == 0x7f ||
        (p[0] == 0xc2 && p[1] >= 0x80 && p[1] < 0xa0) || *p == 0xff)
      th_fail(__FILE__, __LINE__, "control byte 0x%02x in status:\n%s", *p,
              r->out);
  ASSERT_CONTAINS(r->out, "evil\\n\\x1b[31mred\\x7f");
  ASSERT_CONTAINS(r->out, "a\\x1b]0;title\\x07 x\\ny c1\\u009b2J "
                          "bad\\xff\\xed\\xa0\\x80");
  /* Policy, (in node mode, suspension,) GPU, sizes, header and the
   * client: the newlines forged none. */
  ASSERT_EQ(count_substr(r->out, "\n"),
            strstr(r->out, "\nsuspension ") ? 6 : 5);
  r = COGPU("run", "--mem", "1G", "--job-id", job, "--", "sh", "-c",
            "cogpu status --json",
            "c1\xc2\x9b"
            "2J",
            "bad\xed\xa0\x80");
  EXPECT_RC(r, 0);
  ASSERT(!strstr(r->out, "\x1b") && !strstr(r->out, "\xc2\x9b"));
  jv_t *st = JSON(r->out);
  ASSERT_STREQ(js(st, "gpus.0.clients.0.job_id"), job);
  ASSERT_STREQ(js(st, "gpus.0.clients.0.command"),
               "sh -c cogpu status --json c1\xc2\x9b"
               "2J "
               "bad\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
}

/* Long non-ASCII commands and job ids are cut to fit the state; the JSON
 * must still be valid UTF-8 whatever byte the cut falls on. */
TEST_IMPL(cli_status_json_utf8_truncation) {
  char arg[512] = "", job[256] = "";
  for (int i = 0; i < 100; i++)
    strcat(arg, "\xc3\xa9"); /* é */
  for (int i = 0; i < 40; i++)
    strcat(job, "\xc3\xbc"); /* ü */
  const char *const pads[] = {"", "x"};
  for (size_t p = 0; p < COGPU_ARRAY_SIZE(pads); p++) {
    char a[600], j[300];
    snprintf(a, sizeof a, "%s%s", pads[p], arg);
    snprintf(j, sizeof j, "%s%s", pads[p], job);
    res_t *r = COGPU("run", "--mem", "1G", "--job-id", j, "--", "sh", "-c",
                     "cogpu status --json", a);
    EXPECT_RC(r, 0);
    jv_t *st = JSON(r->out);
    ASSERT(strncmp(js(st, "gpus.0.clients.0.command"), "sh -c cogpu", 11) == 0);
    ASSERT(strncmp(js(st, "gpus.0.clients.0.job_id"), j, 8) == 0);
  }
}

/* ------------------------------------------------------------------------ */
/* cogpu doctor                                                              */
/* ------------------------------------------------------------------------ */

TEST_IMPL(cli_doctor_healthy) {
  res_t *r = COGPU("doctor");
  EXPECT_RC(r, 0);
  ASSERT_CONTAINS(r->out, "all checks passed");
  ASSERT_CONTAINS(r->out, "ok       NVML: GPU 0");
  ASSERT_CONTAINS(r->out, "ok       CUDA driver: libcuda.so.1, CUDA 13.0");
  ASSERT_CONTAINS(r->out, "ok       CUDA entry points: cuGetProcAddress "
                          "gives the driver's exported functions");
  if (th_node_mode()) {
    ASSERT_CONTAINS(r->out, "ok       mode: node");
    ASSERT_CONTAINS(r->out, "ok       daemon: cogpud answers at");
    ASSERT_CONTAINS(r->out, getenv("COGPU_SOCKET"));
  } else {
    ASSERT_CONTAINS(r->out, "ok       mode: single-user");
    ASSERT_CONTAINS(r->out, "not created yet");
    ASSERT(access(state_file(), F_OK) != 0); /* doctor only looks */
  }
  ASSERT(!strstr(r->out, "PROBLEM"));
  EXPECT_RC(COGPU("status"), 0);
  r = COGPU("doctor");
  EXPECT_RC(r, 0);
  ASSERT_CONTAINS(r->out, "all checks passed");
  ASSERT_CONTAINS(r->out,
                  th_node_mode() ? getenv("COGPU_SOCKET") : state_file());
  ASSERT(!strstr(r->out, "PROBLEM"));
  r = COGPU("doctor", "extra");
  EXPECT_RC(r, 2);
  ASSERT_CONTAINS(r->err, "doctor");
}

TEST_IMPL_SINGLE(cli_doctor_nvml_failure) {
  EXPECT_RC(COGPU("status"), 0);
  const char *const fails[] = {"FAKE_NVML_FAIL=init", "FAKE_NVML_FAIL=count"};
  for (size_t i = 0; i < COGPU_ARRAY_SIZE(fails); i++) {
    res_t *r = COGPU_ENV(((const char *const[]){fails[i], NULL}), "doctor");
    EXPECT_RC(r, 1);
    ASSERT_CONTAINS(r->out, "PROBLEM  NVML");
    ASSERT_CONTAINS(r->out, "fix:");
    ASSERT_CONTAINS(r->out, "problem(s)");
    ASSERT(!strstr(r->out, "all checks passed"));
  }
  /* No state and no NVML: both reported. */
  use_state_dir("state2");
  res_t *r =
      COGPU_ENV(((const char *const[]){"FAKE_NVML_FAIL=init", NULL}), "doctor");
  EXPECT_RC(r, 1);
  ASSERT_CONTAINS(r->out, "PROBLEM  NVML");
  ASSERT_CONTAINS(r->out, "nvmlInit");
}

/* The driver's cuGetProcAddress hands out functions the preload library
 * cannot recognise (as a driver may): doctor names them. A driver that
 * does not initialise is a problem too. */
TEST_IMPL(cli_doctor_cuda_problems) {
  res_t *r = COGPU_ENV(
      ((const char *const[]){"FAKE_CUDA_PRIVATE_ENTRIES=1", NULL}), "doctor");
  EXPECT_RC(r, 1);
  ASSERT_CONTAINS(r->out, "PROBLEM  CUDA entry points: cuGetProcAddress "
                          "gives functions cogpu does not recognise for: "
                          "cuMemAlloc, cuMemFree\n");
  ASSERT_CONTAINS(r->out, "1 problem(s)");
  r = COGPU_ENV(((const char *const[]){"FAKE_CUDA_FAIL=cuInit:1", NULL}),
                "doctor");
  EXPECT_RC(r, 1);
  ASSERT_CONTAINS(r->out,
                  "PROBLEM  CUDA driver: cuInit failed with CUDA error 999");
  ASSERT(!strstr(r->out, "CUDA entry points"));
}

TEST_IMPL_SINGLE(cli_doctor_corrupt_state) {
  EXPECT_RC(COGPU("status"), 0);
  th_write_file(state_file(), "garbage garbage garbage\n");
  res_t *r = COGPU("doctor");
  EXPECT_RC(r, 1);
  ASSERT_CONTAINS(r->out, "PROBLEM  state");
  ASSERT_CONTAINS(r->out, "not a cogpu state");
  ASSERT_CONTAINS(r->out, "cogpu reset");
  /* A state of the right size whose header checksum is wrong. */
  EXPECT_RC(COGPU("reset"), 0);
  EXPECT_RC(COGPU("status"), 0);
  int fd = open(state_file(), O_RDWR);
  ASSERT(fd >= 0);
  uint32_t bogus = 0x7fffffff;
  ASSERT_EQ(pwrite(fd, &bogus, sizeof bogus, 28), (ssize_t)sizeof bogus);
  close(fd);
  r = COGPU("doctor");
  EXPECT_RC(r, 1);
  ASSERT_CONTAINS(r->out, "PROBLEM  state");
}

TEST_IMPL_SINGLE(cli_doctor_gpu_and_policy_mismatch) {
  EXPECT_RC(COGPU("status"), 0);
  res_t *r = COGPU_ENV(((const char *const[]){"FAKE_NVML_GPUS=8G,8G", NULL}),
                       "doctor");
  EXPECT_RC(r, 1);
  ASSERT_CONTAINS(r->out, "PROBLEM  state");
  ASSERT_CONTAINS(r->out, "differ from NVML");
  r = COGPU_ENV(((const char *const[]){"COGPU_POLICY=mmu", NULL}), "doctor");
  EXPECT_RC(r, 1);
  ASSERT_CONTAINS(r->out, "PROBLEM  policy");
  ASSERT_CONTAINS(r->out, "mmu");
  ASSERT_CONTAINS(r->out, "env COGPU_POLICY");
  /* After a reset, the state follows the configuration. */
  EXPECT_RC(COGPU("reset"), 0);
  r = COGPU_ENV(((const char *const[]){"COGPU_POLICY=mmu", NULL}), "doctor");
  EXPECT_RC(r, 0);
}

/* ------------------------------------------------------------------------ */
/* cogpu reset                                                               */
/* ------------------------------------------------------------------------ */

TEST_IMPL_SINGLE(cli_reset_idle) {
  /* Nothing to reset yet. */
  EXPECT_RC(COGPU("reset"), 0);
  EXPECT_RC(COGPU("status"), 0);
  ASSERT(file_exists(state_file()));
  res_t *r = COGPU("reset");
  EXPECT_RC(r, 0);
  ASSERT_CONTAINS(r->out, "reset");
  ASSERT(!file_exists(state_file()));
  ASSERT_IDLE();
  ASSERT(file_exists(state_file()));
  r = COGPU("reset", "--bogus");
  EXPECT_RC(r, 2);
  ASSERT_CONTAINS(r->err, "--bogus");
  ASSERT(file_exists(state_file()));
}

TEST_IMPL_SINGLE(cli_reset_refused_while_in_use) {
  holder_t h;
  HOLD(&h, "h", "--mem", "1G");
  res_t *r = COGPU("reset");
  ASSERT_NE(r->rc, 0);
  EXPECT_RC(r, 125);
  ASSERT_CONTAINS(r->err, "still use");
  ASSERT_CONTAINS(r->err, "--force");
  ASSERT(file_exists(state_file()));
  jv_t *st = STATUS();
  ASSERT_EQ(ji(st, "gpus.0.clients.0.pid"), h.pid);
  /* --force removes it; the job keeps running on the old state. */
  r = COGPU("reset", "--force");
  EXPECT_RC(r, 0);
  ASSERT_CONTAINS(r->err, "still attached");
  ASSERT(!file_exists(state_file()));
  ASSERT_IDLE();
  ASSERT(still_running(h.pid));
  ASSERT_EQ(HOLD_END(&h), 0);
  ASSERT_IDLE();
}

/* ------------------------------------------------------------------------ */
/* State files                                                               */
/* ------------------------------------------------------------------------ */

static size_t count_bad_states(void) {
  char pattern[PATH_MAX + 16];
  snprintf(pattern, sizeof pattern, "%s.bad.*", state_file());
  return count_glob(pattern);
}

TEST_IMPL_SINGLE(cli_state_garbage_set_aside) {
  EXPECT_RC(COGPU("status"), 0);
  th_write_file(state_file(), "garbage\n");
  res_t *r = COGPU_ENV(((const char *const[]){"COGPU_LOG=warn", NULL}),
                       "status", "--json");
  EXPECT_RC(r, 0);
  JSON(r->out);
  ASSERT_CONTAINS(r->err, "warn");
  ASSERT_CONTAINS(r->err, "state.bad.");
  ASSERT_EQ(count_bad_states(), 1);
  char pattern[PATH_MAX + 16];
  snprintf(pattern, sizeof pattern, "%s.bad.*", state_file());
  glob_t g;
  ASSERT_EQ(glob(pattern, 0, NULL, &g), 0);
  char *kept = slurp(g.gl_pathv[0]);
  ASSERT_STREQ(kept, "garbage\n");
  free(kept);
  globfree(&g);
  /* The fresh state works. */
  EXPECT_RC(COGPU("run", "--mem", "1G", "--", "true"), 0);
  EXPECT_RC(COGPU("doctor"), 0);
  ASSERT_IDLE();
  /* An empty file too. */
  th_write_file(state_file(), "");
  EXPECT_RC(COGPU("status"), 0);
  ASSERT_GE(count_bad_states(), 1);
  ASSERT_IDLE();
}

/* Each unusable state set aside is kept, even several in one second. */
TEST_IMPL_SINGLE(cli_state_bad_files_all_kept) {
  EXPECT_RC(COGPU("status"), 0);
  for (int i = 0; i < 3; i++) {
    char text[32];
    snprintf(text, sizeof text, "garbage %d\n", i);
    th_write_file(state_file(), text);
    EXPECT_RC(COGPU("status"), 0);
  }
  size_t n = count_bad_states();
  if (n != 3)
    th_fail(__FILE__, __LINE__,
            "3 corrupt states were set aside but %zu state.bad.* file(s) "
            "remain: a later one overwrote an earlier one",
            n);
}

TEST_IMPL_SINGLE(cli_state_wrong_mode_refused) {
  EXPECT_RC(COGPU("status"), 0);
  ASSERT_EQ(chmod(state_file(), 0644), 0);
  const char *ran = tp("ran");
  res_t *r = COGPU("status");
  EXPECT_RC(r, 125);
  ASSERT_CONTAINS(r->err, "0644");
  ASSERT_CONTAINS(r->err, "0600");
  ASSERT_CONTAINS(r->err, "state_mode");
  r = COGPU("run", "--mem", "1G", "--", "touch", ran);
  EXPECT_RC(r, 125);
  ASSERT_CONTAINS(r->err, "0644");
  ASSERT(!file_exists(ran));
  r = COGPU("doctor");
  EXPECT_RC(r, 1);
  ASSERT_CONTAINS(r->out, "PROBLEM  state");
  ASSERT_CONTAINS(r->out, "0644");
  /* Left alone: not set aside, not changed. */
  ASSERT_EQ(count_bad_states(), 0);
  struct stat sb;
  ASSERT_EQ(stat(state_file(), &sb), 0);
  ASSERT_EQ(sb.st_mode & 0777, 0644);
  /* Writable by others: refused whatever the configuration says, with
   * the way out (the node daemon). */
  ASSERT_EQ(chmod(state_file(), 0666), 0);
  r = COGPU("status");
  EXPECT_RC(r, 125);
  ASSERT_CONTAINS(r->err, "0666");
  ASSERT_CONTAINS(r->err, "cogpud");
  ASSERT_EQ(chmod(state_file(), 0600), 0);
  ASSERT_IDLE();
}

TEST_IMPL_SINGLE(cli_state_foreign_owner_refused) {
  if (geteuid() != 0)
    SKIP("needs root to give the state file away");
  EXPECT_RC(COGPU("status"), 0);
  ASSERT_EQ(chown(state_file(), 12345, (gid_t)-1), 0);
  res_t *r = COGPU("status");
  EXPECT_RC(r, 125);
  ASSERT_CONTAINS(r->err, "uid 12345");
  r = COGPU("run", "--mem", "1G", "--", "touch", tp("ran"));
  EXPECT_RC(r, 125);
  ASSERT(!file_exists(tp("ran")));
  ASSERT_EQ(count_bad_states(), 0);
}

TEST_IMPL_SINGLE(cli_state_corrupt_in_use_left_alone) {
  holder_t h;
  HOLD(&h, "h", "--mem", "1G");
  int fd = open(state_file(), O_RDWR);
  ASSERT(fd >= 0);
  ASSERT_EQ(pwrite(fd, "XXXXXXXX", 8, 0), 8);
  close(fd);
  res_t *r = COGPU("status");
  EXPECT_RC(r, 125);
  ASSERT_CONTAINS(r->err, state_file());
  ASSERT_CONTAINS(r->err, "live processes");
  ASSERT_EQ(count_bad_states(), 0);
  r = COGPU("run", "--mem", "1G", "--", "touch", tp("ran"));
  EXPECT_RC(r, 125);
  ASSERT(!file_exists(tp("ran")));
  r = COGPU("doctor");
  EXPECT_RC(r, 1);
  ASSERT_CONTAINS(r->out, "PROBLEM  state");
  ASSERT_CONTAINS(r->out, "stop the processes");
  ASSERT_EQ(HOLD_END(&h), 0);
  /* Nobody uses it now: set aside, and a fresh state. */
  EXPECT_RC(COGPU("status"), 0);
  ASSERT_EQ(count_bad_states(), 1);
  ASSERT_IDLE();
}

TEST_IMPL_SINGLE(cli_state_dir_refused) {
  /* World-writable without the sticky bit. */
  const char *dir = tp("open-dir");
  ASSERT_EQ(mkdir(dir, 0777), 0);
  ASSERT_EQ(chmod(dir, 0777), 0);
  setenv("COGPU_STATE_DIR", dir, 1);
  res_t *r = COGPU("status");
  EXPECT_RC(r, 125);
  ASSERT_CONTAINS(r->err, dir);
  ASSERT_CONTAINS(r->err, "sticky");
  /* A file, a symbolic link, a missing parent. */
  const char *file = tp("a-file");
  th_write_file(file, "");
  setenv("COGPU_STATE_DIR", file, 1);
  r = COGPU("status");
  EXPECT_RC(r, 125);
  ASSERT_CONTAINS(r->err, "not a directory");
  const char *real = tp("real-dir"), *link = tp("link-dir");
  ASSERT_EQ(mkdir(real, 0700), 0);
  ASSERT_EQ(symlink(real, link), 0);
  setenv("COGPU_STATE_DIR", link, 1);
  r = COGPU("status");
  EXPECT_RC(r, 125);
  ASSERT_CONTAINS(r->err, "symbolic link");
  const char *deep = tp("no/such/dir");
  setenv("COGPU_STATE_DIR", deep, 1);
  r = COGPU("run", "--mem", "1G", "--", "touch", tp("ran"));
  EXPECT_RC(r, 125);
  ASSERT_CONTAINS(r->err, deep);
  ASSERT(!file_exists(tp("ran")));
}

/* The lines an admin pastes into slurm.conf and gres.conf: the node's GPU
 * memory less the margin, in Slurm's binary units; bad flags refused. */
TEST_IMPL_SINGLE(cli_slurm_conf) {
  const char *env[] = {"FAKE_NVML_GPUS=80G,40G", "COGPU_MARGIN=1G", NULL};
  res_t *r = COGPU_ENV(env, "slurm-conf", "--node", "gpu07");
  EXPECT_RC(r, 0);
  ASSERT_CONTAINS(
      r->out, "\nNodeName=gpu07 Gres=cogpumem:118G Features=cogpu_gpu_79G\n");
  ASSERT_CONTAINS(
      r->out, "\nNodeName=gpu07 Name=cogpumem Count=118G Flags=CountOnly\n");
  ASSERT_CONTAINS(r->out, "largest here: 79G");
  ASSERT_CONTAINS(r->out, "merge into this node's existing NodeName= line");
  /* Sizes that are not whole GiB are written in MiB, floored. */
  const char *env2[] = {"FAKE_NVML_GPUS=80G", "COGPU_MARGIN=2%",
                        "COGPU_STATE_DIR=", NULL};
  char dir[PATH_MAX + 8];
  snprintf(dir, sizeof dir, "COGPU_STATE_DIR=%s", tp("other"));
  env2[2] = dir;
  r = COGPU_ENV(env2, "slurm-conf");
  EXPECT_RC(r, 0);
  ASSERT_CONTAINS(r->out, "Gres=cogpumem:80281M Features=cogpu_gpu_80281M\n");
  EXPECT_RC(COGPU("slurm-conf", "--node"), 2);
  EXPECT_RC(COGPU("slurm-conf", "--node="), 2);
  EXPECT_RC(COGPU("slurm-conf", "--bogus"), 2);
  r = COGPU("slurm-conf", "extra");
  EXPECT_RC(r, 2);
  ASSERT_CONTAINS(r->err, "unexpected argument 'extra'");
  /* A node name must not inject lines or settings into slurm.conf. */
  const char *const bad[] = {"gpu07\nNodeName=evil Gres=cogpumem:1P",
                             "gpu07 Weight=1",
                             "gpu07#",
                             "a=b",
                             "-n",
                             "gpu\x1b"};
  for (size_t i = 0; i < COGPU_ARRAY_SIZE(bad); i++) {
    r = COGPU("slurm-conf", "--node", bad[i]);
    EXPECT_RC(r, 2);
    ASSERT_CONTAINS(r->err, "invalid node name");
    ASSERT_STREQ(r->out, "");
    ASSERT(!strchr(r->err, '\x1b'));
  }
  /* Host lists are node names in slurm.conf. */
  r = COGPU("slurm-conf", "--node", "gpu[01-08],big_1.x");
  EXPECT_RC(r, 0);
  ASSERT_CONTAINS(r->out, "\nNodeName=gpu[01-08],big_1.x Gres=cogpumem:");
}
