/* Metrics registry: validation, rendering, histogram invariants, promtool. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "orchestrator/daemon/metrics.h"

static char *render(metrics_registry *r) {
  char *buf = NULL;
  size_t len = 0;
  cr_assert_eq(metrics_render(r, &buf, &len), 0);
  cr_assert_eq(strlen(buf), len);
  return buf;
}

/* Value of the first line starting with prefix, or NAN. */
static double sample(const char *text, const char *prefix) {
  size_t n = strlen(prefix);
  for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : p)
    if (!strncmp(p, prefix, n) && p[n] == ' ') return strtod(p + n + 1, NULL);
  return NAN;
}

Test(metrics, counter_and_gauge_render) {
  metrics_registry *r = metrics_registry_new();
  char err[256];
  metrics_counter *c = metrics_counter_new(r, "rlorch_rpc_requests_total", "RPCs served.",
                                           (const char *[]){"method", "code", NULL}, err, sizeof err);
  cr_assert_not_null(c, "%s", err);
  metrics_gauge *g = metrics_gauge_new(r, "rlorch_event_loop_lag_seconds", "Loop lag.", NULL, err,
                                       sizeof err);
  cr_assert_not_null(g, "%s", err);
  cr_assert_eq(metrics_counter_inc(c, (const char *[]){"StartRun", "OK"}), 0);
  cr_assert_eq(metrics_counter_add(c, (const char *[]){"StartRun", "OK"}, 2.5), 0);
  cr_assert_eq(metrics_counter_inc(c, (const char *[]){"GetRun", "NOT_FOUND"}), 0);
  cr_assert_eq(metrics_counter_add(c, (const char *[]){"GetRun", "OK"}, -1), -EINVAL);
  cr_assert_eq(metrics_counter_add(c, (const char *[]){"GetRun", "OK"}, NAN), -EINVAL);
  cr_assert_eq(metrics_counter_inc(c, NULL), -EINVAL);
  cr_assert_eq(metrics_gauge_set(g, NULL, 0.25), 0);
  cr_assert_eq(metrics_gauge_add(g, NULL, -1), 0);
  char *t = render(r);
  cr_assert(strstr(t, "# HELP rlorch_rpc_requests_total RPCs served.\n"), "%s", t);
  cr_assert(strstr(t, "# TYPE rlorch_rpc_requests_total counter\n"), "%s", t);
  cr_assert(strstr(t, "# TYPE rlorch_event_loop_lag_seconds gauge\n"), "%s", t);
  cr_assert_float_eq(sample(t, "rlorch_rpc_requests_total{method=\"StartRun\",code=\"OK\"}"), 3.5,
                     1e-12, "%s", t);
  cr_assert_float_eq(sample(t, "rlorch_rpc_requests_total{method=\"GetRun\",code=\"NOT_FOUND\"}"),
                     1.0, 1e-12, "%s", t);
  cr_assert_float_eq(sample(t, "rlorch_event_loop_lag_seconds"), -0.75, 1e-12, "%s", t);
  cr_assert_null(strstr(t, "code=\"OK\"} -"), "failed updates must not create series:\n%s", t);
  free(t);
  metrics_registry_free(r);
}

Test(metrics, special_values) {
  char b[64];
  metrics_format_value(NAN, b, sizeof b);
  cr_assert_str_eq(b, "NaN");
  metrics_format_value(INFINITY, b, sizeof b);
  cr_assert_str_eq(b, "+Inf");
  metrics_format_value(-INFINITY, b, sizeof b);
  cr_assert_str_eq(b, "-Inf");
  metrics_format_value(0.1, b, sizeof b);
  cr_assert_str_eq(b, "0.1");
  metrics_format_value(1e21, b, sizeof b);
  cr_assert_eq(strtod(b, NULL), 1e21);
  metrics_format_value(1.0 / 3.0, b, sizeof b);
  cr_assert_eq(strtod(b, NULL), 1.0 / 3.0, "%s does not read back", b);
}

Test(metrics, histogram_buckets_in_order_and_inf_equals_count) {
  metrics_registry *r = metrics_registry_new();
  char err[256];
  const double bk[] = {0.001, 0.01, 0.1, 1, 10};
  metrics_histogram *h = metrics_histogram_new(r, "rlorch_rpc_duration_seconds", "RPC latency.",
                                               (const char *[]){"method", NULL}, bk, 5, err, sizeof err);
  cr_assert_not_null(h, "%s", err);
  const double obs[] = {0.0005, 0.001, 0.05, 0.05, 0.5, 7, 100, 1e9};
  double sum = 0;
  for (size_t i = 0; i < sizeof obs / sizeof obs[0]; i++) {
    cr_assert_eq(metrics_histogram_observe(h, (const char *[]){"GetRun"}, obs[i]), 0);
    sum += obs[i];
  }
  cr_assert_eq(metrics_histogram_observe(h, (const char *[]){"GetRun"}, NAN), -EINVAL);
  char *t = render(r);
  /* Cumulative and increasing le, in that order. */
  const char *les[] = {"0.001", "0.01", "0.1", "1", "10", "+Inf"};
  const double want[] = {2, 2, 4, 5, 6, 8};
  const char *prev = t;
  for (size_t i = 0; i < 6; i++) {
    char key[128];
    snprintf(key, sizeof key, "rlorch_rpc_duration_seconds_bucket{method=\"GetRun\",le=\"%s\"}", les[i]);
    const char *at = strstr(t, key);
    cr_assert_not_null(at, "missing %s in\n%s", key, t);
    cr_assert(at >= prev, "bucket %s out of order:\n%s", les[i], t);
    prev = at;
    cr_assert_float_eq(sample(t, key), want[i], 1e-9, "%s", key);
  }
  double inf = sample(t, "rlorch_rpc_duration_seconds_bucket{method=\"GetRun\",le=\"+Inf\"}");
  double count = sample(t, "rlorch_rpc_duration_seconds_count{method=\"GetRun\"}");
  cr_assert_eq(inf, count);
  cr_assert_eq(count, 8);
  cr_assert_float_eq(sample(t, "rlorch_rpc_duration_seconds_sum{method=\"GetRun\"}"), sum, 1e-3);
  const char *sum_at = strstr(t, "_sum{"), *cnt_at = strstr(t, "_count{");
  cr_assert(sum_at > prev && cnt_at > sum_at, "_sum then _count after the buckets:\n%s", t);
  free(t);
  metrics_registry_free(r);
}

Test(metrics, histogram_bad_buckets) {
  metrics_registry *r = metrics_registry_new();
  char err[256] = "";
  const double dec[] = {1, 0.5}, dup[] = {1, 1}, inf[] = {1, INFINITY}, nan[] = {NAN};
  cr_assert_null(metrics_histogram_new(r, "rlorch_a_seconds", "", NULL, dec, 2, err, sizeof err));
  cr_assert(strstr(err, "rlorch_a_seconds") && strstr(err, "strictly increasing"), "%s", err);
  cr_assert_null(metrics_histogram_new(r, "rlorch_a_seconds", "", NULL, dup, 2, err, sizeof err));
  cr_assert(strstr(err, "strictly increasing"), "%s", err);
  cr_assert_null(metrics_histogram_new(r, "rlorch_a_seconds", "", NULL, inf, 2, err, sizeof err));
  cr_assert(strstr(err, "not finite"), "%s", err);
  cr_assert_null(metrics_histogram_new(r, "rlorch_a_seconds", "", NULL, nan, 1, err, sizeof err));
  cr_assert(strstr(err, "not finite"), "%s", err);
  cr_assert_null(metrics_histogram_new(r, "rlorch_a_seconds", "", (const char *[]){"le", NULL},
                                       (const double[]){1}, 1, err, sizeof err));
  cr_assert(strstr(err, "\"le\""), "%s", err);
  /* None of the failures registered the name. */
  cr_assert_not_null(metrics_histogram_new(r, "rlorch_a_seconds", "", NULL, (const double[]){1},
                                           1, err, sizeof err), "%s", err);
  metrics_registry_free(r);
}

Test(metrics, label_escaping) {
  metrics_registry *r = metrics_registry_new();
  char err[256];
  metrics_gauge *g = metrics_gauge_new(r, "rlorch_runs", "Runs by state.\nSecond \\ line \"q\"",
                                       (const char *[]){"state", NULL}, err, sizeof err);
  cr_assert_not_null(g, "%s", err);
  cr_assert_eq(metrics_gauge_set(g, (const char *[]){"a\"b\\c\nd"}, 1), 0);
  char *t = render(r);
  cr_assert(strstr(t, "# HELP rlorch_runs Runs by state.\\nSecond \\\\ line \"q\"\n"), "%s", t);
  cr_assert(strstr(t, "rlorch_runs{state=\"a\\\"b\\\\c\\nd\"} 1\n"), "%s", t);
  free(t);
  metrics_registry_free(r);
}

Test(metrics, name_validation) {
  metrics_registry *r = metrics_registry_new();
  char err[256];
  struct {
    int kind; /* 0 counter, 1 gauge */
    const char *name;
    const char *const *labels;
    const char *want;
  } bad[] = {
      {0, "requests_total", NULL, "must start with rlorch_"},
      {0, "rlorch_requests", NULL, "must end in _total"},
      {1, "rlorch_x_total", NULL, "only counters end in _total"},
      {1, "rlorch_bad-name", NULL, "invalid metric name"},
      {1, "9rlorch", NULL, "invalid metric name"},
      {1, "", NULL, "invalid metric name"},
      {1, "rlorch_g", (const char *[]){"__x", NULL}, "reserved"},
      {1, "rlorch_g", (const char *[]){"a:b", NULL}, "invalid label name"},
      {1, "rlorch_g", (const char *[]){"1a", NULL}, "invalid label name"},
      {1, "rlorch_g", (const char *[]){"", NULL}, "invalid label name"},
      {1, "rlorch_g", (const char *[]){"a", "a", NULL}, "duplicate label name"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    err[0] = 0;
    void *f = bad[i].kind == 0
                  ? (void *)metrics_counter_new(r, bad[i].name, "h", bad[i].labels, err, sizeof err)
                  : (void *)metrics_gauge_new(r, bad[i].name, "h", bad[i].labels, err, sizeof err);
    cr_assert_null(f, "%s accepted", bad[i].name);
    cr_assert(strstr(err, bad[i].want), "%s: got \"%s\", want \"%s\"", bad[i].name, err, bad[i].want);
  }
  cr_assert_null(metrics_gauge_new(NULL, "rlorch_g", "h", NULL, err, sizeof err));
  cr_assert_not_null(metrics_gauge_new(r, "rlorch_g", "h", NULL, err, sizeof err), "%s", err);
  cr_assert_null(metrics_counter_new(r, "rlorch_g", "h", NULL, err, sizeof err));
  cr_assert_null(metrics_gauge_new(r, "rlorch_g", "h", NULL, err, sizeof err));
  cr_assert(strstr(err, "already registered"), "%s", err);
  metrics_registry_free(r);
}

Test(metrics, wrong_kind_and_series_cap) {
  metrics_registry *r = metrics_registry_new();
  metrics_gauge *g = metrics_gauge_new(r, "rlorch_g", "h", (const char *[]){"id", NULL}, NULL, 0);
  cr_assert_not_null(g);
  cr_assert_eq(metrics_counter_inc(g, (const char *[]){"x"}), -EINVAL);
  cr_assert_eq(metrics_histogram_observe(g, (const char *[]){"x"}, 1), -EINVAL);
  cr_assert_eq(metrics_gauge_set(g, (const char *[]){NULL}, 1), -EINVAL);
  char id[32];
  for (int i = 0; i < METRICS_MAX_SERIES; i++) {
    snprintf(id, sizeof id, "%d", i);
    cr_assert_eq(metrics_gauge_set(g, (const char *[]){id}, i), 0);
  }
  cr_assert_eq(metrics_gauge_set(g, (const char *[]){"one-more"}, 1), -ENOSPC);
  cr_assert_eq(metrics_gauge_set(g, (const char *[]){"0"}, 5), 0, "existing series still update");
  metrics_registry_free(r);
}

Test(metrics, removed_series_leave_the_page_and_free_their_slot) {
  metrics_registry *r = metrics_registry_new();
  metrics_gauge *g = metrics_gauge_new(r, "rlorch_g", "h", (const char *[]){"id", NULL}, NULL, 0);
  metrics_histogram *h = metrics_histogram_new(r, "rlorch_h", "h", (const char *[]){"id", NULL},
                                               (const double[]){1, 2}, 2, NULL, 0);
  cr_assert(g && h);
  cr_assert_eq(metrics_gauge_set(g, (const char *[]){"a"}, 1), 0);
  cr_assert_eq(metrics_gauge_set(g, (const char *[]){"b"}, 2), 0);
  cr_assert_eq(metrics_gauge_set(g, (const char *[]){"c"}, 3), 0);
  cr_assert_eq(metrics_histogram_observe(h, (const char *[]){"a"}, 1.5), 0);
  cr_assert_eq(metrics_series_remove(g, (const char *[]){"b"}), 0);
  cr_assert_eq(metrics_series_remove(h, (const char *[]){"a"}), 0);
  cr_assert_eq(metrics_series_remove(g, (const char *[]){"b"}), -ENOENT, "only once");
  cr_assert_eq(metrics_series_remove(g, (const char *[]){NULL}), -EINVAL);
  char *t = render(r);
  cr_assert_null(strstr(t, "rlorch_g{id=\"b\"}"), "%s", t);
  cr_assert_null(strstr(t, "rlorch_h_bucket{id=\"a\""), "%s", t);
  cr_assert(strstr(t, "rlorch_g{id=\"a\"} 1\nrlorch_g{id=\"c\"} 3\n"), "the others in order:\n%s", t);
  free(t);
  /* A full family has room again once a series goes. */
  char id[32];
  for (int i = 0; i < METRICS_MAX_SERIES - 2; i++) {
    snprintf(id, sizeof id, "%d", i);
    cr_assert_eq(metrics_gauge_set(g, (const char *[]){id}, i), 0);
  }
  cr_assert_eq(metrics_gauge_set(g, (const char *[]){"full"}, 1), -ENOSPC);
  cr_assert_eq(metrics_series_remove(g, (const char *[]){"a"}), 0);
  cr_assert_eq(metrics_gauge_set(g, (const char *[]){"full"}, 1), 0);
  metrics_registry_free(r);
}

/* The index finds every series after removals move the others down: an
 * update reaches its own series (no duplicate), a removed one comes back at
 * the end, and the page keeps creation order. */
Test(metrics, lookups_after_removals_reach_the_same_series) {
  metrics_registry *r = metrics_registry_new();
  metrics_gauge *g = metrics_gauge_new(r, "rlorch_g", "h", (const char *[]){"worker", "role", NULL},
                                       NULL, 0);
  cr_assert_not_null(g);
  enum { N = 3000 };
  char id[32];
  for (int i = 0; i < N; i++) {
    snprintf(id, sizeof id, "w-%d", i);
    cr_assert_eq(metrics_gauge_set(g, (const char *[]){id, "inference"}, i), 0);
  }
  for (int i = 0; i < N; i += 3) {
    snprintf(id, sizeof id, "w-%d", i);
    cr_assert_eq(metrics_series_remove(g, (const char *[]){id, "inference"}), 0, "%s", id);
  }
  for (int i = 1; i < N; i += 3) { /* updates, not new series */
    snprintf(id, sizeof id, "w-%d", i);
    cr_assert_eq(metrics_gauge_set(g, (const char *[]){id, "inference"}, i + 0.5), 0);
  }
  cr_assert_eq(metrics_gauge_set(g, (const char *[]){"w-0", "inference"}, 7), 0);
  cr_assert_eq(metrics_series_remove(g, (const char *[]){"w-3", "inference"}), -ENOENT);
  char *t = render(r);
  size_t lines = 0;
  for (const char *p = t; (p = strstr(p, "\nrlorch_g{")); p++) lines++;
  cr_assert_eq(lines, N - N / 3 + 1, "one series each, the removed ones gone");
  cr_assert(strstr(t, "rlorch_g{worker=\"w-1\",role=\"inference\"} 1.5\n"
                      "rlorch_g{worker=\"w-2\",role=\"inference\"} 2\n"
                      "rlorch_g{worker=\"w-4\",role=\"inference\"} 4.5\n"), "%.300s", t);
  cr_assert(strstr(t, "rlorch_g{worker=\"w-2999\",role=\"inference\"} 2999\n"
                      "rlorch_g{worker=\"w-0\",role=\"inference\"} 7\n"),
            "a series made again goes last");
  free(t);
  metrics_registry_free(r);
}

Test(metrics, promtool_accepts_every_kind) {
  if (system("command -v promtool >/dev/null 2>&1") != 0) {
    cr_skip_test("promtool not installed (Debian package prometheus): check skipped");
  }
  metrics_registry *r = metrics_registry_new();
  char err[256];
  metrics_gauge *bi = metrics_gauge_new(r, "rlorch_build_info", "Build facts.",
                                        (const char *[]){"version", "cuda", "nccl", NULL}, err, sizeof err);
  metrics_counter *c = metrics_counter_new(r, "rlorch_rpc_requests_total", "RPCs \"served\".",
                                           (const char *[]){"method", "code", NULL}, err, sizeof err);
  metrics_histogram *h = metrics_histogram_new(
      r, "rlorch_rpc_duration_seconds", "RPC latency.", (const char *[]){"method", NULL},
      (const double[]){0.001, 0.01, 0.1, 1}, 4, err, sizeof err);
  metrics_gauge *lag = metrics_gauge_new(r, "rlorch_event_loop_lag_seconds", "Lag.", NULL, err, sizeof err);
  metrics_gauge *runs = metrics_gauge_new(r, "rlorch_runs", "Runs by state.",
                                          (const char *[]){"state", NULL}, err, sizeof err);
  metrics_gauge *odd = metrics_gauge_new(r, "rlorch_odd_values", "Special values.",
                                         (const char *[]){"v", NULL}, err, sizeof err);
  cr_assert(bi && c && h && lag && runs && odd, "%s", err);
  metrics_gauge_set(bi, (const char *[]){"0.1.0", "13.0", "2.28.9"}, 1);
  metrics_counter_inc(c, (const char *[]){"StartRun", "OK"});
  metrics_histogram_observe(h, (const char *[]){"StartRun"}, 0.004);
  metrics_histogram_observe(h, (const char *[]){"GetRun"}, 3);
  metrics_gauge_set(lag, NULL, 0.0001);
  metrics_gauge_set(runs, (const char *[]){"we\"ird\\\nstate"}, 2);
  metrics_gauge_set(odd, (const char *[]){"nan"}, NAN);
  metrics_gauge_set(odd, (const char *[]){"inf"}, INFINITY);
  metrics_gauge_set(odd, (const char *[]){"-inf"}, -INFINITY);
  char *t = render(r);
  char path[64];
  snprintf(path, sizeof path, "%s/rlorch_metrics_XXXXXX", P_tmpdir);
  int fd = mkstemp(path);
  cr_assert(fd >= 0);
  cr_assert_eq(write(fd, t, strlen(t)), (ssize_t)strlen(t));
  close(fd);
  char cmd[512];
  snprintf(cmd, sizeof cmd, "promtool check metrics < %s 2>&1", path);
  FILE *p = popen(cmd, "r");
  cr_assert_not_null(p);
  char out[4096];
  size_t n = fread(out, 1, sizeof out - 1, p);
  out[n] = 0;
  int st = pclose(p);
  unlink(path);
  cr_assert_eq(n, 0, "promtool printed:\n%s\non:\n%s", out, t);
  cr_assert_eq(st, 0);
  free(t);
  metrics_registry_free(r);
}
