/*
 * test-prometheus.c: cogpu's metrics through a real Prometheus (Debian's
 * prometheus package), and the rules and Grafana dashboard shipped in
 * contrib/prometheus (issue 28 item 4).
 *
 * prom_live_scrape starts Prometheus on 127.0.0.1 (a free port, its own
 * TSDB in the test's directory, 1 s scrapes) scraping `cogpu exporter`
 * while jobs run on the fake driver under the test's cogpud, and reads the
 * series back through Prometheus's HTTP API, polled with a bound until the
 * expected values appear. prom_rules_* run promtool on the rules and check
 * the names the rules and the dashboard use against a real `cogpu metrics`
 * output (tests/prom-names.py).
 *
 * Where Prometheus is not installed the tests skip, unless
 * COGPU_TEST_REQUIRE_PROMETHEUS=1 (set by .ci/run, whose set-up installs
 * it): then they fail.
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
#include <unistd.h>

#include "ledger-helpers.h"
#include "task.h"

/* Every test here sets up its own node daemon where it needs one. */
TEST_FILE_ONCE()

/* Run with LD_PRELOAD cleared: the sanitizer runtime the test preloads
 * into its children is no business of Go's or python's. */
static int run_tool(const char *const argv[], char *out, size_t outlen,
                    char *err, size_t errlen) {
  const char *env[] = {"LD_PRELOAD=", NULL};
  return th_run(argv, env, out, outlen, err, errlen, th_ms(30000));
}

static bool have(const char *prog) {
  char out[256], err[256];
  const char *argv[] = {"sh", "-c", "command -v \"$0\"", prog, NULL};
  return run_tool(argv, out, sizeof out, err, sizeof err) == 0;
}

static void need_prometheus(void) {
  const char *progs[] = {"prometheus", "promtool", "python3"};
  char out[256], err[1024];
  const char *yaml[] = {"python3", "-c", "import yaml", NULL};
  bool ok = true;
  for (size_t i = 0; i < sizeof progs / sizeof *progs; i++)
    ok = ok && have(progs[i]);
  if (!ok || run_tool(yaml, out, sizeof out, err, sizeof err) != 0)
    SKIP_UNLESS_REQUIRED("COGPU_TEST_REQUIRE_PROMETHEUS",
                         "prometheus, promtool and python3-yaml "
                         "(scripts/setup.sh installs them)");
}

/* A file of the source tree. */
static const char *src(const char *rel) {
  static char path[4][PATH_MAX];
  static int slot;
  char *p = path[slot++ % 4];
  snprintf(p, PATH_MAX, "%s/../%s", th_build_dir(), rel);
  return p;
}

/* `cogpu metrics` now, in th_path(name). */
static void save_metrics(const char *name) {
  static char out[1 << 18], err[8192];
  const char *argv[] = {"cogpu", "metrics", "--max-jobs", "all", NULL};
  int rc = th_run(argv, NULL, out, sizeof out, err, sizeof err, th_ms(15000));
  if (rc != 0)
    th_fail(__FILE__, __LINE__, "cogpu metrics: exit %d: %s", rc, err);
  th_write_file(th_path(name), out);
}

/* The rules and dashboard against a metrics file: names all exported,
 * and (prom_url not NULL) every dashboard query parsed by Prometheus. */
static void check_names(const char *metrics, const char *prom_url) {
  char out[8192], err[8192];
  const char *argv[] = {"python3",
                        src("tests/prom-names.py"),
                        "--metrics",
                        metrics,
                        "--rules",
                        src("contrib/prometheus/cogpu.rules.yml"),
                        "--dashboard",
                        src("contrib/prometheus/grafana-dashboard.json"),
                        prom_url ? "--prometheus" : NULL,
                        prom_url,
                        NULL};
  if (run_tool(argv, out, sizeof out, err, sizeof err) != 0)
    th_fail(__FILE__, __LINE__, "prom-names.py: %s%s", out, err);
}

/* --- the rules, without a daemon ----------------------------------------- */

TEST_IMPL(prom_rules_promtool) {
  need_prometheus();
  char out[16384], err[16384];
  const char *check[] = {"promtool", "check", "rules",
                         src("contrib/prometheus/cogpu.rules.yml"), NULL};
  if (run_tool(check, out, sizeof out, err, sizeof err) != 0)
    th_fail(__FILE__, __LINE__, "promtool check rules: %s%s", out, err);
  const char *test[] = {"promtool", "test", "rules",
                        src("contrib/prometheus/cogpu.rules.test.yml"), NULL};
  if (run_tool(test, out, sizeof out, err, sizeof err) != 0)
    th_fail(__FILE__, __LINE__, "promtool test rules: %s%s", out, err);
}

/* The checker's own self-test shows it refuses unknown names; here on a
 * real `cogpu metrics` of a node with a job (so that the per-job families
 * have samples too), the shipped files pass. */
TEST_IMPL(prom_rules_dashboard_names) {
  need_prometheus();
  char out[4096], err[8192];
  const char *self[] = {"python3", src("tests/prom-names.py"), "--self-test",
                        NULL};
  if (run_tool(self, out, sizeof out, err, sizeof err) != 0)
    th_fail(__FILE__, __LINE__, "prom-names.py --self-test: %s", err);
  pid_t h = lt_hold("held", 0, 2 * GiB, 0, -1, -1);
  lt_wait_nclients(0, 1, th_ms(5000));
  save_metrics("m.prom");
  ASSERT_CONTAINS(lt_slurp("m.prom"), "cogpu_job_peak_bytes{");
  check_names(th_path("m.prom"), NULL);
  /* A dashboard naming a series cogpu does not export is refused. */
  th_write_file(th_path("bad.json"), "{\"panels\":[{\"targets\":[{\"expr\":"
                                     "\"cogpu_gpu_reserved_byte\"}]}]}");
  const char *bad[] = {"python3",     src("tests/prom-names.py"),
                       "--metrics",   th_path("m.prom"),
                       "--rules",     src("contrib/prometheus/cogpu.rules.yml"),
                       "--dashboard", th_path("bad.json"),
                       NULL};
  ASSERT_EQ(run_tool(bad, out, sizeof out, err, sizeof err), 1);
  ASSERT_CONTAINS(err, "cogpu_gpu_reserved_byte is not a series");
  kill(h, SIGTERM);
  th_wait(h, th_ms(5000));
}

/* --- a live Prometheus -----------------------------------------------------
 */

/* A TCP port free on 127.0.0.1 now (the kernel's pick). Prometheus binds
 * it a moment later: if someone takes it meanwhile, Prometheus exits and
 * the caller tries another. */
static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT(fd >= 0);
  struct sockaddr_in a = {.sin_family = AF_INET};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  socklen_t len = sizeof a;
  ASSERT_EQ(getsockname(fd, (struct sockaddr *)&a, &len), 0);
  close(fd);
  return ntohs(a.sin_port);
}

/* GET path from 127.0.0.1:port: the HTTP status (0: no connection), the
 * body in body. */
static int http_get(int port, const char *path, char *body, size_t len) {
  body[0] = 0;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT(fd >= 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
    close(fd);
    return 0;
  }
  char req[4096];
  int n = snprintf(req, sizeof req,
                   "GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", path);
  ASSERT(n > 0 && (size_t)n < sizeof req);
  if (send(fd, req, (size_t)n, MSG_NOSIGNAL) != n) {
    close(fd);
    return 0;
  }
  static char buf[1 << 16];
  size_t got = 0;
  for (;;) {
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    if (poll(&pf, 1, th_ms(10000)) != 1)
      th_fail(__FILE__, __LINE__, "no answer from Prometheus to %s", path);
    ssize_t r = recv(fd, buf + got, sizeof buf - 1 - got, 0);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      break;
    got += (size_t)r;
  }
  close(fd);
  buf[got] = 0;
  int status = 0;
  if (sscanf(buf, "HTTP/1.%*d %d", &status) != 1)
    return 0;
  const char *b = strstr(buf, "\r\n\r\n");
  snprintf(body, len, "%s", b ? b + 4 : "");
  return status;
}

static void urlencode(const char *s, char *out, size_t len) {
  size_t n = 0;
  for (; *s && n + 4 < len; s++) {
    unsigned char c = (unsigned char)*s;
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
        (c >= '0' && c <= '9') || strchr("-_.~", c))
      out[n++] = (char)c;
    else
      n += (size_t)snprintf(out + n, len - n, "%%%02X", c);
  }
  out[n] = 0;
}

typedef struct prom_s {
  pid_t pid;
  int port;
} prom_t;

/* The value of an instant query that gives one sample; false while it
 * gives none (not scraped yet). */
static bool prom_value(const prom_t *p, const char *query, double *v) {
  char path[4096], enc[3500], body[1 << 16];
  urlencode(query, enc, sizeof enc);
  snprintf(path, sizeof path, "/api/v1/query?query=%s", enc);
  int status = http_get(p->port, path, body, sizeof body);
  if (status != 200)
    th_fail(__FILE__, __LINE__, "query %s: HTTP %d: %s", query, status, body);
  const char *r = strstr(body, "\"result\":[");
  ASSERT(r);
  const char *val = strstr(r, "\"value\":[");
  if (!val)
    return false;
  if (strstr(val + 1, "\"value\":["))
    th_fail(__FILE__, __LINE__, "query %s gives more than one sample: %s",
            query, body);
  const char *q = strchr(val, ',');
  ASSERT(q && q[1] == '"');
  *v = strtod(q + 2, NULL);
  return true;
}

/* Polls query until its value is `want` (bounded: Prometheus scrapes
 * every second). */
static void prom_expect_(const char *file, int line, const prom_t *p,
                         const char *query, double want) {
  double v = -1;
  bool seen = false;
  for (int t = 0; t < th_ms(20000); t += 100) {
    seen = prom_value(p, query, &v);
    if (seen && v == want)
      return;
    th_sleep_ms(100);
  }
  if (seen)
    th_fail(file, line, "Prometheus: %s is %.17g, not %.17g", query, v, want);
  th_fail(file, line, "Prometheus: %s gives nothing (want %.17g)", query, want);
}
#define PROM_EXPECT(p, query, want)                                            \
  prom_expect_(__FILE__, __LINE__, p, query, want)

/* Starts Prometheus scraping the exporter at exporter_port every second,
 * with cogpu's rules loaded, and waits until it is ready. */
static prom_t prom_start(int exporter_port) {
  char conf[4096];
  snprintf(conf, sizeof conf,
           "global:\n"
           "  scrape_interval: 1s\n"
           "  evaluation_interval: 1s\n"
           "rule_files:\n"
           "  - %s\n"
           "scrape_configs:\n"
           "  - job_name: cogpu\n"
           "    static_configs:\n"
           "      - targets: ['127.0.0.1:%d']\n",
           src("contrib/prometheus/cogpu.rules.yml"), exporter_port);
  th_write_file(th_path("prometheus.yml"), conf);
  char cfg_arg[PATH_MAX + 32], tsdb_arg[PATH_MAX + 32], listen[64];
  snprintf(cfg_arg, sizeof cfg_arg, "--config.file=%s",
           th_path("prometheus.yml"));
  snprintf(tsdb_arg, sizeof tsdb_arg, "--storage.tsdb.path=%s",
           th_path("tsdb"));
  for (int attempt = 0; attempt < 5; attempt++) {
    prom_t p = {.port = free_port()};
    snprintf(listen, sizeof listen, "--web.listen-address=127.0.0.1:%d",
             p.port);
    p.pid = fork();
    ASSERT(p.pid >= 0);
    if (p.pid == 0) {
      /* Not through env(1): under TSan, whose runtime is preloaded, an
       * uninstrumented program may crash before it could unset it. */
      unsetenv("LD_PRELOAD");
      int fd = open(th_path("prometheus.log"),
                    O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      execlp("prometheus", "prometheus", cfg_arg, tsdb_arg, listen,
             "--log.level=warn", (char *)NULL);
      _exit(127);
    }
    char body[1024];
    for (int t = 0; t < th_ms(30000); t += 50) {
      int st;
      if (waitpid(p.pid, &st, WNOHANG) == p.pid) {
        p.pid = -1;
        break; /* the port was taken meanwhile, or worse: see the log */
      }
      if (http_get(p.port, "/-/ready", body, sizeof body) == 200)
        return p;
      th_sleep_ms(50);
    }
    if (p.pid > 0) {
      kill(p.pid, SIGKILL);
      th_wait(p.pid, th_ms(5000));
    }
  }
  th_fail(__FILE__, __LINE__, "Prometheus did not start: %s",
          lt_slurp("prometheus.log"));
}

static void prom_stop(prom_t *p) {
  kill(p->pid, SIGTERM);
  int code = th_exit_code(th_wait(p->pid, th_ms(15000)));
  if (code != 0)
    th_fail(__FILE__, __LINE__, "Prometheus exit %d: %s", code,
            lt_slurp("prometheus.log"));
}

static int exporter_port(void) {
  for (int t = 0; t < th_ms(5000); t += 10) {
    const char *p = strstr(lt_slurp("exporter.log"), " port ");
    if (p && atoi(p + 6) > 0)
      return atoi(p + 6);
    th_sleep_ms(10);
  }
  th_fail(__FILE__, __LINE__, "the exporter never said its port: %s",
          lt_slurp("exporter.log"));
}

/* The pid of the client of GPU 0 reserving exactly `bytes`, waited for. */
static int client_reserving(uint64_t bytes) {
  for (int t = 0;; t += 20) {
    int pid = 0;
    cogpu_status_t *st = lt_status();
    for (size_t i = 0; i < st->gpus[0].nclients && !pid; i++)
      if (st->gpus[0].clients[i].reserved_bytes == bytes)
        pid = st->gpus[0].clients[i].pid;
    cogpu_status_free(st);
    if (pid)
      return pid;
    if (t > th_ms(15000))
      th_fail(__FILE__, __LINE__, "no job came to reserve %llu bytes",
              (unsigned long long)bytes);
    th_sleep_ms(20);
  }
}

/* Waits (bounded) until `path` holds `text`. */
static void wait_for_text(const char *tag, const char *text) {
  for (int t = 0; !strstr(lt_slurp(tag), text); t += 20) {
    if (t > th_ms(15000))
      th_fail(__FILE__, __LINE__, "%s never said '%s': %s", tag, text,
              lt_slurp(tag));
    th_sleep_ms(20);
  }
}

static int cogpu_verb(const char *verb, int pid) {
  char pidtxt[16], out[4096], err[4096];
  snprintf(pidtxt, sizeof pidtxt, "%d", pid);
  const char *argv[] = {"cogpu", verb, pidtxt, NULL};
  int rc = th_run(argv, NULL, out, sizeof out, err, sizeof err, th_ms(30000));
  if (rc != 0)
    fprintf(stderr, "cogpu %s %d: exit %d: %s%s\n", verb, pid, rc, out, err);
  return rc;
}

/* One job on a 16 GiB fake GPU reserves 6 GiB (--mem), holds its 300 MiB
 * context and 2 GiB after a moment at 4 GiB more (its peak); a second
 * request waits; the job is suspended and resumed by hand. Prometheus,
 * scraping the exporter every second, holds each figure: reserved, used
 * and peak of the job, the queue, the suspension and resume counters,
 * and the rules' recorded series. Then every dashboard query is sent to
 * it, which must parse them; last, cogpud stops. */
TEST_IMPL_T(prom_live_scrape, 120) {
  need_prometheus();
  if (th_sanitizer_runtime()[0])
    setenv("LD_PRELOAD", th_sanitizer_runtime(), 1);
  setenv("COGPU_NODE_MODE", "daemon", 1);
  setenv("COGPU_CONTEXT_BYTES", "300M", 1);
  setenv("FAKE_CUDA_CTX_BYTES", "300M", 1);
  setenv("COGPU_LOG", "warn", 1);
  th_setenv("COGPU_MARGIN", "0");
  th_setenv("COGPU_SWEEP_INTERVAL", "100ms");
  th_setenv("COGPU_SUSPEND_HOST_MARGIN", "0");
  th_setenv("COGPU_SUSPEND_MAX", "1T");
  if (th_daemon_pid() <= 0)
    th_daemon_start();

  const char *exp_argv[] = {"cogpu",      "exporter", "--listen", "127.0.0.1:0",
                            "--max-jobs", "all",      NULL};
  /* As cogpu-exporter.service does: while cogpud is down, a scrape waits
   * this long for it, then says cogpu_up 0 (with daemon_wait's default
   * 30 s the scrape would time out instead, 1 s here). */
  setenv("COGPU_DAEMON_WAIT", "300ms", 1);
  pid_t exporter = lt_spawn_logged("exporter.log", exp_argv);
  unsetenv("COGPU_DAEMON_WAIT");
  prom_t prom = prom_start(exporter_port());
  PROM_EXPECT(&prom, "cogpu_up", 1);
  PROM_EXPECT(&prom, "up{job=\"cogpu\"}", 1);

  /* (A copy: th_path's buffers are reused by later calls.) */
  char go[PATH_MAX];
  snprintf(go, sizeof go, "%s", th_path("go"));
  char waitarg[PATH_MAX + 16];
  snprintf(waitarg, sizeof waitarg, "waitfile:%s", go);
  const char *job_argv[] = {
      "cogpu",    "run",         "--mem",  "6G",     "--job-id", "prom-a",
      "--",       lt_cudaprog(), "direct", "init",   "ctx",      "alloc:2G",
      "alloc:2G", "free",        waitarg,  "verify", "freeall",  NULL};
  pid_t job = lt_spawn_logged("job", job_argv);
  wait_for_text("job", "waiting");
  int jpid = client_reserving(6 * GiB);

  /* Prometheus renames cogpu's `job` label exported_job: its own `job`
   * (the scrape job's name) wins (docs/metrics.md). */
  const char *sel = "{exported_job=\"prom-a\",job=\"cogpu\"}";
  char q[512];
  snprintf(q, sizeof q, "cogpu_job_reserved_bytes%s", sel);
  PROM_EXPECT(&prom, q, 6.0 * GiB);
  snprintf(q, sizeof q, "cogpu_job_used_bytes%s", sel);
  PROM_EXPECT(&prom, q, 300.0 * 1024 * 1024 + 2.0 * GiB);
  snprintf(q, sizeof q, "cogpu_job_peak_bytes%s", sel);
  PROM_EXPECT(&prom, q, 300.0 * 1024 * 1024 + 4.0 * GiB);
  PROM_EXPECT(&prom, "cogpu_gpu_reserved_bytes{gpu=\"0\"}", 6.0 * GiB);
  PROM_EXPECT(&prom, "cogpu_gpu_queue_length{gpu=\"0\"}", 0);

  /* 12 GiB more cannot be had beside 6: the request waits. */
  pid_t waiter = lt_hold("waiter", 0, 12 * GiB, 0, -1, 0);
  lt_wait_nwaiting(0, 1, th_ms(5000));
  PROM_EXPECT(&prom, "cogpu_gpu_queue_length{gpu=\"0\"}", 1);
  PROM_EXPECT(&prom, "cogpu_gpu_queue_bytes{gpu=\"0\"}", 12.0 * GiB);
  /* The rules' demand: (6 + 12) / 16. */
  PROM_EXPECT(&prom, "cogpu:gpu_demand:ratio{gpu=\"0\"}", 18.0 / 16);
  kill(waiter, SIGKILL);
  th_wait(waiter, th_ms(5000));
  lt_wait_nwaiting(0, 0, th_ms(5000));
  PROM_EXPECT(&prom, "cogpu_gpu_queue_length{gpu=\"0\"}", 0);

  /* Suspended: its footprint goes to host memory, counted once. */
  PROM_EXPECT(&prom, "cogpu_suspensions_total", 0);
  PROM_EXPECT(&prom, "cogpu_checkpoint_bytes_total", 0);
  ASSERT_EQ(cogpu_verb("suspend", jpid), 0);
  PROM_EXPECT(&prom, "cogpu_suspensions_total", 1);
  /* Its copy out: its 6 GiB footprint, in some time. */
  PROM_EXPECT(&prom, "cogpu_checkpoint_bytes_total", 6.0 * GiB);
  PROM_EXPECT(&prom, "cogpu_checkpoint_seconds_total >= bool 0", 1);
  snprintf(q, sizeof q, "cogpu_job_reserved_bytes%s", sel);
  PROM_EXPECT(&prom, q, 0);
  snprintf(q, sizeof q, "cogpu_job_suspended_bytes%s > bool 0", sel);
  PROM_EXPECT(&prom, q, 1);
  PROM_EXPECT(&prom, "cogpu_suspended_bytes > bool 0", 1);
  PROM_EXPECT(&prom, "cogpu:suspensions:increase1h > bool 0", 1);
  /* A real `cogpu metrics` with every family sampled (a suspended job
   * among them), for the names check. */
  save_metrics("m.prom");
  ASSERT_EQ(cogpu_verb("resume", jpid), 0);
  PROM_EXPECT(&prom, "cogpu_resumes_total", 1);
  PROM_EXPECT(&prom, "cogpu_checkpoint_bytes_total", 12.0 * GiB);
  snprintf(q, sizeof q, "cogpu_job_reserved_bytes%s", sel);
  PROM_EXPECT(&prom, q, 6.0 * GiB);

  /* Every dashboard query parses in this Prometheus. */
  char url[64];
  snprintf(url, sizeof url, "http://127.0.0.1:%d", prom.port);
  check_names(th_path("m.prom"), url);

  th_write_file(go, "");
  ASSERT_EQ(th_exit_code(th_wait(job, th_ms(30000))), 0);
  ASSERT_CONTAINS(lt_slurp("job"), "verify ok");
  /* The job gone, its series go stale. */
  snprintf(q, sizeof q, "count(cogpu_job_reserved_bytes%s) or vector(0)", sel);
  PROM_EXPECT(&prom, q, 0);

  /* cogpud stops: the exporter still answers, with cogpu_up 0, and the
   * rules' CogpuDaemonDown alert is pending (it fires after 2 minutes,
   * which promtool test rules checks). */
  th_daemon_stop(SIGTERM);
  PROM_EXPECT(&prom, "up{job=\"cogpu\"}", 1);
  PROM_EXPECT(&prom, "cogpu_up", 0);
  PROM_EXPECT(
      &prom, "ALERTS{alertname=\"CogpuDaemonDown\",alertstate=\"pending\"}", 1);

  prom_stop(&prom);
  kill(exporter, SIGTERM);
  ASSERT_EQ(th_exit_code(th_wait(exporter, th_ms(5000))), 0);
}
