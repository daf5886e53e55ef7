/*
 * node.h: the client side of node mode: a process whose node runs cogpud
 * reaches the ledger only through the daemon's socket (proto.h). The public
 * API (src/api) hands each call of a node-mode handle to the functions
 * below, through the node backend (backend.c). Node mode applies when the
 * daemon's socket exists or the daemon holds its lock (node_mode=auto), or is
 * asked for (node_mode=daemon); then a client never falls back to a ledger of
 * its own, which would book the GPUs twice.
 */
#ifndef COGPU_NODE_H
#define COGPU_NODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "cogpu.h"
#include "internal.h"

typedef struct cogpu__node_s cogpu__node_t;

/* The node client as the public API's backend (backend.c). */
extern const cogpu__backend_t cogpu__node_backend;

/* 1: node mode (use the daemon), 0: single-user mode, or an error (with
 * node_mode=daemon and no socket). */
int cogpu__node_mode(const cogpu__config_t *cfg);

/* The daemon's lock files (lockfile.c): cogpud holds an OFD write lock on
 * SOCKET.lock and on daemon_dir/cogpud.lock while it lives. */
#define COGPU_DAEMON_LOCK_NAME "cogpud.lock"
/* The lock beside the socket (of_socket) or in daemon_dir; -ENAMETOOLONG. */
int cogpu__node_lock_path(const cogpu__config_t *cfg, bool of_socket, char *buf,
                          size_t len);
/* The pid written in a lock file (0 if none can be read). */
long cogpu__node_lock_pid(int fd);
/* Whether the lock file at path (root's or this user's) is held, and by
 * which pid (0 unknown). Takes no lock. */
bool cogpu__node_lock_held(const char *path, long *pid);
/* Whether a daemon lives for cfg's socket or daemon_dir, socket or not. */
bool cogpu__node_daemon_alive(const cogpu__config_t *cfg);

int cogpu__node_attach(const cogpu__config_t *cfg,
                       const cogpu_attach_opts_t *opts, uint32_t for_uid,
                       cogpu__node_t **out);
/* Closes the connection (the daemon frees the slot) and frees n. */
void cogpu__node_detach(cogpu__node_t *n);
/* In a fork child: drop the parent's connection without telling the daemon
 * anything (the parent still holds it). */
void cogpu__node_forked(cogpu__node_t *n);

/* ab (may be NULL): a wait its caller may give up (internal.h). */
int cogpu__node_reserve(cogpu__node_t *n, const cogpu_request_t *req,
                        int *gpu_out, const cogpu__abort_t *ab);
int cogpu__node_release(cogpu__node_t *n, int gpu, uint64_t bytes);
int cogpu__node_held(cogpu__node_t *n, int gpu, uint64_t *bytes);
int cogpu__node_room(cogpu__node_t *n, int gpu, uint64_t *capacity,
                     uint64_t *free_bytes);
uint64_t cogpu__node_job_spare(cogpu__node_t *n, int gpu);
/* How long ago a client last left the node (UINT64_MAX: never). */
uint64_t cogpu__node_left_ago_ms(cogpu__node_t *n);
int cogpu__node_recheck(cogpu__node_t *n, int gpu, uint64_t *over);
int cogpu__node_claim(cogpu__node_t *n, int gpu, uint64_t want, uint64_t *got);
int cogpu__node_unclaim(cogpu__node_t *n, int gpu, uint64_t bytes);
int cogpu__node_find_job(cogpu__node_t *n, const char *job_id, char *tok,
                         size_t len);
int cogpu__node_job_token(cogpu__node_t *n, char *buf, size_t len);
/* Tell the daemon what this process uses (COGPU_MARK_*, backend.h). */
int cogpu__node_mark(cogpu__node_t *n, uint32_t flags);
/* Suspend (or resume) the job of pid, or of job_id; waits until it is done
 * or timeout_ms passes (-1: no bound). *bytes: the footprint moved; *ms:
 * how long it took (suspend) or was suspended (resume); *took_ms: how long
 * the driver's part took. */
int cogpu__node_suspend(const cogpu__config_t *cfg, int pid, const char *job_id,
                        bool resume, int64_t timeout_ms, uint64_t *bytes,
                        uint64_t *ms, uint64_t *took_ms);
int cogpu__node_gpu_count(cogpu__node_t *n);
int cogpu__node_gpu_lookup(cogpu__node_t *n, const char *spec, int *gpu);

/* This process's usage page (backend.h): a sealed memfd, made and passed
 * to the daemon on first use, and passed again after a daemon restart;
 * NULL if it cannot be made or the daemon refused it. */
struct cogpu__usage_s *cogpu__node_usage_page(cogpu__node_t *n);
/* cogpu__job_end through the daemon. */
struct cogpu__job_report_s;
int cogpu__node_job_end(cogpu__node_t *n, int exit_status, bool step,
                        struct cogpu__job_report_s *out);
/* This process's own token (cogpu__step_token). */
int cogpu__node_step_token(cogpu__node_t *n, char *buf, size_t len);

/* HISTORY: the daemon's answer, a memfd (*mfd) of history records. */
int cogpu__node_history(const cogpu__config_t *cfg, bool has_uid, uint32_t uid,
                        int64_t since_s, uint32_t last, int *mfd);

/* A snapshot from the daemon (n may be NULL: a connection of its own). */
int cogpu__node_status(const cogpu__config_t *cfg, cogpu__node_t *n,
                       cogpu_status_t **out);
/* Ask the daemon to reset the node (admins only). */
int cogpu__node_reset(const cogpu__config_t *cfg, bool force, int *live);

#endif /* COGPU_NODE_H */
