/*
 * core.h: the node's decisions, on any state.
 *
 * What a node decides (does a request fit on a GPU, in which order the
 * queue is served, which waiter starves, which GPU an "any GPU" request
 * goes to, when the deadlock guard may act and whom it picks) is written
 * here once, against plain values and a small table of callbacks, so that
 * two very different owners of a node's state decide by the same code:
 *  - the ledger (policy.c, reserve.c, suspend.c), on the shared state,
 *    under its lock and its undo log, in real time;
 *  - the cluster simulator (src/sim), on plain memory, in virtual time,
 *    with thousands of nodes in one process.
 * Nothing here takes a lock, makes a system call, reads a clock or
 * allocates: time comes in as `now`, state through the callbacks. The
 * fit and the booking are inline, so the ledger's fast path costs what it
 * did before.
 */
#ifndef COGPU_LEDGER_CORE_H
#define COGPU_LEDGER_CORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The node's rules: enum cogpu__policy (internal.h), the most clients a
 * GPU takes (0: no limit) and the mmu policy's starvation guard (a waiter
 * older than this is served as under fifo; UINT64_MAX: never). */
typedef struct cogpu__core_rules_s {
  uint32_t policy;
  uint32_t pad0;
  uint64_t max_clients;
  uint64_t mmu_max_age_ns;
} cogpu__core_rules_t;

/* A GPU as the decisions see it. A holder is named by a nonzero number
 * (the ledger: slot + 1). */
typedef struct cogpu__core_gpu_s {
  uint64_t capacity; /* what may be reserved: cogpu__core_capacity */
  uint64_t reserved; /* sum of what holders hold */
  uint64_t nclients; /* holders with bytes, or exclusive use */
  uint64_t excl;     /* the holder with exclusive use, 0 if none */
} cogpu__core_gpu_t;

/* What may be reserved on a GPU of `total` bytes, with `margin` kept free
 * and `foreign` held by programs cogpu does not know. */
static inline uint64_t cogpu__core_capacity(uint64_t total, uint64_t margin,
                                            uint64_t foreign) {
  uint64_t off = margin + foreign;
  return total > off ? total - off : 0;
}

static inline uint64_t cogpu__core_free(const cogpu__core_gpu_t *g) {
  return g->capacity > g->reserved ? g->capacity - g->reserved : 0;
}

/* Can `holder`, which holds `held` bytes on g, be granted `bytes` more
 * there now, or exclusive use? Exclusive use needs the GPU to itself;
 * nobody else fits beside an exclusive holder; a new client counts
 * against max_clients. */
static inline bool cogpu__core_fits(const cogpu__core_rules_t *r,
                                    const cogpu__core_gpu_t *g, uint64_t holder,
                                    uint64_t held, uint64_t bytes,
                                    bool exclusive) {
  if (g->excl && g->excl != holder)
    return false;
  if (exclusive)
    return g->nclients == (uint64_t)(held > 0 || g->excl == holder);
  if (held == 0 && r->max_clients && g->nclients >= r->max_clients)
    return false;
  return bytes <= cogpu__core_free(g);
}

/* The GPU after a grant of `bytes` (or exclusive use) to `holder`, which
 * held `held` there: the caller stores what changed (the ledger through
 * its undo log). */
static inline cogpu__core_gpu_t
cogpu__core_granted(const cogpu__core_gpu_t *g, uint64_t holder, uint64_t held,
                    uint64_t bytes, bool exclusive) {
  cogpu__core_gpu_t n = *g;
  bool was_client = held > 0 || g->excl == holder;
  if (exclusive)
    n.excl = holder;
  n.reserved += bytes;
  if (!was_client && (bytes || exclusive))
    n.nclients++;
  return n;
}

/* The GPU after `holder`, which held `held` there, gives back `bytes` of
 * it (at most held), and its exclusive use if `end_excl`. */
static inline cogpu__core_gpu_t
cogpu__core_released(const cogpu__core_gpu_t *g, uint64_t holder, uint64_t held,
                     uint64_t bytes, bool end_excl) {
  cogpu__core_gpu_t n = *g;
  bool was_client = held > 0 || g->excl == holder;
  if (bytes > held)
    bytes = held;
  n.reserved = n.reserved > bytes ? n.reserved - bytes : 0;
  if (end_excl && g->excl == holder)
    n.excl = 0;
  bool is_client = held - bytes > 0 || n.excl == holder;
  if (was_client && !is_client && n.nclients)
    n.nclients--;
  return n;
}

/* --- The queue ---------------------------------------------------------- */

/* A queue entry as the order sees it. */
typedef struct cogpu__core_entry_s {
  int64_t gpu;       /* asked for, or COGPU_GPU_AUTO */
  int64_t priority;  /* higher first under the priority policies */
  uint64_t ticket;   /* arrival order */
  uint64_t since_ns; /* when it joined the queue (the owner's clock) */
} cogpu__core_entry_t;

/* What an entry is when its turn comes in a service pass. */
enum cogpu__core_kind {
  COGPU_CORE_SKIP = 0, /* not to be served in this pass (served already,
                          or held back) */
  COGPU_CORE_DROP,     /* can never be served: leaves the queue */
  COGPU_CORE_REQUEST,  /* a request: on its GPU, or the most free one */
  COGPU_CORE_RESUME    /* a suspended job's resume: on its own GPU, or
                          another where `moves` allows it */
};

/* The owner's state, through which a pass reads and acts. `id` is the
 * owner's name for an entry (the ledger: a waiter's index). */
typedef struct cogpu__core_ops_s {
  void (*entry)(void *ctx, uint32_t id, cogpu__core_entry_t *out);
  int (*kind)(void *ctx, uint32_t id);
  /* Free bytes on GPU g now (the order of "any GPU" candidates). */
  uint64_t (*free)(void *ctx, uint32_t g);
  /* Does entry id fit on g now? Could it ever, were g empty? */
  bool (*fits)(void *ctx, uint32_t id, uint32_t g);
  bool (*could_fit)(void *ctx, uint32_t id, uint32_t g);
  /* May resume entry id go onto GPU g, not its own, now (migration)? NULL:
   * never. Asked only when its own GPU cannot take it. */
  bool (*moves)(void *ctx, uint32_t id, uint32_t g);
  /* Grant entry id on g (a resume: book its footprint, on g), wake it. */
  void (*serve)(void *ctx, uint32_t id, uint32_t g);
  void (*drop)(void *ctx, uint32_t id);
} cogpu__core_ops_t;

/* Is a served before b? By priority first under the priority policies,
 * then by arrival. */
bool cogpu__core_before(const cogpu__core_rules_t *r,
                        const cogpu__core_entry_t *a,
                        const cogpu__core_entry_t *b);

/* Sort ids[0..n) into service order (stable; linear for a queue that is
 * already nearly in order, which it is: entries arrive in ticket order). */
void cogpu__core_order(const cogpu__core_rules_t *r, uint32_t *ids, size_t n,
                       const cogpu__core_ops_t *ops, void *ctx);

/* Under the mmu policies, the position in ids of the entry that has
 * waited longest if it has waited past mmu_max_age (it is then served as
 * under fifo); -1 otherwise. */
int64_t cogpu__core_starving(const cogpu__core_rules_t *r, uint64_t now,
                             const uint32_t *ids, size_t n,
                             const cogpu__core_ops_t *ops, void *ctx);

/* The GPUs an entry may be served on, most free first (ties: lower
 * index); returns how many (at most ngpus). */
size_t cogpu__core_candidates(const cogpu__core_entry_t *e, uint32_t ngpus,
                              uint32_t *gpus, const cogpu__core_ops_t *ops,
                              void *ctx);

/* The most GPUs a pass handles. */
#define COGPU_CORE_MAX_GPUS 16u

/* One service pass: serve, in the policy's order, every entry the policy
 * allows now. ids[0..n) are the waiting entries in service order
 * (cogpu__core_order); the starving one, if any, is moved to the front.
 * fifo: an entry that does not fit blocks those behind it on the GPUs it
 * could ever fit on; mmu: every entry that fits is served, except that
 * nothing is served past a starving entry on its GPUs. */
void cogpu__core_serve(const cogpu__core_rules_t *r, uint64_t now,
                       uint32_t ngpus, uint32_t *ids, size_t n,
                       const cogpu__core_ops_t *ops, void *ctx);

/* --- The deadlock guard ----------------------------------------------------
 * On a GPU where every holder waits for more there (all of a job's
 * processes wait, for longer than the guard's delay, and the job has not
 * given memory back within it), nobody will ever release: the guard
 * suspends a holder if it can, else fails one waiting request. */

/* Does a request waiting since `since_ns`, or a job that last released at
 * `released_ns`, count as stuck at `now` (past the delay)? */
static inline bool cogpu__core_guard_due(uint64_t since_ns, uint64_t now,
                                         uint64_t delay_ns) {
  return now >= since_ns && now - since_ns >= delay_ns;
}

/* Among stuck holders' waiting requests, is a a better victim than b?
 * The lowest priority, then the newest: the work lost is the least
 * important and the least done. */
static inline bool cogpu__core_victim_before(const cogpu__core_entry_t *a,
                                             const cogpu__core_entry_t *b) {
  if (a->priority != b->priority)
    return a->priority < b->priority;
  return a->ticket > b->ticket;
}

#endif /* COGPU_LEDGER_CORE_H */
