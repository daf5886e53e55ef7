/*
 * gen-conf.c: writes cogpu.conf(5) from its template (argv[1]), putting
 * every option of src/common/options.def where the template has a line
 * "@OPTIONS@"; with --example, the default configuration file. The table is
 * read through the preprocessor, as options.c reads it, so the manual cannot
 * miss an option or disagree with the program on a key, an environment
 * variable, a form or a default.
 */
#include <stdio.h>
#include <string.h>

static const struct {
  const char *name, *key, *def, *form, *help;
} opts[] = {
#define XX(NAME, key, type, def, min, max, form, help)                         \
  {#NAME, #key, def, form, help},
#include "options.def"
#undef XX
};

/* Text for roff: a backslash is written \e, and a line never starts with
 * a control character (the text is always after other text here, but a
 * help string may wrap in a later edit). minus: '-' as \- (defaults and
 * forms are typed as they are shown, -1 and --flags). */
static void roff(FILE *f, const char *s, int minus) {
  for (; *s; s++) {
    if (*s == '\\')
      fputs("\\e", f);
    else if (*s == '-' && minus)
      fputs("\\-", f);
    else
      fputc(*s, f);
  }
}

static void option(FILE *f, int i) {
  fputs(".TP\n.B ", f);
  roff(f, opts[i].key, 1);
  fputs("\n", f);
  roff(f, opts[i].help, 0);
  fputs(".\n.br\nForm: ", f);
  roff(f, opts[i].form, 1);
  fputs(".\n.br\nDefault: ", f);
  if (opts[i].def[0]) {
    fputs("\\fB", f);
    roff(f, opts[i].def, 1);
    fputs("\\fR", f);
  } else {
    fputs("empty", f);
  }
  fputs(".\n.br\nEnvironment: \\fBCOGPU_", f);
  roff(f, opts[i].name, 1);
  fputs("\\fR.\n", f);
}

/* The default configuration file: every option that a file may set, with
 * its help and its default, commented out. Packages install it as
 * /etc/cogpu.conf; `make install` as share/cogpu/cogpu.conf.example. */
static int example(void) {
  puts("# /etc/cogpu.conf: cogpu's configuration (man 5 cogpu.conf).\n"
       "# Every option is shown with its default, commented out: uncomment "
       "a line\n"
       "# to change it. Precedence: default < this file < the COGPU_* "
       "environment\n"
       "# variables; the node daemon, cogpud, reads this file only.");
  for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++) {
    if (!strcmp(opts[i].key, "config"))
      continue; /* only from the environment: an error in a file */
    printf("\n# %s (%s)\n#%s = %s\n", opts[i].help, opts[i].form, opts[i].key,
           opts[i].def);
  }
  return fflush(stdout) == 0 ? 0 : 1;
}

int main(int argc, char **argv) {
  if (argc == 2 && !strcmp(argv[1], "--example"))
    return example();
  if (argc != 2) {
    fputs("usage: gen-conf TEMPLATE > cogpu.conf.5\n"
          "       gen-conf --example > cogpu.conf\n",
          stderr);
    return 2;
  }
  FILE *in = fopen(argv[1], "r");
  if (!in) {
    perror(argv[1]);
    return 1;
  }
  char line[4096];
  int placed = 0;
  while (fgets(line, sizeof line, in)) {
    if (strcmp(line, "@OPTIONS@\n") != 0) {
      fputs(line, stdout);
      continue;
    }
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++)
      option(stdout, (int)i);
    placed++;
  }
  fclose(in);
  if (placed != 1) {
    fprintf(stderr, "%s: needs one line @OPTIONS@, has %d\n", argv[1], placed);
    return 1;
  }
  return fflush(stdout) == 0 ? 0 : 1;
}
