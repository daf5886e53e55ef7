/*
 * api.h: what the public API offers the other components (the preload
 * library, the CLI, the Slurm plug-in) beyond cogpu.h. Like cogpu.h, each
 * call checks its arguments and goes to the handle's backend: the ledger in
 * single-user mode, the node daemon in node mode (api-int.h). The daemon
 * never calls these: it runs the ledger itself (ledger/ledger.h).
 */
#ifndef COGPU_API_H
#define COGPU_API_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "cogpu.h"
#include "internal.h"

/* Attach on behalf of user for_uid (root only; the Slurm plug-in in
 * slurmstepd books a job for its user, whose tasks then join it). In node
 * mode the daemon records the job as for_uid's; in single-user mode the
 * ledger is the caller's own and for_uid is not used. */
int cogpu__attach_as(const cogpu_attach_opts_t *opts, uint32_t for_uid,
                     cogpu_t **out);

/* 1 when an attach of this process goes to the node daemon (node mode),
 * 0 in single-user mode, or an error code (a bad configuration, or
 * node_mode=daemon without the daemon's socket). */
int cogpu__attach_mode(void);

/* cogpu_reserve whose wait the caller may give up (internal.h's
 * cogpu__abort_t): -ECANCELED then. */
int cogpu__reserve_abortable(cogpu_t *h, const cogpu_request_t *req,
                             int *gpu_out, const cogpu__abort_t *ab);

/* Capacity of a GPU and what is free there now, read without the lock
 * (a moment's view, for reporting such as cuMemGetInfo). */
int cogpu__room(cogpu_t *h, int gpu, uint64_t *capacity, uint64_t *free_bytes);

/* The driver refused memory that this process's reservation covered:
 * read what is held outside cogpu on `gpu` again, now (foreign memory is
 * otherwise read once per foreign_refresh), and say by how much the
 * node's reservations and that memory together exceed the GPU (*over; 0
 * when they fit, and the refusal is not the outside's doing). */
int cogpu__recheck(cogpu_t *h, int gpu, uint64_t *over);

/* Milliseconds since a client of the node last left (exited, died,
 * detached) or released all it held on a GPU, read without the lock;
 * UINT64_MAX if none has, or h is not attached. The driver frees a leaving
 * client's memory a moment after the ledger sees it go. */
uint64_t cogpu__left_ago_ms(cogpu_t *h);

/* For a process that joined a job: take up to `want` bytes of the job's
 * reservation on `gpu` that no other process of the job has taken, as this
 * process's share (*got, possibly 0). The share returns to the job when
 * the process detaches or dies. A process of its own job gets 0. */
int cogpu__claim(cogpu_t *h, int gpu, uint64_t want, uint64_t *got);
/* What this process's job holds on `gpu` that none of its processes has
 * claimed (0 for a process of its own), read without the lock. */
uint64_t cogpu__job_spare(cogpu_t *h, int gpu);
/* Give back up to `bytes` of this process's claim on `gpu` to its job, for
 * the job's other processes: the job keeps the memory. */
int cogpu__unclaim(cogpu_t *h, int gpu, uint64_t bytes);

/* The token of a live job with this job id (one that joined no other job),
 * for a later process of the same batch-system job to join; -ESRCH if
 * none. tok needs 24 bytes. */
int cogpu__find_job(cogpu_t *h, const char *job_id, char *tok, size_t len);

/* Tell the node what this process uses (COGPU_MARK_*, backend.h). */
int cogpu__mark(cogpu_t *h, uint32_t flags);

/* This process's usage page (backend.h), or NULL (not attached; the daemon
 * would not take one). Valid until the handle is detached. */
cogpu__usage_t *cogpu__usage_page(cogpu_t *h);

/* Records the job's exit status (a wait(2) status; -1 unknown) for its
 * history record and fills *out. Called by the job's own slot (cogpu run)
 * before it detaches. */
int cogpu__job_end(cogpu_t *h, int exit_status, cogpu__job_report_t *out);
/* cogpu__job_end for one step of a job (a Slurm step): *out has the
 * figures of the processes that joined through this handle's step token
 * (its peak, when, how long the step ran) and the job's reservation,
 * wait and suspensions. */
int cogpu__step_end(cogpu_t *h, int exit_status, cogpu__job_report_t *out);
/* The token (cogpu_attach_opts_t.join) that makes a process part of this
 * handle's job and of its step: the step's report counts it. It is the
 * job's token when this handle holds the job's reservation itself. */
int cogpu__step_token(cogpu_t *h, char *buf, size_t len);
/* Single-user mode: what the handle's job uses now on each GPU (its live
 * processes' used bytes, summed; used[COGPU_USAGE_GPUS], *ngpus filled),
 * and *at_ms, how long since the job started: a sample of its memory
 * timeline, which cogpu run keeps for the job's record. One pass over the
 * slots under the ledger's lock. -ENOTSUP in node mode, where the daemon
 * samples. */
int cogpu__job_sample(cogpu_t *h, uint64_t *used, unsigned *ngpus,
                      uint64_t *at_ms);
/* The end-of-job line(s), like seff's, into buf (each ending in a newline;
 * truncated to len): the job's exact peak against what it reserved, the
 * wait, suspensions, and a hint when the declaration was far off, written
 * as flag then size ("--mem " or "--gpu-mem="); `declared` is the job's
 * declaration (0: on demand), `job` how the job is named ("job 42").
 * Returns the length written. */
size_t cogpu__job_report_line(const cogpu__job_report_t *r, const char *job,
                              const char *flag, uint64_t declared, char *buf,
                              size_t len);

/* For the tests: the ledger's own handle behind h (ledger-int.h), or NULL
 * when h is a node-mode handle. */
struct cogpu_s;
struct cogpu_s *cogpu__ledger_of(cogpu_t *h);

#endif /* COGPU_API_H */
