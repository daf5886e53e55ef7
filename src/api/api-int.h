/*
 * api-int.h: the facade's handle. The public cogpu_t is a backend and the
 * backend's own handle, with what does not depend on the backend: the
 * configuration the handle was attached with, and its fork state. Every
 * public call checks its arguments here, then goes to h->be; nothing in
 * src/api knows a backend's handle, and no backend knows this one.
 */
#ifndef COGPU_API_INT_H
#define COGPU_API_INT_H

#include <stdbool.h>

#include "api/api.h"
#include "backend.h"
#include "cogpu.h"
#include "internal.h"

struct cogpu_handle_s {
  const cogpu__backend_t *be;
  void *b; /* the backend's handle */
  /* Set in a fork child: the handle is the parent's (its backend was told,
   * once). */
  bool forked;
  cogpu__config_t cfg;
  struct cogpu_handle_s *next; /* live handles, for the fork handler */
};

#endif /* COGPU_API_INT_H */
