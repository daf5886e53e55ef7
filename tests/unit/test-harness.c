/*
 * test-harness.c: promises of the test runner itself that tests rely on.
 */
#include <limits.h>
#include <stdio.h>
#include <unistd.h>

#include "task.h"

/* A test runs in its own directory, so that files written by relative
 * path (sbatch's default slurm-<job>.out, say) are removed with it and never
 * land in the source tree. */
TEST_IMPL(harness_test_runs_in_its_directory) {
  char cwd[PATH_MAX];
  ASSERT(getcwd(cwd, sizeof cwd) != NULL);
  char want[PATH_MAX];
  ASSERT(realpath(th_tmpdir(), want) != NULL);
  ASSERT_STREQ(cwd, want);
  FILE *f = fopen("relative.out", "w");
  ASSERT(f != NULL);
  fclose(f);
  ASSERT_EQ(access(th_path("relative.out"), F_OK), 0);
}
