/*
 * history.h: finished jobs in SQLite (docs/history.md). In node mode the
 * daemon is the one writer (its database under history_dir, root's); in
 * single-user mode each user's own database, written by the cogpu run that
 * ends the job. Readers take the records through cogpu__hist_query (the
 * daemon answers `cogpu history` with them, filtered by who asks).
 *
 * Depends on common only: the ledger knows nothing of it, and a node whose
 * database cannot be used runs exactly as without one.
 */
#ifndef COGPU_HISTORY_H
#define COGPU_HISTORY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "internal.h"

/* A memory timeline: at most this many samples of the job's used bytes,
 * every `tl_ms` from the job's start; when full, every other sample is
 * dropped and the interval doubled, so a job of any length fits. */
#define COGPU_HIST_TL_MAX 128

typedef struct cogpu__hist_rec_s {
  int64_t id;       /* assigned by the database */
  int64_t start_ms; /* Unix time, ms */
  int64_t end_ms;
  uint32_t uid;
  int32_t exit_status; /* wait(2) status, or -1 unknown */
  char user[32];
  char command[128];
  char job_id[64];
  int32_t gpu; /* ledger index; -1: none used */
  uint32_t suspensions;
  char gpu_uuid[96];
  char gpu_name[96];
  uint64_t declared;      /* most its reservation held on that GPU */
  uint64_t peak;          /* most its processes used at once */
  uint64_t peak_after_ms; /* time to peak */
  uint64_t waited_ms;
  uint64_t run_ms;
  uint32_t guard_failures; /* requests the deadlock guard failed */
  uint32_t tl_n;
  uint64_t tl_ms;
  uint64_t tl[COGPU_HIST_TL_MAX];
} cogpu__hist_rec_t;

/* A timeline being sampled while its job runs (the daemon's loop, or
 * cogpu run in single-user mode). v[k] is the most of the samples taken in
 * [k * ms, (k + 1) * ms) from the job's start. A slot no sample fell in
 * (the sampler was late past a boundary) holds the sample before it, 0
 * before the first: memory held between two samples is assumed to stay as
 * it was last seen. */
typedef struct cogpu__hist_tl_s {
  uint32_t n;          /* slots in use */
  uint64_t ms;         /* the interval; 0 before the first sample (1 s) */
  uint64_t last;       /* the latest sample in time, */
  uint64_t last_at_ms; /* and when it was taken */
  uint64_t v[COGPU_HIST_TL_MAX];
} cogpu__hist_tl_t;

/* Adds a sample taken `at_ms` from the job's start; when it falls past the
 * last slot, every other sample is dropped (the higher of each pair kept,
 * so no peak is lost) and the interval doubled, as often as needed. */
void cogpu__hist_tl_add(cogpu__hist_tl_t *t, uint64_t at_ms, uint64_t bytes);
/* Copies t (NULL: none) into r's timeline. */
void cogpu__hist_tl_store(cogpu__hist_rec_t *r, const cogpu__hist_tl_t *t);

typedef struct cogpu__hist_s cogpu__hist_t;

typedef struct cogpu__hist_filter_s {
  bool has_uid;
  uint32_t uid;
  int64_t since_ms; /* 0: any */
  uint32_t last;    /* 0: all */
} cogpu__hist_filter_t;

/* The database path for a configuration: history_dir, or by default
 * /var/lib/cogpu (node: for_daemon) or $XDG_STATE_HOME/cogpu, else
 * ~/.local/state/cogpu. 1 with the path; 0 when history is off
 * (history_dir=none); a negative code when no directory can be named. */
int cogpu__hist_path(const cogpu__config_t *cfg, bool for_daemon, char *buf,
                     size_t len);
/* Opens (create: making the directory and the table) the database at path,
 * in WAL mode; a corrupt, locked or unreadable file is an error with a
 * message. */
int cogpu__hist_open(const char *path, bool create, cogpu__hist_t **out);
void cogpu__hist_close(cogpu__hist_t *h);
/* Adds a record, then applies retention (max_age_ms: -1 none; max_rows:
 * 0 none). */
int cogpu__hist_add(cogpu__hist_t *h, const cogpu__hist_rec_t *r,
                    int64_t max_age_ms, int64_t max_rows);
/* The records that pass the filter, newest first; *out is malloc'd. */
int cogpu__hist_query(cogpu__hist_t *h, const cogpu__hist_filter_t *f,
                      cogpu__hist_rec_t **out, size_t *n);

/* The HISTORY answer's memfd: this header, then n records. */
#define COGPU_HIST_MAGIC 0x54534948u /* "HIST" */
#define COGPU_HIST_VERSION 1u
typedef struct cogpu__hist_hdr_s {
  uint32_t magic, version;
  uint32_t n, rec_size;
} cogpu__hist_hdr_t;

#endif /* COGPU_HISTORY_H */
