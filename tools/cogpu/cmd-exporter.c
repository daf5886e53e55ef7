/*
 * cmd-exporter.c: `cogpu exporter`: keeps the node's metrics current for
 * Prometheus, as a file for node_exporter's textfile collector (--textfile,
 * rewritten every --interval and replaced atomically) and/or over HTTP
 * (--listen: GET /metrics).
 *
 * The HTTP side is a small poll loop in one thread: connections are
 * non-blocking, a request may be at most EXP_REQ_MAX bytes and must arrive,
 * and its answer leave, within EXP_CONN_MS; at most EXP_CONNS at once.
 * When all are taken, a new connection takes the place of the oldest that
 * has not finished asking (idle, or slow-loris), else of the oldest slow to
 * read its answer, so that no number of such connections locks a scrape
 * out. A request that came with the connection is read at once,
 * so that a scrape is never the one that makes room. Each scrape takes one
 * status snapshot (one daemon round trip, or one short hold of the ledger lock
 * in single-user mode) and renders it afterwards; scrapes that arrive together
 * share a snapshot. SIGTERM and SIGINT end it cleanly.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"

#define EXP_REQ_MAX 8192 /* a scrape's request is a few hundred bytes */
#define EXP_CONN_MS 5000
#define EXP_CONNS 32

typedef struct conn_s {
  int fd;
  uint64_t deadline_ns;
  char req[EXP_REQ_MAX];
  size_t n;
  bool want_metrics; /* a complete GET /metrics, waiting for the snapshot */
  bool head;
  char *out; /* the answer, being written */
  size_t out_len, out_off;
} conn_t;

typedef struct exporter_s {
  const char *textfile;
  int64_t interval_ms;
  cli_metrics_opts_t mo;
  int lfd;
  conn_t conns[EXP_CONNS];
  char last_err[256]; /* said once until it changes */
} exporter_t;

static volatile sig_atomic_t stop_signal;

static void on_stop(int sig) {
  stop_signal = sig;
}

static void say_once(exporter_t *e, const char *msg) {
  if (strcmp(e->last_err, msg) == 0)
    return;
  snprintf(e->last_err, sizeof e->last_err, "%s", msg);
  if (*msg)
    cli_err("exporter: %s", msg);
}

/* One snapshot, rendered; NULL only without memory. A node that cannot be
 * read renders as cogpu_up 0, with the reason said once on stderr. */
static char *scrape(exporter_t *e, size_t *len) {
  cogpu_status_t *st = NULL;
  uint64_t t0 = cogpu__now_ns();
  int rc = cogpu_status(NULL, &st);
  cli_metrics_opts_t mo = e->mo;
  mo.status_seconds = (double)(cogpu__now_ns() - t0) / 1e9;
  if (rc) {
    char msg[256];
    snprintf(msg, sizeof msg, "cannot read the node's state: %s",
             *cogpu_last_error() ? cogpu_last_error() : cogpu_strerror(rc));
    say_once(e, msg);
    st = NULL;
  } else {
    say_once(e, "");
  }
  char *buf = NULL;
  rc = cli_metrics_render(st, &mo, &buf, len);
  cogpu_status_free(st);
  return rc ? NULL : buf;
}

/* --- the textfile ------------------------------------------------------ */

/* Written to a temporary file in the same directory, then renamed over the
 * file: the collector reads the old figures or the new, never a part.
 * Mode 0644 whatever the umask, for node_exporter's user. The temporary
 * name does not end in .prom, so the collector never reads it. */
static int write_textfile(exporter_t *e) {
  size_t len;
  char *buf = scrape(e, &len);
  if (!buf)
    return cogpu__seterr(-ENOMEM, "out of memory");
  char tmp[4096];
  const char *slash = strrchr(e->textfile, '/');
  int dl = slash ? (int)(slash - e->textfile + 1) : 0;
  snprintf(tmp, sizeof tmp, "%.*s.%s.tmp.%d", dl, e->textfile,
           slash ? slash + 1 : e->textfile, (int)getpid());
  int rc = 0;
  int fd =
      open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) {
    rc = cogpu__seterr(-errno, "cannot create %s: %s", tmp, strerror(errno));
  } else {
    size_t off = 0;
    while (rc == 0 && off < len) {
      ssize_t w = write(fd, buf + off, len - off);
      if (w < 0 && errno != EINTR)
        rc = cogpu__seterr(-errno, "cannot write %s: %s", tmp, strerror(errno));
      else if (w > 0)
        off += (size_t)w;
    }
    if (rc == 0 && fchmod(fd, 0644) != 0)
      rc = cogpu__seterr(-errno, "cannot chmod %s: %s", tmp, strerror(errno));
    if (close(fd) != 0 && rc == 0)
      rc = cogpu__seterr(-errno, "cannot write %s: %s", tmp, strerror(errno));
    if (rc == 0 && rename(tmp, e->textfile) != 0)
      rc = cogpu__seterr(-errno, "cannot rename %s to %s: %s", tmp, e->textfile,
                         strerror(errno));
    if (rc)
      unlink(tmp);
  }
  free(buf);
  return rc;
}

/* --- HTTP ------------------------------------------------------------------
 */

/* [ADDR:]PORT, ADDR an IPv4 address, a host name or [IPv6]; no ADDR: every
 * address. Prints where it listens (the port, if 0 was asked). */
static int listen_on(const char *spec) {
  char host[256] = "", port[16];
  const char *colon = strrchr(spec, ':');
  if (colon) {
    size_t hl = (size_t)(colon - spec);
    if (hl >= 2 && spec[0] == '[' && spec[hl - 1] == ']') {
      spec++;
      hl -= 2;
    }
    if (hl >= sizeof host)
      return cogpu__seterr(-EINVAL, "--listen: address too long");
    memcpy(host, spec, hl);
    host[hl] = 0;
    spec = colon + 1;
  }
  char *end;
  long p = strtol(spec, &end, 10);
  if (!*spec || *end || p < 0 || p > 65535)
    return cogpu__seterr(-EINVAL, "--listen: '%s' is not a port (0-65535)",
                         spec);
  snprintf(port, sizeof port, "%ld", p);
  struct addrinfo hints = {.ai_family = AF_UNSPEC,
                           .ai_socktype = SOCK_STREAM,
                           .ai_flags = AI_PASSIVE | AI_NUMERICSERV},
                  *ai = NULL;
  /* No address: the IPv6 wildcard, which takes IPv4 too where it can. */
  int gr = getaddrinfo(*host ? host : "::", port, &hints, &ai);
  if (gr != 0 && !*host)
    gr = getaddrinfo("0.0.0.0", port, &hints, &ai);
  if (gr != 0)
    return cogpu__seterr(-EINVAL, "--listen: cannot resolve '%s': %s", host,
                         gai_strerror(gr));
  int fd = -1, err = 0;
  for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      err = errno;
      continue;
    }
    int one = 1, zero = 0;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (a->ai_family == AF_INET6 && !*host)
      setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 64) != 0) {
      err = errno;
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(ai);
  if (fd < 0)
    return cogpu__seterr(-err, "--listen: cannot listen on %s%s%s: %s", host,
                         *host ? ":" : "", port, strerror(err));
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  char a[INET6_ADDRSTRLEN] = "?";
  int bound = 0;
  if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0) {
    if (ss.ss_family == AF_INET) {
      struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
      inet_ntop(AF_INET, &s4->sin_addr, a, sizeof a);
      bound = ntohs(s4->sin_port);
    } else {
      struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
      inet_ntop(AF_INET6, &s6->sin6_addr, a, sizeof a);
      bound = ntohs(s6->sin6_port);
    }
  }
  fprintf(stderr, "cogpu: exporter: listening on %s port %d (GET /metrics)\n",
          a, bound);
  return fd;
}

static void conn_close(conn_t *c) {
  close(c->fd);
  free(c->out);
  c->fd = -1;
  c->out = NULL;
}

static void respond(conn_t *c, int code, const char *reason, const char *ctype,
                    const char *body, size_t blen) {
  char hdr[256];
  int hl = snprintf(hdr, sizeof hdr,
                    "HTTP/1.1 %d %s\r\nContent-Type: %s\r\n"
                    "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                    code, reason, ctype, blen);
  size_t send_body = c->head ? 0 : blen;
  c->out = malloc((size_t)hl + send_body + 1);
  if (!c->out) {
    conn_close(c);
    return;
  }
  memcpy(c->out, hdr, (size_t)hl);
  if (send_body)
    memcpy(c->out + hl, body, send_body);
  c->out_len = (size_t)hl + send_body;
  c->out_off = 0;
}

static void respond_text(conn_t *c, int code, const char *reason) {
  char body[128];
  int n = snprintf(body, sizeof body, "%d %s\n", code, reason);
  respond(c, code, reason, "text/plain; charset=utf-8", body, (size_t)n);
}

/* A complete request head is in c->req: decide its answer. Only the
 * request line matters; headers are read and ignored. */
static void on_request(conn_t *c) {
  char *eol = strpbrk(c->req, "\r\n");
  if (eol)
    *eol = 0;
  char method[16], target[1024], version[16];
  if (sscanf(c->req, "%15s %1023s %15s", method, target, version) != 3 ||
      strncmp(version, "HTTP/1.", 7) != 0) {
    respond_text(c, 400, "Bad Request");
    return;
  }
  c->head = strcmp(method, "HEAD") == 0;
  if (strcmp(method, "GET") != 0 && !c->head) {
    respond_text(c, 405, "Method Not Allowed");
    return;
  }
  size_t pl = strcspn(target, "?");
  if (pl != strlen("/metrics") || strncmp(target, "/metrics", pl) != 0) {
    respond_text(c, 404, "Not Found");
    return;
  }
  c->want_metrics = true;
}

static void on_readable(conn_t *c) {
  for (;;) {
    if (c->n == sizeof c->req - 1) {
      /* Bounded: a request head this long is not a scrape. */
      respond_text(c, 431, "Request Header Fields Too Large");
      return;
    }
    ssize_t r = recv(c->fd, c->req + c->n, sizeof c->req - 1 - c->n, 0);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return;
    if (r <= 0) {
      conn_close(c); /* the peer left before asking */
      return;
    }
    c->n += (size_t)r;
    c->req[c->n] = 0;
    if (strstr(c->req, "\r\n\r\n") || strstr(c->req, "\n\n")) {
      on_request(c);
      return;
    }
  }
}

static void on_writable(conn_t *c) {
  while (c->out_off < c->out_len) {
    ssize_t w =
        send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR)
      continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return;
    if (w < 0) {
      conn_close(c);
      return;
    }
    c->out_off += (size_t)w;
  }
  shutdown(c->fd, SHUT_WR);
  conn_close(c);
}

/* All connections taken: the one a new connection replaces. The oldest
 * that has not finished asking; else the oldest whose answer its peer is
 * slow to read (a scrape reads it at once); never one whose request waits
 * for this round's snapshot. NULL if none. */
static conn_t *make_room(exporter_t *e) {
  conn_t *best = NULL;
  for (int pass = 0; pass < 2 && !best; pass++)
    for (size_t i = 0; i < EXP_CONNS; i++) {
      conn_t *q = &e->conns[i];
      bool asking = !q->want_metrics && !q->out;
      if (q->fd < 0 || q->want_metrics || (pass == 0) != asking)
        continue;
      if (!best || q->deadline_ns < best->deadline_ns)
        best = q;
    }
  return best;
}

static void on_accept(exporter_t *e) {
  for (;;) {
    int fd = accept4(e->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0)
      return; /* EAGAIN, or a connection that went away: nothing to do */
    conn_t *c = NULL;
    for (size_t i = 0; i < EXP_CONNS && !c; i++)
      if (e->conns[i].fd < 0)
        c = &e->conns[i];
    if (!c && (c = make_room(e)) != NULL)
      conn_close(c);
    if (!c) {
      close(fd); /* all are being answered: Prometheus retries */
      continue;
    }
    c->fd = fd;
    c->n = 0;
    c->req[0] = 0;
    c->want_metrics = c->head = false;
    c->out = NULL;
    c->out_len = c->out_off = 0;
    c->deadline_ns = cogpu__now_ns() + cogpu__ms_to_ns(EXP_CONN_MS);
    on_readable(c); /* a request already here: asked, so kept */
  }
}

/* Every connection waiting for metrics gets the same snapshot. */
static void serve_metrics(exporter_t *e) {
  bool any = false;
  for (size_t i = 0; i < EXP_CONNS; i++)
    any |= e->conns[i].fd >= 0 && e->conns[i].want_metrics;
  if (!any)
    return;
  size_t len = 0;
  char *buf = scrape(e, &len);
  for (size_t i = 0; i < EXP_CONNS; i++) {
    conn_t *c = &e->conns[i];
    if (c->fd < 0 || !c->want_metrics)
      continue;
    c->want_metrics = false;
    if (buf)
      respond(c, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", buf,
              len);
    else
      respond_text(c, 500, "Internal Server Error");
    if (c->fd >= 0)
      on_writable(c);
  }
  free(buf);
}

static int run_loop(exporter_t *e, const sigset_t *waitmask) {
  uint64_t next_file = 0;
  while (!stop_signal) {
    uint64_t now = cogpu__now_ns();
    if (e->textfile && now >= next_file) {
      int rc = write_textfile(e);
      if (rc && next_file == 0)
        return cli_fail("exporter", rc); /* a wrong path: say so and stop */
      if (rc)
        say_once(e, cogpu_last_error());
      now = cogpu__now_ns();
      next_file = now + cogpu__ms_to_ns((uint64_t)e->interval_ms);
    }
    struct pollfd pf[EXP_CONNS + 1];
    conn_t *pc[EXP_CONNS + 1];
    nfds_t n = 0;
    uint64_t wake = e->textfile ? next_file : UINT64_MAX;
    if (e->lfd >= 0) {
      pf[n] = (struct pollfd){.fd = e->lfd, .events = POLLIN};
      pc[n++] = NULL;
    }
    for (size_t i = 0; i < EXP_CONNS; i++) {
      conn_t *c = &e->conns[i];
      if (c->fd < 0)
        continue;
      if (now >= c->deadline_ns) {
        conn_close(c); /* too slow to ask, or to read the answer */
        continue;
      }
      wake = c->deadline_ns < wake ? c->deadline_ns : wake;
      pf[n] = (struct pollfd){.fd = c->fd, .events = c->out ? POLLOUT : POLLIN};
      pc[n++] = c;
    }
    struct timespec ts, *tsp = NULL;
    if (wake != UINT64_MAX) {
      uint64_t d = wake > now ? wake - now : 0;
      ts.tv_sec = (time_t)(d / 1000000000u);
      ts.tv_nsec = (long)(d % 1000000000u);
      tsp = &ts;
    }
    int r = ppoll(pf, n, tsp, waitmask);
    if (r < 0 && errno != EINTR) {
      cli_err("exporter: poll: %s", strerror(errno));
      return CLI_EXIT_FAIL;
    }
    for (nfds_t i = 0; r > 0 && i < n; i++) {
      if (!pf[i].revents)
        continue;
      if (!pc[i])
        on_accept(e);
      else if (pc[i]->fd >= 0 && pc[i]->out)
        on_writable(pc[i]);
      else if (pc[i]->fd >= 0)
        on_readable(pc[i]);
    }
    serve_metrics(e);
  }
  return 0;
}

static const char exporter_usage[] =
    "usage: cogpu exporter [--textfile PATH [--interval DURATION]] "
    "[--listen [ADDR:]PORT] [--max-jobs N|all] [--no-jobs]";

int cli_exporter(int argc, char **argv) {
  static const struct option opts[] = {{"textfile", required_argument, 0, 't'},
                                       {"interval", required_argument, 0, 'i'},
                                       {"listen", required_argument, 0, 'l'},
                                       {"max-jobs", required_argument, 0, 'm'},
                                       {"no-jobs", no_argument, 0, 'n'},
                                       {0, 0, 0, 0}};
  exporter_t e = {.interval_ms = 15000,
                  .mo = {.max_jobs = 100, .status_seconds = -1},
                  .lfd = -1};
  const char *listen_spec = NULL;
  int c;
  optind = 1;
  while ((c = getopt_long(argc, argv, "+", opts, NULL)) != -1) {
    switch (c) {
    case 't':
      e.textfile = optarg;
      break;
    case 'i':
      if (cogpu__parse_duration_ms("--interval", optarg, &e.interval_ms) ||
          e.interval_ms < 100 || e.interval_ms > 86400000) {
        cli_err("--interval: '%s' is not a duration from 100ms to 1d", optarg);
        return CLI_EXIT_USAGE;
      }
      break;
    case 'l':
      listen_spec = optarg;
      break;
    case 'm':
      e.mo.max_jobs = cli_metrics_max_jobs(optarg);
      if (e.mo.max_jobs < -1)
        return CLI_EXIT_USAGE;
      break;
    case 'n':
      e.mo.max_jobs = 0;
      break;
    default:
      cli_err("%s", exporter_usage);
      return CLI_EXIT_USAGE;
    }
  }
  if (optind < argc || (!e.textfile && !listen_spec)) {
    cli_err("%s%s", optind < argc ? "unexpected argument; " : "",
            exporter_usage);
    return CLI_EXIT_USAGE;
  }
  if (e.textfile && !*e.textfile) {
    cli_err("--textfile: empty path");
    return CLI_EXIT_USAGE;
  }
  cogpu__config_t cfg;
  if (cli_config_load(&cfg))
    return CLI_EXIT_FAIL;
  for (size_t i = 0; i < EXP_CONNS; i++)
    e.conns[i].fd = -1;
  /* The stop signals are taken only inside ppoll: one that comes while a
   * scrape or a write runs ends the loop right after it, never half-way. */
  sigset_t block, waitmask;
  sigemptyset(&block);
  sigaddset(&block, SIGTERM);
  sigaddset(&block, SIGINT);
  sigaddset(&block, SIGHUP);
  sigprocmask(SIG_BLOCK, &block, &waitmask);
  sigdelset(&waitmask, SIGTERM);
  sigdelset(&waitmask, SIGINT);
  sigdelset(&waitmask, SIGHUP);
  struct sigaction sa = {.sa_handler = on_stop};
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  if (listen_spec) {
    e.lfd = listen_on(listen_spec);
    if (e.lfd < 0)
      return cli_fail("exporter", e.lfd);
  }
  int rc = run_loop(&e, &waitmask);
  for (size_t i = 0; i < EXP_CONNS; i++)
    if (e.conns[i].fd >= 0)
      conn_close(&e.conns[i]);
  if (e.lfd >= 0)
    close(e.lfd);
  /* Stopped: figures left behind would be served as current for ever. */
  if (rc == 0 && e.textfile)
    unlink(e.textfile);
  return rc;
}
