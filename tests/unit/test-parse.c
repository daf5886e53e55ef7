/*
 * test-parse.c: the value parsers of src/common/parse.c: every accepted
 * form of sizes, durations, booleans and integers, the refusals and their
 * messages, and the size formatter.
 */
#include <errno.h>
#include <limits.h>

#include "internal.h"
#include "task.h"

#define KiB 1024ull
#define MiB (1024ull * KiB)
#define GiB (1024ull * MiB)
#define TiB (1024ull * GiB)
#define PiB (1024ull * TiB)

static void size_ok(const char *s, uint64_t want) {
  uint64_t v = 12345;
  int rc = cogpu__parse_size("size", s, &v);
  if (rc != 0)
    th_fail(__FILE__, __LINE__, "'%s' refused: %s", s, cogpu_last_error());
  if (v != want)
    th_fail(__FILE__, __LINE__, "'%s' = %llu, want %llu", s,
            (unsigned long long)v, (unsigned long long)want);
}

static void size_bad(const char *s) {
  uint64_t v = 12345;
  cogpu__clearerr();
  int rc = cogpu__parse_size("margin", s, &v);
  if (rc != -EINVAL)
    th_fail(__FILE__, __LINE__, "'%s' accepted (%llu)", s,
            (unsigned long long)v);
  ASSERT_UEQ(v, 12345); /* untouched on error */
  ASSERT_CONTAINS(cogpu_last_error(), "invalid margin '");
}

TEST_IMPL(parse_size_accepts) {
  size_ok("0", 0);
  size_ok("4096", 4096);
  size_ok("4096B", 4096);
  size_ok("4096b", 4096);
  size_ok("512K", 512 * KiB);
  size_ok("512k", 512 * KiB);
  size_ok("512KiB", 512 * KiB);
  size_ok("512KB", 512 * KiB);
  size_ok("512m", 512 * MiB);
  size_ok("512M", 512 * MiB);
  size_ok("12G", 12 * GiB);
  size_ok("12GiB", 12 * GiB);
  size_ok("12gib", 12 * GiB);
  size_ok("12gb", 12 * GiB);
  size_ok("12GB", 12 * GiB);
  size_ok("12Gi", 12 * GiB);
  size_ok("1T", TiB);
  size_ok("1tib", TiB);
  size_ok("2P", 2 * PiB);
  size_ok("  12G  ", 12 * GiB);
  size_ok("\t12G\n", 12 * GiB);
  size_ok("12 GiB", 12 * GiB);
  size_ok("007", 7);
  size_ok("18446744073709551615", UINT64_MAX);
  size_ok("15P", 15 * PiB);
}

TEST_IMPL(parse_size_refuses) {
  const char *bad[] = {"",      "   ",  "banana", "-1",     "-1G",  "+5",
                       "1.5G",  "1,5G", "G",      "GiB",    "12X",  "12ib",
                       "12iB",  "12GG", "12GiBB", "12 G B", "0x10", "1e9",
                       "12G x", "1 2",  "12BB",   "12Bi",   NULL};
  for (int i = 0; bad[i]; i++)
    size_bad(bad[i]);
  /* NULL is refused, not dereferenced. */
  uint64_t v;
  ASSERT_EQ(cogpu__parse_size("x", NULL, &v), -EINVAL);
}

TEST_IMPL(parse_size_overflow) {
  size_bad("18446744073709551616");          /* UINT64_MAX + 1 */
  size_bad("99999999999999999999999999999"); /* far beyond */
  size_bad("16384P");                        /* 2^64 bytes */
  size_bad("17179869184G");                  /* 2^64 bytes */
  ASSERT_CONTAINS(cogpu_last_error(), "too large");
  size_ok("16383P", 16383 * PiB); /* the largest whole P */
}

TEST_IMPL(parse_size_message) {
  uint64_t v;
  ASSERT_EQ(cogpu__parse_size("margin", "banana", &v), -EINVAL);
  ASSERT_STREQ(cogpu_last_error(),
               "invalid margin 'banana': expected a size such as 4096, 512M, "
               "12G or 12GiB");
}

static void dur_ok(const char *s, int64_t want) {
  int64_t v = 12345;
  int rc = cogpu__parse_duration_ms("timeout", s, &v);
  if (rc != 0)
    th_fail(__FILE__, __LINE__, "'%s' refused: %s", s, cogpu_last_error());
  if (v != want)
    th_fail(__FILE__, __LINE__, "'%s' = %lld ms, want %lld", s, (long long)v,
            (long long)want);
}

static void dur_bad(const char *s) {
  int64_t v = 12345;
  int rc = cogpu__parse_duration_ms("timeout", s, &v);
  if (rc != -EINVAL)
    th_fail(__FILE__, __LINE__, "'%s' accepted (%lld)", s, (long long)v);
  ASSERT_EQ(v, 12345);
  ASSERT_CONTAINS(cogpu_last_error(), "invalid timeout '");
}

TEST_IMPL(parse_duration_accepts) {
  dur_ok("0", 0);
  dur_ok("0s", 0);
  dur_ok("0ms", 0);
  dur_ok("250ms", 250);
  dur_ok("250MS", 250);
  dur_ok("30s", 30000);
  dur_ok("30", 30000); /* a bare number is seconds */
  dur_ok("5m", 300000);
  dur_ok("2h", 7200000);
  dur_ok("1d", 86400000);
  dur_ok(" 30 s ", 30000);
  dur_ok("inf", -1);
  dur_ok("INF", -1);
  dur_ok("infinity", -1);
  dur_ok("forever", -1);
  dur_ok("unlimited", -1);
  dur_ok(" inf ", -1);
  dur_ok("9223372036854775807ms", INT64_MAX);
}

TEST_IMPL(parse_duration_refuses) {
  const char *bad[] = {"",
                       "  ",
                       "-1",
                       "-5s",
                       "1.5s",
                       "5x",
                       "s",
                       "ms",
                       "5 m s",
                       "5mm",
                       "infinit",
                       "never",
                       "0x5",
                       "5sec",
                       "1e3",
                       "inf5",
                       "9223372036854775808ms",
                       "106751991167301d",
                       NULL};
  for (int i = 0; bad[i]; i++)
    dur_bad(bad[i]);
  int64_t v;
  ASSERT_EQ(cogpu__parse_duration_ms("timeout", "lunch", &v), -EINVAL);
  ASSERT_STREQ(cogpu_last_error(),
               "invalid timeout 'lunch': expected a duration such as 0, "
               "500ms, 30s, 5m, 2h or inf");
  ASSERT_EQ(cogpu__parse_duration_ms("timeout", NULL, &v), -EINVAL);
}

TEST_IMPL(parse_bool_forms) {
  const char *yes[] = {"1", "true", "TRUE", "yes", "Yes", "on", " on ", NULL};
  const char *no[] = {"0", "false", "False", "no", "NO", "off", "\toff", NULL};
  const char *bad[] = {"", "2", "y", "n", "enable", "truex", "-1", NULL};
  bool b;
  for (int i = 0; yes[i]; i++) {
    b = false;
    ASSERT_OK(cogpu__parse_bool("flag", yes[i], &b));
    ASSERT(b);
  }
  for (int i = 0; no[i]; i++) {
    b = true;
    ASSERT_OK(cogpu__parse_bool("flag", no[i], &b));
    ASSERT(!b);
  }
  for (int i = 0; bad[i]; i++) {
    b = true;
    ASSERT_EQ(cogpu__parse_bool("flag", bad[i], &b), -EINVAL);
    ASSERT(b);
    ASSERT_CONTAINS(cogpu_last_error(), "invalid flag '");
    ASSERT_CONTAINS(cogpu_last_error(), "true");
  }
  ASSERT_EQ(cogpu__parse_bool("flag", NULL, &b), -EINVAL);
}

TEST_IMPL(parse_int_forms) {
  long v;
  ASSERT_OK(cogpu__parse_int("n", "0", 0, 10, &v));
  ASSERT_EQ(v, 0);
  ASSERT_OK(cogpu__parse_int("n", " 10 ", 0, 10, &v));
  ASSERT_EQ(v, 10);
  ASSERT_OK(cogpu__parse_int("n", "+7", 0, 10, &v));
  ASSERT_EQ(v, 7);
  ASSERT_OK(cogpu__parse_int("n", "-3", -5, 5, &v));
  ASSERT_EQ(v, -3);
  ASSERT_OK(
      cogpu__parse_int("n", "9223372036854775807", LONG_MIN, LONG_MAX, &v));
  ASSERT_EQ(v, LONG_MAX);
  ASSERT_OK(
      cogpu__parse_int("n", "-9223372036854775808", LONG_MIN, LONG_MAX, &v));
  ASSERT_EQ(v, LONG_MIN);

  const char *bad[] = {"",   "11",  "-1",  "abc", "1.0", "0x5",
                       "5k", "1 2", "- 1", "--1", "+",   "9223372036854775808",
                       NULL};
  for (int i = 0; bad[i]; i++) {
    v = 42;
    if (cogpu__parse_int("max_clients", bad[i], 0, 10, &v) != -EINVAL)
      th_fail(__FILE__, __LINE__, "'%s' accepted", bad[i]);
    ASSERT_EQ(v, 42);
  }
  ASSERT_EQ(cogpu__parse_int("max_clients", "2000", 0, 1024, &v), -EINVAL);
  ASSERT_STREQ(cogpu_last_error(), "invalid max_clients '2000': expected an "
                                   "integer from 0 to 1024");
  ASSERT_EQ(
      cogpu__parse_int("n", "-9223372036854775809", LONG_MIN, LONG_MAX, &v),
      -EINVAL);
}

TEST_IMPL(parse_fmt_size) {
  char buf[32];
  ASSERT_STREQ(cogpu__fmt_size(0, buf, sizeof buf), "0 B");
  ASSERT_STREQ(cogpu__fmt_size(512, buf, sizeof buf), "512 B");
  ASSERT_STREQ(cogpu__fmt_size(1023, buf, sizeof buf), "1023 B");
  ASSERT_STREQ(cogpu__fmt_size(1024, buf, sizeof buf), "1.0 KiB");
  ASSERT_STREQ(cogpu__fmt_size(1536, buf, sizeof buf), "1.5 KiB");
  ASSERT_STREQ(cogpu__fmt_size(512 * MiB, buf, sizeof buf), "512.0 MiB");
  ASSERT_STREQ(cogpu__fmt_size(12 * GiB, buf, sizeof buf), "12.0 GiB");
  ASSERT_STREQ(cogpu__fmt_size(3 * TiB / 2, buf, sizeof buf), "1.5 TiB");
  ASSERT_STREQ(cogpu__fmt_size(MiB - 1, buf, sizeof buf), "1.0 MiB");
  ASSERT_STREQ(cogpu__fmt_size(UINT64_MAX, buf, sizeof buf), "16.0 EiB");
  /* Returns buf, truncates safely. */
  char small[4];
  ASSERT(cogpu__fmt_size(12 * GiB, small, sizeof small) == small);
  ASSERT_STREQ(small, "12.");
}

/* What fmt_size prints for a whole number of units parses back. */
TEST_IMPL(parse_fmt_size_roundtrip) {
  const uint64_t sizes[] = {0, 1, 4096, 512 * MiB, 12 * GiB, 3 * TiB};
  char buf[32], digits[32];
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    cogpu__fmt_size(sizes[i], buf, sizeof buf);
    /* "12.0 GiB" -> "12 GiB" (fractions are refused by design). */
    char *dot = strstr(buf, ".0 ");
    if (dot)
      memmove(dot, dot + 2, strlen(dot + 2) + 1);
    snprintf(digits, sizeof digits, "%s", buf);
    uint64_t v;
    ASSERT_OK(cogpu__parse_size("size", digits, &v));
    ASSERT_UEQ(v, sizes[i]);
  }
}

/* Durations become nanoseconds and deadlines with saturation (clock.c). */
TEST_IMPL(time_arithmetic_saturates) {
  ASSERT_UEQ(cogpu__ms_to_ns(0), 0);
  ASSERT_UEQ(cogpu__ms_to_ns(1500), 1500000000ull);
  ASSERT_UEQ(cogpu__ms_to_ns(UINT64_MAX / 1000000u),
             UINT64_MAX / 1000000u * 1000000u);
  ASSERT_UEQ(cogpu__ms_to_ns(UINT64_MAX / 1000000u + 1), UINT64_MAX);
  ASSERT_UEQ(cogpu__ms_to_ns(18446744073710ull), UINT64_MAX);
  ASSERT_UEQ(cogpu__ms_to_ns(UINT64_MAX), UINT64_MAX);
  ASSERT_UEQ(cogpu__add_sat(1, 2), 3);
  ASSERT_UEQ(cogpu__add_sat(UINT64_MAX - 1, 1), UINT64_MAX);
  ASSERT_UEQ(cogpu__add_sat(UINT64_MAX - 1, 2), UINT64_MAX);
  ASSERT_UEQ(cogpu__add_sat(UINT64_MAX, UINT64_MAX), UINT64_MAX);
  uint64_t now = cogpu__now_ns();
  ASSERT_UEQ(cogpu__deadline_ns(-1), UINT64_MAX);
  ASSERT(cogpu__deadline_ns(0) >= now);
  ASSERT(cogpu__deadline_ns(1000) >= now + 1000000000ull);
  /* 585 years: wrapped, this was before now. */
  ASSERT(cogpu__deadline_ns(18446744073709ll) > now + 18000000000000000000ull);
  ASSERT_UEQ(cogpu__deadline_ns(INT64_MAX), UINT64_MAX);
  /* The parser takes such bounds: any that fits in milliseconds. */
  int64_t ms;
  ASSERT_OK(cogpu__parse_duration_ms("t", "100000000000s", &ms));
  ASSERT_EQ(ms, 100000000000000ll);
  ASSERT_OK(cogpu__parse_duration_ms("t", "9223372036854775807ms", &ms));
  ASSERT_EQ(ms, INT64_MAX);
}
