/* The synthetic rollout generator: statistics, ids, versions, real sleeps. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>

#include "workers/agent/agent_rollout.h"

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static void check_stats(agent_dist dist) {
  agent_rollout_cfg cfg;
  agent_rollout_cfg_defaults(&cfg);
  cfg.dist = dist;
  cfg.tokens_mean = 500;
  cfg.tokens_std = 100;
  cfg.latency_ms_mean = 20;
  cfg.latency_ms_std = 5;
  agent_rollout_gen g;
  agent_rollout_gen_init(&g, &cfg, 1234);
  enum { N = 20000 };
  double st = 0, st2 = 0, sl = 0;
  for (int i = 0; i < N; i++) {
    agent_rollout r;
    agent_rollout_draw(&g, 3, 17, &r);
    cr_assert_geq(r.tokens, 1u);
    cr_assert_geq(r.latency_s, 0.0);
    st += r.tokens;
    st2 += (double)r.tokens * r.tokens;
    sl += r.latency_s;
  }
  double mean = st / N, sd = sqrt(st2 / N - mean * mean);
  cr_assert_lt(fabs(mean - 500), 5, "token mean %g", mean);
  cr_assert_lt(fabs(sd - 100), 5, "token std %g", sd);
  cr_assert_lt(fabs(sl / N - 0.020), 0.0005, "latency mean %g s", sl / N);
}

Test(agent_rollout, lognormal_statistics) { check_stats(AGENT_DIST_LOGNORMAL); }
Test(agent_rollout, normal_statistics) { check_stats(AGENT_DIST_NORMAL); }

Test(agent_rollout, normal_is_clipped_at_one_token) {
  agent_rollout_cfg cfg;
  agent_rollout_cfg_defaults(&cfg);
  cfg.dist = AGENT_DIST_NORMAL;
  cfg.tokens_mean = 2;
  cfg.tokens_std = 50;
  cfg.latency_ms_mean = 0;
  cfg.latency_ms_std = 1;
  agent_rollout_gen g;
  agent_rollout_gen_init(&g, &cfg, 5);
  int ones = 0;
  for (int i = 0; i < 1000; i++) {
    agent_rollout r;
    agent_rollout_draw(&g, 1, 0, &r);
    cr_assert_geq(r.tokens, 1u);
    cr_assert_geq(r.latency_s, 0.0);
    ones += r.tokens == 1;
  }
  cr_assert_gt(ones, 300, "about half the draws are clipped, saw %d", ones);
}

Test(agent_rollout, ids_unique_and_tagged) {
  agent_rollout_cfg cfg;
  agent_rollout_cfg_defaults(&cfg);
  cfg.latency_ms_mean = 0.2;
  cfg.latency_ms_std = 0.05;
  agent_rollout_gen g;
  agent_rollout_gen_init(&g, &cfg, 77);
  enum { N = 50 };
  agent_rollout a[N], b[N];
  cr_assert_eq(agent_rollout_run(&g, 5, 3, a, N, NULL, NULL), (size_t)N);
  cr_assert_eq(agent_rollout_run(&g, 5, 4, b, N, NULL, NULL), (size_t)N);
  uint64_t ids[2 * N];
  for (int i = 0; i < N; i++) {
    cr_assert_eq(a[i].policy_version, 3u);
    cr_assert_eq(b[i].policy_version, 4u);
    cr_assert_eq(a[i].id >> 40, 5u, "rank in the id");
    cr_assert_geq(a[i].seconds, a[i].latency_s * 0.9, "slept %g of %g", a[i].seconds,
                  a[i].latency_s);
    ids[i] = a[i].id;
    ids[N + i] = b[i].id;
  }
  qsort(ids, 2 * N, sizeof ids[0], cmp_u64);
  for (int i = 1; i < 2 * N; i++) cr_assert_neq(ids[i], ids[i - 1], "duplicate id");
  /* Another rank's generator never produces the same ids. */
  agent_rollout_gen h;
  agent_rollout_gen_init(&h, &cfg, 77);
  agent_rollout r;
  agent_rollout_draw(&h, 6, 0, &r);
  cr_assert_neq(r.id, a[0].id);
}

static int stop_after(void *ud) { return --*(int *)ud < 0; }

Test(agent_rollout, stop_cuts_a_batch_short) {
  agent_rollout_cfg cfg;
  agent_rollout_cfg_defaults(&cfg);
  agent_rollout_gen g;
  agent_rollout_gen_init(&g, &cfg, 1);
  agent_rollout out[10];
  int left = 4;
  cr_assert_eq(agent_rollout_run(&g, 1, 0, out, 10, stop_after, &left), 4u);
}

Test(agent_rollout, config_checks_name_the_flag) {
  agent_rollout_cfg cfg;
  char err[256];
  agent_rollout_cfg_defaults(&cfg);
  cr_assert_eq(agent_rollout_cfg_check(&cfg, err, sizeof err), 0);
  cfg.tokens_mean = 0;
  cr_assert_eq(agent_rollout_cfg_check(&cfg, err, sizeof err), -1);
  cr_assert(strstr(err, "--tokens-mean"), "%s", err);
  agent_rollout_cfg_defaults(&cfg);
  cfg.latency_ms_std = -1;
  cr_assert_eq(agent_rollout_cfg_check(&cfg, err, sizeof err), -1);
  cr_assert(strstr(err, "--latency-ms-std"), "%s", err);
  agent_rollout_cfg_defaults(&cfg);
  cfg.latency_ms_mean = NAN;
  cr_assert_eq(agent_rollout_cfg_check(&cfg, err, sizeof err), -1);
  agent_dist d;
  cr_assert_eq(agent_dist_parse("normal", &d), 0);
  cr_assert_eq(d, AGENT_DIST_NORMAL);
  cr_assert_eq(agent_dist_parse("gamma", &d), -1);
}
