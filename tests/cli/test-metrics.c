/*
 * test-metrics.c: `cogpu metrics` and `cogpu exporter` end to end, on the
 * fake NVML and the test's private node (daemonless, and in node mode with
 * the test's cogpud).
 *
 * The output is checked as Prometheus text by tests/prom-check.py (standard
 * library python3; its own self-test shows it refuses bad input), and by
 * `promtool check metrics` where the Debian package prometheus is
 * installed. The counters are checked after real activity: requests that
 * are granted at once, wait, time out, are refused, are cancelled, and one
 * failed by the deadlock guard.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ledger-helpers.h"
#include "task.h"

#define GIB (1024ull * 1024 * 1024)

typedef struct out_s {
  int rc;
  char out[1 << 18];
  char err[1 << 13];
} out_t;

static out_t *cogpu_argv(const char *const argv[]) {
  static out_t r;
  r.rc = th_run(argv, NULL, r.out, sizeof r.out, r.err, sizeof r.err,
                th_ms(15000));
  return &r;
}
#define COGPU(...) cogpu_argv((const char *const[]){"cogpu", __VA_ARGS__, NULL})

static void save(const char *path, const char *text) {
  th_write_file(path, text);
}

static bool have(const char *prog) {
  char out[256], err[256];
  const char *argv[] = {"sh", "-c", "command -v \"$0\"", prog, NULL};
  return th_run(argv, NULL, out, sizeof out, err, sizeof err, th_ms(5000)) == 0;
}

/* Skips a test that needs python3 (the checker), saying why: where no
 * shell runs (TSan's runtime, which the test preloads into children,
 * crashes it), python3 may well be installed; the plain pass runs it. */
#define NEED_PYTHON3(what)                                                     \
  do {                                                                         \
    if (!have("sh"))                                                           \
      SKIP("no shell runs here (a sanitizer runtime preloaded into it): "      \
           "the plain pass runs it");                                          \
    if (!have("python3"))                                                      \
      SKIP("python3 is not installed" what);                                   \
  } while (0)

/* tests/prom-check.py in the source tree. */
static const char *checker(void) {
  static char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/../tests/prom-check.py", th_build_dir());
  return path;
}

/* The text is valid Prometheus exposition with cogpu's conventions (and
 * promtool agrees, where it is installed). */
static void check_prom_(const char *file, int line, const char *text) {
  NEED_PYTHON3(" (the checker needs it)");
  const char *path = th_path("check.prom");
  save(path, text);
  char out[4096], err[8192];
  const char *argv[] = {"python3", checker(), path, "--prefix", "cogpu_", NULL};
  if (th_run(argv, NULL, out, sizeof out, err, sizeof err, th_ms(15000)) != 0)
    th_fail(file, line, "not valid Prometheus text:\n%s\n--- text:\n%.3000s",
            err, text);
  if (have("promtool")) {
    const char *pargv[] = {"sh", "-c", "promtool check metrics < \"$0\"", path,
                           NULL};
    /* promtool's lint also prints advice (exit 3 for lint problems only):
     * any exit other than 0 is a failure here. */
    if (th_run(pargv, NULL, out, sizeof out, err, sizeof err, th_ms(15000)))
      th_fail(file, line, "promtool check metrics: %s%s", out, err);
  }
}
#define CHECK_PROM(text) check_prom_(__FILE__, __LINE__, text)

/* The value of one series (the exact text before the value), or -1. */
static double sample(const char *text, const char *series) {
  size_t n = strlen(series);
  for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : p)
    if (strncmp(p, series, n) == 0 && p[n] == ' ')
      return strtod(p + n + 1, NULL);
  return -1;
}

static size_t count_lines(const char *text, const char *prefix) {
  size_t n = 0, pl = strlen(prefix);
  for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : p)
    n += strncmp(p, prefix, pl) == 0;
  return n;
}

static double admissions(const char *text, const char *result) {
  char s[128];
  snprintf(s, sizeof s, "cogpu_admissions_total{result=\"%s\"}", result);
  return sample(text, s);
}

static const char *metrics(void) {
  out_t *r = COGPU("metrics", "--max-jobs", "all");
  if (r->rc != 0)
    th_fail(__FILE__, __LINE__, "cogpu metrics: exit %d: %s", r->rc, r->err);
  return r->out;
}

TEST_IMPL(metrics_checker_self_test) {
  NEED_PYTHON3("");
  char out[1024], err[8192];
  const char *argv[] = {"python3", checker(), "--self-test", NULL};
  int rc = th_run(argv, NULL, out, sizeof out, err, sizeof err, th_ms(15000));
  if (rc != 0)
    th_fail(__FILE__, __LINE__, "self-test: %s", err);
}

/* Each way a request ends moves its own counter, by exactly one. */
TEST_IMPL(metrics_admissions_by_result) {
  const char *m = metrics();
  CHECK_PROM(m);
  ASSERT_EQ(sample(m, "cogpu_up"), 1);
  ASSERT_EQ(admissions(m, "immediate"), 0);
  ASSERT_EQ(sample(m, "cogpu_wait_seconds_count"), 0);
  /* Granted at once. */
  out_t *r = COGPU("run", "--mem", "1G", "--no-preload", "--", "true");
  ASSERT_EQ(r->rc, 0);
  /* A holder of 10G of 16G for a while, then refused and timed out. */
  pid_t h = lt_hold("holder", 0, 10 * GIB, 0, -1, th_ms(4000));
  lt_wait_nclients(0, 1, th_ms(5000));
  r = COGPU("run", "--mem", "10G", "--timeout", "0", "--no-preload", "--",
            "true");
  ASSERT_EQ(r->rc, 125);
  r = COGPU("run", "--mem", "10G", "--timeout", "300ms", "--no-preload", "--",
            "true");
  ASSERT_EQ(r->rc, 125);
  ASSERT_CONTAINS(r->err, "timed out");
  /* Cancelled: a waiter killed in the queue. */
  pid_t c = lt_hold("cancelled", 0, 10 * GIB, 0, -1, 0);
  lt_wait_nwaiting(0, 1, th_ms(5000));
  kill(c, SIGKILL);
  th_wait(c, th_ms(5000));
  lt_wait_nwaiting(0, 0, th_ms(5000));
  /* Granted after waiting for the holder's release. */
  pid_t w = lt_hold("waiter", 0, 10 * GIB, 0, -1, 0);
  lt_wait_nwaiting(0, 1, th_ms(5000));
  m = metrics();
  ASSERT_EQ(sample(m, "cogpu_gpu_queue_length{gpu=\"0\",uuid=\"GPU-fa4e0000-"
                      "0000-4000-8000-000000000000\"}"),
            1);
  ASSERT_EQ(th_exit_code(th_wait(w, th_ms(15000))), 0);
  ASSERT_EQ(th_exit_code(th_wait(h, th_ms(15000))), 0);
  m = metrics();
  CHECK_PROM(m);
  ASSERT_EQ(admissions(m, "immediate"), 2); /* cogpu run, the holder */
  ASSERT_EQ(admissions(m, "waited"), 1);
  ASSERT_EQ(admissions(m, "timeout"), 1);
  ASSERT_EQ(admissions(m, "refused"), 1);
  ASSERT_EQ(admissions(m, "cancelled"), 1);
  ASSERT_EQ(admissions(m, "deadlock"), 0);
  /* The waiter waited for the holder: from its start to the release. */
  ASSERT_EQ(sample(m, "cogpu_wait_seconds_count"), 1);
  ASSERT_EQ(sample(m, "cogpu_wait_seconds_bucket{le=\"+Inf\"}"), 1);
  ASSERT_EQ(sample(m, "cogpu_wait_seconds_bucket{le=\"0.1\"}"), 0);
  ASSERT(sample(m, "cogpu_wait_seconds_sum") >= 0.2);
}

/* A request with a bound longer than the clock can count (30,000 years)
 * that is cancelled is counted as cancelled: its deadline saturates, it
 * does not wrap to "already past" and count as a timeout (issue 23). */
TEST_IMPL(metrics_cancel_with_huge_bound) {
  pid_t h = lt_hold("holder", 0, 10 * GIB, 0, -1, -1);
  lt_wait_nclients(0, 1, th_ms(5000));
  pid_t c = lt_hold("cancelled", 0, 10 * GIB, 0, 1000000000000000ll, 0);
  lt_wait_nwaiting(0, 1, th_ms(5000));
  kill(c, SIGKILL);
  th_wait(c, th_ms(5000));
  lt_wait_nwaiting(0, 0, th_ms(5000));
  const char *m = metrics();
  CHECK_PROM(m);
  ASSERT_EQ(admissions(m, "cancelled"), 1);
  ASSERT_EQ(admissions(m, "timeout"), 0);
  kill(h, SIGKILL);
  th_wait(h, th_ms(5000));
}

/* Two jobs each hold 8G of 16G and each wait for 4G more: with suspension
 * off the guard fails one request, and says so in its counters. */
TEST_IMPL(metrics_deadlock_guard_failure) {
  th_setenv("COGPU_MARGIN", "0");
  th_setenv("COGPU_SUSPEND", "no");
  pid_t a = th_spawn_helper("grab_then_grow", (const char *[]){"a", "5", NULL});
  lt_wait_nclients(0, 1, th_ms(5000));
  pid_t b = th_spawn_helper("grab_then_grow", (const char *[]){"b", "1", NULL});
  ASSERT_EQ(th_exit_code(th_wait(b, th_ms(10000))), 3);
  ASSERT_EQ(th_exit_code(th_wait(a, th_ms(10000))), 0);
  const char *m = metrics();
  CHECK_PROM(m);
  ASSERT_EQ(admissions(m, "deadlock"), 1);
  ASSERT_EQ(sample(m, "cogpu_deadlock_guard_total{action=\"failed\"}"), 1);
  ASSERT_EQ(sample(m, "cogpu_deadlock_guard_total{action=\"suspended\"}"), 0);
  ASSERT_EQ(sample(m, "cogpu_suspensions_total"), 0);
  /* a's 4G came from b's release, after a wait. */
  ASSERT_EQ(admissions(m, "waited"), 1);
}

/* Quotes, backslashes and newlines in a job id or command are escaped as
 * the format says; other controls and bytes that are not UTF-8 become
 * U+FFFD, so the text stays one line per sample and valid UTF-8. */
TEST_IMPL(metrics_label_escaping) {
  /* The job is a shell (its command line carries the odd bytes): under
   * TSan, whose runtime the test preloads into children, a shell crashes. */
  if (!have("sh"))
    SKIP("no shell runs here (a sanitizer runtime preloaded into it)");
  const char *file = th_path("job.prom");
  char script[PATH_MAX + 64];
  snprintf(script, sizeof script, "cogpu metrics > '%s'", file);
  out_t *r =
      COGPU("run", "--mem", "1G", "--no-preload", "--job-id", "q\"b\\s\nx",
            "--", "sh", "-c", script, "a\"b\\c", "x\ny\001\xff");
  if (r->rc != 0)
    th_fail(__FILE__, __LINE__, "cogpu run: exit %d, stderr: %s", r->rc,
            r->err);
  char text[1 << 16];
  FILE *f = fopen(file, "re");
  ASSERT(f);
  size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = 0;
  CHECK_PROM(text);
  ASSERT_CONTAINS(text, "job=\"q\\\"b\\\\s\\nx\"");
  /* (The command's \001 and \xff each end as U+FFFD on their way, in
   * the ledger or here: the text has no control byte and no bad UTF-8.) */
  ASSERT_CONTAINS(text, " a\\\"b\\\\c x\\ny\xef\xbf\xbd");
  ASSERT(!strchr(text, '\001') && !strchr(text, '\xff'));
  ASSERT_EQ(count_lines(text, "cogpu_job_reserved_bytes{"), 1);
}

/* Per-job series are capped per GPU, largest reservations first; the rest
 * is summed per GPU. */
TEST_IMPL(metrics_max_jobs) {
  pid_t h[3];
  for (int i = 0; i < 3; i++) {
    char name[16];
    snprintf(name, sizeof name, "job%d", i);
    h[i] = lt_hold(name, 0, (uint64_t)(i + 1) * GIB, 0, -1, -1);
    lt_wait_nclients(0, (size_t)i + 1, th_ms(5000));
  }
  out_t *r = COGPU("metrics", "--max-jobs", "1");
  ASSERT_EQ(r->rc, 0);
  CHECK_PROM(r->out);
  ASSERT_EQ(count_lines(r->out, "cogpu_job_reserved_bytes{"), 1);
  ASSERT_CONTAINS(r->out, "command=\"job2\"} 3221225472\n");
  const char *lbl = "{gpu=\"0\",uuid=\"GPU-fa4e0000-0000-4000-8000-"
                    "000000000000\"}";
  char s[256];
  snprintf(s, sizeof s, "cogpu_gpu_unlisted_jobs%s", lbl);
  ASSERT_EQ(sample(r->out, s), 2);
  snprintf(s, sizeof s, "cogpu_gpu_unlisted_reserved_bytes%s", lbl);
  ASSERT_EQ(sample(r->out, s), 3.0 * GIB);
  r = COGPU("metrics", "--no-jobs");
  ASSERT_EQ(r->rc, 0);
  ASSERT_EQ(count_lines(r->out, "cogpu_job_reserved_bytes{"), 0);
  ASSERT_EQ(sample(r->out, s), 6.0 * GIB);
  r = COGPU("metrics");
  ASSERT_EQ(count_lines(r->out, "cogpu_job_reserved_bytes{"), 3);
  r = COGPU("metrics", "--max-jobs", "x");
  ASSERT_EQ(r->rc, 2);
  r = COGPU("metrics", "extra");
  ASSERT_EQ(r->rc, 2);
  for (int i = 0; i < 3; i++) {
    kill(h[i], SIGTERM);
    th_wait(h[i], th_ms(5000));
  }
}

/* --- the exporter --------------------------------------------------------- */

static pid_t exporter_spawn(const char *const args[], const char *tag) {
  const char *argv[16] = {"cogpu", "exporter"};
  size_t n = 2;
  for (size_t i = 0; args[i] && n < 15; i++)
    argv[n++] = args[i];
  argv[n] = NULL;
  return lt_spawn_logged(tag, argv);
}

/* The port the exporter says it listens on. */
static int exporter_port(const char *tag) {
  for (int i = 0; i < th_ms(5000) / 10; i++) {
    const char *p = strstr(lt_slurp(tag), " port ");
    if (p && atoi(p + 6) > 0)
      return atoi(p + 6);
    th_sleep_ms(10);
  }
  th_fail(__FILE__, __LINE__, "the exporter never said its port: %s",
          lt_slurp(tag));
  return -1;
}

static int http_connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT(fd >= 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
  return fd;
}

static void send_all(int fd, const char *s, size_t n) {
  while (n) {
    ssize_t w = send(fd, s, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return; /* the server may close first (an oversized request) */
    s += w;
    n -= (size_t)w;
  }
}

/* Everything the server sends until it closes (bounded wait). */
static char *recv_all(int fd) {
  static char buf[1 << 18];
  size_t n = 0;
  for (;;) {
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    if (poll(&pf, 1, th_ms(10000)) != 1)
      th_fail(__FILE__, __LINE__, "no answer from the exporter");
    ssize_t r = recv(fd, buf + n, sizeof buf - 1 - n, 0);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      break;
    n += (size_t)r;
  }
  buf[n] = 0;
  close(fd);
  return buf;
}

static char *http(int port, const char *request) {
  int fd = http_connect(port);
  send_all(fd, request, strlen(request));
  return recv_all(fd);
}

static const char *body_of(const char *resp) {
  const char *b = strstr(resp, "\r\n\r\n");
  ASSERT(b);
  return b + 4;
}

TEST_IMPL(exporter_http_scrapes) {
  pid_t e = exporter_spawn(
      (const char *[]){"--listen", "127.0.0.1:0", "--max-jobs", "all", NULL},
      "exp");
  int port = exporter_port("exp");
  pid_t h = lt_hold("held", 0, 2 * GIB, 0, -1, -1);
  lt_wait_nclients(0, 1, th_ms(5000));
  const char *get = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
  /* Several scrapes in a row, each a fresh snapshot. */
  for (int i = 0; i < 20; i++) {
    char *resp = http(port, get);
    ASSERT(strncmp(resp, "HTTP/1.1 200 OK\r\n", 17) == 0);
    ASSERT_CONTAINS(resp, "Content-Type: text/plain; version=0.0.4");
    ASSERT_EQ(sample(body_of(resp), "cogpu_up"), 1);
    if (i == 0) {
      CHECK_PROM(body_of(resp));
      ASSERT_CONTAINS(body_of(resp), "command=\"held\"} 2147483648\n");
    }
  }
  /* A query string is the same path; HTTP/1.0 is served too. */
  char *resp = http(port, "GET /metrics?x=1 HTTP/1.0\r\n\r\n");
  ASSERT(strncmp(resp, "HTTP/1.1 200 OK", 15) == 0);
  resp = http(port, "HEAD /metrics HTTP/1.1\r\n\r\n");
  ASSERT(strncmp(resp, "HTTP/1.1 200 OK", 15) == 0);
  ASSERT_STREQ(body_of(resp), "");
  /* Other paths, methods and garbage. */
  resp = http(port, "GET / HTTP/1.1\r\n\r\n");
  ASSERT(strncmp(resp, "HTTP/1.1 404 ", 13) == 0);
  resp = http(port, "GET /metricsx HTTP/1.1\r\n\r\n");
  ASSERT(strncmp(resp, "HTTP/1.1 404 ", 13) == 0);
  resp = http(port, "POST /metrics HTTP/1.1\r\n\r\n");
  ASSERT(strncmp(resp, "HTTP/1.1 405 ", 13) == 0);
  resp = http(port, "hello\r\n\r\n");
  ASSERT(strncmp(resp, "HTTP/1.1 400 ", 13) == 0);
  /* An oversized request is refused, not buffered. */
  static char big[20000];
  memcpy(big, "GET /metrics HTTP/1.1\r\nX: ", 26);
  memset(big + 26, 'a', sizeof big - 27);
  resp = http(port, big);
  ASSERT(strncmp(resp, "HTTP/1.1 431 ", 13) == 0);
  /* An idle connection holds nobody up, and a few scrapes at once are all
   * answered. */
  int idle = http_connect(port);
  int fds[4];
  for (int i = 0; i < 4; i++) {
    fds[i] = http_connect(port);
    send_all(fds[i], get, strlen(get));
  }
  for (int i = 0; i < 4; i++) {
    resp = recv_all(fds[i]);
    ASSERT(strncmp(resp, "HTTP/1.1 200 OK", 15) == 0);
    ASSERT_EQ(sample(body_of(resp), "cogpu_up"), 1);
  }
  close(idle);
  kill(h, SIGTERM);
  th_wait(h, th_ms(5000));
  kill(e, SIGTERM);
  /* A bound, not a measure: under load the exporter was seen 5 s in the
   * kernel's exit (unmapping the node state), state D. */
  ASSERT_EQ(th_exit_code(th_wait(e, th_ms(20000))), 0);
}

/* Connections that never finish asking (slow-loris: half a request line)
 * and idle ones, hundreds of them, do not lock a scrape out: when all
 * slots are taken, the oldest that has not asked yet makes room (issue
 * 23 item 5). */
TEST_IMPL(exporter_survives_connection_floods) {
  pid_t e =
      exporter_spawn((const char *[]){"--listen", "127.0.0.1:0", NULL}, "exp");
  int port = exporter_port("exp");
  const char *get = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
  enum { FLOOD = 300 };
  static int slow[FLOOD], idle[FLOOD];
  for (int i = 0; i < FLOOD; i++) {
    slow[i] = http_connect(port);
    send_all(slow[i], "GET /metr", 9);
    idle[i] = http_connect(port);
  }
  for (int i = 0; i < 5; i++) {
    char *resp = http(port, get);
    if (strncmp(resp, "HTTP/1.1 200 OK", 15) != 0)
      th_fail(__FILE__, __LINE__, "scrape %d after the flood: '%.80s'", i,
              resp);
    ASSERT_EQ(sample(body_of(resp), "cogpu_up"), 1);
  }
  for (int i = 0; i < FLOOD; i++) {
    close(slow[i]);
    close(idle[i]);
  }
  kill(e, SIGTERM);
  /* A bound, not a measure: under load the exporter was seen 5 s in the
   * kernel's exit (unmapping the node state), state D. */
  ASSERT_EQ(th_exit_code(th_wait(e, th_ms(20000))), 0);
}

static char *read_file(const char *path, ino_t *ino) {
  static char buf[1 << 18];
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return NULL;
  struct stat sb;
  fstat(fd, &sb);
  *ino = sb.st_ino;
  size_t n = 0;
  ssize_t r;
  while ((r = read(fd, buf + n, sizeof buf - 1 - n)) > 0)
    n += (size_t)r;
  close(fd);
  buf[n] = 0;
  return buf;
}

TEST_IMPL(exporter_textfile_atomic) {
  const char *dir = th_path("textfile");
  ASSERT_EQ(mkdir(dir, 0755), 0);
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/cogpu.prom", dir);
  /* The file is 0644 whatever the exporter's umask. */
  mode_t old = umask(077);
  pid_t e = exporter_spawn(
      (const char *[]){"--textfile", path, "--interval", "100ms", NULL}, "exp");
  umask(old);
  struct stat sb;
  for (int i = 0; i < th_ms(5000) / 10 && stat(path, &sb) != 0; i++)
    th_sleep_ms(10);
  ASSERT_EQ(stat(path, &sb), 0);
  ASSERT_EQ(sb.st_mode & 07777, 0644);
  /* Read while it is rewritten: always whole, and replaced (a new inode),
   * never rewritten in place. */
  ino_t first = 0, ino = 0;
  int replaced = 0;
  for (int i = 0; i < 300 && replaced < 3; i++) {
    char *t = read_file(path, &ino);
    ASSERT(t);
    size_t n = strlen(t);
    ASSERT(n > 0 && t[n - 1] == '\n');
    ASSERT(sample(t, "cogpu_suspended_bytes") >= 0); /* the last family */
    if (i == 0) {
      first = ino;
      CHECK_PROM(t);
    } else if (ino != first) {
      replaced++;
      first = ino;
    }
    th_sleep_ms(5);
  }
  ASSERT_GE(replaced, 3);
  /* It follows the node. */
  pid_t h = lt_hold("held", 0, 3 * GIB, 0, -1, -1);
  lt_wait_nclients(0, 1, th_ms(5000));
  const char *s = "cogpu_gpu_reserved_bytes{gpu=\"0\",uuid=\"GPU-fa4e0000-"
                  "0000-4000-8000-000000000000\"}";
  double v = 0;
  for (int i = 0; i < th_ms(5000) / 20 && v != 3.0 * GIB; i++) {
    th_sleep_ms(20);
    v = sample(read_file(path, &ino), s);
  }
  ASSERT_EQ(v, 3.0 * GIB);
  kill(h, SIGTERM);
  th_wait(h, th_ms(5000));
  /* A clean stop removes it (no stale figures), and leaves nothing. */
  kill(e, SIGTERM);
  ASSERT_EQ(th_exit_code(th_wait(e, th_ms(20000))), 0);
  ASSERT(stat(path, &sb) != 0);
  char out[1024], err[1024];
  const char *ls[] = {"sh", "-c", "ls -A \"$0\" | wc -l", dir, NULL};
  ASSERT_EQ(th_run(ls, NULL, out, sizeof out, err, sizeof err, th_ms(5000)), 0);
  ASSERT_EQ(atoi(out), 0);
}

TEST_IMPL(exporter_usage_errors) {
  out_t *r = COGPU("exporter");
  ASSERT_EQ(r->rc, 2);
  r = COGPU("exporter", "--textfile", "x.prom", "--interval", "1ms");
  ASSERT_EQ(r->rc, 2);
  r = COGPU("exporter", "--listen", "127.0.0.1:99999");
  ASSERT_EQ(r->rc, 125);
  ASSERT_CONTAINS(r->err, "not a port");
  r = COGPU("exporter", "--textfile", "/nonexistent-dir/cogpu.prom");
  ASSERT_EQ(r->rc, 125);
  ASSERT_CONTAINS(r->err, "nonexistent-dir");
}
