/*
 * ledger.h: the ledger's interface for the public API (its backend, the
 * single-user mode's) and the node daemon, which runs the ledger itself in
 * trusted mode (ledger-int.h) and calls these on its handles. Programs
 * reach them through the facade (api/api.h), never directly. ledger-int.h
 * is the ledger's own: its layout and internals.
 */
#ifndef COGPU_LEDGER_H
#define COGPU_LEDGER_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "cogpu.h"
#include "internal.h"

/* The ledger's handle (ledger-int.h). */
struct cogpu_s;

/* The ledger as the public API's backend (backend.c). */
extern const cogpu__backend_t cogpu__ledger_backend;

/* Capacity of a GPU and what is free there now, read without the lock
 * (a moment's view, for reporting such as cuMemGetInfo). */
int cogpu__ledger_room(struct cogpu_s *h, int gpu, uint64_t *capacity,
                       uint64_t *free_bytes);

/* The driver refused memory that this process's reservation covered:
 * read what is held outside cogpu on `gpu` again, now, and say by how much
 * the node's reservations and that memory together exceed the GPU (*over;
 * 0 when they fit). */
int cogpu__ledger_recheck(struct cogpu_s *h, int gpu, uint64_t *over);

/* Milliseconds since a client of the node last left (exited, died,
 * detached) or released all it held on a GPU, read without the lock;
 * UINT64_MAX if none has, or h is not attached. */
uint64_t cogpu__ledger_left_ago_ms(struct cogpu_s *h);

/* For a process that joined a job: take up to `want` bytes of the job's
 * reservation on `gpu` that no other process of the job has taken, as this
 * process's share (*got, possibly 0). A process of its own job gets 0. */
int cogpu__ledger_claim(struct cogpu_s *h, int gpu, uint64_t want,
                        uint64_t *got);
/* What this process's job holds on `gpu` that none of its processes has
 * claimed (0 for a process of its own), read without the lock. */
uint64_t cogpu__ledger_job_spare(struct cogpu_s *h, int gpu);
/* Give back up to `bytes` of this process's claim on `gpu` to its job. */
int cogpu__ledger_unclaim(struct cogpu_s *h, int gpu, uint64_t bytes);

/* The token of a live job with this job id (one that joined no other job);
 * -ESRCH if none. tok needs 24 bytes. */
int cogpu__ledger_find_job(struct cogpu_s *h, const char *job_id, char *tok,
                           size_t len);

#endif /* COGPU_LEDGER_H */
