/*
 * history.c: the job history database (history.h, docs/history.md): one
 * SQLite file in WAL mode, so that readers (`cogpu history`) never block
 * the writer, with retention by age and by row count applied after each
 * insert. Every SQLite failure (a corrupt or locked file, a full disk) is
 * returned as an error with SQLite's message; the callers then run on
 * without history.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pwd.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "history/history.h"

struct cogpu__hist_s {
  sqlite3 *db;
  char path[512];
};

void cogpu__hist_tl_add(cogpu__hist_tl_t *t, uint64_t at_ms, uint64_t bytes) {
  if (t->ms == 0)
    t->ms = 1000;
  uint64_t i = at_ms / t->ms;
  while (i >= COGPU_HIST_TL_MAX) {
    /* Full: keep every other sample (the higher of each pair, so that no
     * peak is lost), at twice the interval. */
    for (uint32_t k = 0; k < COGPU_HIST_TL_MAX / 2; k++) {
      uint64_t a = t->v[2 * k], b = t->v[2 * k + 1];
      t->v[k] = a > b ? a : b;
    }
    memset(t->v + COGPU_HIST_TL_MAX / 2, 0,
           COGPU_HIST_TL_MAX / 2 * sizeof t->v[0]);
    t->n = (t->n + 1) / 2;
    t->ms *= 2;
    i = at_ms / t->ms;
  }
  /* Slots the sampler skipped hold what it saw last. */
  for (; t->n < i; t->n++)
    t->v[t->n] = t->last;
  if (i >= t->n) {
    t->v[i] = bytes;
    t->n = (uint32_t)i + 1;
  } else if (bytes > t->v[i]) {
    t->v[i] = bytes;
  }
  if (at_ms >= t->last_at_ms) {
    t->last = bytes;
    t->last_at_ms = at_ms;
  }
}

void cogpu__hist_tl_store(cogpu__hist_rec_t *r, const cogpu__hist_tl_t *t) {
  r->tl_n = 0;
  r->tl_ms = 0;
  memset(r->tl, 0, sizeof r->tl);
  if (!t)
    return;
  r->tl_n = t->n <= COGPU_HIST_TL_MAX ? t->n : COGPU_HIST_TL_MAX;
  r->tl_ms = t->ms;
  memcpy(r->tl, t->v, r->tl_n * sizeof r->tl[0]);
}

int cogpu__hist_path(const cogpu__config_t *cfg, bool for_daemon, char *buf,
                     size_t len) {
  const char *dir = cfg->v[COGPU_OPT_HISTORY_DIR].s;
  if (!strcmp(dir, "none"))
    return 0;
  if (dir[0]) {
    snprintf(buf, len, "%s/history.db", dir);
    return 1;
  }
  if (for_daemon) {
    snprintf(buf, len, "/var/lib/cogpu/history.db");
    return 1;
  }
  const char *xdg = getenv("XDG_STATE_HOME");
  if (xdg && xdg[0] == '/') {
    snprintf(buf, len, "%s/cogpu/history.db", xdg);
    return 1;
  }
  const char *home = getenv("HOME");
  struct passwd pw, *res = NULL;
  char tmp[1024];
  if ((!home || home[0] != '/') &&
      getpwuid_r(geteuid(), &pw, tmp, sizeof tmp, &res) == 0 && res)
    home = res->pw_dir;
  if (!home || home[0] != '/')
    return cogpu__seterr(-ENOENT, "no home directory to keep the job "
                                  "history in: set history_dir");
  snprintf(buf, len, "%s/.local/state/cogpu/history.db", home);
  return 1;
}

/* mkdir -p of path's directory, private to its owner. */
static int make_dirs(const char *path) {
  char d[512];
  snprintf(d, sizeof d, "%s", path);
  char *slash = strrchr(d, '/');
  if (!slash || slash == d)
    return 0;
  *slash = 0;
  int rc = cogpu__mkdirs(d, 0700);
  if (rc) {
    char why[600]; /* the message buffer is the one seterr writes */
    snprintf(why, sizeof why, "%s", cogpu_last_error());
    return cogpu__seterr(rc, "cannot make the job history's directory: %s",
                         why);
  }
  return 0;
}

static int db_err(cogpu__hist_t *h, int src, const char *what) {
  /* A full disk is "disk I/O error" when the write that failed was to the
   * shared-memory file, "database or disk is full" otherwise: both say
   * which. SQLite keeps the system's errno of I/O and open errors only;
   * SQLITE_FULL comes from ENOSPC (cogpu sets no page-count limit). */
  int sys = src == SQLITE_FULL ? ENOSPC
            : h->db && (src == SQLITE_IOERR || src == SQLITE_CANTOPEN)
                ? sqlite3_system_errno(h->db)
                : 0;
  char why[96] = "";
  if (sys > 0)
    snprintf(why, sizeof why, " (%s)", strerror(sys));
  if (sys == ENOSPC)
    src = SQLITE_FULL;
  int rc =
      src == SQLITE_BUSY || src == SQLITE_LOCKED      ? -EBUSY
      : src == SQLITE_FULL                            ? -ENOSPC
      : src == SQLITE_CORRUPT || src == SQLITE_NOTADB ? -EILSEQ
      : src == SQLITE_READONLY || src == SQLITE_PERM || src == SQLITE_CANTOPEN
          ? -EACCES
          : -EIO;
  return cogpu__seterr(rc, "job history %s: %s: %s%s%s", h->path, what,
                       h->db ? sqlite3_errmsg(h->db) : sqlite3_errstr(src), why,
                       rc == -EILSEQ ? " (move the file away to start a new "
                                       "history)"
                                     : "");
}

/* The database's directory must be the caller's and writable by it
 * alone: whoever else can write there could put a database (or a link) in
 * the file's place, and have the writer write, and readers believe, what
 * they like. */
static int dir_safe(const char *path) {
  char d[512];
  snprintf(d, sizeof d, "%s", path);
  char *slash = strrchr(d, '/');
  if (!slash)
    snprintf(d, sizeof d, ".");
  else if (slash == d)
    d[1] = 0; /* "/" */
  else
    *slash = 0;
  struct stat sb;
  if (stat(d, &sb) != 0)
    return cogpu__seterr(-errno, "job history: %s: %s", d, strerror(errno));
  uid_t me = geteuid();
  if (!S_ISDIR(sb.st_mode))
    return cogpu__seterr(-ENOTDIR, "job history: %s is not a directory", d);
  if (sb.st_uid != me)
    return cogpu__seterr(-EPERM,
                         "job history: %s is not owned by uid %u but by uid "
                         "%u: not used (set history_dir to a directory of "
                         "its own)",
                         d, (unsigned)me, (unsigned)sb.st_uid);
  if (sb.st_mode & 022)
    return cogpu__seterr(-EPERM,
                         "job history: %s is writable by others (mode %04o): "
                         "not used (make it mode 0700)",
                         d, (unsigned)(sb.st_mode & 07777));
  return 0;
}

/* A job history says what its users ran and when: the database and its
 * WAL files are their owner's alone (SQLite makes the WAL files with the
 * database's mode). It is made 0600 whatever the umask, and a file an
 * older cogpu left readable by others is made private. */
static void make_private(const char *path, const char *suffix) {
  char p[600];
  snprintf(p, sizeof p, "%s%s", path, suffix);
  struct stat sb;
  if (stat(p, &sb) == 0 && sb.st_uid == geteuid() && (sb.st_mode & 077))
    chmod(p, sb.st_mode & 0700);
}

static int file_private(const char *path) {
  int fd = cogpu__fault_fails(COGPU_FP_HIST_OPEN)
               ? (errno = EMFILE, -1)
               : open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0)
    return cogpu__seterr(-errno, "job history %s: cannot open it: %s", path,
                         strerror(errno));
  struct stat sb;
  int rc = fstat(fd, &sb) != 0 ? -errno : 0;
  close(fd);
  if (rc == 0 && sb.st_uid != geteuid())
    rc = cogpu__seterr(-EPERM, "job history %s is owned by uid %u: not used",
                       path, (unsigned)sb.st_uid);
  if (rc == 0) {
    make_private(path, "");
    make_private(path, "-wal");
    make_private(path, "-shm");
  }
  return rc;
}

static const char schema[] =
    "CREATE TABLE IF NOT EXISTS jobs ("
    " id INTEGER PRIMARY KEY AUTOINCREMENT, start_ms INTEGER, end_ms INTEGER,"
    " uid INTEGER, user TEXT, command TEXT, job_id TEXT, gpu INTEGER,"
    " gpu_uuid TEXT, gpu_name TEXT, declared INTEGER, peak INTEGER,"
    " peak_after_ms INTEGER, waited_ms INTEGER, run_ms INTEGER,"
    " exit_status INTEGER, suspensions INTEGER, guard_failures INTEGER,"
    " tl_ms INTEGER, timeline BLOB);"
    "CREATE INDEX IF NOT EXISTS jobs_end ON jobs(end_ms);"
    "CREATE INDEX IF NOT EXISTS jobs_uid ON jobs(uid, end_ms);";

int cogpu__hist_open(const char *path, bool create, cogpu__hist_t **out) {
  cogpu__hist_t *h = calloc(1, sizeof *h);
  if (!h)
    return cogpu__seterr(-ENOMEM, "out of memory");
  snprintf(h->path, sizeof h->path, "%s", path);
  int rc = create ? make_dirs(path) : 0;
  if (rc == 0 && !create && access(path, F_OK) != 0)
    rc = cogpu__seterr(-ENOENT, "no job history at %s yet", path);
  if (rc == 0)
    rc = dir_safe(path);
  if (rc == 0 && create)
    rc = file_private(path);
  int src = SQLITE_OK;
  if (rc == 0) {
    src = sqlite3_open_v2(path, &h->db,
                          SQLITE_OPEN_READWRITE |
                              (create ? SQLITE_OPEN_CREATE : 0) |
                              SQLITE_OPEN_NOMUTEX,
                          NULL);
    if (src != SQLITE_OK)
      rc = db_err(h, src, "open");
  }
  if (rc == 0) {
    sqlite3_busy_timeout(h->db, 2000);
    /* The first statement reads the file: a corrupt one fails here. WAL:
     * readers never block the writer, nor it them. */
    sqlite3_stmt *st = NULL;
    src = sqlite3_prepare_v2(h->db, "PRAGMA journal_mode=WAL", -1, &st, NULL);
    if (src == SQLITE_OK)
      src = sqlite3_step(st);
    if (src == SQLITE_ROW &&
        strcmp((const char *)sqlite3_column_text(st, 0), "wal") != 0)
      src = SQLITE_CANTOPEN;
    sqlite3_finalize(st);
    if (src != SQLITE_ROW)
      rc = db_err(h, src, "cannot use it");
  }
  if (rc == 0) {
    src = sqlite3_exec(h->db, "PRAGMA synchronous=NORMAL", NULL, NULL, NULL);
    if (src == SQLITE_OK)
      src = sqlite3_exec(h->db, schema, NULL, NULL, NULL);
    if (src != SQLITE_OK)
      rc = db_err(h, src, "cannot use it");
  }
  if (rc) {
    cogpu__hist_close(h);
    return rc;
  }
  *out = h;
  return 0;
}

void cogpu__hist_close(cogpu__hist_t *h) {
  if (!h)
    return;
  if (h->db)
    sqlite3_close(h->db);
  free(h);
}

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int cogpu__hist_add(cogpu__hist_t *h, const cogpu__hist_rec_t *r,
                    int64_t max_age_ms, int64_t max_rows) {
  static const char ins[] =
      "INSERT INTO jobs (start_ms, end_ms, uid, user, command, job_id, gpu,"
      " gpu_uuid, gpu_name, declared, peak, peak_after_ms, waited_ms, run_ms,"
      " exit_status, suspensions, guard_failures, tl_ms, timeline)"
      " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)";
  sqlite3_stmt *st = NULL;
  int src = sqlite3_exec(h->db, "BEGIN IMMEDIATE", NULL, NULL, NULL);
  if (src != SQLITE_OK)
    return db_err(h, src, "cannot write");
  src = sqlite3_prepare_v2(h->db, ins, -1, &st, NULL);
  if (src == SQLITE_OK) {
    int i = 1;
    sqlite3_bind_int64(st, i++, r->start_ms);
    sqlite3_bind_int64(st, i++, r->end_ms);
    sqlite3_bind_int64(st, i++, r->uid);
    sqlite3_bind_text(st, i++, r->user, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, i++, r->command, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, i++, r->job_id, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, i++, r->gpu);
    sqlite3_bind_text(st, i++, r->gpu_uuid, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, i++, r->gpu_name, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, i++, (int64_t)r->declared);
    sqlite3_bind_int64(st, i++, (int64_t)r->peak);
    sqlite3_bind_int64(st, i++, (int64_t)r->peak_after_ms);
    sqlite3_bind_int64(st, i++, (int64_t)r->waited_ms);
    sqlite3_bind_int64(st, i++, (int64_t)r->run_ms);
    sqlite3_bind_int64(st, i++, r->exit_status);
    sqlite3_bind_int64(st, i++, r->suspensions);
    sqlite3_bind_int64(st, i++, r->guard_failures);
    sqlite3_bind_int64(st, i++, (int64_t)r->tl_ms);
    uint32_t n = r->tl_n <= COGPU_HIST_TL_MAX ? r->tl_n : COGPU_HIST_TL_MAX;
    sqlite3_bind_blob(st, i++, r->tl, (int)(n * sizeof r->tl[0]),
                      SQLITE_TRANSIENT);
    src = sqlite3_step(st);
    if (src == SQLITE_DONE)
      src = SQLITE_OK;
  }
  sqlite3_finalize(st);
  /* Retention: older than max_age, and beyond the newest max_rows. */
  char sql[256];
  if (src == SQLITE_OK && max_age_ms >= 0) {
    snprintf(sql, sizeof sql, "DELETE FROM jobs WHERE end_ms < %lld",
             (long long)(now_ms() - max_age_ms));
    src = sqlite3_exec(h->db, sql, NULL, NULL, NULL);
  }
  /* The newest max_rows by id (ids only grow: AUTOINCREMENT). Not "the
   * row max_rows from the newest" (ORDER BY id DESC LIMIT 1 OFFSET n):
   * SQLite steps through n rows for an OFFSET, and at the default 100,000
   * every record took 16 ms (bench-history). max(id) is one index lookup;
   * the ids of the newest rows have no gaps unless some of them were older
   * than history_max_age, whose deletion comes first anyway. */
  if (src == SQLITE_OK && max_rows > 0) {
    snprintf(sql, sizeof sql,
             "DELETE FROM jobs WHERE id <= (SELECT max(id) FROM jobs) - %lld",
             (long long)max_rows);
    src = sqlite3_exec(h->db, sql, NULL, NULL, NULL);
  }
  if (src == SQLITE_OK)
    src = sqlite3_exec(h->db, "COMMIT", NULL, NULL, NULL);
  if (src != SQLITE_OK) {
    int rc = db_err(h, src, "cannot write");
    sqlite3_exec(h->db, "ROLLBACK", NULL, NULL, NULL);
    return rc;
  }
  return 0;
}

static void col_text(sqlite3_stmt *st, int i, char *dst, size_t len) {
  const unsigned char *t = sqlite3_column_text(st, i);
  snprintf(dst, len, "%s", t ? (const char *)t : "");
}

int cogpu__hist_query(cogpu__hist_t *h, const cogpu__hist_filter_t *f,
                      cogpu__hist_rec_t **out, size_t *n) {
  static const char q[] =
      "SELECT id, start_ms, end_ms, uid, user, command, job_id, gpu,"
      " gpu_uuid, gpu_name, declared, peak, peak_after_ms, waited_ms, run_ms,"
      " exit_status, suspensions, guard_failures, tl_ms, timeline FROM jobs"
      " WHERE (?1 = 0 OR uid = ?2) AND end_ms >= ?3"
      " ORDER BY end_ms DESC, id DESC LIMIT ?4";
  *out = NULL;
  *n = 0;
  sqlite3_stmt *st = NULL;
  int src = sqlite3_prepare_v2(h->db, q, -1, &st, NULL);
  if (src != SQLITE_OK)
    return db_err(h, src, "cannot read");
  sqlite3_bind_int(st, 1, f->has_uid);
  sqlite3_bind_int64(st, 2, f->uid);
  sqlite3_bind_int64(st, 3, f->since_ms);
  sqlite3_bind_int64(st, 4, f->last ? (int64_t)f->last : -1);
  size_t cap = 0;
  cogpu__hist_rec_t *v = NULL;
  while ((src = sqlite3_step(st)) == SQLITE_ROW) {
    if (*n == cap) {
      size_t nc = cap ? 2 * cap : 16;
      cogpu__hist_rec_t *nv = realloc(v, nc * sizeof *nv);
      if (!nv) {
        free(v);
        sqlite3_finalize(st);
        return cogpu__seterr(-ENOMEM, "out of memory");
      }
      v = nv;
      cap = nc;
    }
    cogpu__hist_rec_t *r = &v[(*n)++];
    memset(r, 0, sizeof *r);
    int i = 0;
    r->id = sqlite3_column_int64(st, i++);
    r->start_ms = sqlite3_column_int64(st, i++);
    r->end_ms = sqlite3_column_int64(st, i++);
    r->uid = (uint32_t)sqlite3_column_int64(st, i++);
    col_text(st, i++, r->user, sizeof r->user);
    col_text(st, i++, r->command, sizeof r->command);
    col_text(st, i++, r->job_id, sizeof r->job_id);
    r->gpu = (int32_t)sqlite3_column_int64(st, i++);
    col_text(st, i++, r->gpu_uuid, sizeof r->gpu_uuid);
    col_text(st, i++, r->gpu_name, sizeof r->gpu_name);
    r->declared = (uint64_t)sqlite3_column_int64(st, i++);
    r->peak = (uint64_t)sqlite3_column_int64(st, i++);
    r->peak_after_ms = (uint64_t)sqlite3_column_int64(st, i++);
    r->waited_ms = (uint64_t)sqlite3_column_int64(st, i++);
    r->run_ms = (uint64_t)sqlite3_column_int64(st, i++);
    r->exit_status = (int32_t)sqlite3_column_int64(st, i++);
    r->suspensions = (uint32_t)sqlite3_column_int64(st, i++);
    r->guard_failures = (uint32_t)sqlite3_column_int64(st, i++);
    r->tl_ms = (uint64_t)sqlite3_column_int64(st, i++);
    const void *blob = sqlite3_column_blob(st, i);
    int bytes = sqlite3_column_bytes(st, i);
    size_t nt = bytes > 0 ? (size_t)bytes / sizeof r->tl[0] : 0;
    if (nt > COGPU_HIST_TL_MAX)
      nt = COGPU_HIST_TL_MAX;
    if (blob && nt)
      memcpy(r->tl, blob, nt * sizeof r->tl[0]);
    r->tl_n = (uint32_t)nt;
  }
  sqlite3_finalize(st);
  if (src != SQLITE_DONE) {
    free(v);
    *n = 0;
    return db_err(h, src, "cannot read");
  }
  *out = v;
  return 0;
}
