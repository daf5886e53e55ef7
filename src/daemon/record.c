/*
 * record.c: what the daemon knows of each job's GPU memory use, and the
 * job history it alone writes (docs/history.md).
 *
 * Each process under the preload library passes its usage page (a memfd
 * sealed against resizing, so a mapping of it can never fault) on its main
 * connection; the daemon maps it read-only and copies its figures into
 * the process's slot whenever the ledger looks at them (the ledger's
 * `sync` hook). The mapping outlives the process: when its connection
 * closes, however it died, the last figures it stored are still there
 * when its slot is freed. While jobs run, the loop's timer samples what
 * each job's processes use, once a second, into the job's memory timeline
 * (per GPU: the record is of the GPU where the job peaked, known only at
 * its end). When a job's slot is freed, the ledger's `ended` hook builds
 * its record, which a writer thread puts in the database: the loop never
 * waits for SQLite or for a user-name lookup.
 *
 * A service: it takes a page, a sample's tick or a query (with its
 * asker's tag) and hands back results; it knows nothing of connections,
 * and the dispatch (handle.c) replies to the asker.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <pwd.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "daemon/daemon-int.h"
#include "history/history.h"

#define REC_QUEUE_MAX 256u

/* A running job's memory timeline, by job slot: the slot's generation and
 * start name the job (a slot is used again, and a reset starts the
 * generations anew); one timeline per GPU the job has used. */
typedef struct rec_job_s {
  uint32_t gen;
  uint64_t attached_ns;
  uint64_t sum[LEDGER_MAX_GPUS]; /* this sample's, being added up */
  cogpu__hist_tl_t *tl[LEDGER_MAX_GPUS];
} rec_job_t;

/* A `cogpu history` query, run by the writer thread after the records
 * queued before it (so a job that ended before the request is in its
 * answer, with no waiting in the loop), then answered by the loop. */
typedef struct hq_s {
  cogpu__rec_answer_t a; /* first: what the loop is handed back */
  struct hq_s *next;
  uid_t uid;
  cogpu__hist_filter_t f;
} hq_t;
_Static_assert(offsetof(hq_t, a) == 0, "an answer is freed as its query");
/* Queries under way: on the node, and of one user. A query is quick (a
 * few ms) unless the database is locked (SQLite's bounded busy wait): the
 * bounds keep one user's stream of requests from delaying others' for
 * long, and memory bounded. */
#define HQ_MAX 64u
#define HQ_USER_MAX 4u

struct cogpu__drec_s {
  cogpu__daemon_t *d;
  cogpu__usage_t **page; /* LEDGER_MAX_SLOTS: mapped pages, by slot */
  uint32_t *page_gen;    /* the slot's generation the page belongs to */
  rec_job_t **job;       /* LEDGER_MAX_SLOTS: timelines, by job slot */
  uint32_t npages, njobs;
  uint64_t sampled_ns; /* the last sample (monotonic) */
  ledger_usage_hooks_t hooks;
  /* The writer thread and its queue. */
  pthread_t thread;
  bool started, stop;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  pthread_cond_t done_cv; /* a batch was written (or dropped) */
  cogpu__hist_rec_t *queue;
  cogpu__hist_rec_t *batch; /* the writer's copy of the queue, made at start */
  size_t nqueue;
  uint64_t queued, handled;  /* records given to the writer, and done by it */
  uint64_t written, dropped; /* for tests and the log */
  hq_t *hq, **hq_tail;       /* queries for the writer */
  hq_t *hq_run;              /* the writer's, until answered */
  hq_t *hq_done;             /* answered, for the loop */
  unsigned nhq;              /* all three */
  int efd;                   /* the loop's: queries answered */
  bool off_said;
  bool history_on;
  char path[512];
  int64_t max_age_ms, max_rows;
};

static uint64_t rd(const _Atomic uint64_t *p) {
  return atomic_load_explicit(p, memory_order_relaxed);
}

/* A page's figure on GPU g: the page is its process's to write, so what
 * it says is taken as at most what the GPU holds (a forged 2^63 made the
 * sums wrap, issue 23). */
static uint64_t page_rd(const struct cogpu_s *h, const _Atomic uint64_t *p,
                        uint32_t g) {
  uint64_t v = rd(p), total = h->st->hdr.gpus[g].total;
  return v < total ? v : total;
}

static void rec_sync(void *ctx, struct cogpu_s *h, uint32_t s) {
  struct cogpu__drec_s *r = ctx;
  ledger_slot_t *sl = &h->st->slots[s];
  const cogpu__usage_t *p = r->page[s];
  if (!p || r->page_gen[s] != atomic_load(&sl->gen))
    return;
  /* The page names GPUs as its process saw them at start; the ledger's
   * may differ after a move (migration). */
  for (uint32_t v = 0; v < h->st->hdr.ngpus; v++) {
    uint32_t g = cogpu__ledger_map_phys(sl->gpu_map, v);
    if (g >= h->st->hdr.ngpus)
      continue;
    atomic_store_explicit(&sl->usage.used[g], page_rd(h, &p->used[v], g),
                          memory_order_relaxed);
    atomic_store_explicit(&sl->usage.peak[g], page_rd(h, &p->peak[v], g),
                          memory_order_relaxed);
  }
  atomic_store_explicit(&sl->usage.peak_ns, rd(&p->peak_ns),
                        memory_order_relaxed);
}

static void page_drop(struct cogpu__drec_s *r, uint32_t s) {
  if (r->page[s]) {
    munmap(r->page[s], sizeof(cogpu__usage_t));
    r->npages--;
  }
  r->page[s] = NULL;
}

static void job_drop(struct cogpu__drec_s *r, uint32_t j) {
  rec_job_t *x = r->job[j];
  if (!x)
    return;
  for (uint32_t g = 0; g < LEDGER_MAX_GPUS; g++)
    free(x->tl[g]);
  free(x);
  r->job[j] = NULL;
  r->njobs--;
}

/* The timeline of the job in slot j, if it is that job's (create: made
 * when there is none, NULL if out of memory). */
static rec_job_t *job_get(struct cogpu__drec_s *r, struct cogpu_s *h,
                          uint32_t j, bool create) {
  const ledger_slot_t *js = &h->st->slots[j];
  uint32_t gen = atomic_load(&js->gen);
  rec_job_t *x = r->job[j];
  if (x && (x->gen != gen || x->attached_ns != js->attached_ns)) {
    job_drop(r, j); /* an earlier job's, that ended without a record */
    x = NULL;
  }
  if (x || !create)
    return x;
  x = calloc(1, sizeof *x);
  if (!x)
    return NULL;
  x->gen = gen;
  x->attached_ns = js->attached_ns;
  r->job[j] = x;
  r->njobs++;
  return x;
}

static int64_t ns_to_ms(uint64_t ns) {
  return (int64_t)(ns / 1000000u);
}

static int64_t realtime_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

bool cogpu__daemon_rec_sampling(cogpu__daemon_t *d) {
  const struct cogpu__drec_s *r = d->rec;
  return r && r->history_on && (r->npages || r->njobs);
}

void cogpu__daemon_rec_sample(cogpu__daemon_t *d) {
  struct cogpu__drec_s *r = d->rec;
  struct cogpu_s *h = d->dh;
  uint64_t now = cogpu__now_ns();
  /* The timer may run faster (the deadlock guard's delay while requests
   * wait): one sample a second at most. */
  if (!r || !r->history_on || !h ||
      (r->sampled_ns &&
       now - r->sampled_ns < REC_SAMPLE_MS * 1000000u * 9 / 10))
    return;
  r->sampled_ns = now;
  ledger_state_t *st = h->st;
  uint32_t ng = st->hdr.ngpus;
  uint64_t rt = (uint64_t)realtime_ms() * 1000000u;
  cogpu__ledger_lock(h);
  /* What each job's live processes use: the sum of their pages. */
  LEDGER_FOR_SLOTS_WHILE(st, s, r->npages) {
    const cogpu__usage_t *p = r->page[s];
    const ledger_slot_t *sl = &st->slots[s];
    if (!p || sl->state != SLOT_ACTIVE ||
        r->page_gen[s] != atomic_load(&sl->gen))
      continue;
    uint32_t j = cogpu__ledger_job_of(h, s);
    if (j == h->slot)
      continue;
    rec_job_t *x = job_get(r, h, j, true);
    for (uint32_t pg = 0; x && pg < ng; pg++) {
      /* Each page at most the GPU's total, and so the job's sum; the
       * page's GPUs as its process names them (rec_sync). */
      uint32_t g = cogpu__ledger_map_phys(sl->gpu_map, pg);
      if (g >= ng)
        continue;
      uint64_t v = page_rd(h, &p->used[pg], g), total = st->hdr.gpus[g].total;
      x->sum[g] =
          x->sum[g] >= total || v >= total - x->sum[g] ? total : x->sum[g] + v;
    }
  }
  /* Every job with a timeline gets this sample, 0 when none of its
   * processes is alive now (a script between two programs). */
  for (uint32_t j = 0; r->njobs && j < LEDGER_MAX_SLOTS; j++) {
    if (!r->job[j])
      continue;
    rec_job_t *x = job_get(r, h, j, false);
    if (!x || st->slots[j].state != SLOT_ACTIVE) {
      job_drop(r, j);
      continue;
    }
    uint64_t at_ms = rt > x->attached_ns ? (rt - x->attached_ns) / 1000000u : 0;
    for (uint32_t g = 0; g < ng; g++) {
      /* A GPU's timeline starts when the job first uses it. */
      if (!x->tl[g] && x->sum[g])
        x->tl[g] = calloc(1, sizeof *x->tl[g]);
      if (x->tl[g])
        cogpu__hist_tl_add(x->tl[g], at_ms, x->sum[g]);
      x->sum[g] = 0;
    }
  }
  cogpu__ledger_unlock(h);
}

/* Lock held, in the loop: the job of slot s ends. Its record is queued for
 * the writer; a full queue (the disk is that slow) drops it, said once. */
static void rec_ended(void *ctx, struct cogpu_s *h, uint32_t s) {
  struct cogpu__drec_s *r = ctx;
  ledger_slot_t *sl = &h->st->slots[s];
  page_drop(r, s);
  rec_job_t *job = job_get(r, h, s, false);
  /* The daemon's own slot is no job (h is the proxy of a client). */
  if (r->d->dh && s == r->d->dh->slot) {
    job_drop(r, s);
    return;
  }
  cogpu__job_report_t rep;
  cogpu__ledger_job_report(h, s, &rep);
  if (rep.gpu < 0) {
    job_drop(r, s);
    return; /* never used or reserved GPU memory: not a GPU job */
  }
  /* What its command needed, for the resumes of its next runs; learnt
   * whether or not history is kept. */
  cogpu__susp_learn(r->d, sl->uid, sl->command, h->st->hdr.gpus[rep.gpu].name,
                    rep.peak);
  if (!r->history_on) {
    job_drop(r, s);
    return;
  }
  pthread_mutex_lock(&r->mu);
  if (r->nqueue == REC_QUEUE_MAX) {
    r->dropped++;
    pthread_mutex_unlock(&r->mu);
    job_drop(r, s);
    return;
  }
  cogpu__hist_rec_t *x = &r->queue[r->nqueue++];
  r->queued++;
  memset(x, 0, sizeof *x);
  x->start_ms = ns_to_ms(sl->attached_ns);
  x->end_ms = realtime_ms();
  x->uid = sl->uid;
  x->exit_status = sl->exit_status ? (int32_t)(sl->exit_status - 1) : -1;
  snprintf(x->command, sizeof x->command, "%s", sl->command);
  snprintf(x->job_id, sizeof x->job_id, "%s", sl->job_id);
  x->gpu = rep.gpu;
  const ledger_gpu_t *gp = &h->st->hdr.gpus[rep.gpu];
  snprintf(x->gpu_uuid, sizeof x->gpu_uuid, "%s", gp->uuid);
  snprintf(x->gpu_name, sizeof x->gpu_name, "%s", gp->name);
  x->declared = rep.reserved;
  x->peak = rep.peak;
  x->peak_after_ms = rep.peak_after_ms;
  x->waited_ms = rep.waited_ms;
  x->run_ms = rep.run_ms;
  x->suspensions = rep.suspensions;
  x->guard_failures = rep.guard_failures;
  /* The peak goes in at its time: samples a second apart can miss it, and
   * the timeline's highest point is the job's peak. */
  cogpu__hist_tl_t none = {0},
                   *tl = job && job->tl[rep.gpu] ? job->tl[rep.gpu] : &none;
  cogpu__hist_tl_add(tl, rep.peak_after_ms, rep.peak);
  cogpu__hist_tl_store(x, tl);
  pthread_cond_signal(&r->cv);
  pthread_mutex_unlock(&r->mu);
  job_drop(r, s);
}

/* History off, or failing: said once per cause, then tried again at the
 * next record (a disk that was full may have room again). */
static void say_off(struct cogpu__drec_s *r, int rc) {
  static int last_rc;
  if (r->off_said && rc == last_rc)
    return;
  r->off_said = true;
  last_rc = rc;
  cogpu__log(COGPU_LOG_WARN, "job history is off: %s", cogpu_last_error());
}

/* In the writer thread: the records q may see, in a sealed memfd. */
static void run_query(struct cogpu__drec_s *r, hq_t *q) {
  cogpu__hist_t *db = NULL;
  cogpu__hist_rec_t *v = NULL;
  size_t n = 0;
  q->a.fd = -1;
  int rc = cogpu__hist_open(r->path, false, &db);
  if (rc == 0)
    rc = cogpu__hist_query(db, &q->f, &v, &n);
  cogpu__hist_close(db);
  if (rc) {
    q->a.rc = rc;
    snprintf(q->a.msg, sizeof q->a.msg, "%s", cogpu_last_error());
    return;
  }
  cogpu__hist_hdr_t hh = {.magic = COGPU_HIST_MAGIC,
                          .version = COGPU_HIST_VERSION,
                          .n = (uint32_t)n,
                          .rec_size = sizeof *v};
  int mfd = memfd_create("cogpu-history", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  size_t bytes = n * sizeof *v;
  /* A short write (a fault test's) sets no errno: its error is EIO, not
   * whatever an earlier call left there. */
  size_t hlen =
      cogpu__fault_fails(COGPU_FP_HIST_WRITE) ? sizeof hh / 2 : sizeof hh;
  errno = 0;
  if (mfd < 0 || write(mfd, &hh, hlen) != (ssize_t)sizeof hh ||
      (bytes && write(mfd, v, bytes) != (ssize_t)bytes) ||
      fcntl(mfd, F_ADD_SEALS,
            F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) != 0) {
    q->a.rc = errno ? -errno : -EIO;
    snprintf(q->a.msg, sizeof q->a.msg, "cannot pass the history: %s",
             strerror(-q->a.rc));
    if (mfd >= 0)
      close(mfd);
    mfd = -1;
  }
  free(v);
  q->a.fd = mfd;
}

static void *writer(void *arg) {
  struct cogpu__drec_s *r = arg;
  cogpu__hist_t *db = NULL;
  cogpu__hist_rec_t *batch = r->batch;
  pthread_mutex_lock(&r->mu);
  for (;;) {
    while (!r->nqueue && !r->hq && !r->stop)
      pthread_cond_wait(&r->cv, &r->mu);
    if (!r->nqueue && !r->hq && r->stop)
      break;
    size_t n = r->nqueue;
    memcpy(batch, r->queue, n * sizeof *batch);
    r->nqueue = 0;
    /* The queries asked so far, taken with the records queued before
     * them: answered once those are written. */
    hq_t *qs = r->hq;
    r->hq_run = qs;
    r->hq = NULL;
    r->hq_tail = &r->hq;
    pthread_mutex_unlock(&r->mu);
    for (size_t i = 0; i < n; i++) {
      cogpu__user_name(batch[i].uid, batch[i].user, sizeof batch[i].user);
      int rc = db ? 0 : cogpu__hist_open(r->path, true, &db);
      if (rc == 0)
        rc = cogpu__hist_add(db, &batch[i], r->max_age_ms, r->max_rows);
      if (rc) {
        say_off(r, rc);
        cogpu__hist_close(db);
        db = NULL;
        continue;
      }
      if (r->off_said) {
        cogpu__log(COGPU_LOG_INFO, "job history is on again (%s)", r->path);
        r->off_said = false;
      }
      __atomic_add_fetch(&r->written, 1, __ATOMIC_RELAXED);
    }
    for (hq_t *q = qs; q; q = q->next)
      run_query(r, q);
    pthread_mutex_lock(&r->mu);
    r->hq_run = NULL;
    r->handled += n;
    pthread_cond_broadcast(&r->done_cv);
    if (qs) {
      hq_t *last = qs;
      while (last->next)
        last = last->next;
      last->next = r->hq_done;
      r->hq_done = qs;
      uint64_t one = 1;
      if (write(r->efd, &one, sizeof one) < 0) {
        /* the counter is full: the loop is woken already */
      }
    }
  }
  pthread_mutex_unlock(&r->mu);
  cogpu__hist_close(db);
  return NULL;
}

/* The peaks resume admission learns from (cogpu__susp_learn): the most
 * recent runs in the history, oldest first, so that each command keeps its
 * newest. */
#define LEARN_FROM_RUNS 2000u
static void learn_from(struct cogpu__drec_s *r, cogpu__hist_t *db) {
  cogpu__hist_filter_t f = {.last = LEARN_FROM_RUNS};
  cogpu__hist_rec_t *v = NULL;
  size_t n = 0;
  if (cogpu__hist_query(db, &f, &v, &n) != 0)
    return; /* a hint lost, nothing more: the records stay for queries */
  for (size_t i = n; i-- > 0;)
    cogpu__susp_learn(r->d, v[i].uid, v[i].command, v[i].gpu_name, v[i].peak);
  free(v);
}

int cogpu__daemon_rec_start(cogpu__daemon_t *d) {
  struct cogpu__drec_s *r = calloc(1, sizeof *r);
  if (!r)
    return -ENOMEM;
  r->page = calloc(LEDGER_MAX_SLOTS, sizeof *r->page);
  r->page_gen = calloc(LEDGER_MAX_SLOTS, sizeof *r->page_gen);
  r->job = calloc(LEDGER_MAX_SLOTS, sizeof *r->job);
  r->queue = calloc(REC_QUEUE_MAX, sizeof *r->queue);
  if (!r->page || !r->page_gen || !r->job || !r->queue) {
    free(r->page);
    free(r->page_gen);
    free(r->job);
    free(r->queue);
    free(r);
    return -ENOMEM;
  }
  r->d = d;
  r->hq_tail = &r->hq;
  r->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  pthread_mutex_init(&r->mu, NULL);
  pthread_cond_init(&r->cv, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&r->done_cv, &ca);
  pthread_condattr_destroy(&ca);
  r->max_age_ms = d->cfg.v[COGPU_OPT_HISTORY_MAX_AGE].i;
  r->max_rows = d->cfg.v[COGPU_OPT_HISTORY_MAX_ROWS].i;
  int on = cogpu__hist_path(&d->cfg, true, r->path, sizeof r->path);
  r->history_on = on == 1;
  if (on == 0)
    cogpu__log(COGPU_LOG_INFO, "job history is off (history_dir=none)");
  else if (on < 0)
    cogpu__log(COGPU_LOG_WARN, "job history is off: %s", cogpu_last_error());
  if (r->efd < 0) {
    r->history_on = false;
    cogpu__log(COGPU_LOG_WARN, "job history is off: eventfd: %s",
               strerror(errno));
  }
  if (r->history_on) {
    /* Open it now, so that a database that cannot be used is said at
     * start, not at the first job's end. */
    cogpu__hist_t *db = NULL;
    int rc = cogpu__hist_open(r->path, true, &db);
    if (rc != 0)
      say_off(r, rc); /* its cause: the first record's failure is not news */
    else
      learn_from(r, db);
    cogpu__hist_close(db);
    /* The writer's batch, before it starts: without it every record
     * would be dropped, and said nowhere. */
    if (!cogpu__fault_fails(COGPU_FP_HIST_BATCH))
      r->batch = malloc(REC_QUEUE_MAX * sizeof *r->batch);
    if (!r->batch) {
      r->history_on = false;
      cogpu__log(COGPU_LOG_WARN,
                 "job history is off: out of memory for the writer");
    }
  }
  if (r->history_on) {
    r->started = pthread_create(&r->thread, NULL, writer, r) == 0;
    if (!r->started) {
      r->history_on = false;
      cogpu__log(COGPU_LOG_WARN, "job history is off: no writer thread");
    }
  }
  r->hooks =
      (ledger_usage_hooks_t){.ctx = r, .sync = rec_sync, .ended = rec_ended};
  d->rec = r;
  d->host.usage = &r->hooks;
  return 0;
}

void cogpu__daemon_rec_stop(cogpu__daemon_t *d) {
  struct cogpu__drec_s *r = d->rec;
  if (!r)
    return;
  d->host.usage = NULL;
  if (r->started) {
    pthread_mutex_lock(&r->mu);
    r->stop = true;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
    pthread_join(r->thread, NULL);
  }
  for (hq_t *q = r->hq_done, *next; q; q = next) {
    next = q->next;
    cogpu__daemon_rec_answer_free(&q->a);
  }
  for (hq_t *q = r->hq, *next; q; q = next) {
    next = q->next;
    free(q);
  }
  if (r->efd >= 0)
    close(r->efd);
  for (uint32_t s = 0; s < LEDGER_MAX_SLOTS; s++) {
    page_drop(r, s);
    job_drop(r, s);
  }
  free(r->page);
  free(r->page_gen);
  free(r->job);
  free(r->queue);
  free(r->batch);
  free(r);
  d->rec = NULL;
}

int cogpu__daemon_rec_usage(cogpu__daemon_t *d, uint32_t slot, uint32_t gen,
                            int fd, uint64_t size, char *msg, size_t len) {
  struct cogpu__drec_s *x = d->rec;
  struct stat sb;
  int seals = fd >= 0 ? fcntl(fd, F_GET_SEALS) : -1;
  /* Only a memfd that can neither shrink nor grow: a mapping of a file the
   * client could truncate would fault in the daemon. */
  if (!x || fd < 0 || size != sizeof(cogpu__usage_t) || fstat(fd, &sb) != 0 ||
      !S_ISREG(sb.st_mode) || sb.st_size != (off_t)sizeof(cogpu__usage_t) ||
      seals < 0 ||
      (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) !=
          (F_SEAL_SHRINK | F_SEAL_GROW)) {
    snprintf(msg, len, "a usage page must be a sealed memfd of %zu bytes",
             sizeof(cogpu__usage_t));
    return -EINVAL;
  }
  void *p = mmap(NULL, sizeof(cogpu__usage_t), PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED)
    return -errno;
  page_drop(x, slot);
  x->page[slot] = p;
  x->page_gen[slot] = gen;
  x->npages++;
  return 0;
}

void cogpu__daemon_rec_drop(cogpu__daemon_t *d, uint32_t slot) {
  if (d->rec && slot < LEDGER_MAX_SLOTS)
    page_drop(d->rec, slot);
}

uint64_t cogpu__daemon_rec_written(cogpu__daemon_t *d) {
  return d->rec ? __atomic_load_n(&d->rec->written, __ATOMIC_RELAXED) : 0;
}

/* A query of uid's (who may see every user's jobs if admin): who may see
 * what is decided here; the query itself goes to the writer thread. */
int cogpu__daemon_rec_query(cogpu__daemon_t *d, uint64_t tag, uid_t uid,
                            bool admin, const cogpu__m_history_t *q, char *msg,
                            size_t len) {
  struct cogpu__drec_s *x = d->rec;
  cogpu__hist_filter_t f = {.has_uid = q->has_uid,
                            .uid = q->uid,
                            .since_ms = q->since_s * 1000,
                            .last = q->last};
  if (!admin) {
    if (q->has_uid && q->uid != uid) {
      snprintf(msg, len,
               "only root and the admin group may see other users' jobs");
      return -EPERM;
    }
    f.has_uid = true;
    f.uid = uid;
  }
  if (!x || !x->history_on || !x->started) {
    snprintf(msg, len, "the node keeps no job history (history_dir=none)");
    return -ENOENT;
  }
  pthread_mutex_lock(&x->mu);
  /* A user's queries wherever they are: queued, being run by the writer
   * (taken off the queue with the records before them: uncounted, a user
   * could have had twice the bound under way), or answered and not yet
   * sent. */
  unsigned mine = 0;
  hq_t *lists[] = {x->hq, x->hq_run, x->hq_done};
  for (size_t k = 0; k < sizeof lists / sizeof lists[0]; k++)
    for (hq_t *o = lists[k]; o; o = o->next)
      mine += o->uid == uid;
  bool full = x->nhq >= HQ_MAX || mine >= HQ_USER_MAX;
  hq_t *n = full ? NULL : calloc(1, sizeof *n);
  if (n) {
    n->a.tag = tag;
    n->a.fd = -1;
    n->uid = uid;
    n->f = f;
    *x->hq_tail = n;
    x->hq_tail = &n->next;
    x->nhq++;
    pthread_cond_signal(&x->cv);
  }
  pthread_mutex_unlock(&x->mu);
  if (!n) {
    snprintf(msg, len, "%s: try again in a moment",
             full ? "too many history requests under way" : "out of memory");
    return full ? -EBUSY : -ENOMEM;
  }
  return 1;
}

int cogpu__daemon_rec_fd(cogpu__daemon_t *d) {
  return d->rec && d->rec->history_on ? d->rec->efd : -1;
}

/* In the loop: the queries the writer has answered, in a list the caller
 * owns. The wake-up is read before the list is taken, so that an answer
 * added meanwhile wakes the loop again. */
cogpu__rec_answer_t *cogpu__daemon_rec_take(cogpu__daemon_t *d) {
  struct cogpu__drec_s *x = d->rec;
  uint64_t cnt;
  if (!x || read(x->efd, &cnt, sizeof cnt) < 0) {
    /* spurious: nothing to take */
  }
  if (!x)
    return NULL;
  pthread_mutex_lock(&x->mu);
  hq_t *done = x->hq_done;
  x->hq_done = NULL;
  for (hq_t *q = done; q; q = q->next)
    x->nhq--;
  pthread_mutex_unlock(&x->mu);
  for (hq_t *q = done; q; q = q->next)
    q->a.next = q->next ? &q->next->a : NULL;
  return done ? &done->a : NULL;
}

void cogpu__daemon_rec_answer_free(cogpu__rec_answer_t *a) {
  if (a->fd >= 0)
    close(a->fd);
  free(a); /* the first member of its hq_t */
}
