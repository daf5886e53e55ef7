/*
 * test-errors.c: the error contract (issue 11 item 6). docs/errors.md lists
 * each public function's codes; these tests reach the codes in realistic
 * scenarios, in both modes where they apply, and assert that every code a
 * function returns is one its table lists. The tables are parsed here, so
 * the docs and the code cannot drift apart unnoticed.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ledger-helpers.h"

static const char *errors_doc(void) {
  static char buf[1 << 16];
  if (buf[0])
    return buf;
  char path[4096];
  snprintf(path, sizeof path, "%s/../docs/errors.md", th_build_dir());
  FILE *f = fopen(path, "r");
  if (!f)
    th_fail(__FILE__, __LINE__, "cannot open %s", path);
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  return buf;
}

/* The docs' spelling of rc: "-EAGAIN", or "COGPU_EDEADLOCK". */
static void code_token(int rc, char *buf, size_t len) {
  snprintf(buf, len, "%s%s", rc <= -4000 ? "COGPU_" : "-", cogpu_err_name(rc));
}

/* Does the table under "## fn" list rc (a row "| `CODE` |")? */
static bool documented(const char *fn, int rc) {
  const char *doc = errors_doc();
  char head[128], row[128], tok[64];
  snprintf(head, sizeof head, "\n## %s\n", fn);
  const char *s = strstr(doc, head);
  if (!s)
    th_fail(__FILE__, __LINE__, "docs/errors.md has no section for %s", fn);
  s += strlen(head);
  const char *end = strstr(s, "\n## ");
  code_token(rc, tok, sizeof tok);
  snprintf(row, sizeof row, "\n| `%s` |", tok);
  const char *r = strstr(s, row);
  return r && (!end || r < end);
}

#define EXPECT_RC(fn, call, want)                                              \
  do {                                                                         \
    int rc_ = (call);                                                          \
    char t_[64];                                                               \
    code_token(rc_, t_, sizeof t_);                                            \
    if (rc_ != 0 && !documented(#fn, rc_))                                     \
      th_fail(__FILE__, __LINE__,                                              \
              "%s returned %s, which docs/errors.md "                          \
              "does not list for it (%s)",                                     \
              #fn, t_, cogpu_last_error());                                    \
    ASSERT_EQ(rc_, (want));                                                    \
  } while (0)

static cogpu_request_t req(int gpu, uint64_t bytes, int64_t timeout_ms) {
  return (cogpu_request_t){.gpu = gpu,
                           .bytes = bytes,
                           .priority = COGPU_PRIORITY_DEFAULT,
                           .timeout_ms = timeout_ms};
}

/* Every code row of the docs names a code cogpu_err_name knows. */
TEST_IMPL(errors_docs_name_real_codes) {
  const char *doc = errors_doc();
  int rows = 0;
  for (const char *p = doc; (p = strstr(p, "\n| `")); p++) {
    char code[64];
    if (sscanf(p, "\n| `%63[^`]`", code) != 1)
      continue;
    bool known = false;
    for (int rc = -1; rc > -4096 && !known; rc--) {
      char t[64];
      code_token(rc, t, sizeof t);
      known = strcmp(t, code) == 0;
    }
    for (int rc = -4001; rc >= -4005 && !known; rc--) {
      char t[64];
      code_token(rc, t, sizeof t);
      known = strcmp(t, code) == 0;
    }
    if (!known)
      th_fail(__FILE__, __LINE__, "docs/errors.md lists unknown code %s", code);
    rows++;
  }
  ASSERT_GT(rows, 40);
}

TEST_IMPL(errors_attach) {
  cogpu_t *h, *j;
  EXPECT_RC(cogpu_attach, cogpu_attach(NULL, NULL), -EINVAL);
  cogpu_attach_opts_t o = {.join = "not-a-token"};
  EXPECT_RC(cogpu_attach, cogpu_attach(&o, &j), -EINVAL);
  /* A job that ended. */
  ASSERT_OK(cogpu_attach(NULL, &h));
  char tok[24];
  ASSERT_OK(cogpu_job_token(h, tok, sizeof tok));
  ASSERT_OK(cogpu_detach(h));
  o.join = tok;
  EXPECT_RC(cogpu_attach, cogpu_attach(&o, &j), -ESRCH);
  /* A bad configuration value. */
  setenv("COGPU_GROW_STEP", "lots", 1);
  EXPECT_RC(cogpu_attach, cogpu_attach(NULL, &j), COGPU_ECONFIG);
  EXPECT_RC(cogpu_status, cogpu_status(NULL, &(cogpu_status_t *){0}),
            COGPU_ECONFIG);
  unsetenv("COGPU_GROW_STEP");
}

/* Node mode's reachability codes, forced with node_mode=daemon: they apply
 * in either run. */
TEST_IMPL(errors_daemon_unreachable) {
  cogpu_t *h;
  setenv("COGPU_NODE_MODE", "daemon", 1);
  setenv("COGPU_DAEMON_WAIT", "100ms", 1);
  setenv("COGPU_SOCKET", th_path("no-daemon.sock"), 1);
  EXPECT_RC(cogpu_attach, cogpu_attach(NULL, &h), -ECONNREFUSED);
  cogpu_status_t *st;
  EXPECT_RC(cogpu_status, cogpu_status(NULL, &st), -ECONNREFUSED);
  char longp[200];
  memset(longp, 'x', sizeof longp - 1);
  longp[0] = '/';
  longp[sizeof longp - 1] = 0;
  setenv("COGPU_SOCKET", longp, 1);
  EXPECT_RC(cogpu_attach, cogpu_attach(NULL, &h), -ENAMETOOLONG);
}

TEST_IMPL(errors_reserve_release_held) {
  th_setenv("COGPU_MARGIN", "0");
  cogpu_t *h = lt_attach(0);
  cogpu_status_t *st = lt_status();
  uint64_t cap = st->gpus[0].capacity_bytes;
  cogpu_status_free(st);
  cogpu_request_t r = req(0, GiB, -5);
  EXPECT_RC(cogpu_reserve, cogpu_reserve(h, &r, NULL), -EINVAL);
  r = req(99, GiB, 0);
  EXPECT_RC(cogpu_reserve, cogpu_reserve(h, &r, NULL), -ENODEV);
  r = req(0, cap + GiB, 0);
  EXPECT_RC(cogpu_reserve, cogpu_reserve(h, &r, NULL), -E2BIG);
  r = req(0, cap - GiB, 0);
  EXPECT_RC(cogpu_reserve, cogpu_reserve(h, &r, NULL), 0);
  pid_t p = lt_hold("other", 0, GiB, 0, 0, -1);
  lt_wait_nclients(0, 2, 5000);
  r = req(0, GiB, COGPU_NOWAIT);
  EXPECT_RC(cogpu_reserve, cogpu_reserve(h, &r, NULL), -EAGAIN);
  r = req(0, GiB, 50);
  EXPECT_RC(cogpu_reserve, cogpu_reserve(h, &r, NULL), -ETIMEDOUT);
  uint64_t held;
  EXPECT_RC(cogpu_held, cogpu_held(h, 0, NULL), -EINVAL);
  EXPECT_RC(cogpu_held, cogpu_held(h, 99, &held), -ENODEV);
  EXPECT_RC(cogpu_held, cogpu_held(h, 0, &held), 0);
  ASSERT_UEQ(held, cap - GiB);
  EXPECT_RC(cogpu_release, cogpu_release(h, 0, cap), -EINVAL);
  EXPECT_RC(cogpu_release, cogpu_release(h, 99, GiB), -ENODEV);
  EXPECT_RC(cogpu_release, cogpu_release(h, 0, COGPU_ALL), 0);
  kill(p, SIGKILL);
  th_wait(p, th_ms(5000));
  cogpu_detach(h);
}

TEST_IMPL(errors_lookup_token_status) {
  cogpu_t *h = lt_attach(0);
  int g;
  EXPECT_RC(cogpu_gpu_lookup, cogpu_gpu_lookup(h, "GPU-zzzz", &g), -ENODEV);
  EXPECT_RC(cogpu_gpu_lookup, cogpu_gpu_lookup(h, "99", &g), -ENODEV);
  EXPECT_RC(cogpu_gpu_lookup, cogpu_gpu_lookup(h, "", &g), -EINVAL);
  EXPECT_RC(cogpu_gpu_lookup, cogpu_gpu_lookup(h, "0", &g), 0);
  char small[4];
  EXPECT_RC(cogpu_job_token, cogpu_job_token(h, small, sizeof small), -EINVAL);
  EXPECT_RC(cogpu_job_token, cogpu_job_token(NULL, small, 24), -EINVAL);
  EXPECT_RC(cogpu_status, cogpu_status(h, NULL), -EINVAL);
  cogpu_status_t *st;
  EXPECT_RC(cogpu_status, cogpu_status(h, &st), 0);
  cogpu_status_free(st);
  cogpu_detach(h);
}
