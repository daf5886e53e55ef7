/*
 * test-options.c: the option table (options.def), validation by type, the
 * three sources and their precedence (default < file < environment), the
 * config file format and its errors, and that docs/options.md lists every
 * option with its environment variable and default.
 */
#include <ctype.h>
#include <errno.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "internal.h"
#include "task.h"

/* The runner sets COGPU_STATE_DIR, COGPU_LOG and COGPU_CONFIG=""; tests
 * that look at defaults start from an environment without them. */
static void opt_clear_env(void) {
  for (int i = 0; i < COGPU_OPT__COUNT; i++) {
    char var[64];
    snprintf(var, sizeof var, "COGPU_%s", cogpu__opt_table[i].name);
    unsetenv(var);
  }
  setenv("COGPU_CONFIG", "", 1);
}

/* Loads with a config file holding text; returns load's rc. */
static int opt_load_file(cogpu__config_t *cfg, const char *text) {
  const char *path = th_path("cogpu.conf");
  th_write_file(path, text);
  setenv("COGPU_CONFIG", path, 1);
  return cogpu__config_load(cfg);
}

TEST_IMPL(options_table_consistent) {
  ASSERT_EQ(COGPU_ARRAY_SIZE(cogpu__opt_table), COGPU_OPT__COUNT);
  for (int i = 0; i < COGPU_OPT__COUNT; i++) {
    const cogpu__opt_desc_t *d = &cogpu__opt_table[i];
    ASSERT(d->name && d->key && d->def && d->form && d->help);
    ASSERT(d->help[0] && d->form[0]);
    /* The key is the lower-case NAME. */
    ASSERT_EQ(strlen(d->key), strlen(d->name));
    for (size_t k = 0; d->key[k]; k++)
      ASSERT_EQ(d->key[k], tolower((unsigned char)d->name[k]));
    ASSERT_EQ(cogpu__opt_find(d->key), i);
    ASSERT_EQ(cogpu__opt_find(d->name), i);
  }
  ASSERT_EQ(cogpu__opt_table[COGPU_OPT_POLICY].type, COGPU_OPT_TYPE_ENUM);
  ASSERT_EQ(cogpu__opt_table[COGPU_OPT_MARGIN].type,
            COGPU_OPT_TYPE_SIZE_OR_PCT);
  ASSERT_EQ(cogpu__opt_table[COGPU_OPT_TIMEOUT].type, COGPU_OPT_TYPE_DURATION);
  ASSERT_EQ(cogpu__opt_table[COGPU_OPT_STATE_MODE].type, COGPU_OPT_TYPE_MODE);
  ASSERT_EQ(cogpu__opt_table[COGPU_OPT_MEM].type, COGPU_OPT_TYPE_SIZE_OR_AUTO);
  /* The policy enum follows the form's order. */
  const char *policies[] = {"fifo", "mmu", "priority-fifo", "priority-mmu"};
  cogpu__config_t cfg;
  opt_clear_env();
  ASSERT_OK(cogpu__config_load(&cfg));
  for (int p = 0; p < COGPU_POLICY__COUNT; p++) {
    ASSERT_OK(cogpu__config_set(&cfg, COGPU_OPT_POLICY, policies[p]));
    ASSERT_EQ(cfg.v[COGPU_OPT_POLICY].i, p);
  }
}

TEST_IMPL(options_find) {
  ASSERT_EQ(cogpu__opt_find("state_dir"), COGPU_OPT_STATE_DIR);
  ASSERT_EQ(cogpu__opt_find("STATE_DIR"), COGPU_OPT_STATE_DIR);
  ASSERT_EQ(cogpu__opt_find("State_Dir"), COGPU_OPT_STATE_DIR);
  ASSERT_EQ(cogpu__opt_find("state-dir"), COGPU_OPT_STATE_DIR);
  ASSERT_EQ(cogpu__opt_find("policy"), COGPU_OPT_POLICY);
  ASSERT_EQ(cogpu__opt_find("timeout"), COGPU_OPT_TIMEOUT);
  ASSERT_EQ(cogpu__opt_find("nope"), -1);
  ASSERT_EQ(cogpu__opt_find(""), -1);
  ASSERT_EQ(cogpu__opt_find("state_di"), -1);
  ASSERT_EQ(cogpu__opt_find("state_dirx"), -1);
  ASSERT_EQ(cogpu__opt_find(NULL), -1);
}

TEST_IMPL(options_defaults) {
  cogpu__config_t cfg;
  opt_clear_env();
  unsetenv("COGPU_CONFIG");
  if (access("/etc/cogpu.conf", F_OK) == 0)
    SKIP("/etc/cogpu.conf exists on this machine");
  ASSERT_OK(cogpu__config_load(&cfg));
  for (int i = 0; i < COGPU_OPT__COUNT; i++) {
    ASSERT_EQ(cfg.v[i].source, COGPU_SRC_DEFAULT);
    ASSERT_STREQ(cfg.v[i].where, "default");
    if (i != COGPU_OPT_STATE_DIR)
      ASSERT_STREQ(cfg.v[i].s, cogpu__opt_table[i].def);
  }
  ASSERT_STREQ(cfg.v[COGPU_OPT_CONFIG].s, "/etc/cogpu.conf");
  /* The single-user ledger is each user's own: "%u" is the uid. */
  char own[64];
  snprintf(own, sizeof own, "/dev/shm/cogpu-%u", (unsigned)geteuid());
  ASSERT_STREQ(cfg.v[COGPU_OPT_STATE_DIR].s, own);
  ASSERT_EQ(cfg.v[COGPU_OPT_STATE_MODE].i, 0600);
  ASSERT_EQ(cfg.v[COGPU_OPT_POLICY].i, COGPU_POLICY_FIFO);
  ASSERT(cfg.v[COGPU_OPT_MARGIN].pct);
  ASSERT_EQ(cfg.v[COGPU_OPT_MARGIN].i, 2);
  ASSERT_EQ(cfg.v[COGPU_OPT_MAX_CLIENTS].i, 0);
  ASSERT_EQ(cfg.v[COGPU_OPT_MMU_MAX_AGE].i, 60000);
  ASSERT_EQ(cfg.v[COGPU_OPT_FOREIGN_REFRESH].i, 1000);
  ASSERT_EQ(cfg.v[COGPU_OPT_SWEEP_INTERVAL].i, 1000);
  ASSERT_EQ(cfg.v[COGPU_OPT_STATE_MODE].i, 0600);
  ASSERT_STREQ(cfg.v[COGPU_OPT_STATE_GROUP].s, "");
  ASSERT_EQ(cfg.v[COGPU_OPT_LOG].i, COGPU_LOG_WARN);
  ASSERT_EQ(cfg.v[COGPU_OPT_TIMEOUT].i, -1);
}

/* Sets one option from text and checks it is accepted. */
static cogpu__optval_t *opt_ok(cogpu__config_t *cfg, int id, const char *text) {
  int rc = cogpu__config_set(cfg, id, text);
  if (rc != 0)
    th_fail(__FILE__, __LINE__, "%s='%s' refused: %s", cogpu__opt_table[id].key,
            text, cogpu_last_error());
  ASSERT_EQ(cfg->v[id].source, COGPU_SRC_CLI);
  return &cfg->v[id];
}

/* Checks a refusal: COGPU_ECONFIG, value unchanged, message naming the key
 * and the accepted form. */
static void opt_bad(cogpu__config_t *cfg, int id, const char *text) {
  cogpu__optval_t before = cfg->v[id];
  int rc = cogpu__config_set(cfg, id, text);
  if (rc != COGPU_ECONFIG)
    th_fail(__FILE__, __LINE__, "%s='%s' gave %d, not ECONFIG",
            cogpu__opt_table[id].key, text, rc);
  ASSERT(memcmp(&before, &cfg->v[id], sizeof before) == 0);
  char head[128];
  snprintf(head, sizeof head, "%s: invalid value '", cogpu__opt_table[id].key);
  ASSERT_CONTAINS(cogpu_last_error(), head);
  ASSERT_CONTAINS(cogpu_last_error(), cogpu__opt_table[id].form);
  ASSERT_CONTAINS(cogpu_last_error(), "(from command line)");
}

TEST_IMPL(options_set_enum) {
  cogpu__config_t cfg;
  ASSERT_OK(cogpu__config_load(&cfg));
  ASSERT_EQ(opt_ok(&cfg, COGPU_OPT_POLICY, "mmu")->i, COGPU_POLICY_MMU);
  ASSERT_EQ(opt_ok(&cfg, COGPU_OPT_POLICY, "priority-mmu")->i,
            COGPU_POLICY_PRIO_MMU);
  ASSERT_EQ(opt_ok(&cfg, COGPU_OPT_POLICY, " Priority-FIFO ")->i,
            COGPU_POLICY_PRIO_FIFO);
  ASSERT_STREQ(cfg.v[COGPU_OPT_POLICY].s, "priority-fifo"); /* canonical */
  ASSERT_STREQ(cfg.v[COGPU_OPT_POLICY].where, "command line");
  opt_bad(&cfg, COGPU_OPT_POLICY, "lifo");
  ASSERT_STREQ(cogpu_last_error(),
               "policy: invalid value 'lifo' (from command line); accepted: "
               "fifo|mmu|priority-fifo|priority-mmu");
  opt_bad(&cfg, COGPU_OPT_POLICY, "");
  opt_bad(&cfg, COGPU_OPT_POLICY, "fif");
  opt_bad(&cfg, COGPU_OPT_POLICY, "fifo|mmu");
  opt_bad(&cfg, COGPU_OPT_POLICY, "priority");
  ASSERT_EQ(opt_ok(&cfg, COGPU_OPT_LOG, "debug")->i, COGPU_LOG_DEBUG);
  ASSERT_EQ(opt_ok(&cfg, COGPU_OPT_LOG, "off")->i, COGPU_LOG_OFF);
  opt_bad(&cfg, COGPU_OPT_LOG, "verbose");
}

TEST_IMPL(options_set_size_or_pct) {
  cogpu__config_t cfg;
  ASSERT_OK(cogpu__config_load(&cfg));
  cogpu__optval_t *v = opt_ok(&cfg, COGPU_OPT_MARGIN, "5%");
  ASSERT(v->pct);
  ASSERT_EQ(v->i, 5);
  v = opt_ok(&cfg, COGPU_OPT_MARGIN, "0%");
  ASSERT(v->pct && v->i == 0);
  v = opt_ok(&cfg, COGPU_OPT_MARGIN, "100%");
  ASSERT(v->pct && v->i == 100);
  v = opt_ok(&cfg, COGPU_OPT_MARGIN, " 7 % ");
  ASSERT(v->pct && v->i == 7);
  v = opt_ok(&cfg, COGPU_OPT_MARGIN, "512M");
  ASSERT(!v->pct);
  ASSERT_UEQ(v->u, 512ull << 20);
  v = opt_ok(&cfg, COGPU_OPT_MARGIN, "1GiB");
  ASSERT(!v->pct);
  ASSERT_UEQ(v->u, 1ull << 30);
  v = opt_ok(&cfg, COGPU_OPT_MARGIN, "0");
  ASSERT(!v->pct && v->u == 0);
  const char *bad[] = {"101%", "-1%", "%",    "1.5%", "5%%", "banana",
                       "1.5G", "",    "5 %G", "x%",   NULL};
  for (int i = 0; bad[i]; i++)
    opt_bad(&cfg, COGPU_OPT_MARGIN, bad[i]);
}

/* mem takes a size or auto (learned reservations, docs/history.md): auto
 * reads as 0 bytes to whoever takes only sizes (on demand), and is told
 * apart by i. */
TEST_IMPL(options_set_size_or_auto) {
  cogpu__config_t cfg;
  ASSERT_OK(cogpu__config_load(&cfg));
  const char *autos[] = {"auto", "AUTO", " Auto ", NULL};
  for (int i = 0; autos[i]; i++) {
    cogpu__optval_t *v = opt_ok(&cfg, COGPU_OPT_MEM, autos[i]);
    ASSERT_EQ(v->i, 1);
    ASSERT_UEQ(v->u, 0);
    ASSERT_STREQ(v->s, "auto");
  }
  cogpu__optval_t *v = opt_ok(&cfg, COGPU_OPT_MEM, "12G");
  ASSERT_EQ(v->i, 0);
  ASSERT_UEQ(v->u, 12ull << 30);
  v = opt_ok(&cfg, COGPU_OPT_MEM, "0");
  ASSERT(v->i == 0 && v->u == 0);
  const char *bad[] = {"automatic", "auto1G", "auto,4G", "",
                       "-1G",       "1.5G",   "on",      NULL};
  for (int i = 0; bad[i]; i++)
    opt_bad(&cfg, COGPU_OPT_MEM, bad[i]);
  ASSERT_CONTAINS(cogpu_last_error(), "or auto");
  /* From the environment and from a file, as any option. */
  opt_clear_env();
  setenv("COGPU_MEM", "auto", 1);
  ASSERT_OK(cogpu__config_load(&cfg));
  ASSERT_EQ(cfg.v[COGPU_OPT_MEM].i, 1);
  ASSERT_STREQ(cfg.v[COGPU_OPT_MEM].where, "env COGPU_MEM");
  unsetenv("COGPU_MEM");
  ASSERT_OK(opt_load_file(&cfg, "mem = auto\n"));
  ASSERT_EQ(cfg.v[COGPU_OPT_MEM].i, 1);
  ASSERT_EQ(cfg.v[COGPU_OPT_MEM].source, COGPU_SRC_FILE);
}

TEST_IMPL(options_set_int_range) {
  cogpu__config_t cfg;
  ASSERT_OK(cogpu__config_load(&cfg));
  ASSERT_EQ(opt_ok(&cfg, COGPU_OPT_MAX_CLIENTS, "0")->i, 0);
  ASSERT_EQ(opt_ok(&cfg, COGPU_OPT_MAX_CLIENTS, "7")->i, 7);
  ASSERT_EQ(opt_ok(&cfg, COGPU_OPT_MAX_CLIENTS, "1024")->i, 1024);
  opt_bad(&cfg, COGPU_OPT_MAX_CLIENTS, "1025");
  opt_bad(&cfg, COGPU_OPT_MAX_CLIENTS, "-1");
  opt_bad(&cfg, COGPU_OPT_MAX_CLIENTS, "4.5");
  opt_bad(&cfg, COGPU_OPT_MAX_CLIENTS, "lots");
  opt_bad(&cfg, COGPU_OPT_MAX_CLIENTS, "");
  ASSERT_CONTAINS(cogpu_last_error(), "integer 0..1024");
}

TEST_IMPL(options_set_duration) {
  cogpu__config_t cfg;
  ASSERT_OK(cogpu__config_load(&cfg));
  ASSERT_EQ(opt_ok(&cfg, COGPU_OPT_TIMEOUT, "30s")->i, 30000);
  ASSERT_EQ(opt_ok(&cfg, COGPU_OPT_TIMEOUT, "0")->i, 0);
  ASSERT_EQ(opt_ok(&cfg, COGPU_OPT_TIMEOUT, "inf")->i, -1);
  ASSERT_EQ(opt_ok(&cfg, COGPU_OPT_SWEEP_INTERVAL, "250ms")->i, 250);
  ASSERT_EQ(opt_ok(&cfg, COGPU_OPT_MMU_MAX_AGE, "5m")->i, 300000);
  ASSERT_EQ(opt_ok(&cfg, COGPU_OPT_FOREIGN_REFRESH, "2")->i, 2000);
  opt_bad(&cfg, COGPU_OPT_TIMEOUT, "soon");
  opt_bad(&cfg, COGPU_OPT_TIMEOUT, "-5s");
  opt_bad(&cfg, COGPU_OPT_SWEEP_INTERVAL, "1.5s");
  ASSERT_EQ(cfg.v[COGPU_OPT_DRIVER_WAIT].i, 2000);
  ASSERT_EQ(opt_ok(&cfg, COGPU_OPT_DRIVER_WAIT, "0")->i, 0);
  ASSERT_EQ(opt_ok(&cfg, COGPU_OPT_DRIVER_WAIT, "1m")->i, 60000);
  opt_bad(&cfg, COGPU_OPT_DRIVER_WAIT, "61s");
  ASSERT_CONTAINS(cogpu_last_error(), "from 0 to 1m");
  opt_bad(&cfg, COGPU_OPT_DRIVER_WAIT, "inf");
}

/* Ranges are typed columns of the option table (min, max): each bounded
 * option takes its bounds and refuses one past them, with a message, and
 * its form (the docs' and messages' words) states the same range. */
TEST_IMPL(options_ranges_from_table_columns) {
  cogpu__config_t cfg;
  ASSERT_OK(cogpu__config_load(&cfg));
  int bounded = 0;
  for (int id = 0; id < COGPU_OPT__COUNT; id++) {
    const cogpu__opt_desc_t *d = &cogpu__opt_table[id];
    bool dur = d->type == COGPU_OPT_TYPE_DURATION;
    if (d->type != COGPU_OPT_TYPE_INT && !dur) {
      ASSERT(d->min == INT64_MIN && d->max == INT64_MAX);
      continue;
    }
    if (d->min == INT64_MIN && d->max == INT64_MAX)
      continue;
    bounded++;
    ASSERT(d->min <= d->max);
    const char *unit = dur ? "ms" : "";
    char text[64], range[64];
    snprintf(text, sizeof text, "%lld%s", (long long)d->min, unit);
    ASSERT_EQ(opt_ok(&cfg, id, text)->i, d->min);
    snprintf(text, sizeof text, "%lld%s", (long long)d->max, unit);
    ASSERT_EQ(opt_ok(&cfg, id, text)->i, d->max);
    snprintf(text, sizeof text, "%lld%s", (long long)d->max + 1, unit);
    opt_bad(&cfg, id, text);
    if (d->min > 0 || !dur) {
      snprintf(text, sizeof text, "%lld%s", (long long)d->min - 1, unit);
      opt_bad(&cfg, id, text);
    } else {
      opt_bad(&cfg, id, "inf"); /* inf is -1 ms: below any min >= 0 */
    }
    if (dur) {
      /* "...: must be from 10ms to 1h; accepted: DURATION from 10ms to 1h" */
      const char *m = strstr(cogpu_last_error(), "must be from ");
      ASSERT(m != NULL);
      snprintf(range, sizeof range, "%.*s", (int)strcspn(m + 8, ";"), m + 8);
    } else {
      snprintf(range, sizeof range, "%lld..%lld", (long long)d->min,
               (long long)d->max);
    }
    ASSERT_CONTAINS(d->form, range);
  }
  ASSERT_EQ(bounded, 13); /* 6 of the ledger and preload, 4 of node mode,
                            1 of suspension, 2 of the history */
}

TEST_IMPL(options_set_mode) {
  cogpu__config_t cfg;
  ASSERT_OK(cogpu__config_load(&cfg));
  const char *good[] = {"0600", "0640", "0644", "640", NULL};
  const int bits[] = {0600, 0640, 0644, 0640};
  for (int i = 0; good[i]; i++)
    ASSERT_EQ(opt_ok(&cfg, COGPU_OPT_STATE_MODE, good[i])->i, bits[i]);
  /* A ledger other users can write is refused: that needs the daemon. */
  const char *bad[] = {"0777", "0700",      "0",     "0668", "438",   "0660",
                       "0666", "rw-rw-rw-", "00660", "",     "0x1b6", NULL};
  for (int i = 0; bad[i]; i++)
    opt_bad(&cfg, COGPU_OPT_STATE_MODE, bad[i]);
}

TEST_IMPL(options_set_string) {
  cogpu__config_t cfg;
  ASSERT_OK(cogpu__config_load(&cfg));
  ASSERT_STREQ(opt_ok(&cfg, COGPU_OPT_STATE_DIR, "/var/run/cogpu")->s,
               "/var/run/cogpu");
  opt_bad(&cfg, COGPU_OPT_STATE_DIR, "relative/dir");
  ASSERT_CONTAINS(cogpu_last_error(), "not an absolute path");
  opt_bad(&cfg, COGPU_OPT_STATE_DIR, "");
  ASSERT_STREQ(opt_ok(&cfg, COGPU_OPT_STATE_GROUP, "")->s, "");
  ASSERT_STREQ(opt_ok(&cfg, COGPU_OPT_STATE_GROUP, "gpu users")->s,
               "gpu users");
  char longv[300];
  memset(longv, 'a', sizeof longv - 1);
  longv[0] = '/';
  longv[sizeof longv - 1] = 0;
  opt_bad(&cfg, COGPU_OPT_STATE_DIR, longv);
  ASSERT_CONTAINS(cogpu_last_error(), "longer than 255 bytes");
  /* Bad arguments. */
  ASSERT_EQ(cogpu__config_set(&cfg, -1, "x"), -EINVAL);
  ASSERT_EQ(cogpu__config_set(&cfg, COGPU_OPT__COUNT, "x"), -EINVAL);
  ASSERT_EQ(cogpu__config_set(&cfg, COGPU_OPT_POLICY, NULL), -EINVAL);
}

TEST_IMPL(options_precedence) {
  cogpu__config_t cfg;
  opt_clear_env();
  const char *path = th_path("cogpu.conf");
  setenv("COGPU_POLICY", "priority-fifo", 1);
  setenv("COGPU_TIMEOUT", "5m", 1);
  ASSERT_OK(opt_load_file(&cfg, "policy = mmu\n"
                                "margin = 1G\n"
                                "timeout = 30s\n"));
  char where[512];
  /* Environment beats file. */
  ASSERT_EQ(cfg.v[COGPU_OPT_POLICY].i, COGPU_POLICY_PRIO_FIFO);
  ASSERT_EQ(cfg.v[COGPU_OPT_POLICY].source, COGPU_SRC_ENV);
  ASSERT_STREQ(cfg.v[COGPU_OPT_POLICY].where, "env COGPU_POLICY");
  ASSERT_EQ(cfg.v[COGPU_OPT_TIMEOUT].i, 300000);
  ASSERT_STREQ(cfg.v[COGPU_OPT_TIMEOUT].where, "env COGPU_TIMEOUT");
  /* File beats default. */
  ASSERT(!cfg.v[COGPU_OPT_MARGIN].pct);
  ASSERT_UEQ(cfg.v[COGPU_OPT_MARGIN].u, 1ull << 30);
  ASSERT_EQ(cfg.v[COGPU_OPT_MARGIN].source, COGPU_SRC_FILE);
  snprintf(where, sizeof where, "%s:2", path);
  ASSERT_STREQ(cfg.v[COGPU_OPT_MARGIN].where, where);
  /* Untouched: default. */
  ASSERT_EQ(cfg.v[COGPU_OPT_MAX_CLIENTS].source, COGPU_SRC_DEFAULT);
  ASSERT_STREQ(cfg.v[COGPU_OPT_MAX_CLIENTS].where, "default");
  /* The file named by the environment is recorded. */
  ASSERT_STREQ(cfg.v[COGPU_OPT_CONFIG].s, path);
  ASSERT_EQ(cfg.v[COGPU_OPT_CONFIG].source, COGPU_SRC_ENV);
  ASSERT_STREQ(cfg.v[COGPU_OPT_CONFIG].where, "env COGPU_CONFIG");
  /* A later set (a command-line flag) beats everything. */
  ASSERT_OK(cogpu__config_set(&cfg, COGPU_OPT_POLICY, "fifo"));
  ASSERT_EQ(cfg.v[COGPU_OPT_POLICY].source, COGPU_SRC_CLI);
}

TEST_IMPL(options_file_format) {
  cogpu__config_t cfg;
  opt_clear_env();
  ASSERT_OK(opt_load_file(&cfg, "# a comment\n"
                                "\n"
                                "   \t\n"
                                "policy=mmu # trailing comment\n"
                                "  margin   =    3%   \n"
                                "STATE_DIR = /srv/cogpu\n"
                                "state_group = \"\"\n"
                                "max-clients=4\n"
                                "timeout = 1m\n"
                                "timeout = 2m\n" /* the last one wins */
                                "state_mode = '0640'\n"
                                "sweep_interval = 250ms")); /* no newline */
  ASSERT_EQ(cfg.v[COGPU_OPT_POLICY].i, COGPU_POLICY_MMU);
  ASSERT(cfg.v[COGPU_OPT_MARGIN].pct && cfg.v[COGPU_OPT_MARGIN].i == 3);
  ASSERT_STREQ(cfg.v[COGPU_OPT_STATE_DIR].s, "/srv/cogpu");
  ASSERT_STREQ(cfg.v[COGPU_OPT_STATE_GROUP].s, "");
  ASSERT_EQ(cfg.v[COGPU_OPT_STATE_GROUP].source, COGPU_SRC_FILE);
  ASSERT_EQ(cfg.v[COGPU_OPT_MAX_CLIENTS].i, 4);
  ASSERT_EQ(cfg.v[COGPU_OPT_TIMEOUT].i, 120000);
  char where[512];
  snprintf(where, sizeof where, "%s:10", th_path("cogpu.conf"));
  ASSERT_STREQ(cfg.v[COGPU_OPT_TIMEOUT].where, where);
  ASSERT_EQ(cfg.v[COGPU_OPT_STATE_MODE].i, 0640);
  ASSERT_EQ(cfg.v[COGPU_OPT_SWEEP_INTERVAL].i, 250);
  /* An empty file is fine. */
  ASSERT_OK(opt_load_file(&cfg, ""));
  ASSERT_EQ(cfg.v[COGPU_OPT_POLICY].source, COGPU_SRC_DEFAULT);
  /* '#' inside quotes is kept. */
  ASSERT_OK(opt_load_file(&cfg, "state_group = \"a#b\" # c\n"));
  ASSERT_STREQ(cfg.v[COGPU_OPT_STATE_GROUP].s, "a#b");
}

/* Loads text as the config file and checks the error names FILE:LINE and
 * contains want. */
static void opt_file_error(const char *text, int line, const char *want) {
  cogpu__config_t cfg;
  int rc = opt_load_file(&cfg, text);
  if (rc != COGPU_ECONFIG)
    th_fail(__FILE__, __LINE__, "'%s' loaded (rc %d)", text, rc);
  char where[512];
  snprintf(where, sizeof where, "%s:%d", th_path("cogpu.conf"), line);
  ASSERT_CONTAINS(cogpu_last_error(), where);
  ASSERT_CONTAINS(cogpu_last_error(), want);
}

TEST_IMPL(options_file_errors) {
  opt_clear_env();
  opt_file_error("policy = mmu\nthis line has no equals sign\n", 2,
                 "expected 'key = value'");
  opt_file_error("# c\n\nbogus = 1\n", 3, "unknown option 'bogus'");
  ASSERT_CONTAINS(cogpu_last_error(), "policy"); /* lists the known keys */
  opt_file_error("margin = 1G\npolicy = lifo\n", 2,
                 "policy: invalid value 'lifo'");
  ASSERT_CONTAINS(cogpu_last_error(),
                  "accepted: fifo|mmu|priority-fifo|priority-mmu");
  opt_file_error("config = /etc/other.conf\n", 1,
                 "only be set in the environment");
  opt_file_error("max_clients = 5000\n", 1, "integer 0..1024");
  opt_file_error("state_dir = relative\n", 1, "not an absolute path");
  opt_file_error("= 5\n", 1, "unknown option ''");
  opt_file_error("timeout = 30 seconds\n", 1, "timeout: invalid value");
  /* The exact form of a value error. */
  char want[600];
  opt_file_error("\n\npolicy = lifo\n", 3, "policy");
  snprintf(want, sizeof want,
           "policy: invalid value 'lifo' (from %s:3); accepted: "
           "fifo|mmu|priority-fifo|priority-mmu",
           th_path("cogpu.conf"));
  ASSERT_STREQ(cogpu_last_error(), want);
}

TEST_IMPL(options_file_long_line) {
  opt_clear_env();
  char text[6000];
  memset(text, ' ', sizeof text);
  memcpy(text, "policy = mmu\nlog = ", 19);
  text[sizeof text - 2] = '\n';
  text[sizeof text - 1] = 0;
  opt_file_error(text, 2, "line longer than");
}

TEST_IMPL(options_config_missing) {
  cogpu__config_t cfg;
  opt_clear_env();
  setenv("COGPU_CONFIG", th_path("nonexistent.conf"), 1);
  ASSERT_EQ(cogpu__config_load(&cfg), COGPU_ECONFIG);
  ASSERT_CONTAINS(cogpu_last_error(), th_path("nonexistent.conf"));
  ASSERT_CONTAINS(cogpu_last_error(), "COGPU_CONFIG");
  ASSERT_CONTAINS(cogpu_last_error(), "No such file or directory");
  /* A directory is not a config file either. */
  setenv("COGPU_CONFIG", th_tmpdir(), 1);
  ASSERT_EQ(cogpu__config_load(&cfg), COGPU_ECONFIG);
  ASSERT_CONTAINS(cogpu_last_error(), th_tmpdir());
}

TEST_IMPL(options_config_empty) {
  cogpu__config_t cfg;
  opt_clear_env();
  setenv("COGPU_CONFIG", "", 1);
  ASSERT_OK(cogpu__config_load(&cfg));
  ASSERT_STREQ(cfg.v[COGPU_OPT_CONFIG].s, "");
  ASSERT_EQ(cfg.v[COGPU_OPT_CONFIG].source, COGPU_SRC_ENV);
  for (int i = 0; i < COGPU_OPT__COUNT; i++)
    if (i != COGPU_OPT_CONFIG)
      ASSERT_EQ(cfg.v[i].source, COGPU_SRC_DEFAULT);
}

/* Unset COGPU_CONFIG means /etc/cogpu.conf, and a missing one is fine. */
TEST_IMPL(options_config_unset) {
  cogpu__config_t cfg;
  opt_clear_env();
  unsetenv("COGPU_CONFIG");
  if (access("/etc/cogpu.conf", F_OK) == 0)
    SKIP("/etc/cogpu.conf exists on this machine");
  ASSERT_OK(cogpu__config_load(&cfg));
  ASSERT_STREQ(cfg.v[COGPU_OPT_CONFIG].s, "/etc/cogpu.conf");
  ASSERT_EQ(cfg.v[COGPU_OPT_CONFIG].source, COGPU_SRC_DEFAULT);
}

/* An unreadable file is an error naming it. Root reads anything, so the
 * check runs in a child that drops to an unprivileged user when needed. */
TEST_IMPL(options_config_unreadable) {
  const char *path = th_path("secret.conf");
  th_write_file(path, "policy = mmu\n");
  ASSERT_EQ(chmod(path, 0), 0);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0))
      _exit(TH_SKIP);
    cogpu__config_t cfg;
    opt_clear_env();
    setenv("COGPU_CONFIG", path, 1);
    int rc = cogpu__config_load(&cfg);
    if (rc != COGPU_ECONFIG || !strstr(cogpu_last_error(), path) ||
        !strstr(cogpu_last_error(), "Permission denied")) {
      fprintf(stderr, "rc %d: %s\n", rc, cogpu_last_error());
      _exit(1);
    }
    _exit(0);
  }
  int code = th_exit_code(th_wait(pid, th_ms(10000)));
  if (code == TH_SKIP)
    SKIP("cannot drop root privileges");
  ASSERT_EQ(code, 0);
}

TEST_IMPL(options_env_values) {
  cogpu__config_t cfg;
  opt_clear_env();
  setenv("COGPU_STATE_DIR", "/tmp/x", 1);
  setenv("COGPU_MARGIN", "256M", 1);
  setenv("COGPU_MAX_CLIENTS", " 8 ", 1);
  setenv("COGPU_STATE_MODE", "0600", 1);
  setenv("COGPU_STATE_GROUP", "gpu", 1);
  setenv("COGPU_LOG", "debug", 1);
  ASSERT_OK(cogpu__config_load(&cfg));
  ASSERT_STREQ(cfg.v[COGPU_OPT_STATE_DIR].s, "/tmp/x");
  ASSERT_STREQ(cfg.v[COGPU_OPT_STATE_DIR].where, "env COGPU_STATE_DIR");
  ASSERT_UEQ(cfg.v[COGPU_OPT_MARGIN].u, 256ull << 20);
  ASSERT_EQ(cfg.v[COGPU_OPT_MAX_CLIENTS].i, 8);
  ASSERT_STREQ(cfg.v[COGPU_OPT_MAX_CLIENTS].s, "8");
  ASSERT_EQ(cfg.v[COGPU_OPT_STATE_MODE].i, 0600);
  ASSERT_STREQ(cfg.v[COGPU_OPT_STATE_GROUP].s, "gpu");
  ASSERT_EQ(cfg.v[COGPU_OPT_LOG].i, COGPU_LOG_DEBUG);
  ASSERT_EQ(cfg.v[COGPU_OPT_LOG].source, COGPU_SRC_ENV);
  ASSERT_EQ(cfg.v[COGPU_OPT_POLICY].source, COGPU_SRC_DEFAULT);
}

TEST_IMPL(options_env_bad) {
  cogpu__config_t cfg;
  opt_clear_env();
  setenv("COGPU_POLICY", "lifo", 1);
  ASSERT_EQ(cogpu__config_load(&cfg), COGPU_ECONFIG);
  ASSERT_STREQ(cogpu_last_error(),
               "policy: invalid value 'lifo' (from env COGPU_POLICY); "
               "accepted: fifo|mmu|priority-fifo|priority-mmu");
  unsetenv("COGPU_POLICY");
  setenv("COGPU_MARGIN", "lots", 1);
  ASSERT_EQ(cogpu__config_load(&cfg), COGPU_ECONFIG);
  ASSERT_CONTAINS(cogpu_last_error(), "env COGPU_MARGIN");
  unsetenv("COGPU_MARGIN");
  setenv("COGPU_STATE_DIR", "", 1);
  ASSERT_EQ(cogpu__config_load(&cfg), COGPU_ECONFIG);
  ASSERT_CONTAINS(cogpu_last_error(), "env COGPU_STATE_DIR");
  unsetenv("COGPU_STATE_DIR");
  /* A bad environment value is reported even when the file is fine. */
  setenv("COGPU_TIMEOUT", "never", 1);
  ASSERT_EQ(opt_load_file(&cfg, "timeout = 30s\n"), COGPU_ECONFIG);
  ASSERT_CONTAINS(cogpu_last_error(), "env COGPU_TIMEOUT");
  unsetenv("COGPU_TIMEOUT");
  /* COGPU_CONFIG too long for a path value. */
  char longv[400];
  memset(longv, 'a', sizeof longv - 1);
  longv[sizeof longv - 1] = 0;
  setenv("COGPU_CONFIG", longv, 1);
  ASSERT_EQ(cogpu__config_load(&cfg), COGPU_ECONFIG);
  ASSERT_CONTAINS(cogpu_last_error(), "env COGPU_CONFIG");
}

/* --- docs/options.md --------------------------------------------------- */

static char *opt_read_docs(void) {
  char path[4096];
  snprintf(path, sizeof path, "%s/../docs/options.md", th_build_dir());
  FILE *f = fopen(path, "r");
  if (!f)
    th_fail(__FILE__, __LINE__, "cannot open %s", path);
  static char buf[1 << 16];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  return buf;
}

/* The table row of key: the line that starts with "| `key` |". */
static const char *opt_doc_row(const char *doc, const char *key, char *row,
                               size_t len) {
  char head[128];
  snprintf(head, sizeof head, "| `%s` |", key);
  for (const char *p = doc; p; p = strchr(p, '\n')) {
    p += *p == '\n';
    if (strncmp(p, head, strlen(head)) == 0) {
      snprintf(row, len, "%.*s", (int)strcspn(p, "\n"), p);
      return row;
    }
  }
  return NULL;
}

TEST_IMPL(options_docs_in_sync) {
  const char *doc = opt_read_docs();
  char row[1024], want[300];
  for (int i = 0; i < COGPU_OPT__COUNT; i++) {
    const cogpu__opt_desc_t *d = &cogpu__opt_table[i];
    if (!opt_doc_row(doc, d->key, row, sizeof row))
      th_fail(__FILE__, __LINE__, "docs/options.md has no row for `%s`",
              d->key);
    snprintf(want, sizeof want, "| `COGPU_%s` |", d->name);
    ASSERT_CONTAINS(row, want);
    if (d->def[0])
      snprintf(want, sizeof want, "| `%s` |", d->def);
    else
      snprintf(want, sizeof want, "| (empty) |");
    ASSERT_CONTAINS(row, want);
  }
  /* No row for an option that does not exist: count the rows that start
   * with a backquoted key. */
  int rows = 0;
  for (const char *p = doc; (p = strstr(p, "\n| `")); p++)
    rows++;
  ASSERT_EQ(rows, COGPU_OPT__COUNT);
}
