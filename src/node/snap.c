/*
 * snap.c: the status snapshot's codec (proto.h). The daemon builds it, a
 * client parses it; both, and the records themselves, come from the one
 * list of fields in proto.h, so that a field cannot be written by one side
 * and forgotten, or read unchecked, by the other. The parser trusts
 * nothing: the file comes from the daemon, but through a descriptor any
 * process answering the socket could have passed.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cogpu.h"
#include "node/proto.h"
#include "nvml/nvml.h"

/* What a snapshot may hold at most: more GPUs than a node has, or more
 * records than the ledger has slots by orders, is not a snapshot. */
#define SNAP_MAX_GPUS COGPU_NVML_MAX_GPUS
#define SNAP_MAX_RECORDS (1u << 20)

/* Copies a string field into one of dsize bytes, NUL-terminated, never
 * reading past the source field (which need not hold a NUL). */
static void snap_str(char *dst, size_t dsize, const char *src, size_t ssize) {
  size_t l = strnlen(src, ssize);
  if (l >= dsize)
    l = dsize - 1;
  memcpy(dst, src, l);
  dst[l] = 0;
}

#define SNAP_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* --- writer: o (the record) from s (the status) -------------------------- */
#define W(kind, ...) W_##kind(__VA_ARGS__)
#define W_NUM(type, name, status) o->name = (type)s->status;
#define W_STR(size, name, status)                                              \
  snap_str(o->name, sizeof o->name, s->status, sizeof s->status);
#define W_ARR(type, n, name, status)                                           \
  _Static_assert(SNAP_LEN(s->status) == (n), #status " has " #n " entries");   \
  for (size_t i_ = 0; i_ < (n); i_++)                                          \
    o->name[i_] = (type)s->status[i_];
#define W_BOUNDS W_ARR
#define W_USEC(type, name, status) o->name = (type)(s->status * 1e6 + 0.5);
#define W_OWN(type, name, status) o->name = s->status ? 1 : 0;
#define W_ENUM(type, name, status, max) o->name = (type)s->status;
#define W_FRAME(type, name)
#define W_PAD(type, name)

static void hdr_write(cogpu__snap_hdr_t *o, const cogpu_status_t *s) {
  COGPU_SNAP_HDR(W)
}
static void hdr_write_v3(cogpu__snap_hdr_v3_t *o, const cogpu_status_t *s) {
  COGPU_SNAP_HDR_V3(W)
}
static void gpu_write(cogpu__snap_gpu_t *o, const cogpu_gpu_info_t *s) {
  COGPU_SNAP_GPU(W)
}
static void client_write(cogpu__snap_client_t *o,
                         const cogpu_client_info_t *s) {
  COGPU_SNAP_CLIENT(W)
}
static void waiter_write(cogpu__snap_waiter_t *o,
                         const cogpu_waiter_info_t *s) {
  COGPU_SNAP_WAITER(W)
}

/* --- reader: d (the status) from o (the record), checked ----------------- */
#define R(kind, ...) R_##kind(__VA_ARGS__)
#define R_NUM(type, name, status) d->status = o->name;
#define R_STR(size, name, status)                                              \
  snap_str(d->status, sizeof d->status, o->name, sizeof o->name);
#define R_ARR(type, n, name, status)                                           \
  for (size_t i_ = 0; i_ < (n); i_++)                                          \
    d->status[i_] = o->name[i_];
/* Bounds must rise, the last being +Inf: a histogram is rendered from them
 * as they come. */
#define R_BOUNDS(type, n, name, status)                                        \
  for (size_t i_ = 0; i_ < (n); i_++) {                                        \
    if (i_ > 0 && o->name[i_] <= o->name[i_ - 1])                              \
      return -EPROTO;                                                          \
    d->status[i_] = o->name[i_];                                               \
  }                                                                            \
  if (o->name[(n)-1] != UINT64_MAX)                                            \
    return -EPROTO;
#define R_USEC(type, name, status) d->status = (double)o->name / 1e6;
#define R_OWN(type, name, status) d->status = o->name == 1;
#define R_ENUM(type, name, status, max)                                        \
  d->status = o->name <= (max) ? (int)o->name : 0;
#define R_FRAME(type, name)
#define R_PAD(type, name)

static int hdr_read(cogpu_status_t *d, const cogpu__snap_hdr_t *o) {
  COGPU_SNAP_HDR(R)
  return 0;
}
static int hdr_read_v3(cogpu_status_t *d, const cogpu__snap_hdr_v3_t *o) {
  COGPU_SNAP_HDR_V3(R)
  return 0;
}
static void gpu_read(cogpu_gpu_info_t *d, const cogpu__snap_gpu_t *o) {
  COGPU_SNAP_GPU(R)
}
static void client_read(cogpu_client_info_t *d, const cogpu__snap_client_t *o) {
  COGPU_SNAP_CLIENT(R)
}
static void waiter_read(cogpu_waiter_info_t *d, const cogpu__snap_waiter_t *o) {
  COGPU_SNAP_WAITER(R)
}

/* The framing both header layouts begin with (version 3's fields lead
 * version 4's), written through the header of its own version. */
#define SNAP_FRAME(sh, ver, st, nc, nw)                                        \
  do {                                                                         \
    (sh)->magic = COGPU_SNAP_MAGIC;                                            \
    (sh)->version = (ver);                                                     \
    (sh)->ngpus = (uint32_t)(st)->ngpus;                                       \
    (sh)->nclients = (uint32_t)(nc);                                           \
    (sh)->nwaiters = (uint32_t)(nw);                                           \
  } while (0)

static size_t hdr_size(unsigned version) {
  return version == COGPU_SNAP_VERSION_V3 ? sizeof(cogpu__snap_hdr_v3_t)
                                          : sizeof(cogpu__snap_hdr_t);
}

int cogpu__snap_build(const cogpu_status_t *st, unsigned version, char **out,
                      size_t *outsize) {
  if (version != COGPU_SNAP_VERSION && version != COGPU_SNAP_VERSION_V3)
    return -EINVAL;
  size_t nc = 0, nw = 0;
  for (size_t g = 0; g < st->ngpus; g++) {
    nc += st->gpus[g].nclients;
    nw += st->gpus[g].nwaiting;
  }
  size_t size = hdr_size(version) + st->ngpus * sizeof(cogpu__snap_gpu_t) +
                nc * sizeof(cogpu__snap_client_t) +
                nw * sizeof(cogpu__snap_waiter_t);
  char *buf = calloc(1, size);
  if (!buf)
    return -ENOMEM;
  if (version == COGPU_SNAP_VERSION_V3) {
    cogpu__snap_hdr_v3_t *sh = (void *)buf;
    SNAP_FRAME(sh, version, st, nc, nw);
    hdr_write_v3(sh, st);
  } else {
    cogpu__snap_hdr_t *sh = (void *)buf;
    SNAP_FRAME(sh, version, st, nc, nw);
    hdr_write(sh, st);
  }
  cogpu__snap_gpu_t *gs = (void *)(buf + hdr_size(version));
  cogpu__snap_client_t *cs = (void *)(gs + st->ngpus);
  cogpu__snap_waiter_t *ws = (void *)(cs + nc);
  for (size_t g = 0; g < st->ngpus; g++) {
    const cogpu_gpu_info_t *gi = &st->gpus[g];
    gpu_write(&gs[g], gi);
    for (size_t i = 0; i < gi->nclients; i++, cs++) {
      cs->gpu = (uint32_t)g;
      client_write(cs, &gi->clients[i]);
    }
    for (size_t i = 0; i < gi->nwaiting; i++, ws++) {
      ws->gpu = (uint32_t)g;
      waiter_write(ws, &gi->waiting[i]);
    }
  }
  *out = buf;
  *outsize = size;
  return 0;
}

int cogpu__snap_parse(const char *p, size_t size, cogpu_status_t *st) {
  /* Version 3's header is version 4's beginning: its framing is read
   * through it for either. */
  const cogpu__snap_hdr_v3_t *h = (const void *)p;
  if (size < sizeof *h || h->magic != COGPU_SNAP_MAGIC ||
      (h->version != COGPU_SNAP_VERSION &&
       h->version != COGPU_SNAP_VERSION_V3) ||
      h->ngpus > SNAP_MAX_GPUS || h->nclients > SNAP_MAX_RECORDS ||
      h->nwaiters > SNAP_MAX_RECORDS)
    return -EPROTO;
  size_t need = hdr_size(h->version) + h->ngpus * sizeof(cogpu__snap_gpu_t) +
                h->nclients * sizeof(cogpu__snap_client_t) +
                h->nwaiters * sizeof(cogpu__snap_waiter_t);
  if (need != size)
    return -EPROTO;
  const cogpu__snap_gpu_t *gs = (const void *)(p + hdr_size(h->version));
  const cogpu__snap_client_t *cs = (const void *)(gs + h->ngpus);
  const cogpu__snap_waiter_t *ws = (const void *)(cs + h->nclients);
  int rc = h->version == COGPU_SNAP_VERSION_V3
               ? hdr_read_v3(st, h)
               : hdr_read(st, (const cogpu__snap_hdr_t *)(const void *)p);
  if (rc)
    return rc;
  st->ngpus = h->ngpus;
  st->gpus = calloc(h->ngpus ? h->ngpus : 1, sizeof *st->gpus);
  if (!st->gpus)
    return -ENOMEM;
  for (uint32_t g = 0; g < h->ngpus; g++) {
    cogpu_gpu_info_t *gi = &st->gpus[g];
    gpu_read(gi, &gs[g]);
    /* Room for every record on each GPU: which GPU a record names is
     * only known as it is read. */
    gi->clients = calloc(h->nclients + 1, sizeof *gi->clients);
    gi->waiting = calloc(h->nwaiters + 1, sizeof *gi->waiting);
    if (!gi->clients || !gi->waiting)
      return -ENOMEM;
  }
  for (uint32_t i = 0; i < h->nclients; i++) {
    if (cs[i].gpu >= h->ngpus)
      return -EPROTO;
    cogpu_gpu_info_t *gi = &st->gpus[cs[i].gpu];
    client_read(&gi->clients[gi->nclients++], &cs[i]);
  }
  for (uint32_t i = 0; i < h->nwaiters; i++) {
    if (ws[i].gpu >= h->ngpus)
      return -EPROTO;
    cogpu_gpu_info_t *gi = &st->gpus[ws[i].gpu];
    waiter_read(&gi->waiting[gi->nwaiting++], &ws[i]);
  }
  return 0;
}
