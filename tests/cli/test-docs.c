/*
 * test-docs.c: the manual pages and the bash completion against the
 * programs they describe, so that a new subcommand, flag, option or
 * plug-in argument cannot ship undocumented:
 *   cogpu(1): every subcommand of `cogpu help --commands` has a section,
 *     which names every flag of its usage, and every long option of the
 *     subcommands' option tables (tools/cogpu/cmd-X.c) is in the page;
 *   cogpud(8): every flag of cogpud's usage;
 *   cogpu.conf(5): every option of options.def (the page is generated
 *     from it: this checks the generator and that make built it);
 *   spank_cogpu(8): every user option of the plug-in's option table and
 *     every plugstack.conf argument it parses;
 *   the bash completion: the subcommands, and each one's flags.
 * The pages are the build's (build/man/); groff checks that they format
 * without a warning (groff-base, which the set-up installs: a missing
 * groff fails the test).
 */
#include <dirent.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "task.h"

static char *read_all(const char *path) {
  FILE *f = fopen(path, "re");
  if (!f)
    th_fail(__FILE__, __LINE__, "cannot open %s (make man builds the pages)",
            path);
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  ASSERT(buf);
  size_t r;
  while ((r = fread(buf + n, 1, cap - n - 1, f)) > 0) {
    n += r;
    if (n + 1 == cap) {
      cap *= 2;
      buf = realloc(buf, cap);
      ASSERT(buf);
    }
  }
  fclose(f);
  buf[n] = 0;
  return buf;
}

/* A page as text to search: font changes and \& dropped, \- read as -,
 * \e as a backslash. */
static char *read_page(const char *name) {
  char path[PATH_MAX + 64];
  snprintf(path, sizeof path, "%s/man/%s", th_build_dir(), name);
  char *s = read_all(path), *o = s;
  for (const char *p = s; *p;) {
    if (p[0] == '\\' && p[1] == 'f' && p[2]) {
      p += 3;
    } else if (p[0] == '\\' && p[1] == '&') {
      p += 2;
    } else if (p[0] == '\\' && (p[1] == '-' || p[1] == 'e')) {
      *o++ = p[1] == '-' ? '-' : '\\';
      p += 2;
    } else {
      *o++ = *p++;
    }
  }
  *o = 0;
  return s;
}

static char *read_source(const char *rel) {
  char path[PATH_MAX + 64];
  snprintf(path, sizeof path, "%s/../%s", th_build_dir(), rel);
  return read_all(path);
}

typedef struct {
  int rc;
  char out[1 << 16];
  char err[1 << 14];
} run_t;

/* Sanitizer builds run tests with the runtime in LD_PRELOAD: a shell or
 * groff gets none (cogpu and cogpud are linked with it), and so does the
 * completion's call of cogpu from bash. */
static const char *const no_preload[] = {"LD_PRELOAD=", NULL};

static run_t *run(const char *const env[], const char *const argv[]) {
  static run_t r;
  r.rc =
      th_run(argv, env, r.out, sizeof r.out, r.err, sizeof r.err, th_ms(15000));
  return &r;
}
#define RUN(...) run(NULL, (const char *const[]){__VA_ARGS__, NULL})
#define RUN_TOOL(...) run(no_preload, (const char *const[]){__VA_ARGS__, NULL})

/* The --flags in text, each once, space-separated with a space at both
 * ends (" --a --b "), into buf. */
static void flags_of(const char *text, size_t len, char *buf, size_t cap) {
  snprintf(buf, cap, " ");
  for (size_t i = 0; i + 2 < len; i++) {
    if (text[i] != '-' || text[i + 1] != '-' || (i && text[i - 1] == '-'))
      continue;
    size_t n = 2;
    while (i + n < len &&
           (text[i + n] == '-' || (text[i + n] >= 'a' && text[i + n] <= 'z')))
      n++;
    if (n == 2)
      continue; /* "--" alone: the end of cogpu's options */
    char flag[64];
    snprintf(flag, sizeof flag, " %.*s ", (int)n, text + i);
    if (!strstr(buf, flag))
      snprintf(buf + strlen(buf), cap - strlen(buf), "%s", flag + 1);
    i += n - 1;
  }
}

/* The synopsis of cmd in `cogpu help`: its entry's first line up to the
 * description (three or more spaces), and the continuation lines indented
 * by six; the descriptions (indented by 17) are left out, since they
 * mention other commands' flags. */
static void usage_synopsis(const char *usage, const char *cmd, char *buf,
                           size_t cap) {
  buf[0] = 0;
  bool in = false;
  for (const char *p = usage; *p;) {
    size_t len = strcspn(p, "\n");
    size_t ind = strspn(p, " ");
    if (ind == 2) {
      size_t w = strcspn(p + 2, " \n");
      in = w == strlen(cmd) && !strncmp(p + 2, cmd, w);
      if (in) {
        const char *gap = strstr(p, "   ");
        size_t n = gap && gap < p + len ? (size_t)(gap - p) : len;
        snprintf(buf + strlen(buf), cap - strlen(buf), "%.*s\n", (int)n, p);
      }
    } else if (in && ind == 6) {
      snprintf(buf + strlen(buf), cap - strlen(buf), "%.*s\n", (int)len, p);
    }
    p += len + (p[len] == '\n');
  }
}

/* The long options of a getopt_long table in a source file. */
static void source_longopts(const char *src, char *buf, size_t cap) {
  snprintf(buf, cap, " ");
  for (const char *p = src; (p = strstr(p, "{\"")); p++) {
    const char *name = p + 2;
    size_t n = strspn(name, "abcdefghijklmnopqrstuvwxyz-");
    if (n == 0 || name[n] != '"')
      continue;
    const char *rest = name + n + 1;
    rest += strspn(rest, ", \n");
    if (strncmp(rest, "no_argument", 11) &&
        strncmp(rest, "required_argument", 17) &&
        strncmp(rest, "optional_argument", 17))
      continue;
    if (n == 4 && !strncmp(name, "help", 4))
      continue; /* --help: every subcommand's, in the page's help section */
    snprintf(buf + strlen(buf), cap - strlen(buf), "--%.*s ", (int)n, name);
  }
}

/* flag in text as a whole word: "--gpu" is not found in "--gpu-mem". */
static bool has_flag(const char *text, const char *flag) {
  size_t n = strlen(flag);
  for (const char *p = text; (p = strstr(p, flag)); p++) {
    char c = p[n];
    if ((p == text || p[-1] != '-') && c != '-' && !(c >= 'a' && c <= 'z'))
      return true;
  }
  return false;
}

/* Each flag of the list (" --a --b ") is in text, or the test fails. */
static void expect_flags_in(const char *flags, const char *text,
                            const char *what) {
  for (const char *p = flags; (p = strstr(p, "--"));) {
    size_t n = strcspn(p, " ");
    char flag[64];
    snprintf(flag, sizeof flag, "%.*s", (int)n, p);
    if (!has_flag(text, flag))
      th_fail(__FILE__, __LINE__, "%s does not describe %s", what, flag);
    p += n;
  }
}

/* The section of cogpu(1) for cmd: from its `.SS "cogpu CMD` heading to
 * the next heading; NULL if there is none. */
static char *page_section(const char *page, const char *cmd, char *buf,
                          size_t cap) {
  char head[96];
  snprintf(head, sizeof head, "\n.SS \"cogpu %s", cmd);
  for (const char *p = page; (p = strstr(p, head)); p++) {
    char after = p[strlen(head)];
    if (after != ' ' && after != '"')
      continue; /* "cogpu status" is not "cogpu st" */
    const char *end = p + 1;
    const char *ss = strstr(end, "\n.SS "), *sh = strstr(end, "\n.SH ");
    end = ss && (!sh || ss < sh) ? ss : sh ? sh : p + strlen(p);
    snprintf(buf, cap, "%.*s", (int)(end - p), p);
    return buf;
  }
  return NULL;
}

/* The cogpu subcommands (help --commands), each with a newline. */
static char *commands(void) {
  run_t *r = RUN("cogpu", "help", "--commands");
  ASSERT_EQ(r->rc, 0);
  char *s = strdup(r->out);
  ASSERT(s && strchr(s, '\n'));
  return s;
}

static char *usage_text(void) {
  run_t *r = RUN("cogpu", "help");
  ASSERT_EQ(r->rc, 0);
  char *s = strdup(r->out);
  ASSERT(s);
  return s;
}

/* The option tables' source of each subcommand with one. */
static const struct {
  const char *cmd, *file;
} opt_sources[] = {
    {"run", "tools/cogpu/cmd-run.c"},
    {"status", "tools/cogpu/cmd-status.c"},
    {"metrics", "tools/cogpu/cmd-metrics.c"},
    {"exporter", "tools/cogpu/cmd-exporter.c"},
    {"history", "tools/cogpu/cmd-history.c"},
    {"slurm-conf", "tools/cogpu/cmd-slurm.c"},
    {"sim", "tools/cogpu/cmd-sim.c"},
};

TEST_IMPL(docs_man_cogpu) {
  char *page = read_page("cogpu.1"), *cmds = commands(), *usage = usage_text();
  static char sec[1 << 16], syn[4096], flags[4096];
  int n = 0;
  for (char *p = cmds, *nl; (nl = strchr(p, '\n')); p = nl + 1) {
    *nl = 0;
    if (!page_section(page, p, sec, sizeof sec))
      th_fail(__FILE__, __LINE__, "cogpu.1 has no section .SS \"cogpu %s\"", p);
    usage_synopsis(usage, p, syn, sizeof syn);
    flags_of(syn, strlen(syn), flags, sizeof flags);
    char what[96];
    snprintf(what, sizeof what, "cogpu.1's section on cogpu %s", p);
    expect_flags_in(flags, sec, what);
    n++;
  }
  ASSERT_GE(n, 12);
  /* No section for a subcommand that does not exist. */
  int sections = 0;
  for (const char *p = page; (p = strstr(p, "\n.SS \"cogpu ")); p++)
    sections++;
  ASSERT_EQ(sections, n);
  /* Every long option of every subcommand's table. */
  for (size_t i = 0; i < COGPU_ARRAY_SIZE(opt_sources); i++) {
    char *src = read_source(opt_sources[i].file);
    source_longopts(src, flags, sizeof flags);
    ASSERT(strlen(flags) > 3);
    char what[96];
    page_section(page, opt_sources[i].cmd, sec, sizeof sec);
    snprintf(what, sizeof what, "cogpu.1's section on cogpu %s",
             opt_sources[i].cmd);
    expect_flags_in(flags, sec, what);
    free(src);
  }
  free(page);
  free(cmds);
  free(usage);
}

TEST_IMPL(docs_man_cogpud) {
  char *page = read_page("cogpud.8");
  run_t *r = RUN("cogpud", "--no-such-flag");
  ASSERT_EQ(r->rc, 2);
  ASSERT_CONTAINS(r->err, "usage: cogpud");
  char flags[1024];
  flags_of(r->err, strlen(r->err), flags, sizeof flags);
  ASSERT_CONTAINS(flags, " --check ");
  ASSERT_CONTAINS(flags, " --version ");
  expect_flags_in(flags, page, "cogpud.8");
  free(page);
}

TEST_IMPL(docs_man_conf) {
  char *page = read_page("cogpu.conf.5");
  const char *opts = strstr(page, "\n.SH OPTIONS\n");
  ASSERT(opts);
  const char *end = strstr(opts + 1, "\n.SH ");
  ASSERT(end);
  char want[160];
  int entries = 0;
  for (const char *p = opts; (p = strstr(p, "\n.TP\n.B ")) && p < end; p++)
    entries++;
  ASSERT_EQ(entries, COGPU_OPT__COUNT);
  for (int i = 0; i < COGPU_OPT__COUNT; i++) {
    const cogpu__opt_desc_t *d = &cogpu__opt_table[i];
    snprintf(want, sizeof want, "\n.TP\n.B %s\n", d->key);
    if (!strstr(opts, want))
      th_fail(__FILE__, __LINE__, "cogpu.conf.5 has no entry for %s", d->key);
    snprintf(want, sizeof want, "Environment: COGPU_%s.", d->name);
    ASSERT_CONTAINS(opts, want);
    if (d->def[0])
      snprintf(want, sizeof want, "Default: %s.", d->def);
    else
      snprintf(want, sizeof want, "Default: empty.");
    ASSERT_CONTAINS(opts, want);
  }
  ASSERT(!strchr(page, '@')); /* every @PLACEHOLDER@ filled in */
  free(page);
}

TEST_IMPL(docs_man_spank) {
  char *page = read_page("spank_cogpu.8");
  char *src = read_source("contrib/slurm/spank-cogpu.c");
  /* The user options: the entries of the spank_option table. */
  const char *t = strstr(src, "struct spank_option options[] = {");
  ASSERT(t);
  const char *tend = strstr(t, "SPANK_OPTIONS_TABLE_END");
  ASSERT(tend);
  int n = 0;
  for (const char *p = t; (p = strstr(p, "{\"")) && p < tend; p++) {
    size_t len = strcspn(p + 2, "\"");
    char want[96];
    snprintf(want, sizeof want, "--%.*s", (int)len, p + 2);
    if (!has_flag(page, want))
      th_fail(__FILE__, __LINE__, "spank_cogpu.8 does not describe %s", want);
    n++;
  }
  ASSERT_GE(n, 4);
  /* The plugstack.conf arguments: what parse_args compares av[i] with. */
  n = 0;
  for (const char *p = src; (p = strstr(p, "strncmp(av[i], \"")); p++) {
    const char *a = p + strlen("strncmp(av[i], \"");
    size_t len = strcspn(a, "\"");
    char want[96];
    snprintf(want, sizeof want, "\n.BI %.*s ", (int)len, a);
    if (!strstr(page, want))
      th_fail(__FILE__, __LINE__,
              "spank_cogpu.8 has no entry (.BI %.*s) for that argument",
              (int)len, a);
    n++;
  }
  ASSERT_GE(n, 3);
  free(page);
  free(src);
}

TEST_IMPL(docs_man_groff) {
  run_t *r = RUN_TOOL("sh", "-c", "command -v groff");
  if (r->rc != 0)
    th_fail(__FILE__, __LINE__,
            "groff is not installed: scripts/setup.sh installs it "
            "(groff-base)");
  char dir[PATH_MAX + 8];
  snprintf(dir, sizeof dir, "%s/man", th_build_dir());
  DIR *d = opendir(dir);
  ASSERT(d);
  int pages = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    const char *dot = strrchr(e->d_name, '.');
    if (!dot || !dot[1] || !strchr("158", dot[1]) || dot[2])
      continue;
    char path[PATH_MAX + 300];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    r = RUN_TOOL("groff", "-man", "-ww", "-z", path);
    if (r->rc != 0 || r->err[0])
      th_fail(__FILE__, __LINE__, "groff -man -ww on %s: exit %d: %s",
              e->d_name, r->rc, r->err);
    pages++;
  }
  closedir(d);
  ASSERT_EQ(pages, 4);
}

/* What the completion offers for the words (the last is being typed). */
static char *complete(const char *words) {
  char script[PATH_MAX * 2 + 512];
  snprintf(script, sizeof script,
           ". '%s/../contrib/bash-completion/cogpu' && COMP_WORDS=(%s) && "
           "COMP_CWORD=$((${#COMP_WORDS[@]} - 1)) && _cogpu && "
           "printf ' %%s' \"${COMPREPLY[@]}\" && echo ' '",
           th_build_dir(), words);
  run_t *r = RUN_TOOL("bash", "-c", script);
  if (r->rc != 0)
    th_fail(__FILE__, __LINE__, "completion of '%s': exit %d: %s", words, r->rc,
            r->err);
  r->out[strcspn(r->out, "\n")] = 0;
  char *s = strdup(r->out);
  ASSERT(s);
  return s;
}

TEST_IMPL(docs_bash_completion) {
  char *cmds = commands(), *usage = usage_text();
  char *all = complete("cogpu ''");
  static char syn[4096], flags[4096];
  for (char *p = cmds, *nl; (nl = strchr(p, '\n')); p = nl + 1) {
    *nl = 0;
    char want[64], words[96];
    snprintf(want, sizeof want, " %s ", p);
    if (!strstr(all, want))
      th_fail(__FILE__, __LINE__, "completion lacks the subcommand %s: %s", p,
              all);
    snprintf(words, sizeof words, "cogpu %s --", p);
    char *offered = complete(words);
    usage_synopsis(usage, p, syn, sizeof syn);
    flags_of(syn, strlen(syn), flags, sizeof flags);
    char what[96];
    snprintf(what, sizeof what, "the completion of cogpu %s", p);
    expect_flags_in(flags, offered, what);
    for (size_t i = 0; i < COGPU_ARRAY_SIZE(opt_sources); i++) {
      if (strcmp(opt_sources[i].cmd, p) != 0)
        continue;
      char *src = read_source(opt_sources[i].file);
      source_longopts(src, flags, sizeof flags);
      expect_flags_in(flags, offered, what);
      free(src);
    }
    free(offered);
  }
  char *s = complete("cogpu st");
  ASSERT_STREQ(s, " status ");
  free(s);
  s = complete("cogpu sim --format ph");
  ASSERT_STREQ(s, " philly ");
  free(s);
  free(all);
  free(cmds);
  free(usage);
}

/* The default configuration file (packages install it as /etc/cogpu.conf):
 * as it is, no option comes from it; with every line uncommented, every
 * option but config does, so each default it shows is valid there. */
TEST_IMPL(docs_conf_example) {
  char path[PATH_MAX + 64], env[PATH_MAX + 80];
  snprintf(path, sizeof path, "%s/cogpu.conf.example", th_build_dir());
  char *text = read_all(path);
  snprintf(env, sizeof env, "COGPU_CONFIG=%s", path);
  const char *e1[] = {env, NULL};
  run_t *r =
      run(e1, (const char *const[]){"cogpu", "config", "--explain", NULL});
  ASSERT_EQ(r->rc, 0);
  ASSERT_EQ(strstr(r->out, "example:") == NULL, 1); /* no value from it */
  /* Uncommented: "#key = " lines lose their '#'. */
  char *o = text;
  for (const char *p = text; *p;) {
    if (p[0] == '#' && p[1] >= 'a' && p[1] <= 'z')
      p++;
    size_t len = strcspn(p, "\n");
    memmove(o, p, len + (p[len] == '\n'));
    o += len + (p[len] == '\n');
    p += len + (p[len] == '\n');
  }
  *o = 0;
  th_write_file(th_path("all.conf"), text);
  snprintf(env, sizeof env, "COGPU_CONFIG=%s", th_path("all.conf"));
  const char *e2[] = {env, NULL};
  r = run(e2, (const char *const[]){"cogpu", "config", "--explain", NULL});
  ASSERT_EQ(r->rc, 0);
  /* From the file, or from the environment the runner gives every test
   * (COGPU_STATE_DIR, COGPU_SOCKET...): never a default. */
  if (strstr(r->out, "(default)"))
    th_fail(__FILE__, __LINE__, "an option of all.conf was not read: %s",
            r->out);
  char want[PATH_MAX + 32];
  snprintf(want, sizeof want, "(%s:", th_path("all.conf"));
  ASSERT_CONTAINS(r->out, want);
  free(text);
}
