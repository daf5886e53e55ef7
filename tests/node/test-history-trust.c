/*
 * test-history-trust.c: the job history can be trusted and fails safely
 * (docs/history.md, "Trust model", "Retention", "When the history cannot
 * be used"), in both passes of the suite.
 *
 *  - two users: each sees only their own records, asking for another's is
 *    refused, root sees both; users cannot open the daemon's database, and
 *    nothing a user sends the daemon changes another user's record
 *    (history_trust_two_users, history_trust_no_forged_record; root only:
 *    clients run as uid 65533 and nobody, as in test-security.c);
 *  - a history directory others can write is refused, never written into
 *    (history_trust_planted_dir);
 *  - single-user mode: the user's own database, 0600 in a 0700 directory,
 *    whatever the umask (history_trust_single_user_private);
 *  - retention by rows and by age (history_trust_retention_*);
 *  - a corrupt, locked, full or unwritable database: the job runs and
 *    exits exactly as with a working one, cogpu says once why history is
 *    off, and the ledger keeps nothing of the job
 *    (history_trust_fail_*).
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "api/api.h"
#include "history/history.h"
#include "internal.h"
#include "ledger-helpers.h"
#include "node/proto.h"

#define UID_A 65533u
#define UID_B 65534u /* nobody */

/* --- common ----------------------------------------------------------------
 */

/* The environment of test-history.c's tests: the fake's context costs what
 * cogpu counts for it, so a job's peak is known to the byte. Warnings are
 * logged: "job history is off" is one. */
static void ht_env(void) {
  if (th_sanitizer_runtime()[0])
    setenv("LD_PRELOAD", th_sanitizer_runtime(), 1);
  th_setenv("COGPU_MARGIN", "0");
  setenv("COGPU_CONTEXT_BYTES", "300M", 1);
  setenv("FAKE_CUDA_CTX_BYTES", "300M", 1);
  setenv("COGPU_LOG", "warn", 1);
}

/* Node mode: the daemon again, with the test's environment now (history
 * settings and the log level are read at its start). Its log is
 * cogpud.log in the test's directory. */
static void daemon_restart(void) {
  th_daemon_stop(SIGTERM);
  /* Info: the daemon says so when the history works again. */
  setenv("COGPU_LOG", "info", 1);
  th_daemon_start();
  setenv("COGPU_LOG", "warn", 1);
}

static size_t count_of(const char *hay, const char *needle) {
  size_t n = 0;
  for (const char *p = hay; p && (p = strstr(p, needle)); p += strlen(needle))
    n++;
  return n;
}

static char *slurp_file(const char *path) {
  static char buf[4][1 << 16];
  static int next;
  char *b = buf[next++ % 4];
  b[0] = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ssize_t n = read(fd, b, sizeof buf[0] - 1);
    b[n > 0 ? n : 0] = 0;
    close(fd);
  }
  return b;
}

/* Runs `cogpu ARGS` (as root) with stdout and stderr apart; its exit. */
static int cogpu_cmd(const char *const args[], char *out, size_t outlen,
                     char *err, size_t errlen) {
  const char *argv[40] = {"cogpu"};
  int n = 1;
  for (int i = 0; args[i] && n < 39; i++)
    argv[n++] = args[i];
  argv[n] = NULL;
  return th_run(argv, NULL, out, outlen, err, errlen, th_ms(30000));
}

/* `cogpu history --json [a1 a2]` as root; fails the test if it fails. */
static char *history_json(const char *a1, const char *a2) {
  static char out[1 << 17], err[1 << 12];
  const char *args[] = {"history", "--json", a1, a2, NULL};
  int rc = cogpu_cmd(args, out, sizeof out, err, sizeof err);
  if (rc != 0)
    th_fail(__FILE__, __LINE__, "cogpu history: exit %d: %s", rc, err);
  return out;
}

/* The records of `cogpu history --json`, each a string of its own (the
 * output is one record a line, each line starting with " {"). */
#define MAX_RECS 64
typedef struct {
  int n;
  char rec[MAX_RECS][4096];
} recs_t;

static void split_recs(const char *json, recs_t *r) {
  r->n = 0;
  for (const char *p = strstr(json, "\n {"); p && r->n < MAX_RECS;) {
    const char *next = strstr(p + 1, "\n {");
    size_t len = next ? (size_t)(next - p) : strlen(p);
    if (len >= sizeof r->rec[0])
      len = sizeof r->rec[0] - 1;
    memcpy(r->rec[r->n], p, len);
    r->rec[r->n][len] = 0;
    r->n++;
    p = next;
  }
}

static unsigned long long field_u(const char *rec, const char *key) {
  char k[64];
  snprintf(k, sizeof k, "\"%s\":", key);
  const char *p = strstr(rec, k);
  if (!p)
    th_fail(__FILE__, __LINE__, "no %s in %s", key, rec);
  return strtoull(p + strlen(k), NULL, 10);
}

/* The one record whose text holds `needle` ("\"job_id\":\"X\""...); fails
 * unless there is exactly one. */
static const char *the_rec(const recs_t *r, const char *needle) {
  const char *found = NULL;
  int n = 0;
  for (int i = 0; i < r->n; i++)
    if (strstr(r->rec[i], needle)) {
      found = r->rec[i];
      n++;
    }
  if (n != 1)
    th_fail(__FILE__, __LINE__, "%d records hold %s (want 1)", n, needle);
  return found;
}

/* Nothing of any job is left in the ledger: no client, nothing reserved,
 * nobody waiting. */
static void ledger_empty(void) {
  cogpu_status_t *st = lt_status();
  for (size_t g = 0; g < st->ngpus; g++) {
    ASSERT_EQ(st->gpus[g].nclients, 0);
    ASSERT_UEQ(st->gpus[g].reserved_bytes, 0);
    ASSERT_EQ(st->gpus[g].nwaiting, 0);
  }
  cogpu_status_free(st);
  lt_check_invariants();
}

/* --- two users --------------------------------------------------------------
 */

/* Root, a daemon (the suite's in node mode, else one of the test's own),
 * a test directory other users can pass through and pub/, which they can
 * write. */
static void users_begin(void) {
  if (geteuid() != 0)
    SKIP("needs root: runs clients as other users (setresuid, setpriv)");
  ht_env();
  ASSERT(chmod(th_tmpdir(), 0711) == 0);
  ASSERT(mkdir(th_path("pub"), 0777) == 0);
  ASSERT(chmod(th_path("pub"), 0777) == 0);
  setenv("COGPU_NODE_MODE", "daemon", 1);
  if (!th_node_mode())
    th_daemon_start();
}

/* `setpriv` arguments that run what follows as uid (0: as root, none). */
static int as_user(unsigned uid, const char **argv) {
  static char ru[32], rg[32];
  if (uid == 0)
    return 0;
  snprintf(ru, sizeof ru, "--reuid=%u", uid);
  snprintf(rg, sizeof rg, "--regid=%u", uid);
  argv[0] = "setpriv";
  argv[1] = ru;
  argv[2] = rg;
  argv[3] = "--clear-groups";
  return 4;
}

/* `cogpu ARGS` as uid, output apart. Each user has a fake driver state of
 * their own in pub/ (a file one user makes, the other could not open). */
static int cogpu_as(unsigned uid, const char *const args[], char *out,
                    size_t outlen, char *err, size_t errlen) {
  const char *argv[48];
  int n = as_user(uid, argv);
  char fake[4200];
  snprintf(fake, sizeof fake, "FAKE_CUDA_STATE=%s/pub/fake-%u", th_tmpdir(),
           uid);
  argv[n++] = "env";
  argv[n++] = fake;
  argv[n++] = "cogpu";
  for (int i = 0; args[i] && n < 47; i++)
    argv[n++] = args[i];
  argv[n] = NULL;
  return th_run(argv, NULL, out, outlen, err, errlen, th_ms(30000));
}

/* A job of uid's: cogpu run --job-id JOB -- cudaprog ... OPS; exit 0. */
static void job_as(unsigned uid, const char *job, const char *alloc) {
  static char out[1 << 14], err[1 << 14];
  const char *args[] = {"run",         "--job-id", job,    "--",
                        lt_cudaprog(), "direct",   "init", "ctx",
                        alloc,         "freeall",  NULL};
  int rc = cogpu_as(uid, args, out, sizeof out, err, sizeof err);
  if (rc != 0)
    th_fail(__FILE__, __LINE__, "uid %u's job: exit %d: %s", uid, rc, err);
  ASSERT_CONTAINS(err, "used at most");
}

/* UID PATH...: each path must be refused for writing and for reading, and
 * the directory of the first one must not take a new file. */
HELPER_IMPL(ht_open_as) {
  if (argc < 2)
    return 2;
  unsigned uid = (unsigned)atoi(argv[0]);
  if (setgroups(0, NULL) != 0 || setresgid(uid, uid, uid) != 0 ||
      setresuid(uid, uid, uid) != 0) {
    fprintf(stderr, "cannot become uid %u: %s\n", uid, strerror(errno));
    return 3;
  }
  for (int i = 1; i < argc; i++) {
    int w = open(argv[i], O_RDWR | O_CLOEXEC);
    int r = open(argv[i], O_RDONLY | O_CLOEXEC);
    if (w >= 0 || r >= 0) {
      fprintf(stderr, "uid %u opened %s (%s)\n", uid, argv[i],
              w >= 0 ? "read-write" : "read-only");
      return 1;
    }
  }
  char planted[4200];
  snprintf(planted, sizeof planted, "%s", argv[1]);
  char *slash = strrchr(planted, '/');
  snprintf(slash ? slash + 1 : planted,
           sizeof planted - (size_t)(slash ? slash + 1 - planted : 0),
           "history.db-planted");
  int c = open(planted, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (c >= 0) {
    fprintf(stderr, "uid %u made %s\n", uid, planted);
    return 1;
  }
  return 0;
}

/* B (nobody) and A (uid 65533) each run a job. B's `cogpu history` lists
 * B's job only; B asking for A's is refused with a reason; root sees
 * both, and may pick one user. Users can neither open the daemon's
 * database (nor its WAL files) nor add a file next to it. */
TEST_IMPL(history_trust_two_users) {
  users_begin();
  job_as(UID_B, "JOB-B", "alloc:256M");
  job_as(UID_A, "JOB-A", "alloc:512M");
  static char out[1 << 16], err[1 << 13];
  /* B's own history: its job, no other. */
  int rc = cogpu_as(UID_B, (const char *const[]){"history", "--json", NULL},
                    out, sizeof out, err, sizeof err);
  if (rc != 0)
    th_fail(__FILE__, __LINE__, "B's cogpu history: exit %d: %s", rc, err);
  recs_t r;
  split_recs(out, &r);
  ASSERT_EQ(r.n, 1);
  const char *b = the_rec(&r, "\"job_id\":\"JOB-B\"");
  ASSERT_UEQ(field_u(b, "uid"), UID_B);
  ASSERT_CONTAINS(b, "\"user\":\"nobody\"");
  ASSERT_UEQ(field_u(b, "peak_bytes"), 300 * MiB + 256 * MiB);
  /* The table too. */
  rc = cogpu_as(UID_B, (const char *const[]){"history", NULL}, out, sizeof out,
                err, sizeof err);
  ASSERT_EQ(rc, 0);
  ASSERT_CONTAINS(out, "JOB-B");
  ASSERT(!strstr(out, "JOB-A"));
  /* B asks for A's: refused, said why, nothing listed. */
  char ua[16];
  snprintf(ua, sizeof ua, "%u", UID_A);
  rc = cogpu_as(UID_B, (const char *const[]){"history", "--user", ua, NULL},
                out, sizeof out, err, sizeof err);
  ASSERT_NE(rc, 0);
  ASSERT_CONTAINS(err, "only root and the admin group may see other users' "
                       "jobs");
  ASSERT(!strstr(out, "JOB-A"));
  /* Root: both; --user picks one. */
  split_recs(history_json(NULL, NULL), &r);
  ASSERT_EQ(r.n, 2);
  ASSERT_UEQ(field_u(the_rec(&r, "\"job_id\":\"JOB-A\""), "uid"), UID_A);
  ASSERT_UEQ(field_u(the_rec(&r, "\"job_id\":\"JOB-B\""), "uid"), UID_B);
  split_recs(history_json("--user", "nobody"), &r);
  ASSERT_EQ(r.n, 1);
  the_rec(&r, "\"job_id\":\"JOB-B\"");
  /* The database: root's, private, in a root-only directory. */
  const char *dir = getenv("COGPU_HISTORY_DIR");
  char db[4200], wal[4300], shm[4300];
  snprintf(db, sizeof db, "%s/history.db", dir);
  snprintf(wal, sizeof wal, "%s-wal", db);
  snprintf(shm, sizeof shm, "%s-shm", db);
  struct stat sb;
  ASSERT_EQ(stat(dir, &sb), 0);
  ASSERT_EQ(sb.st_uid, 0);
  ASSERT_EQ(sb.st_mode & 077, 0);
  ASSERT_EQ(stat(db, &sb), 0);
  ASSERT_EQ(sb.st_uid, 0);
  ASSERT_EQ(sb.st_mode & 077, 0);
  /* Even with the directory opened up (an admin's mistake), the files
   * themselves refuse other users. */
  ASSERT_EQ(chmod(dir, 0755), 0);
  pid_t p =
      th_spawn_helper("ht_open_as", (const char *const[]){"65534", db, NULL});
  ASSERT_EQ(th_exit_code(th_wait(p, th_ms(10000))), 0);
  if (access(wal, F_OK) == 0 && access(shm, F_OK) == 0) {
    p = th_spawn_helper("ht_open_as",
                        (const char *const[]){"65534", wal, shm, NULL});
    ASSERT_EQ(th_exit_code(th_wait(p, th_ms(10000))), 0);
  }
  ASSERT_EQ(chmod(dir, 0700), 0);
  p = th_spawn_helper("ht_open_as", (const char *const[]){"65534", db, NULL});
  ASSERT_EQ(th_exit_code(th_wait(p, th_ms(10000))), 0);
}

/* B's process (nobody), as a client of the daemon may behave: it sends
 * JOB_END and USAGE on a connection that never attached, asks to attach
 * in A's name, then names its own job and command like A's, claims a
 * 15 GiB peak in its usage page and an exit status of 99. */
HELPER_IMPL(ht_forger) {
  if (argc < 2)
    return 2;
  if (setgroups(0, NULL) != 0 || setresgid(UID_B, UID_B, UID_B) != 0 ||
      setresuid(UID_B, UID_B, UID_B) != 0)
    return 3;
  /* Raw messages without an ATTACH: the daemon drops the connection, with
   * no answer. */
  for (int type = COGPU_M_USAGE; type <= COGPU_M_JOB_END; type++) {
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", getenv("COGPU_SOCKET"));
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0)
      return 4;
    cogpu__msg_t m;
    cogpu__msg_init(&m, type, 1);
    if (type == COGPU_M_JOB_END)
      m.u.job_end.exit_status = 0;
    else
      m.u.usage.size = (uint32_t)sizeof(cogpu__usage_t);
    if (send(fd, &m, sizeof m, 0) != (ssize_t)sizeof m)
      return 5;
    struct timeval tv = {.tv_sec = 10};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ssize_t got = recv(fd, &m, sizeof m, 0);
    close(fd);
    if (got != 0) {
      fprintf(stderr, "message %d without ATTACH: recv %zd\n", type, got);
      return 6;
    }
  }
  /* An ATTACH booking the job for A (what the Slurm plug-in does as root):
   * refused. */
  {
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", getenv("COGPU_SOCKET"));
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0)
      return 4;
    cogpu__msg_t m;
    cogpu__msg_init(&m, COGPU_M_ATTACH, 1);
    m.u.attach.flags = COGPU_ATTACH_FOR_UID;
    m.u.attach.for_uid = UID_A;
    snprintf(m.u.attach.command, sizeof m.u.attach.command, "%s", argv[1]);
    snprintf(m.u.attach.job_id, sizeof m.u.attach.job_id, "%s", argv[0]);
    struct timeval tv = {.tv_sec = 10};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (send(fd, &m, sizeof m, 0) != (ssize_t)sizeof m ||
        recv(fd, &m, sizeof m, 0) != (ssize_t)sizeof m ||
        m.type != COGPU_M_REPLY || m.rc != -EPERM ||
        !strstr(m.u.reply.msg, "only root may book")) {
      fprintf(stderr, "ATTACH for uid %u was not refused (rc %d)\n", UID_A,
              m.rc);
      return 10;
    }
    close(fd);
  }
  cogpu_attach_opts_t o = {.job_id = argv[0], .command = argv[1]};
  cogpu_t *h = NULL;
  if (cogpu_attach(&o, &h) != 0) {
    fprintf(stderr, "attach: %s\n", cogpu_last_error());
    return 7;
  }
  cogpu_request_t q = {.gpu = 0,
                       .bytes = 64 * MiB,
                       .priority = COGPU_PRIORITY_DEFAULT,
                       .timeout_ms = COGPU_NOWAIT};
  cogpu__usage_t *u = cogpu__usage_page(h);
  if (cogpu_reserve(h, &q, NULL) != 0 || !u) {
    fprintf(stderr, "reserve or usage page: %s\n", cogpu_last_error());
    return 8;
  }
  atomic_store(&u->peak[0], 15 * GiB);
  atomic_store(&u->peak_ns, (uint64_t)time(NULL) * 1000000000u);
  cogpu__job_report_t rep;
  if (cogpu__job_end(h, 99 << 8, &rep) != 0) {
    fprintf(stderr, "job end: %s\n", cogpu_last_error());
    return 9;
  }
  cogpu_detach(h);
  return 0;
}

/* A record is written from what the daemon knows: the uid of the
 * connection (the kernel's), the slot's own figures. B cannot make or
 * change a record of A's, whatever it sends: A's job ends with exactly
 * one record, with A's exit status and A's exact peak; what B claimed is
 * in B's own record, under B's name (the figures are self-reported,
 * docs/history.md). */
TEST_IMPL(history_trust_no_forged_record) {
  users_begin();
  char fake[4200], cmd[4300];
  snprintf(fake, sizeof fake, "FAKE_CUDA_STATE=%s/pub/fake-a", th_tmpdir());
  const char *argv[] = {"setpriv",
                        "--reuid=65533",
                        "--regid=65533",
                        "--clear-groups",
                        "env",
                        fake,
                        "cogpu",
                        "run",
                        "--job-id",
                        "JOB-A",
                        "--",
                        lt_cudaprog(),
                        "direct",
                        "init",
                        "ctx",
                        "alloc:512M",
                        "hold:1500",
                        "freeall",
                        NULL};
  pid_t a = lt_spawn_logged("a", argv);
  /* A's job is running with its memory. */
  for (int t = 0;; t += 20) {
    ASSERT_LT(t, th_ms(10000));
    cogpu_status_t *st = lt_status();
    bool up = st->gpus[0].nclients == 1 &&
              st->gpus[0].clients[0].peak_bytes == 300 * MiB + 512 * MiB;
    if (up)
      snprintf(cmd, sizeof cmd, "%s", st->gpus[0].clients[0].command);
    cogpu_status_free(st);
    if (up)
      break;
    th_sleep_ms(20);
  }
  pid_t b =
      th_spawn_helper("ht_forger", (const char *const[]){"JOB-A", cmd, NULL});
  ASSERT_EQ(th_exit_code(th_wait(b, th_ms(20000))), 0);
  ASSERT_EQ(th_exit_code(th_wait(a, th_ms(20000))), 0);
  recs_t r;
  split_recs(history_json(NULL, NULL), &r);
  ASSERT_EQ(r.n, 2);
  const char *ra = the_rec(&r, "\"uid\":65533,");
  const char *rb = the_rec(&r, "\"uid\":65534,");
  ASSERT_CONTAINS(ra, "\"job_id\":\"JOB-A\"");
  ASSERT_UEQ(field_u(ra, "peak_bytes"), 300 * MiB + 512 * MiB);
  ASSERT_CONTAINS(ra, "\"exit_code\":0,");
  ASSERT_CONTAINS(ra, "\"signal\":null");
  ASSERT_CONTAINS(rb, "\"user\":\"nobody\"");
  ASSERT_UEQ(field_u(rb, "peak_bytes"), 15 * GiB);
  ASSERT_UEQ(field_u(rb, "declared_bytes"), 64 * MiB);
  ASSERT_CONTAINS(rb, "\"exit_code\":99,");
  /* A's own view holds A's record only. */
  static char out[1 << 16], err[1 << 13];
  ASSERT_EQ(cogpu_as(UID_A, (const char *const[]){"history", "--json", NULL},
                     out, sizeof out, err, sizeof err),
            0);
  split_recs(out, &r);
  ASSERT_EQ(r.n, 1);
  ASSERT_UEQ(field_u(r.rec[0], "peak_bytes"), 300 * MiB + 512 * MiB);
  ledger_empty();
}

/* A history directory others can write (or another user's) is refused:
 * whoever can write there could plant the database, or a link, and have
 * the daemon write and serve what they like. The daemon says so, runs
 * jobs as without history, and never writes into it. */
TEST_IMPL(history_trust_planted_dir) {
  users_begin();
  char dir[4200], db[4300];
  snprintf(dir, sizeof dir, "%s/pub/hist", th_tmpdir());
  snprintf(db, sizeof db, "%s/history.db", dir);
  ASSERT_EQ(mkdir(dir, 0777), 0);
  ASSERT_EQ(chmod(dir, 0777), 0);
  th_write_file(db, "");
  ASSERT_EQ(chown(db, UID_B, UID_B), 0);
  setenv("COGPU_HISTORY_DIR", dir, 1);
  daemon_restart();
  job_as(UID_A, "JOB-A", "alloc:256M");
  const char *log = slurp_file(th_path("cogpud.log"));
  ASSERT_CONTAINS(log, "job history is off");
  ASSERT_CONTAINS(log, "writable by others");
  struct stat sb;
  ASSERT_EQ(stat(db, &sb), 0);
  ASSERT_EQ(sb.st_size, 0);
  ASSERT_EQ(sb.st_uid, UID_B);
  ASSERT(access(th_path("pub/hist/history.db-wal"), F_OK) != 0);
  /* The same directory made another user's (not writable by others): still
   * not the daemon's. */
  ASSERT_EQ(chmod(dir, 0755), 0);
  ASSERT_EQ(chown(dir, UID_B, UID_B), 0);
  daemon_restart();
  job_as(UID_A, "JOB-A2", "alloc:256M");
  log = slurp_file(th_path("cogpud.log"));
  ASSERT_CONTAINS(log, "not owned by");
  ASSERT_EQ(stat(db, &sb), 0);
  ASSERT_EQ(sb.st_size, 0);
  ledger_empty();
}

/* --- single-user mode --------------------------------------------------------
 */

/* The path's mode bits (0 when absent). */
static unsigned mode_of(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0 ? sb.st_mode & 07777 : 0;
}

/* One job by cogpu run, daemonless; exit 0. */
static void job_single(const char *alloc) {
  static char out[1 << 14], err[1 << 14];
  const char *args[] = {"run", "--",  lt_cudaprog(), "direct", "init",
                        "ctx", alloc, "freeall",     NULL};
  int rc = cogpu_cmd(args, out, sizeof out, err, sizeof err);
  if (rc != 0)
    th_fail(__FILE__, __LINE__, "job: exit %d: %s", rc, err);
  ASSERT(!strstr(err, "job history is off"));
}

/* Each user's own database, in $XDG_STATE_HOME/cogpu, else
 * ~/.local/state/cogpu: the directory 0700 and the files 0600 whatever
 * the umask (a job history shows what a user ran and when). A database
 * left readable by an older cogpu is made private at the next write. */
TEST_IMPL_SINGLE(history_trust_single_user_private) {
  ht_env();
  umask(022);
  setenv("COGPU_HISTORY_DIR", "", 1);
  char xdg[4200], home[4200], p[4400];
  snprintf(xdg, sizeof xdg, "%s/xdg", th_tmpdir());
  snprintf(home, sizeof home, "%s/home", th_tmpdir());
  ASSERT_EQ(mkdir(home, 0755), 0);
  setenv("XDG_STATE_HOME", xdg, 1);
  setenv("HOME", home, 1);
  job_single("alloc:256M");
  snprintf(p, sizeof p, "%s/cogpu", xdg);
  ASSERT_EQ(mode_of(p), 0700);
  snprintf(p, sizeof p, "%s/cogpu/history.db", xdg);
  ASSERT_EQ(mode_of(p), 0600);
  struct stat sb;
  ASSERT_EQ(stat(p, &sb), 0);
  ASSERT_EQ(sb.st_uid, geteuid());
  ASSERT_CONTAINS(history_json(NULL, NULL), "alloc:256M");
  /* Without XDG_STATE_HOME: under HOME. */
  unsetenv("XDG_STATE_HOME");
  job_single("alloc:128M");
  snprintf(p, sizeof p, "%s/.local/state/cogpu", home);
  ASSERT_EQ(mode_of(p), 0700);
  snprintf(p, sizeof p, "%s/.local/state/cogpu/history.db", home);
  ASSERT_EQ(mode_of(p), 0600);
  char *h = history_json(NULL, NULL);
  ASSERT_CONTAINS(h, "alloc:128M");
  ASSERT(!strstr(h, "alloc:256M"));
  /* Made readable by someone (an older cogpu made it 0644): private
   * again after the next job, and its WAL files with it. */
  ASSERT_EQ(chmod(p, 0644), 0);
  job_single("alloc:64M");
  ASSERT_EQ(mode_of(p), 0600);
  char wal[4500];
  snprintf(wal, sizeof wal, "%s-wal", p);
  if (access(wal, F_OK) == 0)
    ASSERT_EQ(mode_of(wal) & 077, 0);
}

/* --- retention ---------------------------------------------------------------
 */

/* A short job of root's whose command names its size; exit 0. */
static void job_root(const char *alloc) {
  static char out[1 << 14], err[1 << 14];
  const char *args[] = {"run", "--",  lt_cudaprog(), "direct", "init",
                        "ctx", alloc, "freeall",     NULL};
  int rc = cogpu_cmd(args, out, sizeof out, err, sizeof err);
  if (rc != 0)
    th_fail(__FILE__, __LINE__, "job %s: exit %d: %s", alloc, rc, err);
}

/* history_max_rows=3: after 6 jobs, the newest 3 remain, newest first. In
 * node mode the daemon's setting decides. */
TEST_IMPL(history_trust_retention_rows) {
  ht_env();
  setenv("COGPU_HISTORY_MAX_ROWS", "3", 1);
  if (th_node_mode())
    daemon_restart();
  for (int i = 1; i <= 6; i++) {
    char op[32];
    snprintf(op, sizeof op, "alloc:%dM", 100 * i);
    job_root(op);
  }
  recs_t r;
  split_recs(history_json(NULL, NULL), &r);
  ASSERT_EQ(r.n, 3);
  ASSERT_CONTAINS(r.rec[0], "alloc:600M");
  ASSERT_CONTAINS(r.rec[1], "alloc:500M");
  ASSERT_CONTAINS(r.rec[2], "alloc:400M");
  ASSERT_UEQ(field_u(r.rec[0], "peak_bytes"), 300 * MiB + 600 * MiB);
}

/* A record as an earlier job left it, ended `ago_ms` ago. */
static void seed(const char *path, const char *command, int64_t ago_ms) {
  cogpu__hist_t *db = NULL;
  if (cogpu__hist_open(path, true, &db) != 0)
    th_fail(__FILE__, __LINE__, "%s", cogpu_last_error());
  cogpu__hist_rec_t *x = calloc(1, sizeof *x);
  ASSERT(x);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  x->end_ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000 - ago_ms;
  x->start_ms = x->end_ms - 1000;
  x->uid = (uint32_t)geteuid();
  snprintf(x->user, sizeof x->user, "root");
  snprintf(x->command, sizeof x->command, "%s", command);
  x->exit_status = 0;
  x->peak = 1 * GiB;
  x->run_ms = 1000;
  ASSERT_OK(cogpu__hist_add(db, x, -1, 0));
  free(x);
  cogpu__hist_close(db);
}

/* history_max_age=7d: a new record deletes those that ended more than 7
 * days ago, keeps the rest. The old records are put in the database
 * directly (a clock 10 days back would need the test to wait). */
TEST_IMPL(history_trust_retention_age) {
  ht_env();
  setenv("COGPU_HISTORY_MAX_AGE", "7d", 1);
  if (th_node_mode())
    daemon_restart();
  char db[4200];
  snprintf(db, sizeof db, "%s/history.db", getenv("COGPU_HISTORY_DIR"));
  const int64_t day = 24 * 3600 * 1000ll;
  seed(db, "seed-10-days", 10 * day);
  seed(db, "seed-8-days", 8 * day);
  seed(db, "seed-6-days", 6 * day);
  seed(db, "seed-1-hour", 3600 * 1000ll);
  ASSERT_CONTAINS(history_json(NULL, NULL), "seed-10-days");
  job_root("alloc:100M");
  char *h = history_json(NULL, NULL);
  ASSERT(!strstr(h, "seed-10-days"));
  ASSERT(!strstr(h, "seed-8-days"));
  ASSERT_CONTAINS(h, "seed-6-days");
  ASSERT_CONTAINS(h, "seed-1-hour");
  ASSERT_CONTAINS(h, "alloc:100M");
  recs_t r;
  split_recs(h, &r);
  ASSERT_EQ(r.n, 3);
}

/* --- database failures -------------------------------------------------------
 */

static volatile sig_atomic_t got_term;
static void on_term(int sig) {
  (void)sig;
  got_term = 1;
}

/* DB READY: holds the database's write lock (BEGIN EXCLUSIVE, as an admin's
 * sqlite3 shell in the middle of a change would) until SIGTERM (at most
 * 60 s), writing READY once it has it. */
HELPER_IMPL(ht_lock_db) {
  if (argc < 2)
    return 2;
  signal(SIGTERM, on_term);
  sqlite3 *db = NULL;
  if (sqlite3_open_v2(argv[0], &db, SQLITE_OPEN_READWRITE, NULL) != SQLITE_OK ||
      sqlite3_exec(db, "BEGIN EXCLUSIVE", NULL, NULL, NULL) != SQLITE_OK) {
    fprintf(stderr, "lock %s: %s\n", argv[0], sqlite3_errmsg(db));
    return 1;
  }
  th_write_file(argv[1], "locked");
  for (int i = 0; i < 6000 && !got_term; i++)
    th_sleep_ms(10);
  sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
  sqlite3_close(db);
  return 0;
}

typedef enum { F_CORRUPT, F_LOCKED, F_FULL, F_UNWRITABLE } fail_t;

typedef struct {
  int code;
  char out[1 << 14], err[1 << 14];
} run_t;

/* The job of these tests: it prints, allocates, and exits 3 (an action
 * cudaprog does not know), so that its exit status and both its outputs
 * can be compared. */
static void job_fail(const char *id, run_t *r) {
  const char *args[] = {
      "run",  "--job-id", id,           "--",      lt_cudaprog(),     "direct",
      "init", "ctx",      "alloc:256M", "freeall", "fail-on-purpose", NULL};
  r->code = cogpu_cmd(args, r->out, sizeof r->out, r->err, sizeof r->err);
}

/* r's stderr less the lines that say history is off, with the job id
 * `id` written as the baseline's, "base". */
static void err_as_base(const run_t *r, const char *id, char *buf, size_t len) {
  char idw[64], basew[64];
  snprintf(idw, sizeof idw, "job %s ", id);
  snprintf(basew, sizeof basew, "job base ");
  size_t o = 0;
  buf[0] = 0;
  for (const char *l = r->err; *l;) {
    const char *nl = strchr(l, '\n');
    size_t n = nl ? (size_t)(nl - l + 1) : strlen(l);
    char line[2048];
    snprintf(line, sizeof line, "%.*s", (int)n, l);
    l += n;
    if (strstr(line, "job history is off"))
      continue;
    char *at = strstr(line, idw);
    if (at)
      o += (size_t)snprintf(buf + o, len > o ? len - o : 0, "%.*s%s%s",
                            (int)(at - line), line, basew, at + strlen(idw));
    else
      o += (size_t)snprintf(buf + o, len > o ? len - o : 0, "%s", line);
  }
}

/* The daemon's log from offset `from` on (node mode). */
static const char *daemon_log_since(size_t from) {
  const char *log = slurp_file(th_path("cogpud.log"));
  return strlen(log) >= from ? log + from : "";
}

/* Node mode: waits until the daemon's writer has handled every record of
 * the jobs that ended (cogpu history waits up to 1 s for it: an answer in
 * less than that came after the writer caught up). */
static void writer_idle(void) {
  static char out[1 << 17], err[1 << 12];
  for (int i = 0; i < th_ms(30); i++) {
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    cogpu_cmd((const char *const[]){"history", "--last", "1", NULL}, out,
              sizeof out, err, sizeof err);
    clock_gettime(CLOCK_MONOTONIC, &b);
    if ((b.tv_sec - a.tv_sec) * 1000 + (b.tv_nsec - a.tv_nsec) / 1000000 < 900)
      return;
  }
  th_fail(__FILE__, __LINE__, "the daemon's history writer never caught up");
}

/* The job, while the history is broken: exactly as the baseline (exit
 * status, stdout, stderr), and nothing left in the ledger. Single-user
 * mode: cogpu run says once why the history is off, with `cause`. */
static void run_broken(const char *id, const run_t *base, const char *cause) {
  static run_t r;
  static char err[1 << 14], want[1 << 14];
  job_fail(id, &r);
  ASSERT_EQ(r.code, base->code);
  ASSERT_STREQ(r.out, base->out);
  err_as_base(&r, id, err, sizeof err);
  err_as_base(base, "base", want, sizeof want);
  ASSERT_STREQ(err, want);
  if (th_node_mode()) {
    ASSERT_EQ(count_of(r.err, "job history"), 0);
  } else {
    ASSERT_EQ(count_of(r.err, "job history is off"), 1);
    ASSERT_CONTAINS(r.err, cause);
  }
  ledger_empty();
  if (th_node_mode())
    writer_idle();
}

/* In a mount namespace of the test's own, a tmpfs of 1 MiB on the history
 * directory. Root only; a full tmpfs is a real ENOSPC, with no signal
 * (RLIMIT_FSIZE would stand in for it with SIGXFSZ and EFBIG instead). */
static void small_tmpfs(const char *dir) {
  if (geteuid() != 0)
    SKIP("a full disk is a small tmpfs: needs root");
  if (unshare(CLONE_NEWNS) != 0)
    SKIP("no mount namespace here: %s", strerror(errno));
  ASSERT_EQ(mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL), 0);
  mkdir(dir, 0700);
  ASSERT_EQ(mount("cogpu-test", dir, "tmpfs", MS_NOSUID | MS_NODEV,
                  "size=1m,mode=0700"),
            0);
}

/* Fills the file system of dir: its last byte taken by dir/NAME. */
static void fill(const char *dir, const char *name) {
  char p[4600];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  ASSERT(fd >= 0);
  static char block[4096];
  ssize_t w;
  while ((w = write(fd, block, sizeof block)) > 0) {
  }
  ASSERT(w < 0 && errno == ENOSPC);
  while ((w = write(fd, block, 1)) > 0) {
  }
  close(fd);
}

/* The job runs, exits and prints exactly as with a working history, twice,
 * while the history is broken in way `how`; cogpu (cogpu run, or the
 * daemon in node mode) says once why, naming `cause`; the ledger keeps
 * nothing; once mended, the next job is recorded again. */
static void fails_safely(fail_t how, const char *cause) {
  ht_env();
  char dir[4400], db[4500], aside[4600], notadir[4200];
  snprintf(dir, sizeof dir, "%s", getenv("COGPU_HISTORY_DIR"));
  snprintf(db, sizeof db, "%s/history.db", dir);
  if (how == F_FULL)
    small_tmpfs(dir);
  if (th_node_mode())
    daemon_restart(); /* its log level, its mount namespace */
  static run_t base;
  job_fail("base", &base);
  ASSERT_EQ(base.code, 3);
  ASSERT_CONTAINS(base.out, "alloc 268435456 ok");
  ASSERT_CONTAINS(base.err, "unknown action fail-on-purpose");
  ASSERT_CONTAINS(base.err, "job base used at most");
  ASSERT(!strstr(base.err, "job history"));
  ASSERT_CONTAINS(history_json(NULL, NULL), "\"job_id\":\"base\"");
  size_t log0 = strlen(slurp_file(th_path("cogpud.log")));
  pid_t holder = -1;
  switch (how) {
  case F_CORRUPT:
    /* Garbage where the database was (the daemon stopped meanwhile: its
     * open connection would keep writing the file it had). */
    th_daemon_stop(SIGTERM);
    unlink(th_path("history/history.db-wal"));
    unlink(th_path("history/history.db-shm"));
    th_write_file(db, "garbage garbage garbage garbage garbage garbage "
                      "garbage garbage garbage garbage garbage garbage\n");
    if (th_node_mode())
      daemon_restart();
    break;
  case F_LOCKED: {
    holder = th_spawn_helper(
        "ht_lock_db", (const char *const[]){db, th_path("locked"), NULL});
    for (int t = 0; access(th_path("locked"), F_OK) != 0; t += 10) {
      ASSERT_LT(t, th_ms(10000));
      th_sleep_ms(10);
    }
    break;
  }
  case F_FULL:
    fill(dir, "filler");
    break;
  case F_UNWRITABLE:
    /* A directory that cannot be made: its parent is a file. */
    snprintf(notadir, sizeof notadir, "%s/notadir", th_tmpdir());
    th_write_file(notadir, "");
    snprintf(dir, sizeof dir, "%s/history", notadir);
    setenv("COGPU_HISTORY_DIR", dir, 1);
    if (th_node_mode())
      daemon_restart();
    break;
  }
  run_broken("j1", &base, cause);
  /* The failed write's connection was closed, which gave back its WAL
   * file's space: full again. */
  if (how == F_FULL)
    fill(dir, "filler2");
  run_broken("j2", &base, cause);
  if (th_node_mode()) {
    const char *log = daemon_log_since(log0);
    ASSERT_EQ(count_of(log, "job history is off"), 1);
    ASSERT_CONTAINS(log, cause);
  }
  /* A corrupt history cannot be read either; a locked one is read as it
   * was (WAL: readers are not blocked); a full one cannot be opened by a
   * new reader, which must make SQLite's shared-memory file (the writer's
   * connection, closed after its failure, took that file with it): a
   * clear error then. */
  static char out[1 << 16], err[1 << 13];
  int rc = cogpu_cmd((const char *const[]){"history", "--json", NULL}, out,
                     sizeof out, err, sizeof err);
  if (how == F_CORRUPT) {
    ASSERT_NE(rc, 0);
    ASSERT_CONTAINS(err, "not a database");
    ASSERT_CONTAINS(err, db);
  } else if (how == F_FULL) {
    ASSERT_NE(rc, 0);
    ASSERT_CONTAINS(err, "No space left on device");
    ASSERT_CONTAINS(err, db);
  } else if (how != F_UNWRITABLE) {
    if (rc != 0)
      th_fail(__FILE__, __LINE__, "cogpu history: exit %d: %s", rc, err);
    ASSERT_CONTAINS(out, "\"job_id\":\"base\"");
  }
  /* Mended: the next job is recorded; the records of the jobs that ran
   * while it was broken are not there (said when they ended). */
  switch (how) {
  case F_CORRUPT:
    snprintf(aside, sizeof aside, "%s.bad", db);
    ASSERT_EQ(rename(db, aside), 0);
    break;
  case F_LOCKED:
    kill(holder, SIGTERM);
    ASSERT_EQ(th_exit_code(th_wait(holder, th_ms(10000))), 0);
    break;
  case F_FULL:
    ASSERT_EQ(unlink(th_path("history/filler")), 0);
    ASSERT_EQ(unlink(th_path("history/filler2")), 0);
    break;
  case F_UNWRITABLE:
    ASSERT_EQ(unlink(notadir), 0);
    break;
  }
  static run_t j3;
  job_fail("j3", &j3);
  ASSERT_EQ(j3.code, base.code);
  ASSERT(!strstr(j3.err, "job history"));
  char *h = history_json(NULL, NULL);
  ASSERT_CONTAINS(h, "\"job_id\":\"j3\"");
  ASSERT(!strstr(h, "\"job_id\":\"j1\""));
  ASSERT(!strstr(h, "\"job_id\":\"j2\""));
  if (how == F_LOCKED || how == F_FULL)
    ASSERT_CONTAINS(h, "\"job_id\":\"base\"");
  if (th_node_mode())
    ASSERT_CONTAINS(daemon_log_since(log0), "job history is on again");
  ledger_empty();
}

TEST_IMPL(history_trust_fail_corrupt) {
  fails_safely(F_CORRUPT, "file is not a database");
}
TEST_IMPL(history_trust_fail_locked) {
  fails_safely(F_LOCKED, "database is locked");
}
TEST_IMPL(history_trust_fail_full) {
  fails_safely(F_FULL, "No space left on device");
}
TEST_IMPL(history_trust_fail_unwritable) {
  fails_safely(F_UNWRITABLE, "Not a directory");
}
