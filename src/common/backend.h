/*
 * backend.h: the contract between the public API (src/api, the facade) and
 * its two backends, the ledger (single-user mode) and the node client (node
 * mode): the table of operations generated from backend.def, and the types
 * both backends and the facade share. It lies in common, below all three,
 * so that the dependency goes one way: a backend implements it without
 * knowing the facade, and the facade calls it without knowing either
 * backend's handle.
 */
#ifndef COGPU_BACKEND_H
#define COGPU_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cogpu.h"
#include "internal.h"

/* What a process reports about itself, for suspension (cogpu__mark): that
 * it uses CUDA through the preload library (so the node daemon may lock
 * and checkpoint it), and what it used that the driver's checkpoint cannot
 * move, which makes its job unsuspendable. Each bit once per process. */
#define COGPU_MARK_CUDA 0x1u
#define COGPU_MARK_MANAGED 0x2u
#define COGPU_MARK_IPC 0x4u
#define COGPU_MARK_VMM_EXPORT 0x8u
#define COGPU_MARK_ALL 0xfu
#define COGPU_MARK_UNSUSPENDABLE                                               \
  (COGPU_MARK_MANAGED | COGPU_MARK_IPC | COGPU_MARK_VMM_EXPORT)
/* Set by the daemon, never by a client: a suspend or resume failed in a
 * way that may have left the job unusable; it is never tried again. */
#define COGPU_MARK_BROKEN 0x100u
/* Set by the daemon, never by a client: root booked this slot for its
 * user (COGPU_ATTACH_FOR_UID: the Slurm plug-in in slurmstepd). A later
 * step of the same job joins only such a slot of the job's user, so a
 * registration a user made under a job's id is never taken for the job. */
#define COGPU_MARK_BOOKED 0x200u
/* Set by the daemon, never by a client: the job asked for more memory on a
 * GPU where it held some (it grows). Only such jobs take part in a
 * deadlock, so only their memory is what one may have to park (a hint,
 * outside the undo log; docs/suspension.md, "Host memory"). */
#define COGPU_MARK_GREW 0x400u
/* Set by the daemon, never by a client: the process cannot be restored
 * onto another GPU (it sees only some of the node's GPUs, or a restore
 * onto another GPU was refused for it), so its job resumes only where it
 * was (docs/suspension.md, "Migration"). */
#define COGPU_MARK_NOMOVE 0x800u

/* --- Usage: what a process's allocations hold (docs/history.md) -----------
 * The preload library counts every allocation exactly; it publishes the
 * process's used bytes per GPU and their peak here with relaxed atomic
 * stores, and whoever keeps the record reads the last values, even after
 * the process died (kill -9): in single-user mode the page is the
 * process's own slot in the shared ledger; in node mode it is a sealed
 * memfd the process passed to the daemon at registration. Indexed by
 * ledger GPU. Only its own process writes it, so a process can misreport
 * only its own job. */
#define COGPU_USAGE_GPUS 16
typedef struct cogpu__usage_s {
  _Atomic uint64_t used[COGPU_USAGE_GPUS];
  _Atomic uint64_t peak[COGPU_USAGE_GPUS];
  /* CLOCK_REALTIME (ns) when a peak was last raised, on any GPU. */
  _Atomic uint64_t peak_ns;
  uint64_t pad[7];
} cogpu__usage_t;
/* The end-of-job report (cogpu run): the figures of the handle's job on
 * the GPU where it peaked highest. */
typedef struct cogpu__job_report_s {
  int gpu;                /* ledger GPU; -1 when the job used no GPU memory */
  uint64_t peak;          /* most its processes held at once, as counted */
  uint64_t reserved;      /* most its reservation held on that GPU */
  uint64_t peak_after_ms; /* from the job's start to its peak */
  uint64_t waited_ms;     /* in the node's queue, all requests */
  uint64_t run_ms;
  unsigned suspensions;
  unsigned guard_failures; /* requests the deadlock guard failed */
  uint64_t escaped; /* most its processes held outside the preload library */
} cogpu__job_report_t;
/* A backend: its name (for messages) and its operations, every one set
 * (each backend's table is generated from backend.def too, so a missing
 * operation does not build). */
typedef struct cogpu__backend_s {
  const char *name;
#define XX(type, name, params) type(*name) params;
#include "backend.def"
#undef XX
} cogpu__backend_t;

#endif /* COGPU_BACKEND_H */
